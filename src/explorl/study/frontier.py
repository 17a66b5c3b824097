"""The pass@1–pass@k frontier: each arm swept over learning rates, compared with GRPO's.

Every arm of a ``frontier`` spec trains at several learning rates; each (arm, lr) is one point
(x, y) = (mean test pass@1, mean test pass@k) over its seeds and problems. The baseline's
(GRPO's) points make its **frontier** F (``explorl.analysis.hull``: the upper concave hull,
flat left of its highest point; G(y) its reverse), and each arm's own points make the arm's:
a point that another learning rate of the same arm (or a mix of two) beats, with at least its
pass@1 and more pass@k, is not part of the frontier the arm reaches (``beaten_by``).

F is defined on GRPO's pass@1 range [min, max] only: a point outside it is *outside*, never
extrapolated. Per point of another arm:

- ``gap_k`` = y − F(x): its pass@k minus GRPO's frontier at its pass@1;
- ``gap_1`` = x − G(y), G(y) = max{x′ : F(x′) ≥ y}: its pass@1 minus the most pass@1 GRPO
  reaches while keeping pass@k ≥ y; defined for y between F at GRPO's largest pass@1 and the
  peak's pass@k;
- the **hull test**: whether the point lies outside the region GRPO's hull reaches (some mix of
  GRPO's points has pass@1 ≥ x and pass@k ≥ y), which also speaks for points outside GRPO's
  pass@1 range.

Intervals: the study's paired bootstrap (``stats.paired_draws``: problems and seeds resampled
jointly, the same draw for every arm), recomputing GRPO's hull and the interpolation in each
replicate; a replicate where the point leaves GRPO's resampled range is left out (the ``how``
says how many). The hull test reports the fraction of replicates in which the point lies
outside: **outside** at ≥ 97.5%, **inside** at ≤ 2.5% (a 95% two-sided rule), else
**undecided**. The MDE linearises the gap at the point estimates (delta method): d[s, p] = y_m −
(1 − t)·y_a − t·y_b − F′·(x_m − (1 − t)·x_a − t·x_b) for the hull edge (a, b) at x, the
per-(seed, problem) pass@1 and pass@k arrays of the three arms, whose ``variance_components``
give the ``Power``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from explorl.analysis.hull import (
    Hull,
    beaten_by,
    dominated,
    frontier_at,
    frontier_edge,
    pass1_at,
    pass1_edge,
    upper_hull,
    where,
)
from explorl.study.stats import (
    BOOT_SEED,
    LEVEL,
    N_BOOT,
    Interval,
    Power,
    paired_draws,
    passk_diff,
    percentile_interval,
    variance_components,
)

HULL_SURE = 0.975  # the hull test: outside (inside) in at least this fraction of replicates


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
    outside: float | None = None  # fraction of replicates outside GRPO's hull
    left_out: float | None = None  # fraction of gap_k's replicates outside GRPO's range
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
    hull: Hull | None = None
    seeds: dict[str, list[int]] = field(default_factory=dict)  # per arm: the seeds compared
    base: tuple[float, float] | None = None  # the model before RL: (pass@1, pass@k)
    knob: str = "lr"  # what the points sweep, as the documents name a value ("lr 5e-05")
    unit: str = "learning rate"  # and in words


def _power(d: np.ndarray) -> Power | None:
    return variance_components(d) if d.shape[1] >= 2 else None


def compare(x1: np.ndarray, xk: np.ndarray, g1: np.ndarray, gk: np.ndarray, *,
            n_boot: int = N_BOOT, seed: int = BOOT_SEED, family: int = 1) -> list[dict]:
    """Each point of one arm against the baseline's frontier. ``x1``, ``xk``: the arm's
    per-(point, seed, problem) pass@1 and pass@k, shape (A, S, P); ``g1``, ``gk``: the
    baseline's (G, S, P), the same seeds in the same order and the same problems. Returns per
    point the dicts of ``Point``'s comparison fields (``gap_k_family`` at the 95% level
    Bonferroni-corrected for ``family`` comparisons)."""
    X1, XK = np.concatenate([g1, x1]), np.concatenate([gk, xk])  # (G + A, S, P)
    n_g = len(g1)
    m1, mk = X1.mean(axis=(1, 2)), XK.mean(axis=(1, 2))
    h = upper_hull(m1[:n_g], mk[:n_g])
    reps = np.full((n_boot, len(x1), 3), np.nan)  # gap_k, gap_1, outside
    for b, (rows, cols) in enumerate(paired_draws(X1.shape[1], X1.shape[2], n_boot=n_boot,
                                                  seed=seed)):
        r1 = X1[:, rows][:, :, cols].mean(axis=(1, 2))
        rk = XK[:, rows][:, :, cols].mean(axis=(1, 2))
        hb = upper_hull(r1[:n_g], rk[:n_g])
        for a in range(len(x1)):
            x, y = r1[n_g + a], rk[n_g + a]
            f, g = frontier_at(hb, x), pass1_at(hb, y)
            reps[b, a] = (np.nan if f is None else y - f, np.nan if g is None else x - g,
                          float(not dominated(hb, x, y)))
    out = []
    for a in range(len(x1)):
        x, y = float(m1[n_g + a]), float(mk[n_g + a])
        row: dict[str, Any] = {"where_k": where(h, x), "outside": float(reps[:, a, 2].mean())}
        e = frontier_edge(h, x)
        if e is not None:
            i, j, t, s = e
            gi, gj = h.idx[i], h.idx[j]
            d = (xk[a] - (1 - t) * gk[gi] - t * gk[gj]
                 - s * (x1[a] - (1 - t) * g1[gi] - t * g1[gj]))
            row["gap_k"] = _iv(y - frontier_at(h, x), reps[:, a, 0], d, LEVEL)
            row["left_out"] = float(np.isnan(reps[:, a, 0]).mean())
            row["gap_k_family"] = _iv(y - frontier_at(h, x), reps[:, a, 0], d,
                                      1 - (1 - LEVEL) / family)
        e = pass1_edge(h, y)
        row["where_1"] = ("inside" if e is not None else "above GRPO's pass@k range"
                          if y > h.ys[h.peak] else "below GRPO's pass@k range")
        if e is not None:
            i, j, u, g = e
            gi, gj = h.idx[i], h.idx[j]
            d = (x1[a] - (1 - u) * g1[gi] - u * g1[gj]
                 - g * (xk[a] - (1 - u) * gk[gi] - u * gk[gj]))
            row["gap_1"] = _iv(x - pass1_at(h, y), reps[:, a, 1], d, LEVEL)
        out.append(row)
    return out


def _iv(estimate: float, reps: np.ndarray, d: np.ndarray, level: float) -> Interval:
    kept = int((~np.isnan(reps)).sum())
    how = (f"{d.shape[1]} problems × {d.shape[0]} seeds resampled (paired), GRPO's hull "
           f"recomputed in each; {len(reps) - kept} of {len(reps)} replicates outside its range "
           "left out")
    return Interval(float(estimate), *percentile_interval(reps, level), how=how,
                    power=_power(np.asarray(d, float)))


def mean_interval(a: np.ndarray, *, n_boot: int = N_BOOT, seed: int = BOOT_SEED) -> Interval:
    """An arm's mean (seeds × problems) with the same bootstrap (its bars on the figure)."""
    a = np.atleast_2d(np.asarray(a, float))
    reps = [a[rows][:, cols].mean() for rows, cols in paired_draws(*a.shape, n_boot=n_boot,
                                                                    seed=seed)]
    return Interval(float(a.mean()), *percentile_interval(np.array(reps)),
                    how=f"{a.shape[1]} problems × {a.shape[0]} seeds resampled")


