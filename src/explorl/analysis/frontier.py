"""The pass@1–pass@k frontier figure: pass@k against pass@1, one line per method through its
learning rates, GRPO in black, the base model as a point, 95% intervals as bars.

``draw_frontier`` draws given points (the study passes its bootstrap intervals);
``run_points`` makes them from run directories with a test evaluation (``explorl report``):
runs are grouped by method (their name up to an ``@``: ``grpo@5.0e-05`` is GRPO) and, within
a method, by learning rate (their ``optim.lr``), each point the mean over its runs (seeds) with
a bootstrap over problems and runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from explorl.analysis.runs import Run, new_figure, save_figure
from explorl.eval.passk import pass_at_k

BASELINE = "grpo"


@dataclass
class FPoint:
    """One (method, learning rate): mean pass@1 and pass@k with their 95% intervals."""

    x: float
    y: float
    x_iv: tuple[float, float] | None = None
    y_iv: tuple[float, float] | None = None
    tag: str = ""  # the learning rate, as written beside the baseline's points


@dataclass
class Series:
    label: str
    points: list[FPoint] = field(default_factory=list)


def _number(value) -> float | None:
    """A config value as a float (YAML 1.1 reads ``5e-05`` as a string); None if it is none."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _lr_tag(value) -> str:
    return f"{float(value):.3g}" if isinstance(value, (int, float)) else str(value)


def draw_frontier(series: list[Series], path: Path, k: int, *, base: tuple[float, float] | None
                  = None, hull: list[tuple[float, float]] | None = None,
                  subtitle: str = "", split: str = "test") -> Path:
    """pass@k against pass@1: the first series (the baseline) in black with its learning
    rates written beside its points, the others in colour, the base model as a star and the
    baseline's frontier (``hull``: the points of its line, sorted by pass@1) dashed."""
    fig, axes = new_figure(width=7.6, height=5.2)
    fig.subplots_adjust(left=0.1, right=1 - 1.9 / 7.6, top=0.87)  # the legend beside them
    ax = axes[0][0]
    for i, s in enumerate(series):
        color = "black" if i == 0 else f"C{(i - 1) % 10}"
        pts = s.points
        ax.plot([p.x for p in pts], [p.y for p in pts], color=color, marker="o",
                markersize=4 if i else 5, linewidth=2.0 if i == 0 else 1.2, label=s.label,
                zorder=4 if i == 0 else 3)
        for p in pts:
            xerr = None if p.x_iv is None else [[p.x - p.x_iv[0]], [p.x_iv[1] - p.x]]
            yerr = None if p.y_iv is None else [[p.y - p.y_iv[0]], [p.y_iv[1] - p.y]]
            if xerr is not None or yerr is not None:
                ax.errorbar([p.x], [p.y], xerr=xerr, yerr=yerr, color=color, linewidth=0.8,
                            capsize=2, alpha=0.7, zorder=2)
            if i == 0 and p.tag:
                ax.annotate(p.tag, (p.x, p.y), textcoords="offset points", xytext=(5, 4),
                            fontsize="x-small", color="black")
    if hull and len(hull) > 1:
        ax.plot(*zip(*hull), color="0.45", linestyle="--", linewidth=1.3, zorder=5,
                label=f"{series[0].label}'s frontier (upper hull)")
    if base is not None:
        ax.plot([base[0]], [base[1]], marker="*", markersize=13, color="black", linestyle="none",
                label="base (before RL)", zorder=5)
    ax.set_xlabel(f"{split} pass@1 (mean over seeds and problems; bars: 95% intervals)")
    ax.set_ylabel(f"{split} pass@{k}")
    ax.set_title(f"pass@1–pass@{k} frontier" + (f": {subtitle}" if subtitle else "")
                 + ("\n(black labels: the learning rate)" if any(p.tag for p in series[0].points)
                    else ""), fontsize="medium")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    save_figure(fig, path, dpi=90)
    return path


# ----------------------------------------------------------------------------- from runs


def _eval_of(run: Run) -> tuple[dict, Path] | None:
    """The run's main evaluation (``eval/eval.json``) and its problems file, if any."""
    d = Path(run.path) / "eval"
    try:
        return json.loads((d / "eval.json").read_text()), d / "problems.jsonl"
    except (OSError, ValueError):
        return None


def _per_problem(problems: Path, k: int) -> np.ndarray | None:
    try:
        rows = [json.loads(line) for line in problems.read_text().splitlines() if line]
    except (OSError, ValueError):
        return None
    n = [r["n_samples"] if "n_samples" in r else len(r["responses"]) for r in rows]
    return np.array([pass_at_k(m, r["n_correct"], k) for m, r in zip(n, rows)])


def _band(a: np.ndarray, n_boot: int = 1000) -> tuple[float, float]:
    """95% percentile interval of the mean of (runs, problems), runs and problems resampled."""
    rng = np.random.default_rng(0)
    reps = [a[rng.integers(0, a.shape[0], a.shape[0])][:, rng.integers(0, a.shape[1],
                                                                       a.shape[1])].mean()
            for _ in range(n_boot)]
    lo, hi = np.percentile(reps, [2.5, 97.5])
    return float(lo), float(hi)


def run_points(runs: list[Run]) -> tuple[list[Series], int, str] | None:
    """The frontier's series from runs with an evaluation reporting pass@1 and a larger k (the
    largest k they all report; of the split most of them were evaluated on); GRPO first. None
    when fewer than two points result."""
    evals = {id(r): e for r in runs if (e := _eval_of(r)) is not None}
    splits = [e[0].get("settings", {}).get("split") for e in evals.values()]
    split = max(set(splits), key=splits.count) if splits else None  # one split on one figure
    evals = {i: e for i, e in evals.items() if e[0].get("settings", {}).get("split") == split}
    ks = [set(e[0].get("k_list") or e[0].get("settings", {}).get("k", [])) for e in evals.values()]
    common = set.intersection(*ks) if ks else set()
    if 1 not in common or max(common) <= 1:
        return None
    k = max(common)
    groups: dict[tuple[str, float | None], list[Run]] = {}
    for r in runs:
        if id(r) in evals:
            lr = _number((r.config or {}).get("optim", {}).get("lr"))
            groups.setdefault((r.name.split("@")[0], lr), []).append(r)
    if len(groups) < 2:
        return None
    methods: dict[str, Series] = {}
    for (method, lr), rs in sorted(groups.items(), key=lambda g: (g[0][0], -(g[0][1] or 0))):
        x = [_per_problem(evals[id(r)][1], 1) for r in rs]
        y = [_per_problem(evals[id(r)][1], k) for r in rs]
        same = all(a is not None and len(a) == len(x[0]) for a in [*x, *y])
        if same:
            X, Y = np.stack(x), np.stack(y)
            p = FPoint(float(X.mean()), float(Y.mean()), _band(X), _band(Y), _lr_tag(lr))
        else:  # no per-problem counts: the means alone
            o = [evals[id(r)][0]["overall"] for r in rs]
            p = FPoint(float(np.mean([v["pass@1"] for v in o])),
                       float(np.mean([v[f"pass@{k}"] for v in o])), tag=_lr_tag(lr))
        methods.setdefault(method, Series(method)).points.append(p)
    order = sorted(methods, key=lambda m: m != BASELINE)
    return [methods[m] for m in order], k, split or "test"
