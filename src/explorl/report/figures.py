"""The claims' figures: each compares only the recipes its claim names."""

from __future__ import annotations

from pathlib import Path

from explorl.analysis.curves import Group
from explorl.analysis.entropy_law import FitError, fit_entropy_law, law_points
from explorl.analysis.frontier import BASELINE, is_baseline
from explorl.analysis.runs import Run, new_figure, save_figure, step_axes
from explorl.report.numbers import LAW_FIT_FRACTION, fmt_value
from explorl.report.tools_report import draw_tool_calls

FIGURES = [
    # (file, title, ylabel, recipes, [(key, style, suffix)])
    ("claim_grpo", "Claim 1: GRPO entropy and training reward", "nats / reward", ["grpo"],
     [("entropy/mean", "-", " entropy"), ("reward/mean", "--", " reward")]),
    ("claim_temperature", "Claims 2a/2b: E3 temperature scheduler (dotted = target)",
     "mean token entropy (nats)", ["grpo", "e3_ts", "e3"],
     [("entropy/mean", "-", ""), ("control/target_entropy", ":", " target")]),
    ("claim_cov", "Claims 3a/3b: Clip-Cov and KL-Cov", "mean token entropy (nats)",
     ["grpo", "clip_cov", "clip_cov_more", "kl_cov", "kl_cov_strong"], [("entropy/mean", "-", "")]),
    ("claim_eepo", "Claim 4: EEPO stage 1 (dashed) and stage 2 (solid) entropy",
     "mean token entropy (nats)", ["eepo", "eepo_open"],  # eepo_open: where a tuned α stays shut
     [("entropy/stage1", "--", " stage 1"), ("entropy/stage2", "-", " stage 2")]),
    ("claim_adaptive", "Claims 5a/5b: adaptive clip-higher (dotted = target)",
     "mean token entropy (nats)", ["grpo", "es_constant", "es_wsd"],
     [("entropy/mean", "-", ""), ("control/target_entropy", ":", " target")]),
    ("claim_budget", "Claim 6: prompts with every response wrong", "fraction of prompts",
     ["e3_no_budget", "e3"], [("rollout/all_wrong_frac", "-", "")]),
]
SMOOTH = 10  # figures show a trailing 10-step mean; the tables use the raw per-step values


