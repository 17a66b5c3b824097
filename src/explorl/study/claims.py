"""The papers' claims (``CLAIMS``) and every threshold of their rules: the one home of both.

The rules were fixed before the study's results were seen (``RULE_NOTES`` says which constant
was set after a pilot). ``evaluate_claims`` applies them to the study table.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from explorl.study.numbers import LAW_FIT_FRACTION, Stat, fmt_value

# "A clearly above B": mean(A) − mean(B) exceeds √(sA² + sB²), the combined sample standard
# deviation over seeds (0 with one seed), and ROUND_OFF. ENTROPY_FALL was set after one 300-step
# GRPO pilot (see RULE_NOTES).
ENTROPY_FALL = 0.85  # GRPO: H final / H initial at most this (a ≥ 15% fall)
REWARD_RISE = 0.05  # GRPO: final − initial training reward at least this
NEAR_H0 = 0.15  # E3 TS: |H final / H0 − 1| at most this
ANNEAL_DROP = 0.95  # E3: H over the last 10% ÷ H over the 10% before annealing, at most this
TRACK_BIAS = 0.10  # ES constant: |mean(H − target)| / target at most this after the first 10%
EEPO_ACTIVE = 0.10  # EEPO: the gate open on at least this fraction of steps
LAW_R2 = (0.3, 0.7)  # law fit: R² ≥ 0.3 partial, ≥ 0.7 yes
LAW_MIN_POINTS = 5  # fewer validation points per run: the law claims are n/a (two coefficients)
LAW_RMSE = 0.03  # early fit: held-out RMSE of val accuracy at most this (3 points)
SAME_BUDGET = 0.01  # budgets: rollouts / step within 1% of the no-budget run's
ROUND_OFF = 1e-6  # differences below this are float round-off, never "clearly above"

RULE_NOTES = f"""\
Rules are fixed in `explorl/study/claims.py` (`CLAIMS` and the constants above it) and were
written before the study's results were seen, except `ENTROPY_FALL` = {ENTROPY_FALL}, set after
one 300-step GRPO pilot (seed 0) showed the lab's entropy falls by about a fifth in 300 steps
(the papers' falls are far steeper). A claim is **yes** when every condition of its rule holds
on the means over seeds, **partial** when some hold, **no** when none hold, and **n/a** when
the lab cannot test it (the rule's precondition fails, e.g. EEPO's gate never opened). "A
clearly above B" means mean(A) − mean(B) > √(s_A² + s_B²), the combined sample standard
deviation over seeds (0 with a single seed), and > {ROUND_OFF:g} (float round-off is not a
difference). "Final" numbers are means over the last 10% of steps; the tracking numbers skip
the first 10% of steps (the controllers' warm-up)."""


def _clearly_above(a: Stat, b: Stat) -> bool | None:
    if a.mean is None or b.mean is None:
        return None
    return a.mean - b.mean > max(math.hypot(a.std or 0.0, b.std or 0.0), ROUND_OFF)


@dataclass
class Precondition:
    """A claim's check returns this instead of conditions when the lab cannot test the claim."""

    reason: str


Table = dict[str, dict[str, Stat]]
PerRun = dict[str, list[dict]]


@dataclass
class Claim:
    """A paper's claim, the recipes it needs, its fixed rule and the check that applies it."""

    id: str
    claim: str
    paper: str
    rule: str
    needs: tuple[str, ...]
    check: Callable[[Table, PerRun], tuple[str, list[bool | None] | Precondition]]


def _le(x: float | None, limit: float) -> bool | None:
    return None if x is None else x <= limit


def _c_grpo(t, runs):
    g = t["grpo"]
    rise = Stat.of([r["final_reward"] - r["initial_reward"] for r in runs["grpo"]])
    text = (f"GRPO H final/initial = {g['entropy_ratio'].fmt()}; training reward "
            f"{Stat.of([r['initial_reward'] for r in runs['grpo']]).fmt()} → "
            f"{g['final_reward'].fmt()} (rise {rise.fmt()})")
    return text, [_le(g["entropy_ratio"].mean, ENTROPY_FALL),
                  None if rise.mean is None else rise.mean >= REWARD_RISE]


def _c_ts(t, runs):
    ts = runs["e3_ts"]
    rel = Stat.of([r["final_entropy"] / r["H0"] if r.get("H0") else None for r in ts])
    text = (f"e3_ts H final / H0 = {rel.fmt()} (H0 = {Stat.of([r['H0'] for r in ts]).fmt()}); "
            f"H final: e3_ts {t['e3_ts']['final_entropy'].fmt()} vs GRPO "
            f"{t['grpo']['final_entropy'].fmt()}")
    return text, [None if rel.mean is None else abs(rel.mean - 1) <= NEAR_H0,
                  _clearly_above(t["e3_ts"]["final_entropy"], t["grpo"]["final_entropy"])]


def _c_anneal(t, runs):
    a = Stat.of([r["anneal_entropy_ratio"] for r in runs["e3"]])
    return (f"e3 H over the last 10% / H before annealing = {a.fmt()}",
            [_le(a.mean, ANNEAL_DROP)])


def _c_cov(t, runs):
    g, cc = t["grpo"]["final_entropy"], t["clip_cov"]["final_entropy"]
    kc = t["kl_cov"]["final_entropy"]
    return (f"H final: GRPO {g.fmt()}, clip_cov {cc.fmt()}, kl_cov {kc.fmt()}",
            [_clearly_above(cc, g), _clearly_above(kc, g)])


def _c_cov_more(t, runs):
    cc, ccm = t["clip_cov"]["final_entropy"], t["clip_cov_more"]["final_entropy"]
    kc, kcs = t["kl_cov"]["final_entropy"], t["kl_cov_strong"]["final_entropy"]
    text = (f"H final: clip_cov {cc.fmt()} → clip_cov_more {ccm.fmt()}; kl_cov {kc.fmt()} → "
            f"kl_cov_strong {kcs.fmt()}")
    return text, [_clearly_above(ccm, cc), _clearly_above(kcs, kc)]


def _c_eepo(t, runs):
    act = Stat.of([r["eepo_active_frac"] for r in runs["eepo"]])
    d = t["eepo"]["eepo_dH"]
    text = (f"gate open on {act.fmt()} of steps; H stage 2 − stage 1 on those steps = "
            f"{d.fmt()} nats")
    if act.mean is None or act.mean < EEPO_ACTIVE:
        return text, Precondition(f"the gate was open on fewer than {EEPO_ACTIVE:.0%} of steps")
    return text, [_clearly_above(d, Stat(0.0, None, 1, [0.0]))]


def _c_track(t, runs):
    es = runs["es_constant"]
    rel = Stat.of([r["tracking_rel_bias"] for r in es])
    target = Stat.of([r["target_mean"] for r in es]).mean
    grpo_bias = (Stat.of([r["tracked_entropy_mean"] - target for r in runs["grpo"]])
                 if target is not None else Stat.of([]))
    es_bias = Stat.of([r["tracking_bias"] for r in es])
    text = (f"es_constant target {fmt_value(target)}: mean(H − target) = {es_bias.fmt()} "
            f"(relative {rel.fmt()}), mean |H − target| = "
            f"{t['es_constant']['tracking_error'].fmt()}; "
            f"GRPO's mean(H − target) over the same steps = {grpo_bias.fmt()}")
    closer = _clearly_above(Stat.of([abs(v) for v in grpo_bias.values]),
                            Stat.of([abs(v) for v in es_bias.values]))
    return text, [None if rel.mean is None else abs(rel.mean) <= TRACK_BIAS, closer]


def _c_wsd(t, runs):
    c, w = t["es_constant"], t["es_wsd"]
    text = (f"H final: WSD {w['final_entropy'].fmt()} vs constant {c['final_entropy'].fmt()}; "
            f"test pass@1: WSD {w['eval_pass@1'].fmt()} vs constant {c['eval_pass@1'].fmt()}")
    return text, [_clearly_above(c["final_entropy"], w["final_entropy"]),
                  _clearly_above(w["eval_pass@1"], c["eval_pass@1"])]


def _c_budget(t, runs):
    e, nb = t["e3"], t["e3_no_budget"]
    rps, nb_rps = e["rollouts_per_step"].mean, nb["rollouts_per_step"].mean
    same = None if rps is None or not nb_rps else abs(rps / nb_rps - 1) <= SAME_BUDGET
    text = (f"all-wrong groups: e3 {e['all_wrong_frac'].fmt()} vs e3_no_budget "
            f"{nb['all_wrong_frac'].fmt()}; rollouts / step {e['rollouts_per_step'].fmt(1)} vs "
            f"{nb['rollouts_per_step'].fmt(1)}")
    if not same:
        return text, Precondition(
            f"the two recipes' rollouts / step differ by more than {SAME_BUDGET:.0%}")
    return text, [_clearly_above(nb["all_wrong_frac"], e["all_wrong_frac"])]


def _c_law(t, runs):
    r2 = Stat.of([r["law_r2"] for r in runs["grpo"]])
    pts = Stat.of([r["law_points"] for r in runs["grpo"]])
    if r2.mean is None or pts.mean < LAW_MIN_POINTS:
        r2 = Stat.of([])
    text = f"GRPO R² = {r2.fmt()} over {pts.fmt(0)} validation points per run"
    return text, [None if r2.mean is None else r2.mean >= LAW_R2[0],
                  None if r2.mean is None else r2.mean >= LAW_R2[1]]


def _c_predict(t, runs):
    g = runs["grpo"]
    rmse, naive = Stat.of([r["law_rmse"] for r in g]), Stat.of([r["law_naive_rmse"] for r in g])
    final = Stat.of([r["law_final_error"] for r in g])
    text = (f"fit on the first {LAW_FIT_FRACTION:.0%} of validation points: held-out RMSE "
            f"{rmse.fmt()}, final-point error {final.fmt()}; persistence baseline RMSE "
            f"{naive.fmt()}")
    return text, [_le(rmse.mean, LAW_RMSE),
                  None if rmse.mean is None or naive.mean is None else rmse.mean < naive.mean]


EM, E3, EEPO, ES = "Entropy Mechanism", "E3", "EEPO", "Entropy Scheduling"
CLAIMS = [
    Claim("1", "GRPO's entropy falls while reward rises", f"{EM} §2; {E3} Fig. 1",
          f"GRPO H final / H initial ≤ {ENTROPY_FALL}; final − initial training reward ≥ "
          f"{REWARD_RISE}", ("grpo",), _c_grpo),
    Claim("2a", "The temperature scheduler keeps entropy near H0", f"{E3} §4.2",
          f"e3_ts |H final / H0 − 1| ≤ {NEAR_H0}; e3_ts H final clearly above GRPO's",
          ("grpo", "e3_ts"), _c_ts),
    Claim("2b", "Annealing lowers entropy in the last phase", f"{E3} §4.2 (Eq. 5)",
          f"e3: H over the last 10% of steps ÷ H over the 10% before the annealing phase ≤ "
          f"{ANNEAL_DROP}", ("e3",), _c_anneal),
    Claim("3a", "Clip-Cov and KL-Cov keep entropy higher than GRPO", f"{EM} §4.4",
          "H final of clip_cov, and of kl_cov, clearly above GRPO's",
          ("grpo", "clip_cov", "kl_cov"), _c_cov),
    Claim("3b", "More clipping / a larger coefficient gives higher entropy", f"{EM} §4.4 (Fig. 13)",
          "H final: clip_cov_more clearly above clip_cov; kl_cov_strong clearly above kl_cov",
          ("clip_cov", "clip_cov_more", "kl_cov", "kl_cov_strong"), _c_cov_more),
    Claim("4", "EEPO's stage-2 entropy exceeds stage-1 when the gate is active", f"{EEPO} §5",
          f"mean H2 − H1 over the steps with the gate open clearly above 0 (n/a when the gate is "
          f"open on < {EEPO_ACTIVE:.0%} of steps)", ("eepo",), _c_eepo),
    Claim("5a", "The adaptive clip controller tracks a constant target", f"{ES} §4.1 (Fig. 5a)",
          f"es_constant |mean(H − target)| / target ≤ {TRACK_BIAS} after the first 10% of steps; "
          "and clearly smaller than GRPO's |mean(H − target)| over the same steps",
          ("grpo", "es_constant"), _c_track),
    Claim("5b", "WSD ends with lower entropy and higher pass@1 than constant", f"{ES} §4.2",
          "es_wsd H final clearly below es_constant's; es_wsd test pass@1 clearly above "
          "es_constant's", ("es_constant", "es_wsd"), _c_wsd),
    Claim("6", "Dynamic budgets lower the all-wrong fraction at equal total rollouts",
          f"{E3} Fig. 8",
          f"all-wrong fraction over training: e3 clearly below e3_no_budget (n/a unless rollouts / "
          f"step agree within {SAME_BUDGET:.0%})", ("e3", "e3_no_budget"), _c_budget),
    Claim("7a", "The entropy–performance law R = −a·e^H + b fits GRPO runs", f"{EM} §2.4 (Eq. 6)",
          f"mean R² over GRPO seeds ≥ {LAW_R2[0]} (partial), ≥ {LAW_R2[1]} (yes); needs ≥ "
          f"{LAW_MIN_POINTS} validation points per run", ("grpo",), _c_law),
    Claim("7b", "An early fit predicts the final accuracy", f"{EM} §2.4 (Fig. 5)",
          f"fit on the first {LAW_FIT_FRACTION:.0%} of GRPO's validation points: held-out RMSE ≤ "
          f"{LAW_RMSE}; and below the persistence baseline (last fitted accuracy held constant)",
          ("grpo",), _c_predict),
]


def evaluate_claims(table: Table, per_run: PerRun) -> list[dict]:
    """Apply each claim's rule: yes = every condition holds, no = none, partial = some.

    A claim whose recipes were not run is ``not run``; one the lab cannot test (a
    ``Precondition`` failed, or a number could not be measured) is ``n/a``, with the reason.
    """
    out = []
    for c in CLAIMS:
        row = {"id": c.id, "claim": c.claim, "paper": c.paper, "rule": c.rule,
               "needs": list(c.needs)}
        missing = [n for n in c.needs if not per_run.get(n)]
        if missing:
            row.update(numbers=f"recipes not in this study: {', '.join(missing)}", conditions=[],
                       verdict="not run")
            out.append(row)
            continue
        numbers, conds = c.check(table, per_run)
        if isinstance(conds, Precondition):
            row.update(numbers=f"{numbers} (not testable: {conds.reason})", conditions=[],
                       verdict="n/a")
            out.append(row)
            continue
        if any(v is None for v in conds):
            verdict = "n/a"
            numbers += " (a number the rule needs could not be measured)"
        elif all(conds):
            verdict = "yes"
        elif any(conds):
            verdict = "partial"
        else:
            verdict = "no"
        row.update(numbers=numbers, conditions=conds, verdict=verdict)
        out.append(row)
    return out
