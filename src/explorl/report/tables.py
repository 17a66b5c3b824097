"""The study's pass@k tables in markdown: pass@k per recipe, differences with intervals and
minimum detectable effects, the evaluation temperatures, the power table and the ablations."""

from __future__ import annotations

from explorl.report.evidence import Evidence
from explorl.report.stats import Interval, verdict


def cell(iv: Interval | None, mde: bool = True) -> str:
    """``estimate [low, high]`` (bold when the interval excludes 0 by more than its
    Monte-Carlo error), with the MDE."""
    if iv is None:
        return "—"
    if not iv.spread:
        return f"{iv.estimate:+.3f} (1 seed)"
    text = iv.fmt()
    text = f"**{text}**" if verdict(iv, +1) in ("shown", "opposite") else text
    return text + (f" ±{iv.mde:.3f}" if mde and iv.mde is not None else "")


SAME = "same runs"


def vs(ev: Evidence, a: str, b: str, k: int, tb: float | None = None) -> str:
    """The cell of ``a`` − ``b`` at pass@k (``b`` at temperature ``tb``): *same runs* when the
    two arms trained identical runs (a zero difference by construction, not a measurement)."""
    return SAME if ev.same_runs(a, b) else cell(ev.pk(a, b, k, tb=tb))


def same_runs_note(ev: Evidence) -> list[str]:
    """One line naming the arms that trained identical runs, number for number."""
    groups = ev.same_groups()
    if not groups:
        return []
    return ["", "Trained the same runs, number for number (the override or the controller "
                "never acted differently at the tuned setting): "
            + "; ".join(" = ".join(g) for g in groups) + f". Their comparisons with each other "
            f"read *{SAME}*: a zero difference by construction, with no interval or power."]


def passk_tables(ev: Evidence | None) -> list[str]:
    """pass@k of the base model and every method (mean over seeds), and each method's
    difference to GRPO and to the base model at k = 1 and the largest k, with intervals."""
    if ev is None or not ev.passk:
        return []
    ks, km = ev.k_list, ev.k_max
    head = "| recipe | " + " | ".join(f"pass@{k}" for k in ks) + " |"
    lines = [head, "|" + "---|" * (len(ks) + 1)]
    for name in base_rows(ev):
        lines.append(f"| **{name}** | " + " | ".join(f"{ev.mean_passk(name, k):.3f}" for k in ks)
                     + " |")
    for name, pk in ev.passk.items():
        lines.append(f"| {name} | " + " | ".join(f"{pk[k].mean():.3f}" for k in ks) + " |")
    if ev.bases:
        lines += ["", "**base** is the model the first recipe starts from, before RL; "
                  + "; ".join(f"**{b}** the one of {_arms_of(ev, b)}" for b in ev.bases)
                  + ". Each arm's − base columns compare it with the model it starts from."]
    diff = ["", "Differences with 95% intervals (t over seeds with the test problems' part; "
                "**bold**: the interval excludes 0) and, after ±, the minimum detectable effect "
                "of the comparison (two-sided 5%, 80% power; see Power):", "",
            f"| recipe | − base, pass@1 | − base, pass@{km} | − GRPO, pass@1 | − GRPO, pass@{km} |",
            "|---|---|---|---|---|"]
    for name in ev.passk:
        cells = [cell(ev.pk(name, "base", 1)), cell(ev.pk(name, "base", km)),
                 "—" if name == ev.baseline else vs(ev, name, ev.baseline, 1),
                 "—" if name == ev.baseline else vs(ev, name, ev.baseline, km)]
        diff.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines + same_runs_note(ev) + diff


def base_rows(ev: Evidence) -> list[str]:
    """The models before RL with an evaluation: ``base``, then each of ``ev.bases``."""
    return (["base"] if ev.base is not None else []) + list(ev.bases)


def _arms_of(ev: Evidence, base: str) -> str:
    return ", ".join(a for a, b in ev.base_for.items() if b == base)


