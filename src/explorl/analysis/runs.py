"""Read a run directory (``config.yaml`` + ``metrics.jsonl``) and make matplotlib figures.

Every reader here is forgiving: metric keys may be missing at some steps or in whole runs,
a line cut short by a crash is skipped, and a step logged twice (a resumed run re-logs the
steps after its last checkpoint) keeps its last record.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from explorl.outputs.runlog import read_metrics

PASSK_KEY = re.compile(r"^val/pass@(\d+)$")


@dataclass
class Run:
    """One run directory: its recipe name, seed and per-step metric records (sorted by step)."""

    path: Path
    name: str
    seed: int | None
    records: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)  # the resolved config.yaml ({} if absent)

    @property
    def label(self) -> str:
        return self.name if self.seed is None else f"{self.name} (seed {self.seed})"

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of the steps where ``key`` holds a finite number."""
        steps, values = [], []
        for rec in self.records:
            v = rec.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                steps.append(rec["step"])
                values.append(float(v))
        return steps, values

    def moved(self, key: str) -> bool:
        """Whether ``key`` took more than one value (a knob a controller actually changed)."""
        return changes(self.series(key)[1])

    def keys(self) -> set[str]:
        return {k for rec in self.records for k in rec}

    def passk_keys(self) -> list[str]:
        """``val/pass@k`` keys present in the run, sorted by k."""
        found = [k for k in self.keys() if PASSK_KEY.match(k)]
        return sorted(found, key=lambda k: int(PASSK_KEY.match(k).group(1)))


def load_run(run_dir: str | Path) -> Run:
    """Load ``run_dir``: name and seed from ``config.yaml`` (dir name if absent), metrics."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory {run_dir} does not exist")
    cfg: dict[str, Any] = {}
    cfg_path = run_dir / "config.yaml"
    if cfg_path.exists():
        loaded = yaml.safe_load(cfg_path.read_text())
        cfg = loaded if isinstance(loaded, dict) else {}
    name = cfg.get("name") or run_dir.name
    seed = cfg.get("seed")
    return Run(
        path=run_dir,
        name=str(name),
        seed=seed if isinstance(seed, int) else None,
        records=read_metrics(run_dir / "metrics.jsonl"),
        config=cfg,
    )


def changes(values: list[float], rel: float = 1e-9) -> bool:
    """True when the values are not all equal (up to ``rel`` of their magnitude)."""
    if not values:
        return False
    lo, hi = min(values), max(values)
    return hi - lo > rel * max(1.0, abs(hi), abs(lo))


UNIT_INTERVAL = re.compile(r"(_frac$|accuracy$|^val/pass@\d+$|^eepo/active$)")
"""Metrics that are fractions or probabilities: their values and bands live in [0, 1]."""


def metric_range(key: str, config: dict[str, Any] | None = None) -> tuple[float, float] | None:
    """The values ``key`` can take, or None when unbounded: [0, 1] for fractions and
    accuracies; for ``reward/mean`` the reward convention's ({0, 1} or {−1, 1}), widened below
    by DAPO's overlong penalty when the run shapes rewards."""
    if UNIT_INTERVAL.search(key):
        return 0.0, 1.0
    if key == "reward/mean":
        reward = (config or {}).get("reward") or {}
        lo = -1.0 if reward.get("convention") == "signed" else 0.0
        if reward.get("overlong_buffer"):
            lo -= float(reward.get("overlong_penalty", 1.0))
        return lo, 1.0
    return None


def clip_band(lo: list[float], hi: list[float], bounds: tuple[float, float] | None
              ) -> tuple[list[float], list[float]]:
    """A band's lower and upper edges clipped to ``bounds`` (unchanged when None)."""
    if bounds is None:
        return lo, hi
    a, b = bounds
    return [min(max(v, a), b) for v in lo], [min(max(v, a), b) for v in hi]


def bound_axis(ax, bounds: tuple[float, float] | None) -> None:
    """Keep the y axis inside the values the metric can take (``metric_range``): a fraction's
    axis stops at 0 and 1, so a flat zero is not drawn between −0.05 and 0.05."""
    if bounds is not None:
        low, high = ax.get_ylim()
        ax.set_ylim(max(low, bounds[0]), min(high, bounds[1]))


def step_axes(ax) -> None:
    """Axes over training steps: integer step ticks (no 2.5), and plain y tick labels (no
    matplotlib offset such as "+6.917" above the axis, which hides the values read off it)."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
    ax.ticklabel_format(axis="both", useOffset=False)


def new_figure(nrows: int = 1, ncols: int = 1, width: float = 6.4, height: float = 4.0,
               suptitle: bool = False):
    """A (figure, axes) pair on the Agg canvas, without pyplot's global state.

    The trainer redraws plots at every validation of a long run; pyplot would keep every
    figure alive unless closed, and would pick an interactive backend on a desktop. Margins
    are fixed in inches: matplotlib's constrained/tight layout doubles the drawing time.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    W, H = width * ncols, height * nrows
    fig = Figure(figsize=(W, H))
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    left, right, bottom, top, gap = 0.95, 0.25, 0.6, 0.4 + (0.35 if suptitle else 0.0), 0.95
    cell_w = (W - left - right - (ncols - 1) * gap) / ncols
    cell_h = (H - bottom - top - (nrows - 1) * gap) / nrows
    fig.subplots_adjust(left=left / W, right=1 - right / W, bottom=bottom / H, top=1 - top / H,
                        wspace=gap / cell_w, hspace=gap / cell_h)
    return fig, axes


def save_figure(fig, path: str | Path, dpi: int = 100) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path
