"""The pass@1–pass@k frontier (``explorl.report.frontier``): GRPO's hull, the interpolation both
ways, the hull test, the t intervals and the MDE, each against numbers worked out by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest

from explorl.analysis.frontier import run_points
from explorl.analysis.hull import beaten_by, dominated, pareto
from explorl.analysis.report import write_report
from explorl.analysis.runs import load_run
from explorl.report.frontier import (
    Frontier,
    Point,
    analyse_frontier,
    compare,
    frontier_at,
    own_beaten,
    pass1_at,
    upper_hull,
    where,
)
from explorl.report.frontier_report import frontier_claims, frontier_json, frontier_table
from explorl.report.stats import Interval, t_ppf

# The pilot's GRPO points (held-out task, 200 steps): (pass@1, pass@64) at lr 1e-4, 5e-5,
# 2.5e-5, 1.25e-5 = A, B, C, D.
G1 = [0.326, 0.345, 0.354, 0.353]
GK = [0.768, 0.855, 0.891, 0.920]


def test_upper_hull_drops_a_point_below_the_chord_of_two_others():
    """Sorted by pass@1: A(.326, .768), B(.345, .855), D(.353, .920), C(.354, .891).
    A→B→D: cross = (.345 − .326)(.920 − .768) − (.855 − .768)(.353 − .326) = .002888 − .002349
    = +.000539 ≥ 0: a left turn, B lies below the chord AD and goes. A→D→C: cross = .027·.123 −
    .152·.028 = .003321 − .004256 = −.000935 < 0: D stays. Hull A, D, C; the peak is D."""
    h = upper_hull(G1, GK)
    assert h.xs == (0.326, 0.353, 0.354) and h.ys == (0.768, 0.920, 0.891)
    assert h.idx == (0, 3, 2) and h.peak == 1
    # equal pass@1: only the higher point counts
    assert upper_hull([0.1, 0.1, 0.2], [0.5, 0.7, 0.6]).idx == (1, 2)


def test_frontier_both_ways_by_hand():
    """F(x) = the most pass@64 the hull reaches at pass@1 ≥ x. Left of D (x ≤ .353) it is D's
    .920, flat (A's lower .768 is beaten by D, which also has more pass@1); between D and C,
    linear: F(.3535) = .920 + (.891 − .920)·(.0005/.001) = .9055; F(.354) = .891. Outside
    [.326, .354]: none. G(y) = the most pass@1 keeping pass@64 ≥ y, on the falling edge D→C:
    G(.9055) = .353 + (.9055 − .920)/(.891 − .920)·.001 = .3535; G(.891) = .354; G(.920) =
    .353; above .920 or below .891: none."""
    h = upper_hull(G1, GK)
    assert frontier_at(h, 0.340) == pytest.approx(0.920)
    assert frontier_at(h, 0.326) == pytest.approx(0.920)
    assert frontier_at(h, 0.3535) == pytest.approx(0.9055)
    assert frontier_at(h, 0.354) == pytest.approx(0.891)
    assert frontier_at(h, 0.320) is None and frontier_at(h, 0.36) is None
    assert where(h, 0.32) == "below GRPO's pass@1 range" and where(h, 0.36).startswith("above")
    assert pass1_at(h, 0.9055) == pytest.approx(0.3535)
    assert pass1_at(h, 0.891) == pytest.approx(0.354)
    assert pass1_at(h, 0.920) == pytest.approx(0.353)
    assert pass1_at(h, 0.93) is None and pass1_at(h, 0.85) is None


@pytest.mark.parametrize("x, y, outside", [
    (0.354, 0.938, True),   # the pilot's KL-Cov: F(.354) = .891 < .938
    (0.3535, 0.90, False),  # F(.3535) = .9055 ≥ .90: a mix of D and C reaches it
    (0.300, 0.95, True),    # below the range, but above the peak's .920: nothing reaches it
    (0.300, 0.90, False),   # D has more of both
    (0.360, 0.10, True),    # more pass@1 than any GRPO point
])
def test_hull_test_by_hand(x, y, outside):
    assert dominated(upper_hull(G1, GK), x, y) is (not outside)


def test_a_point_its_own_method_beats_by_hand():
    """Points 0 (.50, .90), 1 (.60, .80), 2 (.55, .70), 3 (.40, .85), 4 (.55, .85). Hull: 3, 0,
    1 (4 lies on the chord 0→1: .90 + (.80 − .90)·(.05/.10) = .85, so it is not beaten), the
    peak is 0. Point 2: F(.55) = .85 > .70, beaten by the mix of 0 and 1; point 3: left of the
    peak, F(.40) = .90 > .85, beaten by 0 alone (more pass@1 and more pass@k). The pilot's GRPO
    sweep: A (.326, .768) is beaten by D (.353, .920) and B (.345, .855) too (F(.345) = .920)."""
    got = beaten_by([0.50, 0.60, 0.55, 0.40, 0.55], [0.90, 0.80, 0.70, 0.85, 0.85])
    assert got == [None, None, (0, 1), (0,), None]
    assert beaten_by(G1, GK) == [(3,), (3,), None, None]
    assert beaten_by([0.3], [0.9]) == [None]


def _const(v: float, seeds: int = 2, problems: int = 3) -> np.ndarray:
    return np.full((seeds, problems), v)


def test_constant_arms_give_point_intervals_at_the_hand_values():
    """Every seed and problem at its arm's mean: every variance is 0, so the interval is the
    estimate itself. GRPO's frontier is its non-dominated points D (.353, .920) and C (.354,
    .891): A and B, with less of both than D, do not start its pass@1 range. The pilot's KL-Cov
    point (.354, .891 + .047): gap_k = .938 − F(.354) = +.047; its pass@64 is above the peak,
    so gap_1 is none (above GRPO's pass@k range); outside with certainty. A point (.340,
    .9055) lies left of D: no gap_k (below GRPO's pass@1 range), gap_1 = .340 − G(.9055) =
    .340 − .3535 = −.0135, and inside (D has more of both)."""
    g1 = np.stack([_const(v) for v in G1])
    gk = np.stack([_const(v) for v in GK])
    x1 = np.stack([_const(0.354), _const(0.340)])
    xk = np.stack([_const(0.938), _const(0.9055)])
    kl, low = compare(x1, xk, g1, gk)
    assert kl["gap_k"].estimate == pytest.approx(0.047)
    assert (kl["gap_k"].low, kl["gap_k"].high) == pytest.approx((0.047, 0.047))
    assert kl["gap_k"].mde == pytest.approx(0.0, abs=1e-12)
    assert "gap_1" not in kl and kl["where_1"] == "above GRPO's pass@k range"
    assert kl["outside"] == 1.0 and kl["where_k"] == "inside"
    assert "gap_k" not in low and low["where_k"] == "below GRPO's pass@1 range"
    assert low["gap_1"].estimate == pytest.approx(-0.0135)
    assert low["outside"] == 0.0


def test_grpos_frontier_is_its_non_dominated_points():
    """The pilot's hull A, D, C with its peak D: the non-dominated part is D, C, so GRPO's
    pass@1 range is [.353, .354], not [.326, .354] (A is beaten by D on both axes)."""
    h = pareto(upper_hull(G1, GK))
    assert h.xs == (0.353, 0.354) and h.idx == (3, 2) and h.peak == 0
    assert frontier_at(h, 0.340) is None and where(h, 0.340) == "below GRPO's pass@1 range"
    assert frontier_at(h, 0.3535) == pytest.approx(0.9055)
    assert dominated(h, 0.300, 0.90) and not dominated(h, 0.300, 0.95)


def test_gap_interval_and_mde_by_hand():
    """GRPO a = (pass@1 .4, pass@k .6), b = (.6, .5), both constant: the frontier's peak is a,
    its falling edge a→b has slope (.5 − .6)/.2 = −.5. The method's pass@1 is .5 everywhere: t =
    (.5 − .4)/.2 = .5, and F(.5) = .5·.6 + .5·.5 = .55. The linearised difference is d = y_m −
    .5·y_a − .5·y_b − (−.5)·(x_m − .5·x_a − .5·x_b) = y_m − .55 (the x terms are .5 − .5 = 0).
    With y_m = .55 + d′, d′ = [[.05, .15, .10], [.25, .35, .15]] (S = 2, P = 3): gap = mean(d′)
    = 1.05 / 6 = .175. Seed means .10, .25: var .01125, / S = .005625; problem means .15, .25,
    .125: MS_problem = 2 · .004375 = .00875, MS_resid = Σ resid² / 2 = .0075 / 2 = .00375, so
    σ²_problem / P = (.00875 − .00375) / 6 = .000833; SE² = .0064583, SE = .080364.
    Satterthwaite: df_problem = .005² / (.00875² / 2 + .00375² / 2) = .11034, df = .0064583² /
    (.005625² / 1 + .000833² / .11034) = 1.26781 (reported). The interval takes a t quantile
    per term: the seeds' at df S − 1 = 1, the problems' at its df rounded down, at least 1:
    both t(.975, 1) = 12.706, so .175 ± 12.706·SE = [−.846, +1.196], clipped to [−.846, +1];
    MDE = (t(.975, 1) + t(.80, 1))·SE."""
    d = np.array([[0.05, 0.15, 0.10], [0.25, 0.35, 0.15]])
    g1, gk = np.stack([_const(0.4), _const(0.6)]), np.stack([_const(0.6), _const(0.5)])
    got = compare(np.stack([_const(0.5)]), np.stack([0.55 + d]), g1, gk)[0]
    iv = got["gap_k"]
    se = np.sqrt(0.005625 + 0.005 / 6)
    df = (0.005625 + 0.005 / 6) ** 2 / (0.005625 ** 2 + (0.005 / 6) ** 2 / (
        0.005 ** 2 / (0.00875 ** 2 / 2 + 0.00375 ** 2 / 2)))
    assert se == pytest.approx(0.080364, abs=1e-6) and df == pytest.approx(1.26781, abs=1e-5)
    assert iv.estimate == pytest.approx(0.175) and iv.se == pytest.approx(se)
    assert iv.df == pytest.approx(df)
    assert iv.estimate - iv.low == pytest.approx(12.7062047 * se) and iv.high == 1.0
    assert iv.mde == pytest.approx((t_ppf(0.975, 1) + t_ppf(0.8, 1)) * se)
    assert got["where_1"] == "above GRPO's pass@k range"  # .725 > the peak's .6


def test_the_base_model_is_grpos_lr_to_zero_end():
    """GRPO at (.5, .80) and (.6, .70), the base model at (.3, .90): the frontier runs from the
    base model through both, so a method at (.4, .87) is judged against the chord base→(.5,
    .80): F(.4) = .90 − .10·(.1/.2) = .85, gap +.02; without the base model it lies left of
    GRPO's pass@1 range."""
    pk = {"g@1": {1: _const(0.5), 8: _const(0.80)}, "g@2": {1: _const(0.6), 8: _const(0.70)},
          "m@1": {1: _const(0.4), 8: _const(0.87)}}
    seeds = {n: [0, 1] for n in pk}
    points = {"g": [(1, "g@1"), (2, "g@2")], "m": [(1, "m@1")]}
    base = {1: np.full((1, 3), 0.3), 8: np.full((1, 3), 0.90)}
    fr = analyse_frontier(pk, seeds, points, "g", 8, base)
    assert fr.hull.xs == pytest.approx((0.3, 0.5, 0.6))
    (m,) = fr.points["m"]
    assert m.gap_k.estimate == pytest.approx(0.02) and m.where_k == "inside"
    (m,) = analyse_frontier(pk, seeds, points, "g", 8).points["m"]
    assert m.gap_k is None and m.where_k == "below GRPO's pass@1 range"


def test_analyse_frontier_compares_on_the_seeds_every_point_finished():
    """GRPO finished seeds 0, 1 at both its values and the method seed 1 only: the method is
    compared on seed 1; a third GRPO value not finished is left out; one GRPO point alone
    makes no frontier."""
    pk = {"g@1": {1: np.array([[0.3] * 3, [0.3] * 3]), 8: np.array([[0.9] * 3, [0.9] * 3])},
          "g@2": {1: np.array([[0.5] * 3, [0.5] * 3]), 8: np.array([[0.7] * 3, [0.7] * 3])},
          "m@1": {1: np.array([[0.4] * 3]), 8: np.array([[0.85] * 3])}}
    seeds = {"g@1": [0, 1], "g@2": [0, 1], "m@1": [1]}
    points = {"g": [(1, "g@1"), (2, "g@2"), (3, "g@3")], "m": [(1, "m@1"), (2, "m@2")]}
    base = {1: np.array([[0.2] * 3]), 8: np.array([[0.95] * 3])}
    fr = analyse_frontier(pk, seeds, points, "g", 8, base)
    assert fr.seeds == {"g": [0, 1], "m": [1]} and fr.base == pytest.approx((0.2, 0.95))
    assert [p.name for p in fr.points["g"]] == ["g@1", "g@2"]
    g = fr.points["g"][0]
    assert g.base_1.estimate == pytest.approx(0.1) and g.base_k.estimate == pytest.approx(-0.05)
    (m,) = fr.points["m"]
    # F(.4) on the edge (.3, .9)→(.5, .7): .9 − .2·.5 = .8; gap .85 − .8 = +.05; G(.85) = .35
    assert m.gap_k.estimate == pytest.approx(0.05) and m.gap_1.estimate == pytest.approx(0.05)
    assert m.hull == "outside"
    assert analyse_frontier(pk, seeds, {"g": [(1, "g@1")]}, "g", 8) is None
    apart = {**seeds, "g@1": [0], "g@2": [1]}  # no seed finished at both GRPO points
    assert analyse_frontier({**pk, "g@1": {1: pk["g@1"][1][:1], 8: pk["g@1"][8][:1]},
                             "g@2": {1: pk["g@2"][1][1:], 8: pk["g@2"][8][1:]}},
                            apart, points, "g", 8) is None


# ----------------------------------------------------------------------------- explorl report


def _run_with_eval(path, name, lr, seed, correct, n=4, split="test"):
    """A run directory whose eval/ holds ``correct`` (per problem, of ``n`` samples)."""
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(f"name: '{name}'\nseed: {seed}\noptim: {{lr: {lr}}}\n")
    (path / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    (path / "eval").mkdir()
    (path / "eval" / "problems.jsonl").write_text("".join(
        json.dumps({"n_correct": c, "n_samples": n}) + "\n" for c in correct))
    (path / "eval" / "eval.json").write_text(json.dumps({
        "k_list": [1, 4], "settings": {"split": split, "k": [1, 4]},
        "overall": {"pass@1": float(np.mean(correct)) / n,
                    "pass@4": float(np.mean([c > 0 for c in correct]))}}))
    return path


def test_report_draws_the_frontier_of_runs_with_evaluations(tmp_path):
    """Two GRPO learning rates (one run each) and a method at one: points (mean pass@1, mean
    pass@4) by hand. GRPO at 1e-4: correct [4, 0] of 4 → pass@1 (1 + 0)/2 = .5, pass@4 (1 +
    0)/2 = .5; at 5e-5: [2, 1] → pass@1 (.5 + .25)/2 = .375, pass@4 1. GRPO's series comes
    first whatever the order of the runs, its points by decreasing lr."""
    runs = [_run_with_eval(tmp_path / "m", "kl_cov@1e-4", 1e-4, 0, [1, 1]),
            _run_with_eval(tmp_path / "a", "grpo@1e-4", 1e-4, 0, [4, 0]),
            _run_with_eval(tmp_path / "b", "grpo@5e-5", 5e-5, 0, [2, 1]),
            _run_with_eval(tmp_path / "v", "grpo@5e-5", 5e-5, 1, [4, 4], split="val")]
    series, k, split = run_points([load_run(r) for r in runs])
    assert (k, split) == (4, "test")  # the val run is left out: one split per figure
    assert [s.label for s in series] == ["grpo", "kl_cov"]
    g = series[0].points
    assert [(p.x, p.y, p.tag) for p in g] == [(0.5, 0.5, "0.0001"), (0.375, 1.0, "5e-05")]
    report = write_report(runs, tmp_path / "report")
    assert (tmp_path / "report" / "frontier.png").exists()
    assert any(p.name == "frontier.png" for _, _, p in report.figures)
    # a recipe folder's GRPO (real/grpo runs as real-grpo) comes first too; one learning rate
    # for every run: nothing swept, no labels
    ones = [_run_with_eval(tmp_path / "r1", "kl_cov", 1e-5, 0, [1, 1]),
            _run_with_eval(tmp_path / "r2", "real-grpo", 1e-5, 0, [4, 0])]
    series, _, _ = run_points([load_run(r) for r in ones])
    assert [s.label for s in series] == ["real-grpo", "kl_cov"]
    assert [p.tag for s in series for p in s.points] == ["", ""]
    # GRPO over 2 seeds, KL-Cov over 1 so far: each label says how many
    ones.append(_run_with_eval(tmp_path / "r3", "real-grpo", 1e-5, 1, [4, 4]))
    series, _, _ = run_points([load_run(r) for r in ones])
    assert [s.label for s in series] == ["real-grpo (2 seeds)", "kl_cov (1 seed)"]
    # one seed has no spread over seeds: no bars (the tables read n/a); two have them
    (g,), (m,) = (s.points for s in series)
    assert (m.x_iv, m.y_iv) == (None, None) and g.x_iv is not None and g.y_iv is not None
    # runs without evaluations: no frontier, and a stale figure goes
    write_report([_run_with_eval(tmp_path / "c", "x", 1e-4, 0, [1])], tmp_path / "report")
    assert not (tmp_path / "report" / "frontier.png").exists()


# ----------------------------------------------------------------------------- claims


def _pt(arm, value, gap=None, outside=0.0):
    iv = Interval(0.5, 0.45, 0.55, "")
    g = None if gap is None else Interval(gap[0], gap[1], gap[2], "")
    return Point(arm, value, f"{arm}@{value}", iv, iv, gap_k=g, gap_k_family=g,
                 where_k="inside" if g else "below GRPO's pass@1 range", outside=outside)


@pytest.mark.parametrize("gaps, verdict", [
    ([(0.05, 0.01, 0.09), (0.0, -0.02, 0.02)], "shown"),       # one point above, none below
    ([(0.05, 0.01, 0.09), (-0.05, -0.09, -0.01)], "mixed"),
    ([(-0.05, -0.09, -0.01), (0.0, -0.02, 0.02)], "opposite"),
    ([(0.01, -0.01, 0.03), None], "not shown"),                # the second point is outside
    ([None, None], "n/a"),                                      # no point inside: the hull test
])
def test_frontier_claim_verdicts(gaps, verdict):
    fr = Frontier(64, "grpo", points={"grpo": [_pt("grpo", 1e-4)],
                                      "kl": [_pt("kl", v, g, 0.99) for v, g in
                                             zip((1e-4, 5e-5), gaps)]})
    (row,) = frontier_claims(fr)
    assert row["id"] == "F-kl" and row["verdict"] == verdict
    assert "hull test: lr 0.0001: outside (99%)" in row["numbers"]
    assert len(row["conditions"]) == sum(g is not None for g in gaps)


def test_a_hair_more_pass1_for_much_less_passk_is_beaten_within_noise():
    """Point 0: pass@1 .500 on average (per-problem noise), pass@k .80 everywhere; point 1:
    pass@1 .499 (its own noise: the difference's interval holds 0), pass@k .90 everywhere (a
    difference of +.10 with no spread). At the point estimates 0 has more pass@1 and is not
    beaten; within noise 1 beats it. With 1's pass@1 at .30 everywhere (−.20, resolved) it
    does not."""
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 0.1, (2, 2, 16))
    noise -= noise.mean(axis=(1, 2), keepdims=True)
    x1 = np.stack([0.5 + noise[0], 0.499 + noise[1]])
    xk = np.stack([np.full((2, 16), 0.8), np.full((2, 16), 0.9)])
    assert beaten_by(x1.mean(axis=(1, 2)), xk.mean(axis=(1, 2))) == [None, None]
    assert own_beaten(x1, xk) == [(1,), None]
    x1[1] = 0.30
    assert own_beaten(x1, xk) == [None, None]


def test_a_point_its_own_arm_beats_is_shown_but_not_judged():
    """KL's 5e-5 point lies below GRPO's frontier (resolved) but its 2.5e-5 point has more
    pass@1 and more pass@k: the 5e-5 point is not part of the frontier KL reaches, so the claim
    judges 2.5e-5 alone (not shown, not opposite) and says why; the table names the beater."""
    low = _pt("kl", 5e-5, (-0.04, -0.06, -0.02))
    low.beaten_by = (2.5e-5,)
    fr = Frontier(64, "grpo", points={"grpo": [_pt("grpo", 1e-4)],
                                      "kl": [low, _pt("kl", 2.5e-5, (0.0, -0.01, 0.01))]})
    (row,) = frontier_claims(fr)
    assert row["verdict"] == "not shown" and len(row["conditions"]) == 1
    assert "not judged, beaten by the arm's own points: lr 5.0e-05 (by lr 2.5e-05)" in row[
        "numbers"]
    lines = frontier_table(fr)
    assert lines[0].endswith("| beaten by its own |")
    assert lines[3].endswith("| lr 2.5e-05 |") and lines[4].endswith("|  |")
    low.beaten_by = (2.5e-5, 1.25e-5)
    assert frontier_table(fr)[3].endswith("| a mix of lr 2.5e-05 and 1.25e-05 |")
    (row,) = frontier_claims(Frontier(64, "grpo", points={"grpo": [_pt("grpo", 1e-4)],
                                                          "kl": [low]}))
    assert row["verdict"] == "n/a"  # its only point inside GRPO's range is beaten


def test_analyse_frontier_marks_beaten_points_and_sizes_the_family_without_them():
    """GRPO: (.3, .9) and (.5, .7). The method: (.4, .75) at lr 1 is beaten by its own lr 2
    (.45, .85), both inside GRPO's range; so the family is 1 and the claims' interval for lr 2
    is the table's 95% one (constant arms: both are the point itself). GRPO's points beat
    neither of each other."""
    c = lambda v: np.full((2, 3), v)  # noqa: E731
    pk = {"g@1": {1: c(0.3), 8: c(0.9)}, "g@2": {1: c(0.5), 8: c(0.7)},
          "m@1": {1: c(0.4), 8: c(0.75)}, "m@2": {1: c(0.45), 8: c(0.85)}}
    seeds = {n: [0, 1] for n in pk}
    points = {"g": [(1, "g@1"), (2, "g@2")], "m": [(1, "m@1"), (2, "m@2")]}
    fr = analyse_frontier(pk, seeds, points, "g", 8)
    assert [p.beaten_by for p in fr.points["g"]] == [None, None]
    m1, m2 = fr.points["m"]
    assert m1.beaten_by == (2,) and m2.beaten_by is None
    # F(.45) = .9 − .2·.75 = .75; gap .85 − .75 = +.10 at the family level of one comparison
    assert m2.gap_k_family.fmt_abs(3) == m2.gap_k.fmt_abs(3) == "0.100 [0.100, 0.100]"
    assert json.loads(json.dumps(frontier_json(fr)))["points"]["m"][0]["beaten_by"] == [2]


def test_frontier_table_rows_and_family_level():
    """With two points inside GRPO's range, the claims' intervals are at 1 − .05/2 = 97.5%:
    wider than the table's 95% ones (the same SE and df, t(.9875) for t(.975))."""
    g1, gk = np.stack([_const(0.3), _const(0.5)]), np.stack([_const(0.9), _const(0.7)])
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 0.05, (4, 2, 3))
    noise -= noise.mean(axis=(1, 2), keepdims=True)
    x1 = np.stack([_const(0.40) + noise[0], _const(0.45) + noise[1]])
    xk = np.stack([_const(0.8) + noise[2], _const(0.75) + noise[3]])
    got = compare(x1, xk, g1, gk, family=2)
    for row in got:
        iv, fam = row["gap_k"], row["gap_k_family"]
        assert fam.se == iv.se and fam.df == iv.df and fam.estimate == iv.estimate
        assert fam.high - fam.estimate == pytest.approx(t_ppf(0.9875, iv.df) * iv.se)
        assert fam.low < iv.low and iv.high < fam.high
    fr = Frontier(64, "grpo", points={"grpo": [_pt("grpo", 1e-4)], "kl": [_pt("kl", 1e-4)]})
    lines = frontier_table(fr)
    assert lines[0].startswith("| arm | lr | pass@1 | pass@64 |") and len(lines[2:4]) == 2
    assert "below GRPO's pass@1 range" in lines[3]


