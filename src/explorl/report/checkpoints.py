"""pass@1 and pass@k at a long horizon's intermediate checkpoints (``eval.checkpoints``): each
arm's test pass@k at every evaluated step with its interval, its difference with the baseline
(paired), the steps where that difference is resolved, the table, the JSON and the figure; and
the long horizon's claims (the baseline's collapse, each arm ending above it) and the frontier
along training (each arm's checkpoints against the baseline's, as the learning-rate frontier
compares learning rates).

Every checkpoint is evaluated with the final protocol (same test problems, samples and
temperature), so step 0 is the base model's own evaluation: every arm starts from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from explorl.analysis.runs import new_figure, save_figure, step_axes
from explorl.report.claims import E3, EM, Cond, Precondition, claim_row
from explorl.report.frontier import Frontier, analyse_frontier, mean_interval
from explorl.report.frontier_report import PAPERS, frontier_claims
from explorl.report.frontier_report import draw as draw_frontier
from explorl.report.horizon import COLLAPSE, Horizon, draw_horizon, entropy_horizon
from explorl.report.numbers import fmt_value
from explorl.report.stats import Interval, passk_diff
from explorl.report.tables import cell


@dataclass
class Checkpoints:
    """Per (arm, k, step): {seed: per-problem pass@k}; ``base``: k → the base model's."""

    steps: list[int]  # the evaluated checkpoints and the last step, sorted
    k: int
    baseline: str
    arms: list[str]
    got: dict[tuple[str, int, int], dict[int, np.ndarray]] = field(default_factory=dict)
    base: dict[int, np.ndarray] | None = None
    # per (arm, step): {seed: (2, problems) correct answers and samples}; the base model's
    counts: dict[tuple[str, int], dict[int, np.ndarray]] = field(default_factory=dict)
    base_counts: np.ndarray | None = None

    def seeds(self, arm: str, kk: int, step: int) -> list[int]:
        return sorted(self.got.get((arm, kk, step), {}))

    def mean(self, arm: str, kk: int, step: int) -> float | None:
        """Mean over seeds and problems; None when no seed reached the step."""
        v = self.got.get((arm, kk, step))
        return float(np.mean([a.mean() for a in v.values()])) if v else None

    def interval(self, arm: str, kk: int, step: int) -> Interval | None:
        """The mean with its 95% t interval over seeds and problems (``frontier.mean_interval``)."""
        v = self.got.get((arm, kk, step))
        return mean_interval(np.stack([v[s] for s in sorted(v)])) if v else None

    def diff(self, arm: str, kk: int, step: int) -> Interval | None:
        """``arm`` − the baseline at the step over the seeds both reached it with, paired by
        problem and seed; None without a common seed."""
        a, b = self.got.get((arm, kk, step), {}), self.got.get((self.baseline, kk, step), {})
        common = sorted(set(a) & set(b))
        if not common:
            return None
        return passk_diff(np.stack([a[s] for s in common]), np.stack([b[s] for s in common]),
                          paired_seeds=True)

    def resolved(self, arm: str, kk: int) -> list[int]:
        """The steps where ``arm`` − the baseline excludes 0 (on 2 seeds or more)."""
        out = []
        for s in self.steps:
            d = self.diff(arm, kk, s)
            common = set(self.seeds(arm, kk, s)) & set(self.seeds(self.baseline, kk, s))
            if d is not None and len(common) >= 2 and (d.low > 0 or d.high < 0):
                out.append(s)
        return out


