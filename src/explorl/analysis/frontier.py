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
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from explorl.analysis.hull import beaten_by
from explorl.analysis.passk import pass_at_k
from explorl.analysis.runs import Run, new_figure, save_figure

BASELINE = "grpo"


def is_baseline(name: str) -> bool:
    """Whether a run name (before any ``@``) is GRPO's: ``grpo``, or a recipe folder's GRPO
    named ``<folder>-grpo`` (``real/grpo`` runs as ``real-grpo``)."""
    return name == BASELINE or name.endswith(f"-{BASELINE}")


@dataclass
class FPoint:
    """One (method, learning rate): mean pass@1 and pass@k with their 95% intervals."""

    x: float
    y: float
    x_iv: tuple[float, float] | None = None
    y_iv: tuple[float, float] | None = None
    tag: str = ""  # the learning rate, as written beside the baseline's points
    beaten: bool | None = None  # beaten by its method's other points; None: judged here


NO_BARS = ", none for one seed"
"""Said beside the bars where a point has none: one run's spread over seeds is unknown."""


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


def _limits(series: list[Series], base: tuple[float, float] | None) -> tuple[tuple, tuple]:
    """Axis limits holding every point, its interval and the base model, with a margin."""
    xs, ys = [], []
    for s in series:
        for p in s.points:
            xs += [p.x, *(p.x_iv or ())]
            ys += [p.y, *(p.y_iv or ())]
    if base is not None:
        xs.append(base[0])
        ys.append(base[1])
    pad = lambda lo, hi: max(hi - lo, 1e-3) * 0.06  # noqa: E731
    (x0, x1), (y0, y1) = (min(xs), max(xs)), (min(ys), max(ys))
    return (x0 - pad(x0, x1), x1 + pad(x0, x1)), (y0 - pad(y0, y1), y1 + pad(y0, y1))


BEATEN = "open marker: beaten by the method's own {units}"


def _draw_series(ax, s: Series, color: str, baseline: bool) -> bool:
    """One method's line through its points; a point another of its learning rates (or a mix
    of two) beats, with at least its pass@1 and more pass@k, gets an open marker. Returns
    whether any did."""
    pts = s.points
    size = 5 if baseline else 4
    ax.plot([p.x for p in pts], [p.y for p in pts], color=color, marker="o",
            markersize=size, linewidth=2.0 if baseline else 1.4, label=s.label,
            zorder=4 if baseline else 3)
    at_means = beaten_by([p.x for p in pts], [p.y for p in pts])  # where the caller did not say
    beaten = [p for p, b in zip(pts, at_means) if (b is not None if p.beaten is None
                                                     else p.beaten)]
    if beaten:
        ax.plot([p.x for p in beaten], [p.y for p in beaten], linestyle="none", marker="o",
                markersize=size, markerfacecolor="white", markeredgecolor=color,
                zorder=4.5 if baseline else 3.5)
    for p in pts:
        xerr = None if p.x_iv is None else [[p.x - p.x_iv[0]], [p.x_iv[1] - p.x]]
        yerr = None if p.y_iv is None else [[p.y - p.y_iv[0]], [p.y_iv[1] - p.y]]
        if xerr is not None or yerr is not None:
            ax.errorbar([p.x], [p.y], xerr=xerr, yerr=yerr, color=color, linewidth=0.8,
                        capsize=2, alpha=0.6 if baseline else 0.8, zorder=2)
        if p.tag:  # the learning rate: the baseline's left of its points, the method's right
            ax.annotate(p.tag, (p.x, p.y), textcoords="offset points",
                        xytext=(-5, 4) if baseline else (5, -9),
                        ha="right" if baseline else "left", fontsize="x-small", color=color,
                        zorder=6)
    return bool(beaten)