def test_the_hull_test_is_the_one_sided_t_confidence_of_the_margin():
    """GRPO (.3, .9), (.5, .7). A point at (.4, .8 + d) with d per (seed, problem) has gap_k =
    mean(d): its outside-confidence is the q at which the two-sided interval of gap_k's own
    terms (a t quantile per term) just reaches 0: t_half(terms, q) = gap. Right of GRPO's largest
    pass@1 (x = .5 + d) the margin is its pass@1 over GRPO's largest; left of the peak (x = .2),
    its pass@k over the peak's."""
    from explorl.report.stats import t_half

    g1, gk = np.stack([_const(0.3), _const(0.5)]), np.stack([_const(0.9), _const(0.7)])
    d = np.array([[0.01, 0.03, 0.02], [0.00, 0.02, -0.01]])
    inner, right, left = compare(np.stack([_const(0.4), 0.5 + d, _const(0.2)]),
                                 np.stack([0.8 + d, _const(0.5), 0.9 + d]), g1, gk)
    iv = inner["gap_k"]
    assert t_half(iv.terms, inner["outside"]) == pytest.approx(iv.estimate, rel=1e-6)
    assert 0.5 < inner["outside"] < 0.975  # undecided: its 95% interval holds 0
    assert iv.low < 0 < iv.high
    assert right["where_k"].startswith("above") and right["outside"] == pytest.approx(
        inner["outside"])  # the same margin d, on pass@1
    assert left["where_k"].startswith("below") and left["outside"] == pytest.approx(
        inner["outside"])  # the same margin d, on pass@k over the peak's .9


