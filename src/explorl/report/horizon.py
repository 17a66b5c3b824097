"""Entropy over a long horizon: each arm's policy entropy at its evaluated checkpoints as a
fraction of where it started, with 95% t intervals over seeds; whether it collapses
(falls by 70% or more); where its curve parts from the baseline's; and the figure of the curves.

The entropy at step s is the mean of the logged ``entropy/mean`` (the training batch's mean token
entropy at the sampling temperature) over the ``WINDOW`` steps ending at s; the start is the mean
over the first ``WINDOW`` logged steps. A run's ratio at s is the one over the other; an arm's is
the mean over its seeds, its interval the t interval over them (``stats.seed_interval``: df
S − 1, so 4 seeds give t tails of 3.18 SEs), and its difference with the baseline is paired by
seed (the seeds both ran).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from explorl.analysis.curves import trailing_mean
from explorl.analysis.runs import Run, new_figure, save_figure, step_axes
from explorl.report.stats import Interval, seed_interval, verdict

KEY = "entropy/mean"
WINDOW = 20  # steps averaged for the entropy at a step (and at the start)
COLLAPSE = 0.30  # entropy at or below 30% of its start: collapse (a fall of 70% or more)


def window_mean(steps: list[int], values: list[float], end: int | None,
                window: int = WINDOW) -> float | None:
    """Mean of ``values`` over the steps in (end − window, end]; ``end`` None: the first
    ``window`` logged steps (the start). None when no step falls in the window."""
    if not steps:
        return None
    lo, hi = (steps[0] - 1, steps[0] + window - 1) if end is None else (end - window, end)
    got = [v for s, v in zip(steps, values) if lo < s <= hi]
    return float(np.mean(got)) if got else None


def run_ratios(run: Run, at: list[int], window: int = WINDOW) -> tuple[float | None,
                                                                      dict[int, float]]:
    """(the run's start entropy, {step: entropy at step ÷ start}) for the steps it reached."""
    steps, values = run.series(KEY)
    start = window_mean(steps, values, None, window)
    out = {}
    for s in at:
        h = window_mean(steps, values, s, window) if steps and steps[-1] >= s else None
        if start and h is not None:
            out[s] = h / start
    return start, out


@dataclass
class Horizon:
    """Per arm: its seeds, start entropy, ratio at each step, and − the baseline's (paired)."""

    steps: list[int]
    baseline: str
    window: int = WINDOW
    seeds: dict[str, list[int]] = field(default_factory=dict)
    start: dict[str, Interval] = field(default_factory=dict)
    ratio: dict[str, dict[int, Interval]] = field(default_factory=dict)
    diff: dict[str, dict[int, Interval]] = field(default_factory=dict)
    paired: dict[str, int] = field(default_factory=dict)  # seeds an arm shares with the baseline

    def collapse(self, arm: str) -> str:
        """``collapses`` when the ratio's interval at the last step lies at or below
        ``COLLAPSE``, ``does not collapse`` when above it, else ``undecided``; ``n/a``
        without a ratio there, ``one seed`` with no interval."""
        if len(self.seeds.get(arm, [])) < 2 and self.steps[-1] in self.ratio.get(arm, {}):
            return "one seed"
        v = verdict(self.ratio.get(arm, {}).get(self.steps[-1]), -1, COLLAPSE)
        return {"shown": "collapses", "opposite": "does not collapse",
                "not shown": "undecided"}.get(v, "n/a")

    def parted(self, arm: str) -> list[int]:
        """The steps where the arm's ratio − the baseline's excludes 0 (on 2 seeds or more)."""
        if self.paired.get(arm, 0) < 2:
            return []
        return [s for s, iv in self.diff.get(arm, {}).items() if iv.low > 0 or iv.high < 0]


def entropy_horizon(groups: dict[str, list[Run]], steps: list[int], baseline: str = "grpo",
                    window: int = WINDOW) -> Horizon | None:
    """The ``Horizon`` of every arm with runs at ``steps`` (sorted); None without steps or
    without any run that logged entropy."""
    if not steps:
        return None
    steps = sorted(steps)
    h = Horizon(steps, baseline, window)
    per: dict[str, dict[int, tuple[float | None, dict[int, float]]]] = {}
    for arm, runs in groups.items():
        got = {r.seed: run_ratios(r, steps, window) for r in runs}
        got = {seed: v for seed, v in got.items() if v[0] is not None}
        if not got:
            continue
        per[arm] = got
        h.seeds[arm] = sorted(got, key=lambda s: (s is None, s))
        h.start[arm] = seed_interval([v[0] for v in got.values()])
        h.ratio[arm] = {s: iv for s in steps
                        if (iv := seed_interval([v[1].get(s) for v in got.values()]))}
    if not per:
        return None
    base = per.get(baseline, {})
    for arm, got in per.items():
        if arm == baseline or not base:
            continue
        common = [s for s in got if s in base]
        h.paired[arm] = len(common)
        h.diff[arm] = {s: iv for s in steps if (iv := seed_interval(
            [got[x][1][s] - base[x][1][s] for x in common
             if s in got[x][1] and s in base[x][1]]))}
    return h


def _cell(iv: Interval | None, n: int, signed: bool = False) -> str:
    """The interval; the estimate alone from one seed (no interval)."""
    if iv is None:
        return "—"
    if n < 2:
        return f"{iv.estimate:+.3f}" if signed else f"{iv.estimate:.3f}"
    return iv.fmt() if signed else iv.fmt_abs()


def horizon_lines(h: Horizon | None) -> list[str]:
    """The markdown of the study's "Entropy over training" section (none without a horizon)."""
    if h is None:
        return []
    s = h.steps
    head = ["arm", "seeds", "H start (nats)", *[f"H step {x} / H start" for x in s],
            f"collapse (H ≤ {COLLAPSE:.0%} of its start at step {s[-1]})"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm in h.ratio:
        n = len(h.seeds[arm])
        out.append("| " + " | ".join([arm, str(n), _cell(h.start[arm], n),
                                      *[_cell(h.ratio[arm].get(x), n) for x in s],
                                      h.collapse(arm)]) + " |")
    if h.diff:
        head = ["arm", *[f"− {h.baseline}, step {x}" for x in s], "parts from it at steps"]
        out += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for arm, d in h.diff.items():
            n = h.paired[arm]
            parted = ", ".join(map(str, h.parted(arm))) or "none"
            out.append("| " + " | ".join([arm, *[_cell(d.get(x), n, True) for x in s],
                                          parted if n > 1 else "one seed"]) + " |")
    return out + ["", f"Entropy at a step: mean `{KEY}` (the training batch's mean token "
                      f"entropy) over the {h.window} steps ending there; the start: over the "
                      f"first {h.window}. Ratios are means over seeds with 95% t intervals over "
                      "seeds (df: seeds − 1; differences paired by seed). "
                      f"**collapses**: the interval at step {s[-1]} lies at or below "
                      f"{COLLAPSE:.2f} (entropy fell by 70% or more); **does not collapse**: "
                      "above it; else undecided."]


def horizon_json(h: Horizon | None) -> dict | None:
    if h is None:
        return None
    return {"steps": h.steps, "baseline": h.baseline, "window": h.window, "collapse": COLLAPSE,
            "seeds": h.seeds,
            "arms": {arm: {"start": h.start[arm].to_json(),
                           "ratio": {str(s): iv.to_json() for s, iv in h.ratio[arm].items()},
                           "minus_baseline": {str(s): iv.to_json()
                                              for s, iv in h.diff.get(arm, {}).items()},
                           "collapse": h.collapse(arm), "parted_at": h.parted(arm)}
                     for arm in h.ratio}}


def draw_horizon(groups: dict[str, list[Run]], h: Horizon | None,
                 out_dir: Path) -> list[tuple[str, str]]:
    """``horizon_entropy.png``: each arm's entropy ÷ its start against steps (a trailing mean
    over the horizon's window, mean over seeds, the band a 95% t interval over seeds), the collapse
    line and the evaluated checkpoints; (title, file) or none."""
    if h is None:
        return []
    window = h.window
    fig, axes = new_figure(width=7.6, height=4.4)
    ax = axes[0][0]
    others = [a for a in h.ratio if a != h.baseline]  # coloured as the frontier figure's
    for arm in h.ratio:
        color = "black" if arm == h.baseline else f"C{others.index(arm) % 10}"
        curves: dict[int, list[float]] = {}
        for r in groups.get(arm, []):
            steps, values = r.series(KEY)
            start = window_mean(steps, values, None, window)
            if not start:
                continue
            for s, v in list(zip(steps, trailing_mean(values, window)))[window - 1:]:
                curves.setdefault(s, []).append(v / start)
        xs = sorted(curves)
        if not xs:
            continue
        mean = [float(np.mean(curves[x])) for x in xs]
        ax.plot(xs, mean, color=color, linewidth=2.0 if arm == h.baseline else 1.4,
                label=f"{arm} ({len(h.seeds[arm])} seed{'s' if len(h.seeds[arm]) > 1 else ''})")
        if len(h.seeds[arm]) > 1:
            band = [seed_interval(curves[x]) for x in xs]
            ax.fill_between(xs, [b.low for b in band], [b.high for b in band], color=color,
                            alpha=0.15, linewidth=0)
    ax.axhline(COLLAPSE, color="0.3", linestyle=":", linewidth=1.2,
               label=f"collapse: {COLLAPSE:.0%} of the start")
    for s in h.steps:
        ax.axvline(s, color="0.8", linewidth=0.8, zorder=0)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("training step (grey lines: the evaluated checkpoints; band: 95% t interval "
                  "over seeds)")
    ax.set_ylabel(f"entropy ÷ its first {window} steps'")
    ax.set_title(f"Entropy over training ({window}-step trailing mean)", fontsize="medium")
    ax.grid(alpha=0.3)
    step_axes(ax)
    ax.legend(fontsize="small")
    save_figure(fig, out_dir / "horizon_entropy.png", dpi=90)
    return [("Entropy over training, relative to its start, with the collapse line",
             "horizon_entropy.png")]
