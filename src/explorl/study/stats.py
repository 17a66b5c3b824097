"""Confidence intervals of the study: percentile bootstraps over seeds and problems.

Every claim of the study is judged by an interval, not by a threshold on means:

- ``passk_diff``: the difference of mean pass@k between two arms on the same test problems,
  resampling problems (the same draw for both arms: paired) and, within each arm, seeds (the
  same seed draw for both when they ran the same seeds, as a method and GRPO do; the base model
  is one arm of one "seed").
- ``seed_interval``: the mean over seeds of a per-run number (an entropy ratio, a paired
  per-seed difference); with 3 seeds it can only take 10 distinct resampled means, so it is
  crude, and the documents say so.

Intervals are 95% percentile intervals of ``N_BOOT`` resamples from a fixed seed: rerunning the
analysis reproduces them. ``verdict`` reads one: **shown** when it excludes 0 on the claimed
side, **opposite** when it excludes 0 on the other side, **not shown** otherwise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from explorl.eval.passk import pass_at_k

N_BOOT = 4000
LEVEL = 0.95
BOOT_SEED = 0


@dataclass(frozen=True)
class Interval:
    """A point estimate with its bootstrap interval."""

    estimate: float
    low: float
    high: float
    how: str  # what was resampled, for the documents

    def fmt(self, digits: int = 3) -> str:
        return f"{self.estimate:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}]"

    def fmt_abs(self, digits: int = 3) -> str:
        """Without signs: for quantities that are not differences (ratios, R²)."""
        return f"{self.estimate:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"

    def to_json(self) -> dict:
        return {"estimate": self.estimate, "low": self.low, "high": self.high, "how": self.how}


def verdict(iv: Interval | None, direction: int, null: float = 0.0) -> str:
    """``shown`` / ``opposite`` / ``not shown`` for the claim that the quantity is above
    (``direction`` +1) or below (−1) ``null``; ``n/a`` without an interval."""
    if iv is None:
        return "n/a"
    above, below = iv.low > null, iv.high < null
    if (above and direction > 0) or (below and direction < 0):
        return "shown"
    if above or below:
        return "opposite"
    return "not shown"


def _percentiles(samples: np.ndarray) -> tuple[float, float]:
    tail = (1 - LEVEL) / 2 * 100
    lo, hi = np.percentile(samples, [tail, 100 - tail])
    return float(lo), float(hi)


def seed_interval(values: list[float | None], *, n_boot: int = N_BOOT,
                  seed: int = BOOT_SEED) -> Interval | None:
    """Mean of per-run values with a bootstrap over runs (None when no value was measured)."""
    vals = np.array([float(v) for v in values if v is not None])
    if len(vals) == 0:
        return None
    rng = np.random.default_rng(seed)
    draws = vals[rng.integers(0, len(vals), size=(n_boot, len(vals)))].mean(axis=1)
    return Interval(float(vals.mean()), *_percentiles(draws), how=f"{len(vals)} runs resampled")


def passk_diff(a: np.ndarray, b: np.ndarray, *, paired_seeds: bool, n_boot: int = N_BOOT,
               seed: int = BOOT_SEED) -> Interval:
    """Mean pass@k of arm ``a`` minus arm ``b``: arrays (seeds, problems) over the same
    problems (columns in the same order). Problems are resampled once per draw for both arms;
    seeds jointly when ``paired_seeds`` (both arms ran the same seeds, rows in the same order),
    else within each arm."""
    a, b = np.atleast_2d(np.asarray(a, float)), np.atleast_2d(np.asarray(b, float))
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"the two arms cover {a.shape[1]} and {b.shape[1]} problems")
    if paired_seeds and a.shape[0] != b.shape[0]:
        raise ValueError(f"paired seeds need as many runs per arm, got {a.shape[0]}, {b.shape[0]}")
    rng = np.random.default_rng(seed)
    n_prob = a.shape[1]
    out = np.empty(n_boot)
    for i in range(n_boot):
        cols = rng.integers(0, n_prob, n_prob)
        ra = rng.integers(0, a.shape[0], a.shape[0])
        rb = ra if paired_seeds else rng.integers(0, b.shape[0], b.shape[0])
        out[i] = a[ra][:, cols].mean() - b[rb][:, cols].mean()
    how = (f"{n_prob} problems × {a.shape[0]} seeds resampled"
           + (" (paired)" if paired_seeds else f" vs {b.shape[0]}"))
    return Interval(float(a.mean() - b.mean()), *_percentiles(out), how=how)


def problem_passk(problems_jsonl: str | Path, k_list: list[int]) -> dict[int, np.ndarray]:
    """Per-problem unbiased pass@k of one evaluation (``explorl eval``'s problems.jsonl), rows
    in file order (the split's order)."""
    rows = [json.loads(line) for line in Path(problems_jsonl).read_text().splitlines() if line]
    out = {}
    for k in k_list:
        out[k] = np.array([pass_at_k(len(r["responses"]), r["n_correct"], k) for r in rows])
    return out