def test_the_frontier_figure_gives_each_method_its_panel_beyond_two(tmp_path):
    """One or two methods share the baseline's panel (7.6 in wide at 90 dpi: 684 px); three or
    more get one panel each on a grid of three columns (3 × 4.2 in = 1134 px), rows as needed
    (four methods: 2 rows × 3.4 in = 612 px)."""
    from PIL import Image

    from explorl.analysis.frontier import FPoint, Series, draw_frontier

    def series(name, dx):
        return Series(name, [FPoint(0.5 + dx, 0.9 - dx, (0.45 + dx, 0.55 + dx), (0.85, 0.95),
                                    "0.0001"), FPoint(0.55 + dx, 0.8, tag="5e-05")])

    grpo = series("grpo", 0.0)
    one = draw_frontier([grpo, series("a", 0.01)], tmp_path / "one.png", 64, base=(0.4, 0.97),
                        hull=[(0.5, 0.9), (0.55, 0.8)])
    four = draw_frontier([grpo, *[series(m, 0.01 * i) for i, m in enumerate("abcd")]],
                         tmp_path / "four.png", 64, base=(0.4, 0.97))
    assert Image.open(one).size == (684, 468)
    assert Image.open(four).size == (1134, 612)


def test_the_single_panel_legend_fits_inside_the_figure(tmp_path, monkeypatch):
    """The legend beside a single panel (1.9 in of margin) holds the frontier's long name
    ("grpo's frontier (with per-sample mixtures)", wrapped) within the figure's right edge."""
    from explorl.analysis import frontier as F

    edges = []

    def keep(fig, path, dpi=90):
        fig.canvas.draw()
        (legend,) = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
        edges.append((legend.get_window_extent().x1, fig.bbox.x1))

    monkeypatch.setattr(F, "save_figure", keep)
    pts = [F.FPoint(0.5, 0.9, tag="250"), F.FPoint(0.55, 0.8, tag="500")]
    F.draw_frontier([F.Series("grpo", pts), F.Series("kl_cov_x5", pts)], tmp_path / "one.png",
                    64, base=(0.4, 0.97), hull=[(0.4, 0.97), (0.5, 0.9), (0.55, 0.8)],
                    hull_label="frontier (with per-sample mixtures)")
    right, width = edges[0]
    assert right <= width