def draw_frontier(series: list[Series], path: Path, k: int, *, base: tuple[float, float] | None
                  = None, hull: list[tuple[float, float]] | None = None,
                  subtitle: str = "", split: str = "test", unit: str = "learning rate",
                  labels: str = "", hull_label: str = "") -> Path:
    """pass@k against pass@1: the first series (the baseline) in black, the others in colour,
    each point labelled with its learning rate (``unit``: what the points sweep; ``labels``: what
    the labels say, default the unit), the base model as a star and the baseline's frontier
    (``hull``: the points of its line, sorted by pass@1; with the study's per-sample mixtures a
    curve, ``hull_label`` naming it after the baseline) dashed.

    Up to two methods share one panel with the baseline; more get a panel each (small
    multiples on the same axes, each with the baseline, its frontier and the base model), so
    that nine methods' lines and intervals do not cover one another."""
    baseline, others = series[0], series[1:]
    panels = [others] if len(others) <= 2 else [[s] for s in others]
    fig, axes, nrows, ncols = _panel_grid(len(panels))
    single = len(panels) == 1
    limits = _limits(series, base)
    title = f"pass@1–pass@{k} frontier" + (f": {subtitle}" if subtitle else "")
    tagged = any(p.tag for s in series for p in s.points)
    no_bars = NO_BARS if any(p.x_iv is None for s in series for p in s.points) else ""
    open_marker = False
    beaten_label = "\n".join(textwrap.wrap(BEATEN.format(units=unit + "s"), 24))
    # wrapped as that one, so that the single panel's legend fits the margin beside it
    hull_name = "\n".join(textwrap.wrap(f"{baseline.label}'s {hull_label or 'frontier'}", 24))
    for n, ax in enumerate(axes.flat):
        if n >= len(panels):
            ax.set_axis_off()
            continue
        open_marker |= _draw_panel(ax, baseline, panels[n], others, limits, base=base, hull=hull,
                                   hull_name=hull_name)
        if single:
            ax.set_xlabel(f"{split} pass@1 (mean over seeds and problems; bars: 95% "
                          f"intervals{no_bars})")
            ax.set_ylabel(f"{split} pass@{k}")
            ax.set_title(title + (f"\n(labels: the {labels or unit})" if tagged else ""),
                         fontsize="medium")
            if open_marker:
                ax.plot([], [], linestyle="none", marker="o", markerfacecolor="white",
                        markeredgecolor="0.3", label=beaten_label)
            ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
            continue
        s = panels[n][0]
        ax.set_title(f"{s.label} against {baseline.label}", fontsize="medium",
                     color=f"C{others.index(s) % 10}")
        if n % ncols == 0:
            ax.set_ylabel(f"{split} pass@{k}")
        if n // ncols == nrows - 1 or n + ncols >= len(panels):
            ax.set_xlabel(f"{split} pass@1")
    if not single:
        tags = f"labels: the {labels or unit}; " if tagged else ""
        fig.suptitle(f"{title}\n(one panel per method, on the same axes; {tags}"
                     f"bars: 95% intervals over seeds and problems{no_bars})",
                     fontsize="medium")
        _shared_legend(fig, axes, len(panels), nrows, skip=others[0].label,
                       beaten_label=beaten_label if open_marker else None)
    save_figure(fig, path, dpi=90)
    return path


