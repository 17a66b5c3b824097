"""Confidence intervals of the study: percentile bootstraps over seeds and problems.

Every claim of the study is judged by an interval, not by a threshold on means:

- ``passk_diff``: the difference of mean pass@k between two arms on the same test problems,
  resampling problems (the same draw for both arms: paired) and, within each arm, seeds (the
  same seed draw for both when they ran the same seeds, as a method and GRPO do; the base model
  is one arm of one "seed").
- ``Power`` (``variance_components``, ``paired_power``): the seed, problem and residual
  variance of a pass@k difference and the minimum effect it could detect (MDE), with the seeds
  that would reach a target MDE.
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
    power: Power | None = None  # variance components: the minimum detectable effect

    @property
    def mde(self) -> float | None:
        """Minimum detectable effect of the comparison (``Power``); None when not computed."""
        return None if self.power is None else self.power.mde()

    def fmt(self, digits: int = 3) -> str:
        return f"{self.estimate:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}]"

    def fmt_abs(self, digits: int = 3) -> str:
        """Without signs: for quantities that are not differences (ratios, R²)."""
        return f"{self.estimate:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"

    def to_json(self) -> dict:
        out = {"estimate": self.estimate, "low": self.low, "high": self.high, "how": self.how}
        return out | ({"power": self.power.to_json()} if self.power is not None else {})


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
    power = paired_power(a, b, paired_seeds=paired_seeds) if n_prob >= 2 else None
    return Interval(float(a.mean() - b.mean()), *_percentiles(out), how=how, power=power)


def paired_draws(n_seeds: int, n_problems: int, *, n_boot: int = N_BOOT, seed: int = BOOT_SEED):
    """The resamples of ``passk_diff`` with paired seeds, for a statistic of several arms: per
    draw, (seed rows, problem columns), the same for every arm (columns drawn first, then rows,
    from the same generator: ``passk_diff(a, b, paired_seeds=True)`` is the mean of
    ``a[rows][:, cols] − b[rows][:, cols]`` over these draws)."""
    rng = np.random.default_rng(seed)
    for _ in range(n_boot):
        cols = rng.integers(0, n_problems, n_problems)
        rows = rng.integers(0, n_seeds, n_seeds)
        yield rows, cols


def percentile_interval(samples: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """The ``level`` percentile interval of bootstrap replicates (NaNs left out)."""
    samples = np.asarray(samples, float)
    samples = samples[~np.isnan(samples)]
    if not len(samples):
        return float("nan"), float("nan")
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(samples, [tail, 100 - tail])
    return float(lo), float(hi)


def problem_passk(problems_jsonl: str | Path, k_list: list[int]) -> dict[int, np.ndarray]:
    """Per-problem unbiased pass@k of one evaluation (``explorl eval``'s problems.jsonl), rows
    in file order (the split's order)."""
    rows = [json.loads(line) for line in Path(problems_jsonl).read_text().splitlines() if line]
    n = [r["n_samples"] if "n_samples" in r else len(r["responses"]) for r in rows]  # packed
    out = {}
    for k in k_list:
        out[k] = np.array([pass_at_k(m, r["n_correct"], k) for m, r in zip(n, rows)])
    return out


# ----------------------------------------------------------------------------- power

Z_ALPHA = 1.959963984540054  # two-sided 5%: the 95% intervals' level
Z_POWER = 0.8416212335729143  # 80% power
MDE_Z = Z_ALPHA + Z_POWER  # 2.8016: a true effect of MDE_Z · SE is detected 80% of the time


@dataclass(frozen=True)
class Power:
    """Variance components of a paired difference d[s, p] (seeds × problems) and what they
    detect.

    A two-way crossed model without replication, d[s, p] = μ + seed_s + problem_p + e[s, p],
    with ANOVA estimators (``variance_components``). The mean over S seeds and P problems has

        SE²(S, P) = σ²_problem / P + σ²_seed / S + σ²_resid / (S·P)

    and the minimum detectable effect (two-sided 5%, 80% power) is MDE = (1.960 + 0.842) · SE.
    With one seed, the seed and residual terms cannot be told apart: SE² = var(d over problems)
    / P and σ²_seed is None (the MDE then ignores seed-to-seed variation; the documents say so).
    """

    seeds: int
    problems: int
    var_problem: float
    var_seed: float | None
    var_resid: float

    def se(self, seeds: int | None = None, problems: int | None = None) -> float:
        s, p = seeds or self.seeds, problems or self.problems
        var = self.var_problem / p + self.var_resid / (s * p)
        return float(np.sqrt(var + (self.var_seed or 0.0) / s))

    def mde(self, seeds: int | None = None, problems: int | None = None) -> float:
        return MDE_Z * self.se(seeds, problems)

    def seeds_for(self, target: float, problems: int | None = None) -> int | None:
        """The fewest seeds whose MDE ≤ ``target`` at ``problems`` problems; None when no
        number of seeds gets there (the problem term alone exceeds it) or σ²_seed is unknown."""
        if self.var_seed is None:
            return None
        p = problems or self.problems
        room = (target / MDE_Z) ** 2 - self.var_problem / p
        if room <= 0:
            return None
        return max(1, int(np.ceil((self.var_seed + self.var_resid / p) / room - 1e-12)))

    def to_json(self) -> dict:
        return {"seeds": self.seeds, "problems": self.problems, "var_problem": self.var_problem,
                "var_seed": self.var_seed, "var_resid": self.var_resid, "mde": self.mde()}


def variance_components(d: np.ndarray) -> Power:
    """ANOVA estimates of σ²_problem, σ²_seed, σ²_resid of a (seeds, problems) array of paired
    differences (negative estimates clipped to 0, as usual)."""
    d = np.atleast_2d(np.asarray(d, float))
    s, p = d.shape
    if p < 2:
        raise ValueError("variance components need at least 2 problems")
    if s == 1:
        return Power(1, p, float(d[0].var(ddof=1)), None, 0.0)
    rows, cols, grand = d.mean(axis=1), d.mean(axis=0), d.mean()
    ms_seed = p * rows.var(ddof=1)
    ms_problem = s * cols.var(ddof=1)
    resid = d - rows[:, None] - cols[None, :] + grand
    ms_resid = float((resid ** 2).sum() / ((s - 1) * (p - 1)))
    return Power(s, p, max(0.0, float((ms_problem - ms_resid) / s)),
                 max(0.0, float((ms_seed - ms_resid) / p)), ms_resid)


def paired_power(a: np.ndarray, b: np.ndarray, *, paired_seeds: bool) -> Power:
    """``Power`` of the difference of arm ``a`` and arm ``b`` as ``passk_diff`` compares them:
    paired by seed row when ``paired_seeds``; otherwise ``b`` (one evaluation, e.g. the base
    model) is taken as fixed and subtracted from every run of ``a`` (unpaired arms of several
    seeds: ``b``'s mean over seeds)."""
    a, b = np.atleast_2d(np.asarray(a, float)), np.atleast_2d(np.asarray(b, float))
    d = a - b if paired_seeds else a - b.mean(axis=0, keepdims=True)
    return variance_components(d)