def test_the_frontier_figure_titles_say_what_the_labels_are(tmp_path, monkeypatch):
    """The title names what the point labels give (the unit, or ``labels``), in the single panel
    and above the small multiples (where the legend's names once leaked into it)."""
    from explorl.analysis import frontier as F

    titles = []

    def keep(fig, path, dpi=90):
        sup = fig._suptitle.get_text() if fig._suptitle is not None else ""
        titles.append(sup + "|" + " ".join(ax.get_title() for ax in fig.axes))

    monkeypatch.setattr(F, "save_figure", keep)

    def series(name, dx):
        return F.Series(name, [F.FPoint(0.5 + dx, 0.9 - dx, tag="100"),
                               F.FPoint(0.55 + dx, 0.8, tag="200")])

    grpo = series("grpo", 0.0)
    F.draw_frontier([grpo, series("a", 0.01)], tmp_path / "one.png", 64, base=(0.4, 0.97))
    F.draw_frontier([grpo, *[series(m, 0.01 * i) for i, m in enumerate("abc")]],
                    tmp_path / "three.png", 64, base=(0.4, 0.97), unit="checkpoint",
                    labels="training step")
    assert "(labels: the learning rate)" in titles[0]
    assert "labels: the training step;" in titles[1]
    assert "[" not in titles[1] and "base (before RL)" not in titles[1]