def draw_figures(groups: dict[str, list[Run]], out_dir: Path, ev=None) -> list[tuple[str, str]]:
    """The claims' figures (only the recipes each claim compares; GRPO is ``ev.baseline``, the
    study's GRPO row) and, with the evidence ``ev`` (``claims.Evidence``), the pass@k curves
    and the pooled law; returns (title, file name)."""
    made, g = [], ev.baseline if ev is not None else BASELINE  # the study's GRPO row: real-grpo
    for file, title, ylabel, names, lines in FIGURES:
        names = [g if n == "grpo" else n for n in names]
        present = [n for n in names if groups.get(n)]
        subjects = [n for n in names if n != g] or names  # GRPO alone is only a baseline
        if not any(n in present for n in subjects):
            continue
        fig, axes = new_figure(width=7.0, height=4.2)
        ax = axes[0][0]
        for name in present:
            color = f"C{names.index(name)}"
            for key, style, suffix in lines:
                steps, mean, lo, hi = Group(name, groups[name]).band(key, SMOOTH)
                if not steps:
                    continue
                ax.plot(steps, mean, color=color, linestyle=style, label=f"{name}{suffix}")
                if len(groups[name]) > 1:
                    ax.fill_between(steps, lo, hi, color=color, alpha=0.15, linewidth=0)
        ax.set_title(title)
        ax.set_xlabel(f"training step ({SMOOTH}-step trailing mean; band = min–max over seeds)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        step_axes(ax)
        ax.legend(fontsize="small")
        save_figure(fig, out_dir / f"{file}.png", dpi=80)
        made.append((title, f"{file}.png"))
    made += draw_tool_calls(groups, out_dir)
    law = [r for r in groups.get(g, []) if len(_law_points(r)[1]) >= 3]
    if law:
        made.append(("Claims 7a/7b: entropy–performance law on GRPO runs", _draw_law(law, out_dir)))
    if ev is not None and ev.passk:
        made.insert(0, ("Claims N1/N2, 8, 9: test pass@k against k", _draw_passk(ev, out_dir)))
    if ev is not None and ev.law.get("a") is not None:
        made.append(("Claim 7a: the law fitted across every run", _draw_pooled(groups, ev,
                                                                              out_dir)))
    return made


N_BEST, N_WORST = 3, 2  # the pass@k figure draws these many best and worst methods in colour


def reference(ev) -> str | None:
    """GRPO's row on the pass@k figure: ``grpo`` (or ``<dir>-grpo``: real-grpo), or in a sweep (rows
    ``grpo@<lr>``) the one with the highest mean pass@1, GRPO as a practitioner would tune it."""
    own = [n for n in ev.passk if is_baseline(n)]  # real/grpo: real-grpo
    if own:
        return own[0]
    sweep = [n for n in ev.passk if n.startswith("grpo@") and 1 in ev.passk[n]]
    return max(sweep, key=lambda n: float(ev.passk[n][1].mean()), default=None)


def highlighted(ev) -> list[str]:
    """The methods drawn in colour on the pass@k figure, chosen by result: GRPO
    (``reference``), then the ``N_BEST`` best and the ``N_WORST`` worst of the rest by mean
    pass@k at the largest k (the rest in grey). An arm that trained the same runs as an earlier
    one (``Evidence.same_runs``) is drawn once, under the earlier one's name (``twin_labels``)."""
    km = ev.k_max
    ref = reference(ev)
    twins = {n for g in ev.same_groups() for n in g[1:]}
    rest = sorted((n for n in ev.passk if n != ref and n not in twins),
                  key=lambda n: -float(ev.passk[n][km].mean()))
    worst = rest[max(N_BEST, len(rest) - N_WORST):]
    return ([ref] if ref else []) + rest[:N_BEST] + worst


def twin_labels(ev) -> dict[str, str]:
    """Legend label per arm: the name, with the arms that trained the same runs after "=" (e3 =
    e3_no_anneal); where the arms' numbers of seeds differ (a partial report), each with its
    own, so a mean over one seed is not read as one over four."""
    labels = {n: n for n in ev.passk}
    for g in ev.same_groups():
        labels[g[0]] = " = ".join(g)
    counts = {n: len(ev.seeds.get(n) or []) for n in ev.passk}
    if len(set(counts.values())) > 1:
        labels = {n: f"{t} ({counts[n]} seed{'s' * (counts[n] != 1)})" for n, t in labels.items()}
    return labels


def _draw_passk(ev, out_dir: Path) -> str:
    """pass@k vs k (log₂ axis): the base model (and any other model an arm starts from,
    dashed), GRPO with its 95% band (t interval over seeds and problems), the best and worst
    methods at the largest k in colour (``highlighted``) and every other method in grey; the
    right panel subtracts from each arm the model it starts from."""
    ks = ev.k_list
    shown, labels = highlighted(ev), twin_labels(ev)
    if shown and shown[0] == reference(ev) and "@" in shown[0]:  # a sweep's best-pass@1 GRPO
        labels = {**labels, shown[0]: f"{labels[shown[0]]} (GRPO's best pass@1)"}
    fig, axes = new_figure(width=6.2, height=4.8, ncols=2)
    for ax, relative in zip(axes[0], (False, True)):
        base = {b: [ev.mean_passk(b, k) for k in ks] for b in ("base", *ev.bases)
                if ev.mean_passk(b, ks[0]) is not None}
        for b, curve in base.items() if not relative else ():
            label = ev.base_label if b == "base" else f"{b} (before RL)"
            ax.plot(ks, curve, color="black", linewidth=2.2 if b == "base" else 1.4,
                    linestyle="-" if b == "base" else "--", marker="o", label=label)
        names = [n for n in ev.passk if n not in shown] + shown
        for name in names:
            curve = [float(ev.passk[name][k].mean()) for k in ks]
            if relative:
                if ev.base_name(name) not in base:
                    continue
                curve = [c - b for c, b in zip(curve, base[ev.base_name(name)])]
            if name in shown:
                i = shown.index(name)
                ax.plot(ks, curve, color=f"C{i}", marker=".", linewidth=1.6, label=labels[name],
                        zorder=3)
            else:
                ax.plot(ks, curve, color="0.72", linewidth=0.8, zorder=1,
                        label="other methods" if name == names[0] else None)
        ref = reference(ev)
        if ref:
            lo, hi = [], []
            for k in ks:
                iv = ev.pk(ref, "base", k) if relative else None
                if relative and iv is not None:
                    lo.append(iv.low)
                    hi.append(iv.high)
            if relative and lo:
                ax.fill_between(ks, lo, hi, color="C0", alpha=0.18, linewidth=0,
                                label=f"{ref} − {ev.base_short}, 95% interval")
        if relative:
            ax.axhline(0, color="black", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.set_xlabel("k (samples per problem)")
        ax.set_ylabel(f"pass@k − {ev.base_short} pass@k" if relative
                      else "test pass@k (mean over seeds)")
        to = "the base model" if ev.base_short == "base" else f"the {ev.base_short}"
        ax.set_title((f"difference to {to}" + (" (each its own)" if ev.bases else ""))
                     if relative else "pass@k")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small", loc="lower right" if not relative else "best")
    save_figure(fig, out_dir / "passk_curves.png", dpi=80)
    return "passk_curves.png"


def _draw_pooled(groups: dict[str, list[Run]], ev, out_dir: Path) -> str:
    fig, axes = new_figure(width=7.0, height=4.2)
    ax = axes[0][0]
    H, R = [], []
    for runs in groups.values():
        for run in runs:
            _s, h, r = _law_points(run)
            H += h
            R += r
    ax.scatter(H, R, s=8, color="C0", alpha=0.5, label=f"{len(H)} validation points")
    fit = ev.law["fit"]
    grid = sorted(H)
    ax.plot(grid, [fit.predict(h) for h in grid], color="C3",
            label=f"{fit.formula('.3f', 'e^H')} (R² = {fit.r2:.2f})")
    ax.set_title("Claim 7a: one law across every run of the study")
    ax.set_xlabel("training-batch entropy H at the validation step (nats)")
    ax.set_ylabel("validation accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small")
    save_figure(fig, out_dir / "law_pooled.png", dpi=80)
    return "law_pooled.png"


def _law_points(run: Run):
    return law_points(run)


def _draw_law(runs: list[Run], out_dir: Path) -> str:
    fig, axes = new_figure(width=9.5, height=4.2)
    fig.subplots_adjust(right=1 - 3.0 / 9.5)  # room for the legend on the right
    ax = axes[0][0]
    for i, run in enumerate(runs):
        _steps, H, R = _law_points(run)
        color = f"C{i}"
        ax.scatter(H, R, color=color, s=12, label=f"seed {run.seed}")
        try:
            fit = fit_entropy_law(H, R, 1.0)
            early = fit_entropy_law(H, R, LAW_FIT_FRACTION)
        except FitError:
            continue
        grid = sorted(H)
        ax.plot(grid, [fit.predict(h) for h in grid], color=color, label=f"fit (R² = {fit.r2:.2f})")
        ax.plot(grid, [early.predict(h) for h in grid], color=color, linestyle="--",
                label=f"early fit, first {early.n_fit} pts (RMSE = {fmt_value(early.rmse)})")
    ax.set_title("Claims 7a/7b: R = −a·exp(H) + b on GRPO runs")
    ax.set_xlabel("training-batch entropy H at the validation step (nats)")
    ax.set_ylabel("validation accuracy (mean over eval.n_samples)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the points
    save_figure(fig, out_dir / "claim_law.png", dpi=80)
    return "claim_law.png"