def _panel_grid(n_panels: int):
    """``(figure, axes, rows, columns)``: one panel, with room for the legend beside it; or up
    to three columns of small multiples, with two lines of title above the panels' own."""
    ncols = 1 if n_panels == 1 else min(3, n_panels)
    nrows = -(-n_panels // ncols)
    single = n_panels == 1
    fig, axes = new_figure(nrows, ncols, width=7.6 if single else 4.2,
                           height=5.2 if single else 3.4, suptitle=not single)
    if single:
        fig.subplots_adjust(left=0.1, right=1 - 1.9 / 7.6, top=0.87)  # the legend beside it
    else:  # two lines of title above the panels' own
        fig.subplots_adjust(top=1 - 1.0 / (3.4 * nrows))
    return fig, axes, nrows, ncols


def _draw_panel(ax, baseline: Series, panel: list[Series], others: list[Series], limits,
                *, base: tuple[float, float] | None, hull: list[tuple[float, float]] | None,
                hull_name: str) -> bool:
    """One panel: the baseline, its frontier (labelled ``hull_name``), the base model and
    ``panel``'s series (coloured by their place in ``others``) on the shared ``limits``. True
    when a point is drawn open (beaten)."""
    open_marker = _draw_series(ax, baseline, "black", True)
    if hull and len(hull) > 1:
        ax.plot(*zip(*hull), color="0.45", linestyle="--", linewidth=1.3, zorder=5,
                label=hull_name)
    if base is not None:
        ax.plot([base[0]], [base[1]], marker="*", markersize=12, color="black",
                linestyle="none", label="base (before RL)", zorder=5)
    for s in panel:
        i = others.index(s)
        open_marker |= _draw_series(ax, s, f"C{i % 10}", False)
    xlim, ylim = limits
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.grid(alpha=0.3)
    return open_marker


def _shared_legend(fig, axes, n_panels: int, nrows: int, *, skip: str,
                   beaten_label: str | None) -> None:
    """The small multiples' one legend (the first panel's entries but ``skip``, the method
    drawn there; with ``beaten_label``, the open marker's entry): in the first empty cell, else
    in a row below the panels."""
    handles, names = axes.flat[0].get_legend_handles_labels()
    keep = [(h, lab) for h, lab in zip(handles, names) if lab != skip]
    if beaten_label is not None:
        from matplotlib.lines import Line2D

        keep.append((Line2D([], [], linestyle="none", marker="o", markerfacecolor="white",
                            markeredgecolor="0.3"), beaten_label))
    spare = [ax for ax in axes.flat[n_panels:]]
    if spare:  # the legend in the first empty cell, else in a row below the panels
        spare[0].legend(*zip(*keep), loc="center", fontsize="small", frameon=False)
    else:
        fig.subplots_adjust(bottom=0.55 / (3.4 * nrows) + 0.12 / nrows)
        fig.legend(*zip(*keep), loc="lower center", ncol=len(keep), fontsize="x-small",
                   frameon=False)


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
    one_lr = len({lr for _, lr in groups}) == 1  # nothing swept: no labels
    methods: dict[str, Series] = {}
    for (method, lr), rs in sorted(groups.items(), key=lambda g: (g[0][0], -(g[0][1] or 0))):
        x = [_per_problem(evals[id(r)][1], 1) for r in rs]
        y = [_per_problem(evals[id(r)][1], k) for r in rs]
        same = all(a is not None and len(a) == len(x[0]) for a in [*x, *y])
        if same:
            X, Y = np.stack(x), np.stack(y)
            one = len(rs) < 2  # one seed: no spread over seeds to draw (the tables: n/a)
            p = FPoint(float(X.mean()), float(Y.mean()), None if one else _band(X),
                       None if one else _band(Y), "" if one_lr else _lr_tag(lr))
        else:  # no per-problem counts: the means alone
            o = [evals[id(r)][0]["overall"] for r in rs]
            p = FPoint(float(np.mean([v["pass@1"] for v in o])),
                       float(np.mean([v[f"pass@{k}"] for v in o])),
                       tag="" if one_lr else _lr_tag(lr))
        methods.setdefault(method, Series(method)).points.append(p)
    order = sorted(methods, key=lambda m: not is_baseline(m))
    seeds = {m: max(len(rs) for (name, _), rs in groups.items() if name == m) for m in methods}
    if len(set(seeds.values())) > 1:  # a mean over 1 seed is not one over 4: say which is which
        for m, series in methods.items():
            series.label = f"{m} ({seeds[m]} seed{'s' * (seeds[m] != 1)})"
    return [methods[m] for m in order], k, split or "test"