def _base_pt(value, d1, dk):
    """A GRPO point with its differences from the base model: (estimate, low, high) each."""
    iv = Interval(0.5, 0.45, 0.55, "")
    return Point("grpo", value, f"grpo@{value}", iv, iv, base_1=Interval(*d1, ""),
                 base_k=Interval(*dk, ""))


def test_regime_from_grpos_points_by_hand():
    """The issue's held-out pilot: no lr gains pass@1 with an interval above 0 (lows −0.03,
    −0.01, 0.0, 0.0), so none keeps; every lr narrows, and at 1e-4 it loses 0.201 pass@64 for
    −0.007 pass@1: sharpens. Countdown-like: lr 1.25e-5 gains +0.150 [+0.140, +0.160] and
    keeps pass@64 (−0.007 [−0.017, +0.003] does not lie below 0): learns, and 1e-4 narrows.
    A point gaining +0.05 [+0.03, +0.07] while losing −0.04 [−0.06, −0.02] and another with
    nothing resolved: trades (0.04 ≤ 0.05). Nothing resolved anywhere: changes little."""
    from explorl.report.frontier_report import regime

    held_out = [_base_pt(1e-4, (-0.007, -0.03, 0.02), (-0.201, -0.256, -0.148)),
                _base_pt(5e-5, (0.012, -0.01, 0.03), (-0.113, -0.156, -0.074)),
                _base_pt(2.5e-5, (0.021, 0.0, 0.04), (-0.078, -0.117, -0.043)),
                _base_pt(1.25e-5, (0.020, 0.0, 0.04), (-0.049, -0.082, -0.023))]
    r = regime(Frontier(64, "grpo", points={"grpo": held_out}))
    assert r["regime"] == "RL sharpens more than it learns" and r["keeps"] == []
    assert r["narrows"] == [1e-4, 5e-5, 2.5e-5, 1.25e-5]
    assert "At lr 0.0001, 5.0e-05, 2.5e-05, 1.25e-05 grpo loses pass@64" in r["text"]
    learns = [_base_pt(1e-4, (0.142, 0.123, 0.161), (-0.121, -0.150, -0.091)),
              _base_pt(1.25e-5, (0.150, 0.140, 0.160), (-0.007, -0.017, 0.003))]
    r = regime(Frontier(64, "grpo", points={"grpo": learns}))
    assert (r["regime"], r["keeps"], r["narrows"]) == ("RL learns", [1.25e-5], [1e-4])
    assert ("At lr 1.25e-05 grpo gains pass@1 and keeps pass@64; at lr 0.0001 it loses "
            "pass@64") in r["text"]
    trades = [_base_pt(1e-4, (0.05, 0.03, 0.07), (-0.04, -0.06, -0.02)),
              _base_pt(5e-5, (0.01, -0.01, 0.03), (-0.01, -0.03, 0.01))]
    assert regime(Frontier(64, "grpo", points={"grpo": trades}))["regime"] == \
        "RL trades pass@k for pass@1"
    # one narrowing lr whose loss exceeds its gain is enough: 0.06 > 0.05
    one = [*trades, _base_pt(2.5e-5, (0.05, 0.03, 0.07), (-0.06, -0.08, -0.04))]
    assert regime(Frontier(64, "grpo", points={"grpo": one}))["regime"] == \
        "RL sharpens more than it learns"
    little = [_base_pt(1e-4, (0.01, -0.01, 0.03), (-0.01, -0.03, 0.01))]
    r = regime(Frontier(64, "grpo", points={"grpo": little}))
    assert r["regime"] == "RL changes little" and "neither gains pass@1" in r["text"]
    assert regime(Frontier(64, "grpo", points={"grpo": [_pt("grpo", 1e-4)]})) is None  # no base
    assert regime(None) is None


