"""Knapsack RL rollout budgets (arXiv 2509.25849; code ``sampling_budget_by_knapsack``,
``solve_by_dp``; docs/methods/wider-field.md §6h): per-prompt sample counts that maximise the
expected value of the groups that give a non-zero gradient, at a fixed batch total.

Same interface contract as E3's ``control.budget.allocate_budgets``: B counts in
[n_min, n_max] summing to n_default·B. Plain Python (no torch): B is a few hundred prompts.
"""

from __future__ import annotations

import math


def knapsack_value(n: int, p: float) -> float:
    """V(N, p) = (1 − p^N − (1 − p)^N) · p(1 − p)²: P[a group of N is neither all right nor all
    wrong] times the paper's information gain of a prompt with success rate p. 0 for p ∈ {0, 1}."""
    return (1.0 - p**n - (1.0 - p) ** n) * p * (1.0 - p) ** 2


def _gain(n: int, p: float) -> float:
    """V(n+1, p) − V(n, p) = p(1−p)² · (p^n (1−p) + (1−p)^n p): > 0 and strictly decreasing in
    n for 0 < p < 1, so V is concave and taking the largest increments first is optimal."""
    q = 1.0 - p
    return p * q * q * (p**n * q + q**n * p)


def _wanted(p: float, alpha: float, n_min: int, n_max: int) -> int:
    """Samples after which a group has a non-zero gradient with probability ≈ α: the code's
    cost ln(1 − α)/ln max(p, 1 − p), truncated to an int as the code does, within the bounds."""
    cost = math.log(1.0 - alpha) / math.log(max(p, 1.0 - p))
    return min(n_max, max(n_min, int(cost)))


def _spread(counts: list[int], idx: list[int], extra: int, n_max: int) -> int:
    """Add ``extra`` samples evenly over ``idx`` (batch order first), each up to n_max; returns
    what did not fit."""
    while extra > 0:
        room = [i for i in idx if counts[i] < n_max]
        if not room:
            break
        share, rest = divmod(extra, len(room))
        for j, i in enumerate(room):
            add = min(n_max - counts[i], share + (1 if j < rest else 0))
            counts[i] += add
            extra -= add
    return extra


def knapsack_budgets(
    success_rates: list[float | None],
    n_default: int,
    n_min: int,
    n_max: int,
    alpha: float | None = None,
) -> list[int]:
    """Per-prompt sample counts maximising Σ_i V(N_i, p_i) (Knapsack RL; docs/methods/wider-field.md
    §6h).

    ``success_rates``: per prompt of the batch, its last observed success rate p, or None if
    never sampled (it gets n_default, as in the code). The other prompts share the rest of
    n_default·B, each within [n_min, n_max]:

    - prompts with 0 < p < 1 carry value; V is increasing and concave in N, so the optimum
      for a given total hands out the largest marginal gains first (exact; the paper's DP finds
      the same optimum). Ties between prompts go to the earlier one in the batch.
    - prompts with p ∈ {0, 1} have value 0 at any N and get n_min, plus whatever the valued
      prompts cannot take (spread evenly, p = 0 prompts first: they may still be solvable).
    - ``alpha`` (the code's fallback, 0.9 there; None = off): a valued prompt "needs" only
      ln(1 − α)/ln max(p, 1 − p) samples; when these needs sum to less than the budget, the
      excess goes to the p = 0 (then p = 1) prompts instead of piling more onto solved groups.

    **Ours**: the bounds hold for every prompt (the code spreads an infeasible leftover
    uniformly, past max_n, and its DP counts a prompt with no extra unit as value 0, not
    V(min_n)). Returns B integers in [n_min, n_max] summing to n_default·B.
    """
    B = len(success_rates)
    if not 1 <= n_min <= n_default <= n_max:
        raise ValueError(f"need 1 ≤ n_min ≤ n_default ≤ n_max, got {n_min}, {n_default}, {n_max}")
    if any(p is not None and not 0.0 <= p <= 1.0 for p in success_rates):
        raise ValueError("success rates must be in [0, 1] (or None for an unseen prompt)")
    if alpha is not None and not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    counts = [n_default if p is None else n_min for p in success_rates]
    valued = [i for i, p in enumerate(success_rates) if p is not None and 0.0 < p < 1.0]
    zero = [i for i, p in enumerate(success_rates) if p == 0.0]
    one = [i for i, p in enumerate(success_rates) if p == 1.0]
    seen_total = n_default * (B - success_rates.count(None))
    n_flat = len(zero) + len(one)

    # How many samples the valued prompts get: all they can (V increases), or with the
    # fallback what they need, but never so few or so many that the others break a bound.
    most = min(n_max * len(valued), seen_total - n_min * n_flat)
    least = max(n_min * len(valued), seen_total - n_max * n_flat)
    if alpha is None:
        total = most
    else:
        wanted = sum(_wanted(success_rates[i], alpha, n_min, n_max) for i in valued)
        total = min(most, max(least, wanted))

    increments = sorted(
        (-_gain(n, success_rates[i]), i, n) for i in valued for n in range(n_min, n_max)
    )
    for _, i, _ in increments[: total - n_min * len(valued)]:
        counts[i] += 1

    left = seen_total - total - n_min * n_flat
    left = _spread(counts, zero, left, n_max)
    left = _spread(counts, one, left, n_max)
    assert left == 0 and sum(counts) == n_default * B, "infeasible budget (cannot happen)"
    return counts
