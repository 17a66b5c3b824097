"""The report's curves: runs grouped by recipe, smoothed, drawn one panel per metric.

Up to ``MANY_GROUPS`` recipes share one set of axes (mean over seeds with a min–max band);
beyond that each panel is small multiples, one recipe per cell against the first in grey.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from explorl.analysis.runs import (
    Run,
    bound_axis,
    changes,
    clip_band,
    metric_range,
    new_figure,
    save_figure,
    step_axes,
)


@dataclass
class Group:
    """Runs of one recipe (usually different seeds)."""

    name: str
    runs: list[Run]

    @property
    def label(self) -> str:
        seeds = [r.seed for r in self.runs if r.seed is not None]
        if len(self.runs) == 1:
            return self.runs[0].label
        if len(seeds) == len(self.runs):
            return f"{self.name} (seeds {', '.join(map(str, seeds))})"
        return f"{self.name} ({len(self.runs)} runs)"

    def band(
        self, key: str, window: int = 1
    ) -> tuple[list[int], list[float], list[float], list[float]]:
        """(steps, mean, min, max) of ``key`` across the group's runs that logged each step; each
        run's series is first smoothed by a trailing mean over ``window`` logged points."""
        by_step: dict[int, list[float]] = {}
        for run in self.runs:
            steps, values = run.series(key)
            for s, v in zip(steps, trailing_mean(values, window)):
                by_step.setdefault(s, []).append(v)
        steps = sorted(by_step)
        vals = [by_step[s] for s in steps]
        return (
            steps,
            [statistics.fmean(v) for v in vals],
            [min(v) for v in vals],
            [max(v) for v in vals],
        )


def trailing_mean(values: list[float], window: int) -> list[float]:
    """values[i] replaced by the mean of values[max(0, i − window + 1) : i + 1]."""
    if window <= 1:
        return list(values)
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def smoothing_window(groups: list[Group]) -> int:
    """Trailing-mean window of the per-step curves: about 1% of the longest run (1 = none)."""
    longest = max((len(r.records) for g in groups for r in g.runs), default=0)
    return max(1, round(longest / 100))


FEW_GROUPS = 3
"""Up to this many recipes a panel has room for each one's raw per-step values, drawn faintly
under a curve smoothed over about 5% of the run (TensorBoard's view); more recipes get the 1%
smoothing of ``smoothing_window`` and no raw lines."""


def display_window(groups: list[Group]) -> int:
    """The trailing-mean window of the drawn curves (``FEW_GROUPS`` explains the two cases)."""
    if len(groups) > FEW_GROUPS:
        return smoothing_window(groups)
    longest = max((len(r.records) for g in groups for r in g.runs), default=0)
    return max(smoothing_window(groups), round(longest / 20))


def group_colors(n: int) -> list:
    """n distinguishable colours: matplotlib's 10-colour cycle, or tab20 beyond 10 lines."""
    if n <= 10:
        return [f"C{i}" for i in range(n)]
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    return [cmap(i % 20) for i in range(n)]


def place_legend(ax, fig, n_entries: int) -> None:
    """Inside the axes for a few entries; to the right of it (figure widened) for many."""
    if n_entries <= 6:
        ax.legend(fontsize="small")
        return
    extra = 2.6  # inches for the legend column
    w, h = fig.get_size_inches()
    left, right = fig.subplotpars.left * w, (1 - fig.subplotpars.right) * w
    fig.set_size_inches(w + extra, h)
    fig.subplots_adjust(left=left / (w + extra), right=1 - (right + extra) / (w + extra))
    ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


@dataclass
class Panel:
    """One overlay figure: ``lines`` are (metric key, line style, label suffix); ``section`` is
    the report heading it appears under."""

    file: str
    title: str
    ylabel: str
    lines: list[tuple[str, str, str]]
    section: str = ""


SECTIONS = ("Reward and accuracy", "Entropy and exploration", "Policy update", "Responses")


KNOBS = {
    "temperature": ("control/temperature", "Sampling temperature", "temperature T"),
    "eps_high": ("control/eps_high", "Clip-higher eps_high", "eps_high"),
    "entropy_coef": ("control/entropy_coef", "Entropy-bonus coefficient", "entropy_coef"),
    "kl_coef": ("control/kl_coef", "Reference-KL coefficient", "kl_coef"),
}
"""Knob panels: drawn only when the knob moved in a run or differs between runs."""