def test_the_figure_draws_a_point_its_own_method_beats_with_an_open_marker():
    """(.40, .85) is beaten by (.50, .90): one open (white-faced) marker over it, and the
    drawing says so (the legend then explains open markers); a method whose points are all on
    its own frontier gets none."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from explorl.analysis.frontier import FPoint, Series, _draw_series

    fig, ax = plt.subplots()
    s = Series("m", [FPoint(0.40, 0.85), FPoint(0.50, 0.90), FPoint(0.60, 0.80)])
    assert _draw_series(ax, s, "C0", False) is True
    opened = [ln for ln in ax.lines if ln.get_markerfacecolor() == "white"]
    assert len(opened) == 1 and list(opened[0].get_xdata()) == [0.40]
    ax2 = fig.add_subplot(2, 1, 2)
    assert _draw_series(ax2, Series("g", [FPoint(0.5, 0.9), FPoint(0.6, 0.8)]), "k", True) is False
    # the study says which (its rule also weighs noise): that is what is drawn
    ax3 = fig.add_subplot(2, 2, 4)
    told = Series("m", [FPoint(0.40, 0.85, beaten=False), FPoint(0.60, 0.80, beaten=True)])
    assert _draw_series(ax3, told, "C1", False) is True
    (opened,) = [ln for ln in ax3.lines if ln.get_markerfacecolor() == "white"]
    assert list(opened.get_xdata()) == [0.60]
    plt.close(fig)


# ----------------------------------------------------------------------------- mixtures


def _mixture_by_enumeration(ca: int, cb: int, n: int, k: int, lam: float) -> float:
    """pass@k of drawing k responses, each from A with probability λ (else B), without
    replacement from each run's n (c of them right): enumerate how many come from A."""
    from math import comb

    fail = sum(comb(k, j) * lam ** j * (1 - lam) ** (k - j)
               * comb(n - ca, j) / comb(n, j) * comb(n - cb, k - j) / comb(n, k - j)
               for j in range(k + 1))
    return 1 - fail


