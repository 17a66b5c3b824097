"""The frontier's part of the study's documents: its table, its claims ("method X moves the
frontier outward"), its figure and its JSON."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from explorl.analysis.frontier import FPoint, Series, draw_frontier
from explorl.report.claims import Cond, Precondition, claim_row
from explorl.report.frontier import Frontier, Point
from explorl.report.numbers import value_text
from explorl.report.tables import cell

PAPERS = {  # the paper whose method an arm runs, by the recipe its name starts with
    "kl_cov": "Entropy Mechanism §4.4", "clip_cov": "Entropy Mechanism §4.4",
    "passk": "Pass@k Training (Chen et al. 2025)", "e3": "E3 §5", "eepo": "EEPO §5",
    "es_": "Entropy Scheduling §4",
}

LEFT_OUT = 0.05  # (old study.json files) a gap whose replicates left GRPO's range this often

FRONTIER_NOTES = """\
{intro}; a point is its mean test pass@1 and
pass@{k} over seeds and problems. GRPO's frontier is the non-dominated part of the upper concave
hull of what GRPO reaches: its points, the model before RL (GRPO's {zero} end, when it was
evaluated){mixtures}; from the most pass@{k} to the most pass@1, the most pass@{k} GRPO reaches
at each pass@1. A {unit} below it, or with less of both than another, does not define it, and
its pass@1 range is that frontier's. **pass@{k} − frontier**: the point's pass@{k} minus
GRPO's frontier at the point's pass@1 (none outside its pass@1 range: no extrapolation);
**pass@1 − frontier**: its pass@1 minus the most pass@1 GRPO reaches while keeping pass@{k} at
the point's level. Intervals: each gap linearised at the point estimates (the frontier's edge
at the point fixed), a 95% t interval whose variance holds the seeds' part (t at seeds − 1
degrees of freedom) and the problems' part (its own t), clipped to [−1, 1]; no resampling; ±
is the minimum detectable effect from the same terms. **hull test**: the one-sided
confidence, by the same interval's rule, that the point lies outside everything GRPO's
frontier reaches (more pass@1 *and* more pass@{k}): *outside* at ≥ 97.5%, *inside* at ≤ 2.5%,
else *undecided*. Next to a steep edge of GRPO's frontier (two {units} with almost the same
pass@1) the linearised MDE is large; the interval is the judge. **beaten by its own**: the
arm's other {unit} (or mix of two) that reaches at least the point's pass@1 with more
pass@{k}, or (for arms other than GRPO) one with more pass@{k} (95% interval above 0) at a
pass@1 not resolved below the point's; such a point is not part of the frontier the arm
reaches (as GRPO's own beaten points are not part of GRPO's) and its claim does not judge
it."""

MIXTURES = (" and the per-sample mixtures of every two of them (each response sampled from one "
            "with probability λ, else from the other, λ in steps of 1/32: per problem p = λ·p_A + "
            "(1 − λ)·p_B, so pass@1 is the chord's but pass@{k} = 1 − (1 − p)^{k} lies above "
            "it; each mixture's pass@{k} is estimated without bias per seed and problem from the "
            "two runs' counts), and per-query mixes of those (the hull's chords)")
CHORDS = " and per-query mixes of them (the hull's chords: the per-problem counts were not read)"

CLAIM_RULE = """\
A frontier claim ({id}-…) compares the frontier the arm reaches with GRPO's: it is judged at
each of the arm's {units} whose point lies on the arm's own frontier (no other {unit} of the
arm, or mix of two, has at least its pass@1 and more pass@k, nor more pass@k, resolved, at a
pass@1 not resolved below it) and whose pass@1 lies inside GRPO's range, each interval
Bonferroni-corrected for their number (95% over the family): **shown** when some point lies
above GRPO's frontier and none below, **opposite** when some lies below and none above,
**mixed** when both, **not shown** when none is decided; **n/a** when no such point exists (the
hull test then speaks)."""


def _tag(value: Any) -> str:
    return value_text(value)


def regime(fr: Frontier | None) -> dict | None:
    """Which regime the task is in, read from the baseline's points against the model before
    RL (``base_1``, ``base_k``: differences with 95% intervals). At a learning rate the baseline
    *keeps* pass@k when it gains pass@1 (interval above 0) and its pass@k interval does not lie
    below 0, and *narrows* when its pass@k interval lies below 0. The task is in the regime
    where **RL learns** when some learning rate keeps (pass@1 for free); otherwise where **RL
    sharpens more than it learns** when at some narrowing learning rate the pass@k lost exceeds
    the pass@1 gained (estimates), where **RL trades pass@k for pass@1** when at every narrowing
    one the gain is at least the loss, and where **RL changes little** when none narrows.
    None without the base model's evaluation."""
    if fr is None:
        return None
    pts = [p for p in fr.points.get(fr.baseline, []) if p.base_1 and p.base_k]
    if not pts:
        return None
    keeps = [p for p in pts if p.base_1.low > 0 and p.base_k.high >= 0]
    narrows = [p for p in pts if p.base_k.high < 0]
    if keeps:
        name = "RL learns"
    elif any(-p.base_k.estimate > p.base_1.estimate for p in narrows):
        name = "RL sharpens more than it learns"
    elif narrows:
        name = "RL trades pass@k for pass@1"
    else:
        name = "RL changes little"
    k = fr.k
    lrs = lambda ps: ", ".join(_tag(p.value) for p in ps)  # noqa: E731
    kn = fr.knob
    parts = [f"{kn} {_tag(p.value)}: pass@1 {p.base_1.fmt()}, pass@{k} {p.base_k.fmt()}"
             for p in pts]
    b = fr.baseline
    said = []
    if keeps:
        said.append(f"At {kn} {lrs(keeps)} {b} gains pass@1 and keeps pass@{k}")
    if narrows:
        said.append(f"{'at' if keeps else 'At'} {kn} {lrs(narrows)} {'it' if keeps else b} "
                    f"loses pass@{k}")
    sentence = "; ".join(said) or (f"{b} neither gains pass@1 while keeping pass@{k} nor "
                                   f"loses pass@{k} at any {fr.unit}")
    text = (f"**Regime, from {b}'s points against the model before RL: {name}.** {sentence} "
            f"(differences with the base model, 95% intervals: {'; '.join(parts)}).")
    return {"regime": name, "keeps": [p.value for p in keeps],
            "narrows": [p.value for p in narrows], "text": text}