def panels(passk_keys: list[str], runs: list[Run]) -> list[Panel]:
    styles = ["-", "--", ":", "-."]
    passk = [(k, styles[i % 4], f" {k.removeprefix('val/')}") for i, k in enumerate(passk_keys)]
    H = "mean token entropy (nats)"
    eepo = any(r.series("entropy/stage1")[0] for r in runs)
    entropy_title = "Policy entropy" + (" (EEPO runs: dashed = stage 1, dotted = stage 2)"
                                        if eepo else "")
    knobs = [Panel(name, title, ylabel, [(key, "-", "")]) for name, (key, title, ylabel)
             in KNOBS.items() if changes([v for r in runs for v in r.series(key)[1]])]
    acc, ent, upd, resp = SECTIONS
    panels = [
        Panel("reward", "Training reward", "mean reward", [("reward/mean", "-", "")], acc),
        Panel("val_accuracy", "Validation accuracy (sampled)", "validation accuracy",
              [("val/accuracy", "-", "")], acc),
        Panel("val_passk", "Validation pass@k", "pass@k", passk, acc),
        Panel("all_wrong", "Prompts with all responses wrong", "fraction of prompts",
              [("rollout/all_wrong_frac", "-", "")], acc),
        Panel("entropy", entropy_title, H,
              [("entropy/mean", "-", ""), ("entropy/stage1", "--", " stage 1"),
               ("entropy/stage2", ":", " stage 2")], ent),
        *knobs,
        Panel("target_entropy", "Target entropy", H, [("control/target_entropy", "-", "")]),
        Panel("budgets", "Rollout budget per prompt (dashed = min, solid = max)",
              "samples per prompt",
              [("rollout/budget_min", "--", " min"), ("rollout/budget_max", "-", " max")]),
        Panel("covariance", "Covariance of log-prob and advantage", "mean Cov(logp, A)",
              [("cov/mean", "-", "")]),
        Panel("grad_norm", "Gradient norm (before clipping)", "global L2 norm",
              [("grad/norm", "-", "")], upd),
        Panel("clip_frac", "PPO clip fraction", "fraction of tokens",
              [("loss/clip_frac", "-", "")], upd),
        Panel("response_length", "Response length (solid = mean, dashed = max)", "tokens",
              [("response/length_mean", "-", " mean"), ("response/length_max", "--", " max")],
              resp),
        Panel("truncated", "Truncated responses (no EOS before the length limit)",
              "fraction of responses", [("response/truncated_frac", "-", "")], resp),
    ]
    for p in panels:
        p.section = p.section or ent
    return panels


MANY_GROUPS = 6
"""Beyond this many recipes one set of axes is a thicket: each panel becomes small multiples,
one recipe per cell against the first recipe (the reference, e.g. GRPO) drawn in grey."""

MULTIPLES_COLUMNS = 4


def draw(panel: Panel, groups: list[Group], path: Path, window: int) -> Path | None:
    fig = figure(panel, groups, window)
    return None if fig is None else save_figure(fig, path)


def figure(panel: Panel, groups: list[Group], window: int):
    """The panel's figure (None when no group logged any of its keys): one set of axes for up
    to ``MANY_GROUPS`` recipes, small multiples beyond."""
    if len(groups) > MANY_GROUPS:
        return _multiples(panel, groups)
    return _overlay(panel, groups, window)