def test_a_per_sample_mixtures_pass_at_k_by_hand():
    """n = 4, A right 2 times, B once, k = 2, λ = ½. A's (1 − p)^j estimates C(2, j)/C(4, j) =
    1, ½, 1/6; B's C(3, j)/C(4, j) = 1, ¾, ½. Two samples: both from B (¼) fail with prob ½,
    one each (½) with ½·¾, both from A (¼) with 1/6: fail = ⅛ + 3/16 + 1/24 = 17/48, pass@2 =
    31/48 (the sampling enumerated agrees; and at 5 and 1 of 16, k = 8, λ = .3). At λ = 0 and 1
    the mixture is B's and A's own pass@2, ½ and 5/6."""
    from explorl.report.frontier import fail_estimates, mixture_passk

    qa, qb = fail_estimates(np.array([2.0, 4.0]), 2), fail_estimates(np.array([1.0, 4.0]), 2)
    assert qa == pytest.approx([1, 0.5, 1 / 6]) and qb == pytest.approx([1, 0.75, 0.5])
    got = mixture_passk(qa, qb, np.array([0.0, 0.5, 1.0]))
    assert got == pytest.approx([0.5, 31 / 48, 5 / 6])
    assert got[1] == pytest.approx(_mixture_by_enumeration(2, 1, 4, 2, 0.5))
    assert mixture_passk(fail_estimates(np.array([5.0, 16.0]), 8),
                         fail_estimates(np.array([1.0, 16.0]), 8), np.array([0.3]))[0] == \
        pytest.approx(_mixture_by_enumeration(5, 1, 16, 8, 0.3))
    with pytest.raises(ValueError, match="at least 8 samples"):
        fail_estimates(np.array([1.0, 4.0]), 8)