def frontier_table(fr: Frontier | None) -> list[str]:
    """The frontier's markdown: one row per (arm, learning rate)."""
    if fr is None:
        return []
    k = fr.k
    head = ["arm", fr.knob, "pass@1", f"pass@{k}", "− base, pass@1", f"− base, pass@{k}",
            f"pass@{k} − GRPO frontier at its pass@1", f"pass@1 − GRPO at its pass@{k}",
            "hull test", "beaten by its own"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, pts in fr.points.items():
        for p in pts:
            hull = "" if p.outside is None else f"{p.hull} ({p.outside:.0%})"
            gap_k = cell(p.gap_k) if p.gap_k else (p.where_k if arm != fr.baseline else "")
            if p.gap_k and (p.left_out or 0) > LEFT_OUT:
                gap_k += f" † {p.left_out:.0%}"
            gap_1 = cell(p.gap_1) if p.gap_1 else (p.where_1 if arm != fr.baseline else "")
            lines.append("| " + " | ".join([
                arm, _tag(p.value), p.pass1.fmt_abs(), p.passk.fmt_abs(),
                cell(p.base_1, mde=False) if p.base_1 else "",
                cell(p.base_k, mde=False) if p.base_k else "", gap_k, gap_1, hull,
                _beaten_text(p, fr.knob)]) + " |")
    seeds = "; ".join(f"{a}: {', '.join(map(str, s))}" for a, s in fr.seeds.items())
    reg = regime(fr)
    return [*([reg["text"], ""] if reg else []), *lines, "", frontier_notes(fr), "",
            f"Seeds compared: {seeds}."]


def _beaten_text(p: Point, knob: str = "lr") -> str:
    """Which of the arm's own points beat the point ("" when none does)."""
    if not p.beaten_by:
        return ""
    lrs = " and ".join(_tag(v) for v in p.beaten_by)
    return f"{knob} {lrs}" if len(p.beaten_by) == 1 else f"a mix of {knob} {lrs}"


INTROS = {"learning rate": "Each arm trains at every learning rate of the sweep"}
ZEROS = {"learning rate": "learning rate → 0", "checkpoint": "step 0"}


def frontier_notes(fr: Frontier) -> str:
    """``FRONTIER_NOTES`` in the words of what the points sweep."""
    intro = INTROS.get(fr.unit, f"Each arm's points are its {fr.unit}s")
    mix = (MIXTURES if fr.mixed else CHORDS).format(k=fr.k)
    text = FRONTIER_NOTES.format(k=fr.k, intro=intro, unit=fr.unit, units=fr.unit + "s",
                                 zero=ZEROS.get(fr.unit, f"{fr.knob} → 0"), mixtures=mix)
    return textwrap.fill(" ".join(text.split()), 96, break_on_hyphens=False)


def claim_rule(fr: Frontier, id_: str = "F") -> str:
    """``CLAIM_RULE`` for claims with the id prefix ``id_``."""
    text = CLAIM_RULE.format(id=id_, unit=fr.unit, units=fr.unit + "s")
    return textwrap.fill(" ".join(text.split()), 96, break_on_hyphens=False)


def frontier_claims(fr: Frontier | None, id_: str = "F", what: str = "") -> list[dict]:
    """Per non-baseline arm, the claim that it moves GRPO's frontier outward (``CLAIM_RULE``),
    in ``evaluate_claims``' row format; ids ``<id_>-<arm>``, ``what`` after "frontier"."""
    if fr is None:
        return []
    out = []
    for arm, pts in fr.points.items():
        if arm == fr.baseline:
            continue
        paper = next((v for key, v in PAPERS.items() if arm.startswith(key)), "")
        head = {"id": f"{id_}-{arm}",
                "claim": f"{arm} moves the pass@1–pass@{fr.k} frontier{what} outward",
                "paper": paper, "needs": [fr.baseline, arm]}
        kn = fr.knob
        hull = "; ".join(f"{kn} {_tag(p.value)}: {p.hull} ({p.outside:.0%})" for p in pts)
        conds = [Cond(f"{kn} {_tag(p.value)}: pass@{fr.k} − GRPO frontier at pass@1 "
                      f"{p.pass1.estimate:.3f}", p.gap_k_family, +1)
                 for p in pts if p.gap_k and not p.beaten_by]
        beaten = [f"{kn} {_tag(p.value)} (by {_beaten_text(p, kn)})" for p in pts if p.beaten_by]
        if beaten:
            hull += "; not judged, beaten by the arm's own points: " + ", ".join(beaten)
        verdicts = [c.verdict for c in conds]
        up, down = "shown" in verdicts, "opposite" in verdicts
        row = claim_row(head, conds or Precondition(
            "no point of the arm's own frontier has its pass@1 inside GRPO's range; hull test: "
            + hull), f"; hull test: {hull}", "mixed" if up and down else "shown" if up else
            "opposite" if down else "not shown")
        out.append(row)
    return out


def frontier_json(fr: Frontier | None) -> dict:
    if fr is None:
        return {}

    def point(p: Point) -> dict:
        ivs = {key: getattr(p, key) for key in ("pass1", "passk", "gap_k", "gap_1",
                                                "gap_k_family", "base_1", "base_k")}
        return {"arm": p.arm, "value": p.value, "name": p.name, "where_k": p.where_k,
                "where_1": p.where_1, "outside": p.outside, "hull": p.hull,
                "left_out": p.left_out,
                "beaten_by": list(p.beaten_by) if p.beaten_by else None,
                **{key: iv.to_json() if iv else None for key, iv in ivs.items()}}

    return {"k": fr.k, "baseline": fr.baseline, "knob": fr.knob, "base": fr.base, "seeds": fr.seeds,
            "regime": regime(fr), "mixtures": fr.mixed,
            "hull": list(zip(fr.hull.xs, fr.hull.ys)) if fr.hull else [],
            "points": {a: [point(p) for p in pts] for a, pts in fr.points.items()}}


def draw(fr: Frontier | None, out_dir: Path, subtitle: str = "", file: str = "frontier.png",
         title: str = "") -> list[tuple[str, str]]:
    """``report/<file>`` (default ``frontier.png``): (title, file) for the study's figures, or
    none."""
    if fr is None:
        return []
    series = [Series(arm, [FPoint(p.pass1.estimate, p.passk.estimate, (p.pass1.low, p.pass1.high),
                                  (p.passk.low, p.passk.high), str(p.value)
                                  if isinstance(p.value, int) else f"{float(p.value):.3g}"
                                  if isinstance(p.value, float) else str(p.value),
                                  beaten=p.beaten_by is not None)
                           for p in pts]) for arm, pts in fr.points.items()]
    hull = None
    if fr.hull:  # F: GRPO's non-dominated points (the base model its lr → 0 end), peak first
        hull = list(zip(fr.hull.xs, fr.hull.ys))
    draw_frontier(series, out_dir / file, fr.k, base=fr.base, hull=hull, subtitle=subtitle,
                  unit=fr.unit, labels="training step" if fr.knob == "step" else "",
                  hull_label="frontier (with per-sample mixtures)" if fr.mixed else "")
    return [(title or f"The pass@1–pass@{fr.k} frontier: every arm through its learning rates",
             file)]