def _multiples(panel: Panel, groups: list[Group]):
    """One cell per recipe: its mean with the min–max band over seeds in colour, the first
    recipe's mean in grey beneath for reference; every cell on the same y axis. Each cell
    holds two recipes, so the curves get the few-recipe smoothing (about 5% of the run)."""
    cells = [g for g in groups if any(g.band(k)[0] for k, _, _ in panel.lines)]
    if not cells:
        return None
    ref = groups[0]
    window = display_window(groups[:1])
    ncols = min(MULTIPLES_COLUMNS, len(cells))
    nrows = math.ceil(len(cells) / ncols)
    fig, axes = new_figure(nrows, ncols, width=3.4, height=2.5, suptitle=True)
    bounds = metric_range(panel.lines[0][0], groups[0].runs[0].config)
    multi_line = len(panel.lines) > 1
    for i, ax in enumerate(ax for row in axes for ax in row):
        if i >= len(cells):
            ax.set_visible(False)
            continue
        group = cells[i]
        for key, style, suffix in panel.lines:
            sparse = key.startswith("val/")
            w = 1 if sparse else window
            marker = "o" if sparse else None
            if group is not ref:
                steps, mean, _, _ = ref.band(key, w)
                if steps:
                    ax.plot(steps, mean, color="0.6", linestyle=style, marker=marker,
                            markersize=2, linewidth=1.0)
            steps, mean, lo, hi = group.band(key, w)
            if not steps:
                continue
            ax.plot(steps, mean, color="C0", linestyle=style,
                    marker="o" if len(steps) == 1 else marker, markersize=2,
                    linewidth=1.2, label=suffix.strip() or None)
            if len(group.runs) > 1:
                lo, hi = clip_band(lo, hi, bounds)
                ax.fill_between(steps, lo, hi, color="C0", alpha=0.15, linewidth=0)
        seeds = f" ({len(group.runs)} seeds)" if len(group.runs) > 1 else ""
        ax.set_title(group.name + seeds + (" — reference" if group is ref else ""),
                     fontsize="small")
        ax.tick_params(labelsize="x-small")
        ax.grid(alpha=0.3)
        step_axes(ax)
        if i == 0 and multi_line and ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="xx-small")
    shown = [ax for row in axes for ax in row if ax.get_visible()]
    low = min(ax.get_ylim()[0] for ax in shown)
    high = max(ax.get_ylim()[1] for ax in shown)
    for ax in shown:
        ax.set_ylim(low, high)
        bound_axis(ax, bounds)
    for c in range(ncols):  # the lowest visible cell of each column
        [ax for row in axes for ax in row[c:c + 1] if ax.get_visible()][-1].set_xlabel(
            "training step", fontsize="small")
    for row in axes:
        row[0].set_ylabel(panel.ylabel, fontsize="small")
    notes = [f"{window}-step trailing mean"] if window > 1 else []
    if any(len(g.runs) > 1 for g in cells):
        notes.append("band = min–max over seeds")
    fig.suptitle(f"{panel.title}: one recipe per cell, grey = {ref.name}"
                 + (f" ({'; '.join(notes)})" if notes else ""), fontsize="medium")
    return fig


def _overlay(panel: Panel, groups: list[Group], window: int):
    fig, axes = new_figure(width=7.0, height=4.2)
    ax = axes[0][0]
    colors = group_colors(len(groups))
    entries, smoothed = 0, False
    for group, color in zip(groups, colors):
        for key, style, suffix in panel.lines:
            sparse = key.startswith("val/")  # validation points: drawn as they are
            steps, mean, lo, hi = group.band(key, 1 if sparse else window)
            if not steps:
                continue
            smoothed |= not sparse and window > 1
            raw = not sparse and window > 1 and len(groups) <= FEW_GROUPS
            if raw:  # the values behind the smoothed curve, faintly
                ax.plot(*group.band(key, 1)[:2], color=color, linestyle=style, linewidth=0.8,
                        alpha=0.3)
            marker = "o" if len(steps) == 1 or sparse else None
            ax.plot(steps, mean, color=color, linestyle=style, marker=marker, markersize=3,
                    linewidth=1.2, label=group.label + suffix)
            if len(group.runs) > 1:
                lo, hi = clip_band(lo, hi, metric_range(key, group.runs[0].config))
                ax.fill_between(steps, lo, hi, color=color, alpha=0.12, linewidth=0)
            entries += 1
    if not entries:
        return None
    ax.set_title(panel.title)
    notes = [f"{window}-step trailing mean"
             + (", faint: raw" if len(groups) <= FEW_GROUPS else "")] if smoothed else []
    if any(len(g.runs) > 1 for g in groups):
        notes.append("band = min–max over seeds")
    ax.set_xlabel("training step" + (f" ({'; '.join(notes)})" if notes else ""))
    ax.set_ylabel(panel.ylabel)
    bound_axis(ax, metric_range(panel.lines[0][0], groups[0].runs[0].config))
    ax.grid(alpha=0.3)
    step_axes(ax)
    place_legend(ax, fig, entries)
    return fig


ALL_PANEL_FILES = {p.file for p in panels([], [])} | set(KNOBS)