def checkpoint_table(cp: Checkpoints | None) -> list[str]:
    """The markdown of the study's "Checkpoints" section: pass@1 and pass@k (mean over seeds)
    of each arm at every step, then each arm − the baseline with its paired interval and MDE,
    and the steps where that difference is resolved."""
    if cp is None:
        return []
    k, cols = cp.k, cp.steps
    head = ["arm", *[f"pass@1 step {s}" for s in cols], *[f"pass@{k} step {s}" for s in cols]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in cp.arms:
        cells = [fmt_value(cp.mean(name, kk, st)) for kk in (1, k) for st in cols]
        lines.append("| " + " | ".join([name, *cells]) + " |")
    start = ""
    if cp.base is not None:
        start = (f" Step 0 is the base model: pass@1 {cp.base[1].mean():.3f}, pass@{k} "
                 f"{cp.base[k].mean():.3f}.")
    lines += ["", "Each checkpoint evaluated with the final protocol (mean over seeds)." + start]
    others = [n for n in cp.arms
              if n != cp.baseline and any((cp.baseline, 1, st) in cp.got for st in cols)]
    if not others:
        return lines
    head = ["arm", *[f"− {cp.baseline}, pass@{kk} step {st}" for kk in (1, k) for st in cols],
            "pass@1 resolved at steps", f"pass@{k} resolved at steps"]
    lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in others:
        cells = [cell(cp.diff(name, kk, st)) for kk in (1, k) for st in cols]
        n = max((len(set(cp.seeds(name, 1, s)) & set(cp.seeds(cp.baseline, 1, s)))
                 for s in cols), default=0)
        where = [", ".join(map(str, cp.resolved(name, kk))) or "none" if n >= 2 else "one seed"
                 for kk in (1, k)]
        lines.append("| " + " | ".join([name, *cells, *where]) + " |")
    return lines + ["", f"Differences with {cp.baseline} on the seeds both finished: 95% "
                    "t interval over seeds with the problems' part (paired), ± the MDE; "
                    "**resolved at steps**: where that interval excludes 0 (2 seeds or more)."]


def checkpoint_json(cp: Checkpoints | None) -> dict | None:
    if cp is None:
        return None
    arms = {}
    for name in cp.arms:
        per = {}
        for kk in (1, cp.k):
            at = {str(s): {"mean": iv.to_json(), "seeds": cp.seeds(name, kk, s)}
                  | ({"minus_baseline": d.to_json()}
                     if (d := cp.diff(name, kk, s)) is not None and name != cp.baseline else {})
                  for s in cp.steps if (iv := cp.interval(name, kk, s)) is not None}
            per[f"pass@{kk}"] = {"at": at, "resolved_at": cp.resolved(name, kk)
                                 if name != cp.baseline else []}
        arms[name] = per
    base = ({f"pass@{kk}": float(v.mean()) for kk, v in cp.base.items()}
            if cp.base is not None else None)
    return {"steps": cp.steps, "k": cp.k, "baseline": cp.baseline, "base": base, "arms": arms}


def draw_checkpoints(cp: Checkpoints | None, out_dir: Path) -> list[tuple[str, str]]:
    """``horizon_passk.png``: test pass@1 (left) and pass@k (right) against the training step,
    one line per arm through its checkpoints from the base model at step 0, bars the 95%
    t interval over seeds and problems; (title, file) or none."""
    if cp is None:
        return []
    fig, axes = new_figure(1, 2, width=5.4, height=4.2, suptitle=True)
    handles = {}
    others = [a for a in cp.arms if a != cp.baseline]  # coloured as the frontier figure's
    for col, kk in enumerate((1, cp.k)):
        ax = axes[0][col]
        for i, arm in enumerate(cp.arms):
            color = "black" if arm == cp.baseline else f"C{others.index(arm) % 10}"
            pts = [(s, iv) for s in cp.steps if (iv := cp.interval(arm, kk, s)) is not None]
            if not pts:
                continue
            shift = (i - (len(cp.arms) - 1) / 2) * 0.006 * cp.steps[-1]  # bars side by side
            xs, ys = [s + shift for s, _ in pts], [iv.estimate for _, iv in pts]
            lo = [iv.estimate - iv.low for _, iv in pts]
            hi = [iv.high - iv.estimate for _, iv in pts]
            if cp.base is not None:  # every arm starts from the base model
                ax.plot([0, xs[0]], [cp.base[kk].mean(), ys[0]], color=color, linewidth=1.0,
                        linestyle=":")
            n = max(len(cp.seeds(arm, kk, s)) for s, _ in pts)
            h = ax.errorbar(xs, ys, yerr=[lo, hi], color=color, marker="o", markersize=4,
                            linewidth=2.0 if arm == cp.baseline else 1.4, capsize=3,
                            label=f"{arm} ({n} seed{'s' if n > 1 else ''})")
            handles.setdefault(arm, h)
        if cp.base is not None:
            b = ax.plot([0], [cp.base[kk].mean()], marker="s", color="0.35", markersize=7,
                        linestyle="none", label="base model")[0]
            handles.setdefault("base model", b)
        ax.set_xlabel("training step")
        ax.set_ylabel(f"test pass@{kk}")
        ax.set_title(f"pass@{kk}", fontsize="medium")
        ax.grid(alpha=0.3)
        step_axes(ax)
    axes[0][1].legend(handles.values(), [h.get_label() for h in handles.values()], fontsize="small")
    fig.suptitle(f"Test pass@1 and pass@{cp.k} at the evaluated checkpoints (bars: 95% "
                 "t intervals over seeds and problems)", fontsize="medium")
    save_figure(fig, out_dir / "horizon_passk.png", dpi=90)
    return [(f"Test pass@1 and pass@{cp.k} at each checkpoint", "horizon_passk.png")]


HORIZON_RULE = """\
The long-horizon claims are judged at the last step. **H-collapse**: the baseline's entropy
there ÷ its start (95% t interval over seeds) lies below 0.30, a fall of 70% or more. **L-…**:
the arm ends with more entropy (its ratio − the baseline's, paired by seed) and more pass@{k}
(paired t interval over seeds with the problems' part) than the baseline; the steps where each
difference is resolved follow the numbers. A claim on one seed is **n/a**: one seed has no
spread."""


def horizon_claims(h: Horizon | None, cp: Checkpoints | None) -> list[dict]:
    """The baseline's collapse and, per other arm, "ends with more entropy and pass@k than the
    baseline", in ``evaluate_claims``' row format (``HORIZON_RULE``)."""
    if h is None or h.baseline not in h.ratio:
        return []
    last, base = h.steps[-1], h.baseline
    out = []

    def row(id_: str, claim: str, paper: str, needs: list[str], conds: list[Cond],
            seeds: int, after: str = "") -> dict:
        head = {"id": id_, "claim": claim, "paper": paper, "needs": needs}
        if seeds < 2:
            conds = Precondition(f"{seeds} seed{'s' if seeds != 1 else ''}"
                                 f"{' shared with ' + base if needs[1:] else ''}")
        return claim_row(head, conds, after)

    out.append(row("H-collapse", f"{base}'s entropy collapses over {last} steps (falls by "
                   f"{1 - COLLAPSE:.0%} or more)", f"{EM} §2; {E3} Fig. 1", [base],
                   [Cond(f"{base} H step {last} / H start", h.ratio[base].get(last), -1,
                         COLLAPSE)], len(h.seeds[base])))
    for arm in h.ratio:
        if arm == base:
            continue
        paper = next((v for key, v in PAPERS.items() if arm.startswith(key)), "")
        conds = [Cond(f"H step {last} / H start, {arm} − {base}", h.diff.get(arm, {}).get(last),
                      +1)]
        after = f"; entropy resolved at steps: {', '.join(map(str, h.parted(arm))) or 'none'}"
        if cp is not None:
            conds.append(Cond(f"{arm} − {base}, test pass@{cp.k} at step {last}",
                              cp.diff(arm, cp.k, last), +1))
            after += (f"; pass@{cp.k} resolved at steps: "
                      f"{', '.join(map(str, cp.resolved(arm, cp.k))) or 'none'}")
        out.append(row(f"L-{arm}", f"{arm} ends {last} steps with more entropy and pass@"
                       f"{cp.k if cp else 'k'} than {base}", paper, [base, arm], conds,
                       h.paired.get(arm, 0), after))
    return out


def training_frontier(cp: Checkpoints | None) -> Frontier | None:
    """The frontier along training: each arm's checkpoints as the points of a sweep (the value
    is the step), compared with the baseline's checkpoints' frontier exactly as the
    learning-rate frontier is (``frontier.analyse_frontier``): a method must beat stopping the
    baseline early, not only the baseline at the same step. None with fewer than two of the
    baseline's checkpoints."""
    if cp is None:
        return None
    passk, seeds, points, counts = {}, {}, {}, {}
    for arm in sorted(cp.arms, key=lambda a: a != cp.baseline):
        for s in cp.steps:
            v1, vk = cp.got.get((arm, 1, s), {}), cp.got.get((arm, cp.k, s), {})
            both = sorted(set(v1) & set(vk))
            if not both:
                continue
            name = f"{arm}@step{s}"
            passk[name] = {1: np.stack([v1[x] for x in both]),
                           cp.k: np.stack([vk[x] for x in both])}
            seeds[name] = both
            points.setdefault(arm, []).append((s, name))
            c = cp.counts.get((arm, s), {})
            if all(x in c for x in both):
                counts[name] = np.stack([c[x] for x in both], axis=1)
    base = {kk: v.reshape(1, -1) for kk, v in cp.base.items()} if cp.base is not None else None
    fr = analyse_frontier(passk, seeds, points, cp.baseline, cp.k, base, counts,
                          cp.base_counts)
    if fr is not None:
        fr.knob, fr.unit = "step", "checkpoint"
    return fr


@dataclass
class LongHorizon:
    """A long-horizon study's analysis: entropy and pass@k at the checkpoints, the frontier
    along training, their claims and figures."""

    horizon: Horizon | None
    checkpoints: Checkpoints | None
    along: Frontier | None
    claims: list[dict]
    figures: list[tuple[str, str]]


def analyse_long(groups: dict, cp: Checkpoints | None, steps: list[int], k: int, baseline: str,
                 report: Path, task: str, base_counts: np.ndarray | None = None) -> LongHorizon:
    """Everything ``eval.checkpoints`` adds to a study (``steps``: the checkpoints and the last
    step; ``groups``: row → its runs' curves; ``cp``: pass@k at the checkpoints, the study's
    ``analyse.checkpoint_passk``)."""
    horizon = entropy_horizon(groups, steps, baseline)
    if cp is not None:
        cp.base_counts = base_counts
    along = training_frontier(cp)
    figures = [*draw_frontier(along, report, f"lab:{task}, along training",
                              "frontier_training.png", f"The pass@1–pass@{k} frontier along "
                              "training: every arm through its checkpoints"),
               *draw_checkpoints(cp, report), *draw_horizon(groups, horizon, report)]
    claims = [*frontier_claims(along, "T", " along training"), *horizon_claims(horizon, cp)]
    return LongHorizon(horizon, cp, along, claims, figures)
