"""The papers' claims (``CLAIMS``), each judged by 95% intervals (``study.stats``).

A claim has one or more conditions; each condition is a quantity with its interval and the side
of a null value the paper claims (``+1`` above, ``-1`` below; ``0``: within ±null of 0). A
condition is **shown** when its interval lies wholly on the claimed side, **opposite** when it
lies wholly on the other side, **not shown** otherwise. A claim is **shown** when every
condition is, **opposite** when some condition is opposite and none is shown, **mixed** when
both occur, **partial** when some but not all are shown, **not shown** when none is; **n/a** when
the lab cannot test it (a precondition fails or a number could not be measured), **not run** when
its recipes are not in the study.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from explorl.report.evidence import Evidence
from explorl.report.stats import Interval, t_ppf, verdict

EEPO_ACTIVE = 0.10  # EEPO's claim needs the gate open on at least this fraction of steps
NEAR_H0 = 0.15  # E3 TS: H final / H0 − 1 within ±this
TRACK_BIAS = 0.10  # ES constant: mean(H − target) / target within ±this
LAW_R2 = 0.5  # the law "fits" when the interval of R² lies above this (a fit, not an effect)
SAME_BUDGET = 0.01  # budgets: rollouts / step within 1% of the no-budget run's

RULE_NOTES = """\
Each claim is judged by 95% intervals (`explorl/report/stats.py`), never by a threshold on means.
A pass@k comparison is a mean over seeds and test problems (the same problems for every seed);
its interval is a t interval whose variance holds the seeds' part (the spread of the per-seed
means) and the problems' part (two-way ANOVA), each part with its own t quantile: the seeds' at
seeds − 1 degrees of freedom, so {seeds} give it tails of {t:.2f} SEs rather than the normal's
1.96 (a single t at a pooled degrees of freedom covers less than 95% at 3-4 seeds). Differences
of pass@k are clipped to [−1, 1], levels to [0, 1]. Arms that ran the same seeds are paired by
seed; the base model is one evaluation. Per-run quantities (entropy ratios, tracking bias) are
paired by seed and get the t interval over seeds. These intervals involve no resampling: their
Monte-Carlo error is 0. The law's R² bootstraps runs, with resamples added until its bounds'
Monte-Carlo error (printed) is below 0.001. A condition is **shown** when its interval excludes
the null on the claimed side by more than that error, **opposite** when it does so on the other
side; a claim is **shown** when all its conditions are, **partial** when some are,
**opposite**/**mixed** when some interval points the other way. The law's R² conditions are
goodness-of-fit thresholds (R² > 0.5), not effects. A pass@k condition also gives its minimum
detectable effect (MDE: the difference it would detect with 80% power, from the interval's own
variance terms; see Power); with several evaluation temperatures, a large-k claim is also judged
with each arm at its own best one. A *not shown* is not evidence of no effect: it says the
interval holds 0; an effect is absent only within the interval's bounds (and below the MDE, at
80% power). Below the table, the number of decided verdicts chance alone would give."""


def rule_notes(n_seeds: int) -> str:
    """RULE_NOTES for a study of ``n_seeds`` seeds: the t quantile of the seed-dominated
    interval (df n − 1)."""

    plural = "s" if n_seeds != 1 else ""
    t = t_ppf(0.975, max(n_seeds - 1, 1))
    return RULE_NOTES.format(seeds=f"{n_seeds} seed{plural}", t=t)


@dataclass
class Cond:
    """One condition of a claim: a quantity's interval and the side the paper claims."""

    label: str
    iv: Interval | None
    direction: int  # +1: above null; -1: below null; 0: within ±null of 0
    null: float = 0.0

    @property
    def verdict(self) -> str:
        if self.iv is None or not self.iv.spread:  # one seed: a value, no interval to judge by
            return "n/a"
        if self.direction == 0:
            e = self.iv.mc_error
            inside = -self.null + e < self.iv.low and self.iv.high < self.null - e
            outside = self.iv.low > self.null + e or self.iv.high < -self.null - e
            return "shown" if inside else "opposite" if outside else "not shown"
        return verdict(self.iv, self.direction, self.null)

    def text(self) -> str:
        if self.iv is None:
            return f"{self.label}: not measured"
        side = {1: ">", -1: "<", 0: "within ±"}[self.direction]
        if not self.iv.spread:
            return f"{self.label} = {self.iv.estimate:+.3f} (1 seed: no interval, n/a)"
        mde = f"; MDE {self.iv.mde:.3f}" if self.iv.mde is not None else ""
        mc = f"; MC error {self.iv.mc_error:.4f}" if self.iv.mc_error else ""
        return f"{self.label} = {self.iv.fmt()} ({side}{'' if self.direction == 0 else ' '}"\
               f"{self.null:g}: {self.verdict}{mde}{mc})"


@dataclass
class Precondition:
    """A claim's check returns this when the lab cannot test the claim."""

    reason: str


def _key(k: str) -> Callable[[dict], float | None]:
    return lambda r: r.get(k)


Check = Callable[[Evidence], "list[Cond] | Precondition"]


@dataclass
class Claim:
    id: str
    claim: str
    paper: str
    needs: tuple[str, ...]
    check: Check


def _narrow_up(ev):
    return [Cond("GRPO − base, test pass@1", ev.pk("grpo", "base", 1), +1)]


def _narrow_down(ev):
    k = ev.k_max
    return [Cond(f"GRPO − base, test pass@{k}", ev.pk("grpo", "base", k), -1)]


def _c_grpo(ev):
    return [Cond("GRPO entropy fall 1 − H final/H initial", ev.one("grpo", lambda r: 1 - r[
                 "entropy_ratio"]), +1),
            Cond("GRPO training reward final − initial",
                 ev.one("grpo", lambda r: r["final_reward"] - r["initial_reward"]), +1)]


def _c_ts(ev):
    return [Cond("e3_ts H final / H0 − 1", ev.one("e3_ts", lambda r: r["final_entropy"] / r["H0"]
                                                   - 1), 0, NEAR_H0),
            Cond("H final e3_ts − GRPO", ev.pair("e3_ts", "grpo", _key("final_entropy")), +1)]


def _c_anneal(ev):
    betas = [r.get("anneal_beta") for r in ev.per_run.get("e3", [])]
    if betas and all(b is not None and b >= 1 for b in betas):  # Eq. 5 at β = 1: target = H0
        return Precondition(f"e3 ran at β = {betas[0]:g}, whose annealed target is H0 itself: "
                            "there is no annealing to judge")
    return [Cond("e3 H last 10% / H before annealing − 1",
                 ev.one("e3", lambda r: r["anneal_entropy_ratio"] - 1), -1)]


def _c_cov(ev):
    return [Cond("H final clip_cov − GRPO", ev.pair("clip_cov", "grpo", _key("final_entropy")), +1),
            Cond("H final kl_cov − GRPO", ev.pair("kl_cov", "grpo", _key("final_entropy")), +1)]


def _c_cov_more(ev):
    pairs = [(a, b) for a, b in (("clip_cov_more", "clip_cov"), ("kl_cov_strong", "kl_cov"))
             if not ev.same_runs(a, b)]  # a variant at its recipe's tuned value: nothing to judge
    if not pairs:
        return Precondition("each variant trained the same runs as its recipe (the tuned "
                            "value already was the variant's)")
    return [Cond(f"H final {a} − {b}", ev.pair(a, b, _key("final_entropy")), +1)
            for a, b in pairs]


def _c_eepo(ev):
    """On the first EEPO arm (the recipe, then its variants) whose gate was open on enough
    steps: the mechanism is judged where it acted, even when the tuned α never opened it."""
    arms = sorted((n for n, runs in ev.per_run.items()
                   if any(r.get("eepo_active_frac") is not None for r in runs)),
                  key=lambda n: n != "eepo")
    for name in arms:
        active = ev.one(name, _key("eepo_active_frac"))
        if active is not None and active.estimate >= EEPO_ACTIVE:
            return [Cond(f"{name} H stage 2 − stage 1 (gate open on {active.estimate:.0%} of "
                         "steps)", ev.one(name, _key("eepo_dH")), +1)]
    return Precondition(f"the gate was open on fewer than {EEPO_ACTIVE:.0%} of steps"
                        + (f" in every EEPO arm ({', '.join(arms)})" if len(arms) > 1 else ""))


def _c_track(ev):
    es = ev.runs("es_constant")
    target = {s: r.get("target_mean") for s, r in es.items()}

    def grpo_bias(r):
        t = target.get(r["seed"])
        return None if t is None else abs(r["tracked_entropy_mean"] - t)

    gap = ev.pair("es_constant", "grpo", lambda r: abs(r["tracking_bias"]) if "tracking_bias"
                  in r and r["tracking_bias"] is not None else grpo_bias(r))
    return [Cond("es_constant mean(H − target)/target", ev.one("es_constant",
                 _key("tracking_rel_bias")), 0, TRACK_BIAS),
            Cond("|mean(H − target)| es_constant − GRPO", gap, -1)]


def _c_wsd(ev):
    if ev.same_runs("es_wsd", "es_constant"):
        return Precondition("es_wsd and es_constant trained the same runs: the controller set "
                            "the same eps_high under both schedules (entropy stayed on one side "
                            "of both targets)")
    return [Cond("H final es_constant − es_wsd",
                 ev.pair("es_constant", "es_wsd", _key("final_entropy")), +1),
            Cond("es_wsd − es_constant, test pass@1", ev.pk("es_wsd", "es_constant", 1), +1)]


def _c_budget(ev):
    rps = ev.pair("e3", "e3_no_budget", lambda r: r["rollouts_per_step"])
    base = ev.one("e3_no_budget", _key("rollouts_per_step"))
    if rps is None or base is None or abs(rps.estimate) > SAME_BUDGET * base.estimate:
        return Precondition(f"the two recipes' rollouts / step differ by more than "
                            f"{SAME_BUDGET:.0%}")
    return [Cond("all-wrong groups e3_no_budget − e3",
                 ev.pair("e3_no_budget", "e3", _key("all_wrong_frac")), +1)]


def _c_law(ev):
    pooled = ev.law.get("r2")
    conds = [Cond("GRPO per-run R²", ev.one("grpo", _key("law_r2")), +1, LAW_R2)]
    if pooled is not None:
        conds.append(Cond("pooled R² (every run of the task)", pooled, +1, LAW_R2))
    return conds


def _c_predict(ev):
    gap = lambda r: r["law_rmse"] - r["law_naive_rmse"]  # noqa: E731
    return [Cond("early-fit RMSE − persistence RMSE (GRPO)", ev.one("grpo", gap), -1),
            Cond("early-fit RMSE − persistence RMSE (every run)", ev.every(gap), -1)]


def _gate_open(ev, name: str) -> bool | None:
    """Whether an EEPO arm's gate was open on at least ``EEPO_ACTIVE`` of steps (mean over
    seeds); None for an arm without a gate."""
    frac = ev.one(name, _key("eepo_active_frac"))
    return None if frac is None else frac.estimate >= EEPO_ACTIVE


def _acting(ev, names) -> "list[str] | Precondition":
    """The methods among ``names`` that trained runs of their own; a method whose tuned setting
    trained GRPO's runs number for number never acted, so a comparison with GRPO is not a
    measurement of it: its first variant at another value of its tuned knob that acted
    (``Evidence.stand_ins``, named in the label) stands in, and with none the claim is n/a,
    with why. An EEPO arm whose gate opened on fewer than ``EEPO_ACTIVE`` of steps (as claim 4
    reads it) likewise gives way to such a variant whose gate did open, where there is one."""
    idle = [n for n in names if ev.same_runs(n, "grpo")]
    acting = [n for n in names if n not in idle]
    for n in idle:  # a variant at another value of its tuned knob that acted stands in for it
        acting += [v for v in ev.stand_ins.get(n, []) if v in ev.per_run
                   and not ev.same_runs(v, "grpo") and v not in acting][:1]
    for i, n in enumerate(acting):  # an EEPO whose gate hardly opened: its open-gate variant
        if _gate_open(ev, n) is False:
            alt = [v for v in ev.stand_ins.get(n, []) if _gate_open(ev, v) and v not in acting]
            acting[i] = alt[0] if alt else n
    if acting:
        return acting
    why = ""
    if "eepo" in idle:
        frac = ev.one("eepo", _key("eepo_active_frac"))
        why = f"; EEPO's gate was open on {frac.estimate:.0%} of steps" if frac else ""
    return Precondition(f"{' and '.join(idle)} trained the same runs as GRPO, number for number, "
                        f"at the tuned setting (the method never acted{why}); the tuning table "
                        "has its settings that act")


def _large_k(*names):
    """Each method − GRPO at the largest k; with several evaluation temperatures, also each at
    its own best one (GRPO sampled hotter may close a gap that only the method's entropy made;
    the method keeps the same freedom, so a loss there is a loss, not a temperature mismatch)."""
    def check(ev):
        acting = _acting(ev, names)
        if isinstance(acting, Precondition):
            return acting
        k = ev.k_max
        conds = [Cond(f"{n} − GRPO, test pass@{k}", ev.pk(n, "grpo", k), +1) for n in acting]
        best = ev.best_temperature("grpo", k)
        if best is not None:
            for n in acting:
                own = ev.best_temperature(n, k)
                conds.append(Cond(f"{n} at its best T = {own:g} − GRPO at its best T = {best:g}, "
                                  f"test pass@{k}", ev.pk(n, "grpo", k, ta=own, tb=best), +1))
        return conds
    return check


def _pass1(*names):
    def check(ev):
        acting = _acting(ev, names)
        if isinstance(acting, Precondition):
            return acting
        return [Cond(f"{n} − GRPO, test pass@1", ev.pk(n, "grpo", 1), +1) for n in acting]
    return check


EM, E3, EEPO, ES = "Entropy Mechanism", "E3", "EEPO", "Entropy Scheduling"
CLAIMS = [
    Claim("N1", "GRPO raises pass@1 over the base model", f"{E3} §1; Yue et al. 2025",
          ("grpo",), _narrow_up),
    Claim("N2", "GRPO lowers pass@k at large k below the base model (narrowing)",
          f"{E3} §1 (Fig. 1); Yue et al. 2025", ("grpo",), _narrow_down),
    Claim("1", "GRPO's entropy falls while reward rises", f"{EM} §2; {E3} Fig. 1", ("grpo",),
          _c_grpo),
    Claim("2a", "The temperature scheduler keeps entropy near H0", f"{E3} §4.2",
          ("grpo", "e3_ts"), _c_ts),
    Claim("2b", "Annealing lowers entropy in the last phase", f"{E3} §4.2 (Eq. 5)", ("e3",),
          _c_anneal),
    Claim("3a", "Clip-Cov and KL-Cov keep entropy higher than GRPO", f"{EM} §4.4",
          ("grpo", "clip_cov", "kl_cov"), _c_cov),
    Claim("3b", "More clipping / a larger coefficient gives higher entropy",
          f"{EM} §4.4 (Fig. 13)", ("clip_cov", "clip_cov_more", "kl_cov", "kl_cov_strong"),
          _c_cov_more),
    Claim("4", "EEPO's stage-2 entropy exceeds stage-1 when the gate is active", f"{EEPO} §5",
          ("eepo",), _c_eepo),
    Claim("5a", "The adaptive clip controller tracks a constant target", f"{ES} §4.1 (Fig. 5a)",
          ("grpo", "es_constant"), _c_track),
    Claim("5b", "WSD ends with lower entropy and higher pass@1 than constant", f"{ES} §4.2",
          ("es_constant", "es_wsd"), _c_wsd),
    Claim("6", "Dynamic budgets lower the all-wrong fraction at equal total rollouts",
          f"{E3} Fig. 8", ("e3", "e3_no_budget"), _c_budget),
    Claim("7a", "The entropy–performance law R = −a·e^H + b fits", f"{EM} §2.4 (Eq. 6)",
          ("grpo",), _c_law),
    Claim("7b", "An early fit predicts later accuracy better than persistence",
          f"{EM} §2.4 (Fig. 5)", ("grpo",), _c_predict),
    Claim("8a", "E3 raises pass@k at large k over GRPO", f"{E3} §5 (Table 2)", ("grpo", "e3"),
          _large_k("e3")),
    Claim("8b", "EEPO raises pass@k at large k over GRPO", f"{EEPO} §5 (Fig. 4)",
          ("grpo", "eepo"), _large_k("eepo")),
    Claim("8c", "Entropy Scheduling raises pass@k at large k over GRPO", f"{ES} §4 (Fig. 6)",
          ("grpo", "es_constant", "es_wsd"), _large_k("es_constant", "es_wsd")),
    Claim("8d", "Clip-Cov and KL-Cov raise pass@k at large k over GRPO", f"{EM} §4.4 (Fig. 11)",
          ("grpo", "clip_cov", "kl_cov"), _large_k("clip_cov", "kl_cov")),
    Claim("9a", "E3 raises pass@1 over GRPO", f"{E3} §5 (Table 1)", ("grpo", "e3"),
          _pass1("e3")),
    Claim("9b", "EEPO raises pass@1 over GRPO", f"{EEPO} §5 (Table 1)", ("grpo", "eepo"),
          _pass1("eepo")),
    Claim("9c", "Entropy Scheduling raises pass@1 over GRPO", f"{ES} §4 (Table 1)",
          ("grpo", "es_constant", "es_wsd"), _pass1("es_constant", "es_wsd")),
    Claim("9d", "Clip-Cov and KL-Cov raise pass@1 over GRPO", f"{EM} §4.4 (Table 2)",
          ("grpo", "clip_cov", "kl_cov"), _pass1("clip_cov", "kl_cov")),
]


def combine(verdicts: list[str]) -> str:
    """A claim's verdict from its conditions' (see the module docstring)."""
    if not verdicts or "n/a" in verdicts:
        return "n/a"
    shown, opposite = verdicts.count("shown"), verdicts.count("opposite")
    if shown == len(verdicts):
        return "shown"
    if opposite and shown:
        return "mixed"
    if opposite:
        return "opposite"
    return "partial" if shown else "not shown"


JUDGED = ("shown", "opposite", "mixed", "partial", "not shown")  # verdicts an interval gave
CHANCE = 1 - 0.95  # a claim's chance of a decided verdict (shown or opposite) when nothing works


def chance_line(claims: list[dict]) -> str:
    """How many decided verdicts chance alone gives a table of claims: each claim judged
    (``JUDGED``) reads *shown* or *opposite* with probability at most 5% when nothing works
    (a condition's 95% interval; a frontier claim's family of points is Bonferroni-corrected to
    95%), so the expected number is at most 0.05·m and the probability of at least one at most
    1 − 0.95^m for m independent claims (claims sharing runs are correlated: that lowers the
    second, not the first)."""
    m = sum(c["verdict"] in JUDGED for c in claims)
    shown = sum(c["verdict"] == "shown" for c in claims)
    opposite = sum(c["verdict"] == "opposite" for c in claims)
    return (f"**By chance:** {m} claims judged here: {shown} shown, {opposite} opposite. Were no "
            "method to change "
            f"anything, each would read *shown* or *opposite* with probability at most "
            f"{CHANCE:.0%}, so up to {CHANCE * m:.1f} such verdicts are expected by chance alone, "
            f"and at least one with probability up to {1 - (1 - CHANCE) ** m:.0%} (independent "
            "claims). One *shown* among many is weak evidence until another study (other seeds "
            "or another task) finds it again.")


def judge(c: Claim, ev: Evidence) -> dict:
    """One claim's row: its conditions, intervals and verdict (``not run`` when its recipes
    are not in the study, ``n/a`` when a precondition fails)."""
    head = {"id": c.id, "claim": c.claim, "paper": c.paper, "needs": list(c.needs)}
    missing = [n for n in c.needs if not ev.per_run.get(n)]
    if missing:
        what = ("no finished run yet" if set(missing) <= ev.unfinished
                else "recipes not in this study")
        return head | {"numbers": f"{what}: {', '.join(missing)}",
                       "conditions": [], "verdict": "not run"}
    return claim_row(head, c.check(ev))


def claim_row(head: dict, conds: list[Cond] | Precondition, after: str = "",
              verdict: str | None = None) -> dict:
    """A claims table row: ``head`` (id, claim, paper, needs) with the conditions' numbers
    (``after`` appended), their intervals and the verdict (``combine``'s unless given); ``n/a``
    with the reason for a ``Precondition``."""
    if isinstance(conds, Precondition):
        return head | {"numbers": f"not testable: {conds.reason}", "conditions": [],
                       "verdict": "n/a"}
    return head | {"numbers": "; ".join(x.text() for x in conds) + after,
                   "conditions": [{"label": x.label, "direction": x.direction, "null": x.null,
                                   "interval": x.iv.to_json() if x.iv else None,
                                   "verdict": x.verdict} for x in conds],
                   "verdict": verdict or combine([x.verdict for x in conds])}


def evaluate_claims(ev: Evidence, claims: list[Claim] | None = None) -> list[dict]:
    """Every claim's row (``judge``): the study's ``claims`` (its spec's ``claims:``,
    ``declared.as_claim``), or without them the library's exploration claims (``CLAIMS``)."""
    return [judge(c, ev) for c in (CLAIMS if claims is None else claims)]