def temperature_tables(ev: Evidence | None) -> list[str]:
    """pass@1 and pass@k_max of every recipe (and the base model) at each evaluation
    temperature, each recipe's best temperature at k_max, and each method − GRPO: at the main
    temperature, against GRPO at its best, and each at its own best."""
    if ev is None or len(ev.temperatures) < 2:
        return []
    ts, km = sorted(ev.temperatures), ev.k_max
    names = base_rows(ev) + list(ev.passk)
    head = ["recipe", *[f"pass@1 T={t:g}" for t in ts], *[f"pass@{km} T={t:g}" for t in ts],
            f"best T (pass@{km})"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in names:
        vals = [ev.mean_passk(name, k, t) for k in (1, km) for t in ts]
        best = ev.best_temperature(name, km)
        lines.append(f"| {name} | " + " | ".join("—" if v is None else f"{v:.3f}" for v in vals)
                     + f" | {'—' if best is None else f'{best:g}'} |")
    best = ev.best_temperature(ev.baseline, km)
    if best is None or ev.baseline not in ev.passk:
        return lines
    t0 = ev.temperature
    hotter = best != t0  # GRPO's best is another temperature: show what it closes on its own
    intro = (f"Each method − GRPO at pass@{km}: both at T = {t0:g}; "
             + (f"the method at T = {t0:g} against GRPO at its best temperature T = {best:g} "
                "(how much of the gap GRPO sampled hotter closes); " if hotter else
                f"(GRPO's pass@{km} is highest at T = {t0:g}); ")
             + "and each at its own best temperature, the large-k claims' second condition "
             "(best temperatures are chosen on these test problems, the same favour to both "
             "arms), with pass@1 at those temperatures:")
    head = ["recipe", f"− GRPO T={t0:g}, pass@{km}"]
    if hotter:
        head.append(f"at T={t0:g} − GRPO at T={best:g}, pass@{km}")
    head += ["its best T", f"at its best T − GRPO at T={best:g}, pass@{km}",
             f"at its best T − GRPO at T={best:g}, pass@1"]
    lines += ["", intro, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in ev.passk:
        if name == ev.baseline:
            continue
        if ev.same_runs(name, ev.baseline):  # GRPO against itself at another T
            lines.append(f"| {name} | " + " | ".join([SAME] * (len(head) - 1)) + " |")
            continue
        own = ev.best_temperature(name, km)
        cells = [cell(ev.pk(name, ev.baseline, km))]
        if hotter:
            cells.append(cell(ev.pk(name, ev.baseline, km, tb=best)))
        cells += [f"{own:g}", cell(ev.pk(name, ev.baseline, km, ta=own, tb=best)),
                  cell(ev.pk(name, ev.baseline, 1, ta=own, tb=best))]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


POWER_NOTES = """\
The minimum detectable effect (MDE) of a comparison is the true difference its 95% interval
would exclude 0 for with 80% probability, from the interval's own variance terms, each with its
t quantiles: MDE = √(Σ (t_0.975,df_i + t_0.80,df_i)² · v_i), the terms var_s(mean_p d) / S (df
S − 1) and σ²_problem / P (its own df) for S seeds and P problems (`explorl/report/stats.py`,
`variance_components`; the base model counts as fixed). The three variances are the two-way
ANOVA estimates from the per-problem, per-seed differences of the two arms. With one seed
σ²_seed cannot be estimated and the MDE leaves it out. *Seeds for the target*: the fewest seeds
whose projected MDE at this P (SE² = σ²_problem / P + (σ²_seed + σ²_resid / P) / S, the seeds'
term at df S − 1) reaches the spec's `power.target_mde` (∞: the problem term alone exceeds it;
add problems)."""


def power_table(spec, ev: Evidence | None) -> list[str]:
    """Per comparison with GRPO (and GRPO's with the base model) at ``power.k``: the interval,
    the MDE, its variance components and the seeds a target MDE needs; then the same for the
    coverage margin pass@k − pass@1 (the quantity a study of exploration often declares)."""
    if ev is None or ev.baseline not in ev.passk:
        return []
    k = spec.power.k or ev.k_max
    g = ev.baseline
    pairs = [(g, "base")] + [(n, g) for n in ev.passk if n != g]
    lines = _power_rows(spec, ev, pairs, f"pass@{k} difference", lambda a, b: ev.pk(a, b, k))
    if k > 1 and 1 in ev.k_list:
        margin = _power_rows(spec, ev, pairs, f"pass@{k} − pass@1 difference",
                             lambda a, b: ev.margin(a, b, k))
        if len(margin) > 2:
            lines += ["", f"The coverage margin pass@{k} − pass@1, each arm's minus the other's "
                      "(paired by seed as above):", "", *margin]
    return lines + ["", POWER_NOTES]


def _power_rows(spec, ev: Evidence, pairs: list[tuple[str, str]], what: str,
                interval) -> list[str]:
    """The power table's header and a row per (a, b) of ``pairs``: ``interval(a, b)``."""
    target = spec.power.target_mde
    head = ["comparison", what, "MDE", "σ²_problem", "σ²_seed", "σ²_resid", "S × P",
            *([f"seeds for MDE {target:g}"] if target else [])]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for a, b in pairs:
        if b != "base" and ev.same_runs(a, b):
            lines.append(f"| {a} − {b} | {SAME} |" + " — |" * (len(head) - 2))
            continue
        iv = interval(a, b)
        if iv is None or iv.power is None:
            continue
        p = iv.power
        row = [f"{a} − {b}", iv.fmt(), f"{p.mde():.3f}", f"{p.var_problem:.4f}",
               "—" if p.var_seed is None else f"{p.var_seed:.5f}", f"{p.var_resid:.4f}",
               f"{p.seeds} × {p.problems}"]
        if target:
            need = p.seeds_for(target)
            row.append("—" if p.var_seed is None else "∞" if need is None else str(need))
        lines.append("| " + " | ".join(row) + " |")
    return lines


def ablation_tables(spec, ev: Evidence | None) -> list[str]:
    """Per ablated method: the method and each arm − GRPO and − the method at pass@1 and the
    largest k, and their final entropy, with intervals."""
    if ev is None or not spec.ablations:
        return []
    km = ev.k_max
    out: list[str] = []
    for method, arms in spec.ablations.items():
        present = [n for n in [method, *arms] if n in ev.passk]
        if len(present) < 2 or ev.baseline not in ev.passk:
            continue
        out += [f"**{method}** taken apart (each arm at the main evaluation temperature):", "",
                f"| arm | − GRPO, pass@1 | − GRPO, pass@{km} | − {method}, pass@{km} | H final "
                "− GRPO (nats) |", "|---|---|---|---|---|"]
        g = ev.baseline
        for name in present:
            dh = ev.pair(name, g, lambda r: r["final_entropy"])
            out.append(f"| {name} | {vs(ev, name, g, 1)} | {vs(ev, name, g, km)} | "
                       f"{'—' if name == method else vs(ev, name, method, km)} | "
                       f"{SAME if ev.same_runs(name, g) else cell(dh, mde=False)} |")
        out.append("")
        same = [n for n in present[1:] if ev.same_runs(n, method)]
        if same:
            out += [f"{', '.join(same)}: the same runs as {method}, number for number (the arm's "
                    f"override changes nothing at {method}'s tuned setting).", ""]
    return out