def test_grpos_frontier_holds_its_per_sample_mixtures():
    """Two problems, n = 4, k = 2, two seeds alike. GRPO at lr a: 2 and 2 right (pass@1 .5,
    pass@2 5/6 on each: .8333); at lr b: 4 and 1 right (pass@1 (1 + .25)/2 = .625, pass@2 (1 +
    .5)/2 = .75). Their chord at pass@1 .5625 reads (.8333 + .75)/2 = .7917; sampling each
    response from a or b with λ = ½ reaches, on problem 1, fail = ¼·q_a(2)·1 = 1/24 (b never
    fails it), on problem 2, fail = 17/48 (the previous test): pass@2 (23/24 + 31/48)/2 =
    .8021. An arm at (.5625, .80) lies above the chord (+.0083) but below the mixture: its
    gap_k is .80 − .8021 = −.0021, not +.0083."""
    from explorl.report.frontier import analyse_frontier, fail_estimates, mixture_passk

    def arrays(c):
        c = np.array([c, c], float)  # two seeds alike
        p1 = c / 4
        p2 = 1 - np.array([[fail_estimates(np.array([x, 4.0]), 2)[2] for x in row] for row in c])
        return {1: p1, 2: p2}, np.stack([c, np.full_like(c, 4.0)])

    (pa, ca), (pb, cb) = arrays([2, 2]), arrays([4, 1])
    arm = {1: np.full((2, 2), 0.5625), 2: np.full((2, 2), 0.80)}
    pk = {"g@a": pa, "g@b": pb, "m@x": arm}
    seeds = {n: [0, 1] for n in pk}
    points = {"g": [("a", "g@a"), ("b", "g@b")], "m": [("x", "m@x")]}
    chord = analyse_frontier(pk, seeds, points, "g", 2)
    mixed = analyse_frontier(pk, seeds, points, "g", 2, counts={"g@a": ca, "g@b": cb})
    assert not chord.mixed and mixed.mixed
    half = (23 / 24 + 31 / 48) / 2
    q = [fail_estimates(np.array([c, 4.0]), 2) for c in (2, 2, 4, 1)]
    assert half == pytest.approx(np.mean([mixture_passk(q[0], q[2], np.array([0.5]))[0],
                                          mixture_passk(q[1], q[3], np.array([0.5]))[0]]))
    assert chord.points["m"][0].gap_k.estimate == pytest.approx(0.80 - (5 / 6 + 0.75) / 2)
    got = mixed.points["m"][0].gap_k
    assert got.estimate == pytest.approx(0.80 - half)
    assert (0.5625, pytest.approx(half)) in [(x, y) for x, y in zip(mixed.hull.xs,
                                                                     mixed.hull.ys)]
