"""The study's bootstrap intervals against cases worked out by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest

from explorl.report.stats import (
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
    ½, df = P − 1 = 1: the t interval is ½ ± 12.706·½ = [−5.85, +6.85], which a difference of
    probabilities clips to [−1, +1]."""
    from explorl.report.stats import crossed_interval

    d = np.array([[1.0, 0.0]])
    raw = crossed_interval(d)
    assert raw.estimate == 0.5 and raw.se == pytest.approx(0.5) and raw.df == pytest.approx(1)
    assert (raw.low, raw.high) == pytest.approx((0.5 - 12.7062047 * 0.5, 0.5 + 12.7062047 * 0.5))
    iv = passk_diff(d, np.array([[0.0, 0.0]]), paired_seeds=True)
    assert (iv.estimate, iv.low, iv.high) == (0.5, -1.0, 1.0) and iv.se == raw.se


def test_levels_clip_to_probabilities():
    """An arm's mean pass@k near 1 with a wide interval: its upper end stops at 1."""
    from explorl.report.frontier import mean_interval

    iv = mean_interval(np.array([[1.0, 0.9], [1.0, 1.0]]))
    assert iv.high == 1.0 and iv.low < iv.estimate < 1.0


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
    from explorl.report.stats import t_cdf, t_ppf

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
    from explorl.report.stats import crossed_interval

    prob = np.array([0.1, -0.2, 0.3, 0.0, 0.05])
    iv = crossed_interval(np.tile(prob, (4, 1)))
    assert iv.se == pytest.approx(np.sqrt(prob.var(ddof=1) / 5))
    assert iv.df == pytest.approx(4)  # the problem term alone: P − 1


def _nulls(n: int, seeds: int, problems: int, share: float, *, bimodal: bool = False,
           seed: int = 0, chunk: int = 250):
    """``n`` simulated null studies (true mean 0) of ``seeds`` × ``problems``, the seeds'
    part carrying ``share`` of Var(mean d), the rest split evenly between the problems' and
    the residual's part; yields each null's (mean, MS_seed, MS_problem, MS_resid), vectorised
    in chunks. ``bimodal``: a seed fails (its effect −h) with probability 1/5, else 0,
    centred (+h/5), h set so that the seeds' part keeps its share."""
    rng = np.random.default_rng(seed)
    var_s = share * seeds  # Var(mean d) = 1
    var_p = (1 - share) / 2 * problems
    var_r = (1 - share) / 2 * seeds * problems
    for lo in range(0, n, chunk):
        m = min(chunk, n - lo)
        if bimodal:
            h = np.sqrt(var_s / 0.16)
            eff = np.where(rng.random((m, seeds, 1)) < 0.2, -h, 0.0) + 0.2 * h
        else:
            eff = rng.normal(0, np.sqrt(var_s), (m, seeds, 1))
        d = (eff + rng.normal(0, np.sqrt(var_p), (m, 1, problems))
             + rng.normal(0, np.sqrt(var_r), (m, seeds, problems)))
        rows, cols, grand = d.mean(2), d.mean(1), d.mean((1, 2))
        resid = d - rows[:, :, None] - cols[:, None, :] + grand[:, None, None]
        ms_s = problems * rows.var(1, ddof=1)
        ms_p = seeds * cols.var(1, ddof=1)
        ms_r = (resid ** 2).sum((1, 2)) / ((seeds - 1) * (problems - 1))
        yield from zip(grand, ms_s, ms_p, ms_r)


def _null_coverage(seeds: int, problems: int, share: float, *, n: int, bimodal: bool = False,
                   pooled: bool = False) -> float:
    """Share of ``n`` null studies whose 95% interval (``crossed_terms`` and ``t_half``, the
    interval ``crossed_interval`` builds; ``pooled``: the older rule, one t at the terms'
    Satterthwaite df) holds 0."""
    from explorl.report.stats import crossed_terms, satterthwaite, t_half, t_ppf

    hit = 0
    for mean, ms_s, ms_p, ms_r in _nulls(n, seeds, problems, share, bimodal=bimodal):
        terms = crossed_terms(ms_s, ms_p, ms_r, seeds, problems)
        if pooled:
            half = t_ppf(0.975, satterthwaite(list(terms))) * np.sqrt(sum(v for v, _ in terms))
        else:
            half = t_half(terms)
        hit += abs(mean) <= half
    return hit / n


