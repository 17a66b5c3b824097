"""Confidence intervals of the study: t intervals over seeds whose variance includes the
problems' part, from the two-way (seeds × problems) layout every comparison of runs has.

Every claim of the study is judged by an interval, not by a threshold on means. A comparison of
runs is a mean of an array d[s, p] over S seeds and P test problems (``crossed``): the
difference of two arms' per-problem pass@k (paired by seed and problem), an arm's own pass@k,
or a linear combination of several arms' (a frontier gap, linearised at the point estimates).
The problems are the same for every seed (the layout is crossed, not nested), so

    d[s, p] = μ + seed_s + problem_p + e[s, p],
    Var(mean d) = σ²_problem / P + σ²_seed / S + σ²_resid / (S·P),

estimated without bias by two-way ANOVA mean squares as a sum of two terms:

    SE² = A + B,  A = MS_seed / (S·P) = var_s(mean_p d) / S        (df S − 1)
                  B = max(0, MS_problem − MS_resid) / (S·P)         (df of the difference)

(the t interval over the seeds' means plus the problems' part, which seeds share and which
their spread therefore never shows). Each term gets its own t quantile (``t_half``):

    half-width = √(t²_{0.975, S−1} · A + t²_{0.975, df_B} · B)

so the seeds' term always carries the tails of S − 1 degrees of freedom. A single pooled t
with Satterthwaite's df under-covers at few seeds: where the seeds dominate, a draw whose seed
means happen to agree gives a small A, hence a large pooled df and a short quantile exactly
when the SE is too small (3 seeds × 1024 problems, seeds carrying 70–95% of the variance:
coverage 0.92–0.93). The per-term interval holds 0.95 or more there (``tests/test_study_stats``
simulates it). Differences of pass@k are clipped to [−1, 1] and levels to [0, 1] (``bounds``):
a bound beyond what a probability allows says nothing.

- ``passk_diff``: two arms on the same problems (paired by seed when both ran the same seeds;
  the base model is one evaluation subtracted from every run);
- ``crossed_interval``: the mean of any (seeds, problems) array, or of a linear combination;
- ``seed_interval``: the mean over runs of a per-run number (an entropy ratio, a paired per-seed
  difference): the t interval over runs (df n − 1);
- ``Power``: the variance components and the minimum detectable effect (MDE) of the same terms
  the interval uses: MDE = √(Σ (t_{0.975, df_i} + t_{0.80, df_i})² · v_i) (one term: (t_{0.975,
  df} + t_{0.80, df}) · SE).

The few bootstrapped quantities (a fit's R² over runs) report the Monte-Carlo error of their
bounds (``percentile_mc_error``) and grow the number of resamples until it is below
``MC_TARGET``. ``verdict`` reads an interval: **shown** when it excludes 0 on the claimed side
by more than its Monte-Carlo error, **opposite** when it does so on the other side, **not
shown** otherwise.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from explorl.analysis.passk import pass_at_k
from explorl.report.tdist import betainc, t_cdf, t_ppf  # noqa: F401  (betainc re-exported)

LEVEL = 0.95
POWER = 0.80
MC_TARGET = 0.001  # a bootstrapped bound's Monte-Carlo error must be below this
N_BOOT = 4000  # the first batch of a bootstrap (more follow until MC_TARGET is met)
MAX_BOOT = 64000
BOOT_SEED = 0


# ----------------------------------------------------------------------------- intervals

Terms = tuple[tuple[float, float], ...]  # variance terms (value, its degrees of freedom)
DF_CAP = 1000  # a term's df above this counts as this (t 1.962 for ∞'s 1.960: a hair wider)


def _df_key(df: float) -> float:
    """A term's df for its quantile: rounded down (a smaller df gives a wider quantile) and
    capped at ``DF_CAP``, so that the quantiles come from a small cache."""
    if not math.isfinite(df) or df >= DF_CAP:
        return float(DF_CAP)
    return float(max(1, math.floor(df)))


def t_half(terms: Terms, q: float = 1 - (1 - LEVEL) / 2) -> float:
    """Half-width of a sum of variance terms with a t quantile per term:
    √(Σ t²_{q, df_i} · v_i). One term: t_{q, df} · SE, the usual t interval."""
    return math.sqrt(sum(t_ppf(q, _df_key(df)) ** 2 * v for v, df in terms if v > 0))


def mde_of(terms: Terms, level: float = LEVEL, power: float = POWER) -> float:
    """Minimum detectable effect of a sum of variance terms: √(Σ (t_{1−α/2, df_i} +
    t_{power, df_i})² · v_i); one term: (t_{1−α/2, df} + t_{power, df}) · SE."""
    return math.sqrt(sum(mde_factor(_df_key(df), level, power) ** 2 * v
                         for v, df in terms if v > 0))


def mde_factor(df: float, level: float = LEVEL, power: float = POWER) -> float:
    """(t_{1 − α/2, df} + t_{power, df}): the MDE in SEs of a two-sided ``level`` interval."""
    return t_ppf(1 - (1 - level) / 2, df) + t_ppf(power, df)


Z_ALPHA = t_ppf(0.975, math.inf)  # 1.960: the 95% intervals' level, many degrees of freedom
Z_POWER = t_ppf(POWER, math.inf)  # 0.842: 80% power
MDE_Z = Z_ALPHA + Z_POWER  # 2.802: the MDE factor when the degrees of freedom are many


ONE_RUN = "1 run: no interval"  # ``seed_interval`` of one value: the value, no spread


@dataclass(frozen=True)
class Interval:
    """A point estimate with its interval: ``se``, ``df`` (Satterthwaite's, descriptive) and
    the variance ``terms`` of a t interval; ``mc_error``, the Monte-Carlo error of the bounds
    of a bootstrapped one (0 for a t interval)."""

    estimate: float
    low: float
    high: float
    how: str  # what the interval is over, for the documents
    power: Power | None = None  # variance components: the minimum detectable effect
    se: float | None = None
    df: float | None = None
    mc_error: float = 0.0
    terms: Terms | None = None

    @property
    def spread(self) -> bool:
        """Whether the interval measures a spread: not a single run's value (``ONE_RUN``),
        which no verdict may be read from."""
        return self.how != ONE_RUN

    @property
    def mde(self) -> float | None:
        """Minimum detectable effect of the comparison (``Power``); None when not computed."""
        return None if self.power is None else self.power.mde()

    def fmt(self, digits: int = 3) -> str:
        return f"{self.estimate:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}]"

    def fmt_abs(self, digits: int = 3) -> str:
        """Without signs: for quantities that are not differences (ratios, R²)."""
        return f"{self.estimate:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"

    def to_json(self) -> dict:
        out = {"estimate": self.estimate, "low": self.low, "high": self.high, "how": self.how}
        if self.se is not None:
            out |= {"se": self.se, "df": _finite(self.df)}
        if self.terms:
            out["terms"] = [[v, _finite(df)] for v, df in self.terms]
        out["mc_error"] = self.mc_error
        return out | ({"power": self.power.to_json()} if self.power is not None else {})


def _finite(x: float | None) -> float | None:
    """A number for JSON (∞ written as None)."""
    return None if x is None or not math.isfinite(x) else float(x)


def verdict(iv: Interval | None, direction: int, null: float = 0.0) -> str:
    """``shown`` / ``opposite`` / ``not shown`` for the claim that the quantity is above
    (``direction`` +1) or below (−1) ``null``: an interval excludes it only when its bound
    clears it by more than the bound's Monte-Carlo error; ``n/a`` without an interval, or from
    one run (no spread to judge a difference by)."""
    if iv is None or not iv.spread:
        return "n/a"
    above, below = iv.low > null + iv.mc_error, iv.high < null - iv.mc_error
    if (above and direction > 0) or (below and direction < 0):
        return "shown"
    if above or below:
        return "opposite"
    return "not shown"


def one_sided_confidence(iv: Interval) -> float:
    """The confidence that the quantity is above 0 by the interval's own rule: with the level
    L at which its two-sided interval just reaches 0, (1 + L)/2 when the estimate is above 0,
    (1 − L)/2 below (so ≥ 0.975 exactly when the 95% interval lies above 0)."""
    est = iv.estimate
    terms = iv.terms or (((iv.se or 0.0) ** 2, iv.df if iv.df is not None else math.inf),)
    if not any(v > 0 for v, _ in terms):
        return 1.0 if est > 0 else 0.0 if est < 0 else 0.5
    if est == 0:
        return 0.5
    lo, hi = 0.5, 1.0 - 1e-12  # q = (1 + L)/2: the half-width grows with q
    if t_half(terms, hi) <= abs(est):
        q = hi
    else:
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if t_half(terms, mid) < abs(est) else (lo, mid)
        q = 0.5 * (lo + hi)
    return q if est > 0 else 1.0 - q


def t_interval(estimate: float, se: float, df: float, how: str, level: float = LEVEL,
               power: Power | None = None, terms: Terms | None = None,
               bounds: tuple[float, float] | None = None) -> Interval:
    """estimate ± the half-width of ``terms`` at ``level`` (``t_half``; default one term,
    se² with ``df``: t_{(1 + level)/2, df} · se), clipped to ``bounds`` (what the quantity
    can be: [−1, 1] for a difference of probabilities)."""
    terms = terms if terms is not None else ((float(se) ** 2, float(df)),)
    half = t_half(terms, 1 - (1 - level) / 2) if se > 0 else 0.0
    low, high = float(estimate - half), float(estimate + half)
    if bounds is not None:
        low, high = max(low, bounds[0]), min(high, bounds[1])
    return Interval(float(estimate), low, high, how, power=power, se=float(se), df=float(df),
                    terms=tuple((float(v), float(d)) for v, d in terms))


def satterthwaite(terms: list[tuple[float, float]]) -> float:
    """Degrees of freedom of a sum of variance terms (value, its df): (Σ v)² / Σ v² / df;
    ∞ when every term is 0 or has infinite df (descriptive: the interval uses ``t_half``)."""
    total = sum(v for v, _ in terms)
    den = sum(v * v / df for v, df in terms if v > 0 and math.isfinite(df))
    if total <= 0 or den <= 0:
        return math.inf
    return total * total / den


def seed_interval(values: list[float | None], level: float = LEVEL) -> Interval | None:
    """Mean of per-run values with its t interval over runs (df n − 1; one run: the value with
    no spread); None when no value was measured."""
    vals = np.array([float(v) for v in values if v is not None])
    if len(vals) == 0:
        return None
    n = len(vals)
    if n == 1:
        return Interval(float(vals[0]), float(vals[0]), float(vals[0]), ONE_RUN)
    se = float(vals.std(ddof=1) / np.sqrt(n))
    return t_interval(float(vals.mean()), se, n - 1, f"t over {n} runs (df {n - 1})", level)


# ----------------------------------------------------------------------------- the crossed layout


@dataclass(frozen=True)
class Power:
    """Variance components of a mean of d[s, p] (seeds × problems) and what they detect.

    A two-way crossed model without replication, d[s, p] = μ + seed_s + problem_p + e[s, p],
    with ANOVA estimators (``variance_components``). The interval's own variance ``se_obs``² =
    MS_seed / (S·P) + max(0, MS_problem − MS_resid) / (S·P), its ``terms`` (each with its df)
    give the minimum detectable effect at the measured design (``mde_of``: two-sided 5%, 80%
    power). At another design (S′ seeds, P′ problems) the components project SE²(S′, P′) =
    σ²_problem / P′ + (σ²_seed + σ²_resid / P′) / S′, the seeds' part with df S′ − 1. With one
    seed the seed and residual terms cannot be told apart: SE² = var(d over problems) / P,
    σ²_seed is None (the MDE then ignores seed-to-seed variation; the documents say so).
    """

    seeds: int
    problems: int
    var_problem: float
    var_seed: float | None
    var_resid: float
    se_obs: float | None = None  # the interval's SE at the measured design
    df: float | None = None  # and its (Satterthwaite) degrees of freedom
    extra_var: float = 0.0  # SE² from another arm's seeds (unpaired arms), not projected
    terms_obs: Terms | None = None  # the interval's variance terms at the measured design

    def _design(self, seeds: int | None, problems: int | None) -> tuple[int, int]:
        return seeds or self.seeds, problems or self.problems

    def _terms(self, s: int, p: int) -> list[tuple[float, float]]:
        """The projected SE² as terms: (seed part, df S − 1), (problem part, df P − 1)."""
        seed = ((self.var_seed or 0.0) + self.var_resid / p) / s
        if self.var_seed is None:  # one seed: no seed term, the residual is the problems'
            return [(self.var_problem / p + self.var_resid / (s * p), max(p - 1, 1))]
        return [(seed, max(s - 1, 1)), (self.var_problem / p, max(p - 1, 1))]

    def _observed(self, seeds: int | None, problems: int | None) -> bool:
        return self.se_obs is not None and self._design(seeds, problems) == (self.seeds,
                                                                               self.problems)

    def terms(self, seeds: int | None = None, problems: int | None = None) -> Terms:
        if self._observed(seeds, problems) and self.terms_obs is not None:
            return self.terms_obs
        return tuple(self._terms(*self._design(seeds, problems)))

    def se(self, seeds: int | None = None, problems: int | None = None) -> float:
        if self._observed(seeds, problems):
            return float(self.se_obs)
        s, p = self._design(seeds, problems)
        return float(np.sqrt(sum(v for v, _ in self._terms(s, p)) + self.extra_var))

    def dof(self, seeds: int | None = None, problems: int | None = None) -> float:
        if self._observed(seeds, problems) and self.df is not None:
            return float(self.df)
        return satterthwaite(self._terms(*self._design(seeds, problems)))

    def mde(self, seeds: int | None = None, problems: int | None = None) -> float:
        return mde_of(self.terms(seeds, problems))

    def seeds_for(self, target: float, problems: int | None = None,
                  most: int = 1000) -> int | None:
        """The fewest seeds (≥ 2) whose projected MDE ≤ ``target`` at ``problems`` problems
        (``mde_of`` the projected terms); None when no number up to ``most`` gets there (the
        problem term alone is too large) or σ²_seed is unknown."""
        if self.var_seed is None:
            return None
        p = problems or self.problems
        if mde_of(((self.var_problem / p, max(p - 1, 1)),)) >= target:
            return None

        def reaches(s: int) -> bool:
            return mde_of(tuple(self._terms(s, p))) <= target

        for s in range(2, min(most, 100) + 1):  # seed by seed where a seed counts
            if reaches(s):
                return s
        if most <= 100 or not reaches(most):
            return None
        lo, hi = 100, most  # beyond, the MDE falls steadily: bisect
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if reaches(mid) else (mid, hi)
        return hi

    def to_json(self) -> dict:
        return {"seeds": self.seeds, "problems": self.problems, "var_problem": self.var_problem,
                "var_seed": self.var_seed, "var_resid": self.var_resid, "se": self.se(),
                "df": _finite(self.dof()), "mde": self.mde()}


def _mean_squares(d: np.ndarray) -> tuple[float, float, float]:
    """(MS_seed, MS_problem, MS_resid) of a (seeds ≥ 2, problems ≥ 2) array."""
    s, p = d.shape
    rows, cols, grand = d.mean(axis=1), d.mean(axis=0), d.mean()
    resid = d - rows[:, None] - cols[None, :] + grand
    return (float(p * rows.var(ddof=1)), float(s * cols.var(ddof=1)),
            float((resid ** 2).sum() / ((s - 1) * (p - 1))))


def crossed_terms(ms_s: float, ms_p: float, ms_r: float, s: int, p: int) -> Terms:
    """The interval's variance terms of a (``s`` ≥ 2 seeds, ``p`` problems) layout from its
    mean squares: (MS_seed / (S·P), df S − 1) and (max(0, MS_problem − MS_resid) / (S·P), the
    Satterthwaite df of that difference of mean squares)."""
    prob = max(0.0, ms_p - ms_r) / (s * p)
    prob_df = ((ms_p - ms_r) ** 2 / (ms_p ** 2 / (p - 1) + ms_r ** 2 / ((s - 1) * (p - 1)))
               if prob > 0 else math.inf)
    return ((ms_s / (s * p), float(s - 1)), (prob, prob_df))


def variance_components(d: np.ndarray, extra: tuple[float, float] | None = None) -> Power:
    """ANOVA estimates of σ²_problem, σ²_seed, σ²_resid of a (seeds, problems) array (negative
    estimates clipped to 0, as usual) with the interval's SE, terms (``crossed_terms``) and
    Satterthwaite df (see the module docstring); ``extra``: (variance, df) of another arm's
    seed means (unpaired arms), a third term."""
    d = np.atleast_2d(np.asarray(d, float))
    s, p = d.shape
    if p < 2:
        raise ValueError("variance components need at least 2 problems")
    ev, edf = extra if extra is not None else (0.0, math.inf)
    if s == 1:
        var = float(d[0].var(ddof=1))
        terms = ((var / p, float(p - 1)), (ev, edf))
        return Power(1, p, var, None, 0.0, float(np.sqrt(var / p + ev)),
                     satterthwaite(list(terms)), ev, terms)
    ms_s, ms_p, ms_r = _mean_squares(d)
    terms = (*crossed_terms(ms_s, ms_p, ms_r, s, p), (ev, edf))
    se = float(np.sqrt(sum(v for v, _ in terms)))
    return Power(s, p, max(0.0, (ms_p - ms_r) / s), max(0.0, (ms_s - ms_r) / p), ms_r, se,
                 satterthwaite(list(terms)), ev, terms)


DIFF = (-1.0, 1.0)  # what a difference of probabilities (pass@k) can be
LEVEL_BOUNDS = (0.0, 1.0)  # and a probability


def crossed_interval(d: np.ndarray, *, estimate: float | None = None, level: float = LEVEL,
                     how: str = "", extra: tuple[float, float] | None = None,
                     bounds: tuple[float, float] | None = None) -> Interval:
    """The mean of a (seeds, problems) array (or ``estimate``, whose linearisation ``d`` is)
    with its t interval (``variance_components``, a t quantile per term), clipped to
    ``bounds``; with one problem, the t interval over seeds alone."""
    d = np.atleast_2d(np.asarray(d, float))
    s, p = d.shape
    est = float(d.mean()) if estimate is None else float(estimate)
    what = how or f"t over {s} seed{'s' if s != 1 else ''} × {p} problems"
    if p < 2:
        iv = seed_interval(list(d[:, 0]), level)
        return t_interval(est, iv.se or 0.0, iv.df or math.inf, what, level, bounds=bounds)
    pw = variance_components(d, extra)
    df = pw.df if pw.df is not None else math.inf
    text = f"{what} (seeds' term t df {s - 1})" if s > 1 else f"{what} (df {_df_text(df)})"
    return t_interval(est, float(pw.se_obs), df, text, level, pw, pw.terms_obs, bounds)


def _df_text(df: float) -> str:
    return "∞" if not math.isfinite(df) else f"{df:.1f}" if df < 100 else f"{df:.0f}"


def passk_diff(a: np.ndarray, b: np.ndarray, *, paired_seeds: bool,
               level: float = LEVEL) -> Interval:
    """Mean pass@k of arm ``a`` minus arm ``b``: arrays (seeds, problems) over the same
    problems (columns in the same order), the interval clipped to [−1, 1]. Paired by seed row
    when ``paired_seeds`` (both arms ran the same seeds, rows in the same order): the t
    interval of d = a − b; else ``b``'s mean over its rows is subtracted from every run of
    ``a`` and ``b``'s own seed variance (var of its row means / its rows) is added (none for a
    single evaluation such as the base model, whose per-problem values then count with the
    problems)."""
    a, b = np.atleast_2d(np.asarray(a, float)), np.atleast_2d(np.asarray(b, float))
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"the two arms cover {a.shape[1]} and {b.shape[1]} problems")
    if paired_seeds and a.shape[0] != b.shape[0]:
        raise ValueError(f"paired seeds need as many runs per arm, got {a.shape[0]}, {b.shape[0]}")
    n_prob = a.shape[1]
    if paired_seeds:
        return crossed_interval(a - b, level=level, bounds=DIFF,
                                how=f"t over {a.shape[0]} paired seeds × {n_prob} problems")
    extra = None
    if b.shape[0] > 1:
        extra = (float(b.mean(axis=1).var(ddof=1) / b.shape[0]), b.shape[0] - 1)
    return crossed_interval(a - b.mean(axis=0, keepdims=True), level=level, extra=extra,
                            bounds=DIFF,
                            how=f"t over {a.shape[0]} seeds vs {b.shape[0]} × {n_prob} problems")


# ----------------------------------------------------------------------------- bootstraps


def percentile_interval(samples: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """The ``level`` percentile interval of bootstrap replicates (NaNs left out)."""
    samples = np.asarray(samples, float)
    samples = samples[~np.isnan(samples)]
    if not len(samples):
        return float("nan"), float("nan")
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(samples, [tail, 100 - tail])
    return float(lo), float(hi)


def percentile_mc_error(samples: np.ndarray, level: float = LEVEL) -> float:
    """The Monte-Carlo error (one standard error) of the bounds of ``percentile_interval``, the
    larger of the two: the q-quantile of B replicates is the order statistic of rank ≈ qB, whose
    rank has binomial SD √(Bq(1 − q)); the error is half the distance between the order
    statistics one SD either side (a distribution-free estimate of SE(quantile))."""
    x = np.sort(np.asarray(samples, float)[~np.isnan(np.asarray(samples, float))])
    n = len(x)
    if n < 2:
        return float("inf")
    q = (1 - level) / 2
    sd = math.sqrt(n * q * (1 - q))
    out = 0.0
    for r in (q * n, (1 - q) * n):
        lo, hi = int(max(0, math.floor(r - sd))), int(min(n - 1, math.ceil(r + sd)))
        out = max(out, float(x[hi] - x[lo]) / 2.0)
    return out


def bootstrap(stat, n_units: int, *, level: float = LEVEL, seed: int = BOOT_SEED,
              first: int = N_BOOT, most: int = MAX_BOOT,
              target: float = MC_TARGET) -> tuple[np.ndarray, float, float, float]:
    """A percentile bootstrap over ``n_units`` units: ``stat(counts)`` takes a (replicates,
    n_units) array of how often each unit was drawn and returns one value per replicate (NaN:
    a failed replicate). The replicates double from ``first`` until the bounds' Monte-Carlo
    error (``percentile_mc_error``) is below ``target`` or ``most`` are drawn. Returns
    (replicates, low, high, MC error)."""
    rng = np.random.default_rng(seed)
    parts: list[np.ndarray] = []
    have, want = 0, first
    while True:
        b = want - have
        idx = rng.integers(0, n_units, (b, n_units))
        counts = np.zeros((b, n_units))
        np.add.at(counts, (np.repeat(np.arange(b), n_units), idx.ravel()), 1.0)
        parts.append(np.asarray(stat(counts), float))
        have = want
        arr = np.concatenate(parts)
        err = percentile_mc_error(arr, level)
        if err < target or want >= most:
            lo, hi = percentile_interval(arr, level)
            return arr, lo, hi, err
        want = min(most, want * 2)


def problem_passk(problems_jsonl: str | Path, k_list: list[int]) -> dict[int, np.ndarray]:
    """Per-problem unbiased pass@k of one evaluation (``explorl eval``'s problems.jsonl), rows
    in file order (the split's order)."""
    rows = [json.loads(line) for line in Path(problems_jsonl).read_text().splitlines() if line]
    n = [r["n_samples"] if "n_samples" in r else len(r["responses"]) for r in rows]  # packed
    out = {}
    for k in k_list:
        out[k] = np.array([pass_at_k(m, r["n_correct"], k) for m, r in zip(n, rows)])
    return out


def problem_counts(problems_jsonl: str | Path) -> np.ndarray:
    """Per problem of one evaluation, (correct answers c, samples n): shape (2, problems)."""
    rows = [json.loads(line) for line in Path(problems_jsonl).read_text().splitlines() if line]
    return np.array([[r["n_correct"] for r in rows],
                     [r["n_samples"] if "n_samples" in r else len(r["responses"]) for r in rows]],
                    float)
