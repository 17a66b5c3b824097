"""The study's bootstrap intervals against cases worked out by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest

from explorl.study.stats import (
    Interval,
    passk_diff,
    problem_passk,
    seed_interval,
    verdict,
)


def test_constant_values_give_a_point_interval():
    iv = seed_interval([0.7, 0.7, 0.7])
    assert (iv.estimate, iv.low, iv.high) == pytest.approx((0.7, 0.7, 0.7))
    assert seed_interval([None, None]) is None
    assert seed_interval([None, 0.5]).estimate == 0.5  # unmeasured runs are left out


def test_paired_shift_is_exact():
    """a = b + 0.1 on every problem and seed: every resample's difference is 0.1."""
    rng = np.random.default_rng(1)
    b = rng.random((3, 50))
    iv = passk_diff(b + 0.1, b, paired_seeds=True)
    assert iv.estimate == pytest.approx(0.1)
    assert iv.low == pytest.approx(0.1) and iv.high == pytest.approx(0.1)


def test_two_problem_interval_by_hand():
    """One seed, a = [1, 0], b = [0, 0]: d = [1, 0], mean ½, var over problems ½, SE = √(½/2) =
    ½, df = P − 1 = 1: the interval is ½ ± 12.706·½."""
    iv = passk_diff(np.array([[1.0, 0.0]]), np.array([[0.0, 0.0]]), paired_seeds=True)
    assert iv.estimate == 0.5 and iv.se == pytest.approx(0.5) and iv.df == pytest.approx(1)
    assert (iv.low, iv.high) == pytest.approx((0.5 - 12.7062047 * 0.5, 0.5 + 12.7062047 * 0.5))