def analyse_frontier(passk: dict[str, dict[int, np.ndarray]], seeds: dict[str, list[int]],
                     points: dict[str, list[tuple[Any, str]]], baseline: str, k: int,
                     base: dict[int, np.ndarray] | None = None, *, n_boot: int = N_BOOT,
                     seed: int = BOOT_SEED) -> Frontier | None:
    """The frontier of a study's sweep: ``points`` (arm → its (value, row name), the
    ``frontier_points`` of the spec) read from ``passk`` (row → k → (seeds, problems), rows in
    ``seeds[row]``'s order). Each arm is compared on the seeds that every baseline point and
    every point of the arm finished; a row not finished yet is left out. None when fewer than
    two baseline points have finished, or no seed has finished at all of them."""
    have = {a: [(v, n) for v, n in pts if n in passk and 1 in passk[n] and k in passk[n]]
            for a, pts in points.items()}
    g_pts = have.get(baseline, [])
    if len(g_pts) < 2:
        return None
    out = Frontier(k, baseline)
    if base is not None and 1 in base and k in base:
        out.base = (float(base[1].mean()), float(base[k].mean()))

    def stack(pts, common, kk):
        return np.stack([passk[n][kk][[seeds[n].index(s) for s in common]] for _, n in pts])

    g_seeds = sorted(set.intersection(*(set(seeds[n]) for _, n in g_pts)))
    if not g_seeds:  # no seed finished at every baseline point yet
        return None
    g1, gk = stack(g_pts, g_seeds, 1), stack(g_pts, g_seeds, k)
    out.hull = upper_hull(g1.mean(axis=(1, 2)), gk.mean(axis=(1, 2)))
    out.seeds[baseline] = g_seeds
    out.points[baseline] = []
    g_beaten = _beaten(g_pts, g1.mean(axis=(1, 2)), gk.mean(axis=(1, 2)))
    for i, (v, n) in enumerate(g_pts):
        p = Point(baseline, v, n, mean_interval(g1[i], n_boot=n_boot, seed=seed),
                  mean_interval(gk[i], n_boot=n_boot, seed=seed), beaten_by=g_beaten[i])
        if base is not None and 1 in base and k in base:
            p.base_1 = passk_diff(g1[i], base[1], paired_seeds=False, n_boot=n_boot, seed=seed)
            p.base_k = passk_diff(gk[i], base[k], paired_seeds=False, n_boot=n_boot, seed=seed)
        out.points[baseline].append(p)
    for arm, pts in have.items():
        if arm == baseline or not pts:
            continue
        common = sorted(set(g_seeds).intersection(*(set(seeds[n]) for _, n in pts)))
        if not common:
            continue
        out.seeds[arm] = common
        a1, ak = stack(pts, common, 1), stack(pts, common, k)
        b1, bk = stack(g_pts, common, 1), stack(g_pts, common, k)
        m1 = a1.mean(axis=(1, 2))
        beaten = [None if b is None else tuple(pts[j][0] for j in b)
                  for b in own_beaten(a1, ak, n_boot=n_boot, seed=seed)]
        hb = upper_hull(b1.mean(axis=(1, 2)), bk.mean(axis=(1, 2)))
        judged = sum(where(hb, x) == "inside" and b is None for x, b in zip(m1, beaten))
        got = compare(a1, ak, b1, bk, n_boot=n_boot, seed=seed, family=max(1, judged))
        out.points[arm] = [Point(arm, v, n, mean_interval(a1[i], n_boot=n_boot, seed=seed),
                                 mean_interval(ak[i], n_boot=n_boot, seed=seed), **got[i],
                                 beaten_by=beaten[i])
                           for i, (v, n) in enumerate(pts)]
    return out


def _beaten(pts: list[tuple[Any, str]], m1: np.ndarray, mk: np.ndarray) -> list[tuple | None]:
    """Per point of one arm, the values (learning rates) of its own points that beat it."""
    return [None if b is None else tuple(pts[j][0] for j in b) for b in beaten_by(m1, mk)]


def own_beaten(x1: np.ndarray, xk: np.ndarray, *, n_boot: int = N_BOOT,
               seed: int = BOOT_SEED) -> list[tuple[int, ...] | None]:
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
            if (passk_diff(xk[j], xk[i], paired_seeds=True, n_boot=n_boot, seed=seed).low > 0
                    and passk_diff(x1[j], x1[i], paired_seeds=True, n_boot=n_boot,
                                   seed=seed).high >= 0):
                out[i] = (j,)
                break
    return out