def test_the_interval_is_the_one_the_coverage_test_simulates():
    """``crossed_interval``'s bounds are the estimate ± ``t_half`` of ``crossed_terms``."""
    from explorl.report.stats import _mean_squares, crossed_interval, crossed_terms, t_half

    d = np.random.default_rng(3).normal(0, 1, (3, 40)) + np.array([[0.5], [-0.2], [0.1]])
    iv = crossed_interval(d)
    terms = crossed_terms(*_mean_squares(d), 3, 40)
    assert np.ravel(iv.terms[:2]) == pytest.approx(np.ravel(terms)) and terms[0][1] == 2
    assert iv.high - iv.estimate == pytest.approx(t_half(terms))


N_NULLS = 2000
MC_SE = float(np.sqrt(0.95 * 0.05 / N_NULLS))  # .0049


@pytest.mark.parametrize("seeds, problems, share, bimodal", [
    (3, 1024, 0.8, False), (3, 1024, 0.9, False),  # the v3 / v4 designs, the seeds dominate
    (4, 1024, 0.8, False), (4, 1024, 0.9, False),
    (3, 256, 0.95, False), (4, 256, 0.5, False),
    (3, 1024, 0.5, True), (4, 1024, 0.5, True),  # one seed in five fails
])
def test_a_null_at_the_studies_designs_is_covered_at_least_at_the_nominal_rate(
        seeds, problems, share, bimodal):
    """2,000 simulated null studies per design: the 95% interval holds 0 in at least 95% of
    them, up to the simulation's error (less than 2 Monte-Carlo SEs below, .0098), and is not
    absurdly wide (below 99%)."""
    cover = _null_coverage(seeds, problems, share, n=N_NULLS, bimodal=bimodal)
    assert 0.95 - 2 * MC_SE < cover < 0.99, cover


def test_one_pooled_t_at_satterthwaites_df_under_covers_where_seeds_dominate():
    """The rule the per-term quantiles replace: at 3 seeds × 1024 problems with the seeds
    carrying 80% of the variance, one t at the Satterthwaite df holds 0 in about 92-93% of
    nulls, more than 2 Monte-Carlo SEs below 95%."""
    assert _null_coverage(3, 1024, 0.8, n=N_NULLS, pooled=True) < 0.95 - 2 * MC_SE


def test_the_mde_is_the_intervals_own():
    """At the measured design the MDE is √(Σ (t(.975, df_i) + t(.80, df_i))² · v_i) over the
    interval's own terms: the seeds' with df 3, the problems' with its own df."""
    import math

    from explorl.report.stats import DF_CAP, t_ppf

    rng = np.random.default_rng(2)
    a = rng.random((4, 50))
    iv = passk_diff(a + rng.normal(0, 0.05, (4, 1)), a, paired_seeds=True)
    want = math.sqrt(sum((t_ppf(0.975, min(math.floor(df), DF_CAP)) + t_ppf(0.8, min(
        math.floor(df), DF_CAP))) ** 2 * v for v, df in iv.terms if v > 0))
    assert iv.terms[0][1] == 3 and iv.mde == pytest.approx(want)
    assert iv.power.se() == pytest.approx(iv.se) and iv.power.dof() == pytest.approx(iv.df)


def test_a_bootstrapped_bound_reports_its_monte_carlo_error():
    """The bootstrap doubles its replicates until the bounds' MC error is below the target;
    a verdict needs the bound to clear the null by more than that error."""
    from explorl.report.stats import bootstrap, percentile_mc_error

    x = np.random.default_rng(0).normal(0.0, 1.0, 200)
    reps, lo, hi, err = bootstrap(lambda w: w @ x / len(x), len(x), first=500, target=0.004)
    assert err < 0.004 and len(reps) > 500 and lo < x.mean() < hi
    assert percentile_mc_error(reps) == err
    close = Interval(0.01, 0.0005, 0.02, "x", mc_error=0.001)
    assert verdict(close, +1) == "not shown"
    assert verdict(Interval(0.01, 0.0015, 0.02, "x", mc_error=0.001), +1) == "shown"