def test_unpaired_seeds_against_a_single_base_row():
    """Three seeds of a method against one base evaluation: b has one row."""
    a = np.array([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
    b = np.array([[0.5, 0.5]])
    iv = passk_diff(a, b, paired_seeds=False)
    assert (iv.estimate, iv.low, iv.high) == (0.5, 0.5, 0.5)
    with pytest.raises(ValueError, match="problems"):
        passk_diff(np.zeros((1, 3)), np.zeros((1, 2)), paired_seeds=False)
    with pytest.raises(ValueError, match="paired seeds"):
        passk_diff(np.zeros((3, 2)), np.zeros((1, 2)), paired_seeds=True)


def test_intervals_are_reproducible_and_cover_the_estimate():
    rng = np.random.default_rng(0)
    a, b = rng.random((3, 40)), rng.random((3, 40))
    one, two = passk_diff(a, b, paired_seeds=True), passk_diff(a, b, paired_seeds=True)
    assert one == two and one.low <= one.estimate <= one.high and one.low < one.high


@pytest.mark.parametrize(
    "low, high, direction, want",
    [(0.1, 0.3, +1, "shown"), (0.1, 0.3, -1, "opposite"), (-0.3, -0.1, -1, "shown"),
     (-0.3, -0.1, +1, "opposite"), (-0.1, 0.2, +1, "not shown"), (0.0, 0.2, +1, "not shown")],
)
def test_verdicts(low, high, direction, want):
    assert verdict(Interval((low + high) / 2, low, high, "x"), direction) == want
    assert verdict(None, +1) == "n/a"


def test_problem_passk_uses_the_unbiased_estimator(tmp_path):
    """n = 4 samples, c = 1 right: pass@1 = 1/4, pass@2 = 1 − C(3,2)/C(4,2) = 1/2, pass@4 = 1."""
    path = tmp_path / "problems.jsonl"
    rows = [{"responses": ["a", "b", "c", "d"], "n_correct": 1},
            {"responses": ["a", "b", "c", "d"], "n_correct": 0}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = problem_passk(path, [1, 2, 4])
    assert got[1] == pytest.approx([0.25, 0.0]) and got[2] == pytest.approx([0.5, 0.0])
    assert got[4] == pytest.approx([1.0, 0.0])


# ----------------------------------------------------------------------------- t intervals


def test_t_quantiles_and_cdf_against_tables():
    """Student's t from the incomplete beta function: table values of t(.975, df) and
    t(.80, df), the CDF at 2 with 5 df, and the normal's at df = ∞."""
    from explorl.study.stats import t_cdf, t_ppf

    assert t_ppf(0.975, 1) == pytest.approx(12.7062047, abs=1e-6)
    assert t_ppf(0.975, 3) == pytest.approx(3.1824463, abs=1e-6)
    assert t_ppf(0.975, 10) == pytest.approx(2.2281389, abs=1e-6)
    assert t_ppf(0.80, 3) == pytest.approx(0.9784723, abs=1e-6)
    assert t_ppf(0.975, float("inf")) == pytest.approx(1.9599640, abs=1e-6)
    assert t_ppf(0.025, 3) == pytest.approx(-3.1824463, abs=1e-6)
    assert t_cdf(2.0, 5) == pytest.approx(0.9490303, abs=1e-6)
    assert t_cdf(0.0, 2.5) == pytest.approx(0.5)


def test_seed_interval_is_the_t_interval_over_runs():
    """The long run's KL-Cov ×5 per-seed pass@64 differences 0.039, 0.015, 0.044, 0.000: mean
    .0245, SD .02060, SE .01030, t(.975, 3) = 3.1824: [−.0083, +.0573]."""
    iv = seed_interval([0.039, 0.015, 0.044, 0.000])
    assert iv.estimate == pytest.approx(0.0245) and iv.df == 3
    assert iv.se == pytest.approx(np.std([0.039, 0.015, 0.044, 0.0], ddof=1) / 2)
    assert (iv.low, iv.high) == pytest.approx((0.0245 - 3.1824463 * iv.se,
                                               0.0245 + 3.1824463 * iv.se))
    assert iv.low < 0 < iv.high and verdict(iv, +1) == "not shown"


def test_crossed_variance_holds_the_problems_part_the_seed_means_miss():
    """d[s, p] = problem_p only (every seed the same): the seed means agree exactly, so a t
    over seeds alone would give SE 0; the crossed SE is √(var_p / P) from the problems' part."""
    from explorl.study.stats import crossed_interval

    prob = np.array([0.1, -0.2, 0.3, 0.0, 0.05])
    iv = crossed_interval(np.tile(prob, (4, 1)))
    assert iv.se == pytest.approx(np.sqrt(prob.var(ddof=1) / 5))
    assert iv.df == pytest.approx(4)  # the problem term alone: P − 1


def _null_coverage(sd_seed: float, sd_problem: float, sd_resid: float, *, n: int,
                   seeds: int = 4, problems: int = 64, seed: int = 0) -> float:
    """Share of ``n`` simulated null studies (true mean 0) whose 95% interval holds 0."""
    from explorl.study.stats import t_cdf, variance_components

    rng = np.random.default_rng(seed)
    d = (rng.normal(0, sd_seed, (n, seeds, 1)) + rng.normal(0, sd_problem, (n, 1, problems))
         + rng.normal(0, sd_resid, (n, seeds, problems)))
    hit = 0
    for x in d:
        pw = variance_components(x)
        hit += t_cdf(abs(float(x.mean())) / pw.se_obs, pw.df) < 0.975
    return hit / n


@pytest.mark.parametrize("sd_seed, sd_problem, sd_resid", [
    (0.02, 0.0, 0.05),   # the seeds dominate (KL-Cov ×5 at 1000 steps): df ≈ 3
    (0.0, 0.05, 0.05),   # the problems dominate (a frontier gap at 200 steps): df large
    (0.01, 0.03, 0.10),  # both
])
def test_a_null_at_four_seeds_is_covered_at_the_nominal_rate(sd_seed, sd_problem, sd_resid):
    """1500 simulated null studies of 4 seeds × 64 problems: the 95% interval holds 0 in 95%
    of them, within 3 Monte-Carlo SEs (√(.95·.05/1500) = .0056)."""
    cover = _null_coverage(sd_seed, sd_problem, sd_resid, n=1500)
    assert abs(cover - 0.95) < 3 * np.sqrt(0.95 * 0.05 / 1500), cover


def test_the_mde_is_the_intervals_own():
    """At the measured design the MDE is (t(.975, df) + t(.80, df)) · SE of the interval."""
    from explorl.study.stats import t_ppf

    rng = np.random.default_rng(2)
    a = rng.random((4, 50))
    iv = passk_diff(a + rng.normal(0, 0.05, (4, 1)), a, paired_seeds=True)
    assert iv.mde == pytest.approx((t_ppf(0.975, iv.df) + t_ppf(0.8, iv.df)) * iv.se)
    assert iv.power.se() == pytest.approx(iv.se) and iv.power.dof() == pytest.approx(iv.df)


def test_a_bootstrapped_bound_reports_its_monte_carlo_error():
    """The bootstrap doubles its replicates until the bounds' MC error is below the target;
    a verdict needs the bound to clear the null by more than that error."""
    from explorl.study.stats import bootstrap, percentile_mc_error

    x = np.random.default_rng(0).normal(0.0, 1.0, 200)
    reps, lo, hi, err = bootstrap(lambda w: w @ x / len(x), len(x), first=500, target=0.004)
    assert err < 0.004 and len(reps) > 500 and lo < x.mean() < hi
    assert percentile_mc_error(reps) == err
    close = Interval(0.01, 0.0005, 0.02, "x", mc_error=0.001)
    assert verdict(close, +1) == "not shown"
    assert verdict(Interval(0.01, 0.0015, 0.02, "x", mc_error=0.001), +1) == "shown"
