"""The pass@1–pass@k frontier: each arm swept over learning rates, compared with GRPO's.

Every arm of a ``frontier`` spec trains at several learning rates; each (arm, lr) is one point
(x, y) = (mean test pass@1, mean test pass@k) over its seeds and problems. The baseline's
(GRPO's) points and the model before RL (GRPO's lr → 0 end, when it was evaluated) make its
**frontier** F (``explorl.analysis.hull``): the non-dominated part of the upper concave hull of
what GRPO reaches, from its highest pass@k to its highest pass@1 (``pareto``); G(y) is its
reverse. What GRPO reaches includes **per-sample mixtures** (``mixtures``): sampling each
response from point A with probability λ, else from point B, has per problem p = λ·p_A + (1 −
λ)·p_B, so its pass@1 is the chord's but its pass@k = 1 − (1 − p)^k lies above the chord
(concave in λ); the hull of every pair's mixtures (and per-query mixes of those: the hull's
chords) is what the study compares with. Each mixture's per-(seed, problem) pass@k is the
unbiased estimate from the two runs' counts (``mixture_passk``). Each arm's
own points make the arm's: a point that another learning rate of the same arm (or a mix of
two) beats, with at least its pass@1 and more pass@k, is not part of the frontier the arm
reaches (``beaten_by``).

F is defined on that frontier's pass@1 range only: a point outside it is *outside*, never
extrapolated. Per point of another arm:

- ``gap_k`` = y − F(x): its pass@k minus GRPO's frontier at its pass@1;
- ``gap_1`` = x − G(y), G(y) = max{x′ : F(x′) ≥ y}: its pass@1 minus the most pass@1 GRPO
  reaches while keeping pass@k ≥ y; defined for y between F at GRPO's largest pass@1 and the
  frontier's highest pass@k;
- the **hull test**: whether the point lies outside the region GRPO's frontier reaches (some
  mix of its points has pass@1 ≥ x and pass@k ≥ y), which also speaks for points outside its
  pass@1 range.

Intervals (``stats.crossed_interval``): each gap is linearised at the point estimates, the hull
edge (a, b) at x fixed: d[s, p] = y_m − (1 − t)·y_a − t·y_b − F′·(x_m − (1 − t)·x_a − t·x_b),
from the per-(seed, problem) pass@1 and pass@k of the three arms (the base model, one
evaluation, the same in every seed), and its t interval over seeds with the problems' part
gives the interval and the MDE. The hull test reports the one-sided confidence that the point
lies outside, by the same interval's rule (``stats.one_sided_confidence``): of the gap at its
pass@1 inside the range, of its pass@k over the frontier's highest left of it, of its pass@1
over GRPO's largest right of it: **outside** at ≥ 97.5%, **inside** at ≤ 2.5% (the 95% interval
of that margin excludes 0), else **undecided**.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from explorl.analysis.hull import (
    Hull,
    beaten_by,
    frontier_at,
    frontier_edge,
    pareto,
    pass1_at,
    pass1_edge,
    upper_hull,
    where,
)
from explorl.report.stats import (
    DIFF,
    LEVEL,
    LEVEL_BOUNDS,
    Interval,
    crossed_interval,
    one_sided_confidence,
    passk_diff,
)

HULL_SURE = 0.975  # the hull test: outside (inside) in at least this fraction of replicates
MIX_STEPS = 32  # per-sample mixtures of two points at λ = 1/32, 2/32, …, 31/32


def fail_estimates(counts: np.ndarray, k: int) -> np.ndarray:
    """Per problem, the unbiased estimates of (1 − p)^j for j = 0 … k from c correct of n
    samples: C(n − c, j) / C(n, j) (the pass@k estimator's complement). ``counts``: (2, …) of
    (c, n); returns (…, k + 1). Needs n ≥ k."""
    c, n = np.asarray(counts, float)
    if np.any(n < k):
        raise ValueError(f"a mixture's pass@{k} needs at least {k} samples per problem, "
                         f"some have {int(n.min())}")
    out = np.ones(c.shape + (k + 1,))
    for j in range(1, k + 1):
        out[..., j] = out[..., j - 1] * np.clip(n - c - j + 1, 0, None) / (n - j + 1)
    return out


def mixture_passk(qa: np.ndarray, qb: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """Unbiased per-problem pass@k of the per-sample mixture (weight λ on A) of two
    independent evaluations, from their ``fail_estimates`` (…, k + 1): 1 − Σ_j C(k, j) λ^j
    (1 − λ)^{k−j} · q_A[j] · q_B[k − j] (j of the k samples from A). Returns (…, len(λ))."""
    k = qa.shape[-1] - 1
    j = np.arange(k + 1)
    comb = np.array([math.comb(k, i) for i in j], float)
    lam = np.asarray(lam, float)[:, None]
    w = comb * lam ** j * (1 - lam) ** (k - j)  # (L, k + 1)
    return 1.0 - (qa * qb[..., ::-1]) @ w.T


def mixtures(g1: np.ndarray, q: np.ndarray, steps: int = MIX_STEPS
             ) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample mixtures of every pair of points: ``g1`` (G, S, P) their pass@1, ``q`` (G, S,
    P, k + 1) their ``fail_estimates``. Returns the mixtures' pass@1 and pass@k, each (M, S, P),
    M = G(G − 1)/2 · (steps − 1)."""
    lam = np.arange(1, steps) / steps
    x1, xk = [], []
    for a in range(len(g1)):
        for b in range(a + 1, len(g1)):
            xk.append(np.moveaxis(mixture_passk(q[a], q[b], lam), -1, 0))
            x1.append(lam[:, None, None] * g1[a] + (1 - lam[:, None, None]) * g1[b])
    if not x1:
        return np.zeros((0,) + g1.shape[1:]), np.zeros((0,) + g1.shape[1:])
    return np.concatenate(x1), np.concatenate(xk)


# ----------------------------------------------------------------------------- the comparison


@dataclass
class Point:
    """One (arm, value) of the sweep with its means and, for a non-baseline arm, its
    comparison with the baseline's frontier."""

    arm: str
    value: Any
    name: str
    pass1: Interval
    passk: Interval
    gap_k: Interval | None = None  # pass@k − F(pass@1); None outside GRPO's range
    gap_1: Interval | None = None  # pass@1 − G(pass@k); None outside
    gap_k_family: Interval | None = None  # gap_k at the claims' Bonferroni level
    where_k: str = ""
    where_1: str = ""
    outside: float | None = None  # confidence that the point lies outside GRPO's frontier
    left_out: float | None = None  # (kept for old study.json files; no longer measured)
    base_1: Interval | None = None  # − the model before RL (the baseline's points)
    base_k: Interval | None = None
    beaten_by: tuple | None = None  # the values of the arm's own points that beat this one

    @property
    def hull(self) -> str:
        if self.outside is None:
            return ""
        return ("outside" if self.outside >= HULL_SURE else "inside"
                if self.outside <= 1 - HULL_SURE else "undecided")


@dataclass
class Frontier:
    """The sweep's points per arm (the baseline first), GRPO's hull and the large k."""

    k: int
    baseline: str
    points: dict[str, list[Point]] = field(default_factory=dict)
    hull: Hull | None = None  # GRPO's frontier: the non-dominated part of its hull (``pareto``)
    seeds: dict[str, list[int]] = field(default_factory=dict)  # per arm: the seeds compared
    base: tuple[float, float] | None = None  # the model before RL: (pass@1, pass@k)
    knob: str = "lr"  # what the points sweep, as the documents name a value ("lr 5e-05")
    unit: str = "learning rate"  # and in words
    mixed: bool = False  # GRPO's frontier holds the per-sample mixtures of its points


LIFT = "base"  # the value naming the model before RL among the baseline's points (lr → 0)


def compare(x1: np.ndarray, xk: np.ndarray, g1: np.ndarray, gk: np.ndarray, *,
            family: int = 1) -> list[dict]:
    """Each point of one arm against the baseline's frontier. ``x1``, ``xk``: the arm's
    per-(point, seed, problem) pass@1 and pass@k, shape (A, S, P); ``g1``, ``gk``: the
    baseline's (G, S, P), the same seeds in the same order and the same problems (the base
    model, when it is one of them, repeated over the seeds). Returns per point the dicts of
    ``Point``'s comparison fields (``gap_k_family`` at the 95% level Bonferroni-corrected for
    ``family`` comparisons)."""
    m1, mk = g1.mean(axis=(1, 2)), gk.mean(axis=(1, 2))
    h = pareto(upper_hull(m1, mk))
    out = []
    for a in range(len(x1)):
        x, y = float(x1[a].mean()), float(xk[a].mean())
        row: dict[str, Any] = {"where_k": where(h, x)}
        e = frontier_edge(h, x)
        if e is not None:
            i, j, t, s = e
            gi, gj = h.idx[i], h.idx[j]
            d = (xk[a] - (1 - t) * gk[gi] - t * gk[gj]
                 - s * (x1[a] - (1 - t) * g1[gi] - t * g1[gj]))
            gap = y - frontier_at(h, x)
            row["gap_k"] = _iv(gap, d, LEVEL)
            row["gap_k_family"] = _iv(gap, d, 1 - (1 - LEVEL) / family)
            margin = row["gap_k"]
        elif x > h.xs[-1]:  # right of GRPO's pass@1: outside by its pass@1
            last = h.idx[-1]
            margin = _iv(x - h.xs[-1], x1[a] - g1[last], LEVEL)
        else:  # left of the peak: outside only with more pass@k than the peak
            top = h.idx[h.peak]
            margin = _iv(y - h.ys[h.peak], xk[a] - gk[top], LEVEL)
        row["outside"] = _confidence(margin)
        e = pass1_edge(h, y)
        row["where_1"] = ("inside" if e is not None else "above GRPO's pass@k range"
                          if y > h.ys[h.peak] else "below GRPO's pass@k range")
        if e is not None:
            i, j, u, g = e
            gi, gj = h.idx[i], h.idx[j]
            d = (x1[a] - (1 - u) * g1[gi] - u * g1[gj]
                 - g * (xk[a] - (1 - u) * gk[gi] - u * gk[gj]))
            row["gap_1"] = _iv(x - pass1_at(h, y), d, LEVEL)
        out.append(row)
    return out


def _confidence(iv: Interval) -> float:
    """One-sided confidence that the quantity is above 0, by its interval's own rule
    (``stats.one_sided_confidence``: ≥ 0.975 exactly when its 95% interval lies above 0)."""
    return one_sided_confidence(iv)


def _iv(estimate: float, d: np.ndarray, level: float) -> Interval:
    d = np.asarray(d, float)
    how = (f"t over {d.shape[0]} paired seeds × {d.shape[1]} problems, linearised at GRPO's "
           "frontier edge")
    return crossed_interval(d, estimate=estimate, level=level, how=how, bounds=DIFF)


def mean_interval(a: np.ndarray) -> Interval:
    """An arm's mean (seeds × problems) with its t interval, clipped to [0, 1] (its bars on
    the figure)."""
    return crossed_interval(np.atleast_2d(np.asarray(a, float)), bounds=LEVEL_BOUNDS)


def analyse_frontier(passk: dict[str, dict[int, np.ndarray]], seeds: dict[str, list[int]],
                     points: dict[str, list[tuple[Any, str]]], baseline: str, k: int,
                     base: dict[int, np.ndarray] | None = None,
                     counts: dict[str, np.ndarray] | None = None,
                     base_counts: np.ndarray | None = None) -> Frontier | None:
    """The frontier of a study's sweep: ``points`` (arm → its (value, row name), the
    ``frontier_points`` of the spec) read from ``passk`` (row → k → (seeds, problems), rows in
    ``seeds[row]``'s order); ``base`` (k → the model before RL's per-problem pass@k, one
    evaluation) joins the baseline's points as its lr → 0 end. With ``counts`` (row → (2,
    seeds, problems): correct answers and samples, rows in the same order) for every baseline
    row, and ``base_counts`` ((2, problems)) with ``base``, GRPO's frontier holds the
    per-sample mixtures of its points (``mixtures``); without, only its points and their
    chords (``Frontier.mixed`` says which). Each arm is compared on the seeds
    that every baseline point and every point of the arm finished; a row not finished yet is
    left out. None when fewer than two baseline points have finished, or no seed has finished
    at all of them."""
    have = {a: [(v, n) for v, n in pts if n in passk and 1 in passk[n] and k in passk[n]]
            for a, pts in points.items()}
    g_pts = have.get(baseline, [])
    if len(g_pts) < 2:
        return None
    out = Frontier(k, baseline)
    lift = None
    if base is not None and 1 in base and k in base:
        lift = {kk: np.asarray(base[kk], float).reshape(-1) for kk in (1, k)}
        out.base = (float(lift[1].mean()), float(lift[k].mean()))

    def stack(pts, common, kk):
        rows = [passk[n][kk][[seeds[n].index(s) for s in common]] for _, n in pts]
        if lift is not None and pts is g_pts:  # the base model, the same in every seed
            rows.append(np.broadcast_to(lift[kk], (len(common), len(lift[kk]))))
        return np.stack(rows)

    mixed = (counts is not None and all(n in counts for _, n in g_pts)
             and (lift is None or base_counts is not None))

    def reach(common):
        """The baseline's points (and the base model), then their mixtures: pass@1, pass@k."""
        b1, bk = stack(g_pts, common, 1), stack(g_pts, common, k)
        if not mixed:
            return b1, bk
        c = [counts[n][:, [seeds[n].index(s) for s in common]] for _, n in g_pts]
        if lift is not None:
            c.append(np.broadcast_to(np.asarray(base_counts, float)[:, None, :],
                                     (2, len(common), base_counts.shape[-1])))
        m1, mk = mixtures(b1, np.stack([fail_estimates(x, k) for x in c]))
        return np.concatenate([b1, m1]), np.concatenate([bk, mk])

    g_seeds = sorted(set.intersection(*(set(seeds[n]) for _, n in g_pts)))
    if not g_seeds:  # no seed finished at every baseline point yet
        return None
    out.mixed = mixed
    r1, rk = reach(g_seeds)
    out.hull = pareto(upper_hull(r1.mean(axis=(1, 2)), rk.mean(axis=(1, 2))))
    out.seeds[baseline] = g_seeds
    out.points[baseline] = _baseline_points(baseline, g_pts, stack(g_pts, g_seeds, 1),
                                            stack(g_pts, g_seeds, k), lift, k)
    for arm, pts in have.items():
        if arm == baseline or not pts:
            continue
        common = sorted(set(g_seeds).intersection(*(set(seeds[n]) for _, n in pts)))
        if not common:
            continue
        out.seeds[arm] = common
        a1, ak = stack(pts, common, 1), stack(pts, common, k)
        b1, bk = reach(common)
        m1 = a1.mean(axis=(1, 2))
        beaten = [None if b is None else tuple(pts[j][0] for j in b)
                  for b in own_beaten(a1, ak)]
        hb = pareto(upper_hull(b1.mean(axis=(1, 2)), bk.mean(axis=(1, 2))))
        judged = sum(where(hb, x) == "inside" and b is None for x, b in zip(m1, beaten))
        got = compare(a1, ak, b1, bk, family=max(1, judged))
        out.points[arm] = [Point(arm, v, n, mean_interval(a1[i]), mean_interval(ak[i]),
                                 **got[i], beaten_by=beaten[i])
                           for i, (v, n) in enumerate(pts)]
    return out


def _baseline_points(baseline: str, g_pts: list, g1: np.ndarray, gk: np.ndarray,
                     lift: dict | None, k: int) -> list[Point]:
    """The baseline's own points (``g1``/``gk``: (points [+ the base model], seeds, problems)),
    each with the points (or the base model) that beat it and, with ``lift``, its difference
    from the model before RL."""
    gm1, gmk = g1.mean(axis=(1, 2)), gk.mean(axis=(1, 2))
    values = [v for v, _ in g_pts] + ([LIFT] if lift is not None else [])
    g_beaten = [None if b is None else tuple(values[j] for j in b) for b in beaten_by(gm1, gmk)]
    out = []
    for i, (v, n) in enumerate(g_pts):
        p = Point(baseline, v, n, mean_interval(g1[i]), mean_interval(gk[i]),
                  beaten_by=g_beaten[i])
        if lift is not None:
            p.base_1 = passk_diff(g1[i], lift[1][None], paired_seeds=False)
            p.base_k = passk_diff(gk[i], lift[k][None], paired_seeds=False)
        out.append(p)
    return out


def own_beaten(x1: np.ndarray, xk: np.ndarray) -> list[tuple[int, ...] | None]:
    """Per point of one arm (``x1``, ``xk``: (points, seeds, problems)), the indices of its own
    points that beat it, or None: ``beaten_by`` at the point estimates (another point or a mix
    of two with at least its pass@1 and more pass@k), or another point whose pass@k is higher
    (paired 95% interval above 0) at a pass@1 not resolved below the point's (the interval of
    the difference reaches 0). The second keeps a point that has a hair more pass@1 than its
    neighbour and much less pass@k (the steep end of a sweep) from standing for the arm's
    frontier on the strength of noise; of several such beaters, the one with most pass@k."""
    out = beaten_by(x1.mean(axis=(1, 2)), xk.mean(axis=(1, 2)))
    mk = xk.mean(axis=(1, 2))
    for i in range(len(x1)):
        if out[i] is not None:
            continue
        for j in sorted(range(len(x1)), key=lambda j: -mk[j]):
            if j == i or mk[j] <= mk[i]:
                continue
            if (passk_diff(xk[j], xk[i], paired_seeds=True).low > 0
                    and passk_diff(x1[j], x1[i], paired_seeds=True).high >= 0):
                out[i] = (j,)
                break
    return out
