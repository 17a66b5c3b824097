"""Knapsack RL budgets (docs/methods/wider-field.md §6h): the worked values, sum and bounds, and the
brute-force optimum on small batches."""

import itertools
import random

import pytest

from explorl.algorithms.knapsack import knapsack_budgets, knapsack_value


def total_value(counts, rates):
    return sum(knapsack_value(n, p) for n, p in zip(counts, rates, strict=True) if p is not None)


def test_value_worked_example():
    # p = 0.5: V(2) = (1 − ¼ − ¼)·⅛ = 0.0625, V(8) = (1 − 2/256)·⅛ = 0.12402
    assert knapsack_value(2, 0.5) == pytest.approx(0.0625)
    assert knapsack_value(8, 0.5) == pytest.approx(0.124023, abs=1e-6)
    assert knapsack_value(8, 0.0) == 0.0 and knapsack_value(8, 1.0) == 0.0


def test_hand_example_without_and_with_the_fallback():
    rates = [0.5, 0.9, 0.0, None]
    # total 16, the unseen prompt keeps 4; 12 for the rest, the p = 0 prompt at n_min = 2, so the
    # valued two share 10: every increment of p = 0.5 (0.03125 … 0.0039) beats p = 0.9's
    # (0.00081, 0.00066, …): [6, 4].
    assert knapsack_budgets(rates, 4, 2, 6) == [6, 4, 2, 4]
    # α = 0.9: needs int(ln 0.1/ln 0.5) = 3 and min(6, int(ln 0.1/ln 0.9) = 21) = 6, sum 9 < 10:
    # the valued two get 9 (the best 5 increments: four of p = 0.5, one of p = 0.9) and the
    # p = 0 prompt the spare sample.
    assert knapsack_budgets(rates, 4, 2, 6, alpha=0.9) == [6, 3, 3, 4]


def random_case(rng, b):
    choices = [None, 0.0, 1.0, 0.125, 0.25, 0.5, 0.75, 0.9]
    rates = [rng.choice(choices) for _ in range(b)]
    n_min = rng.randint(1, 4)
    n_default = rng.randint(n_min, n_min + 3)
    n_max = rng.randint(n_default, n_default + 4)
    return rates, n_default, n_min, n_max


@pytest.mark.parametrize("alpha", [None, 0.9, 0.5])
def test_sum_and_bounds_hold_everywhere(alpha):
    rng = random.Random(0)
    for _ in range(300):
        rates, n_default, n_min, n_max = random_case(rng, rng.randint(0, 12))
        counts = knapsack_budgets(rates, n_default, n_min, n_max, alpha=alpha)
        assert sum(counts) == n_default * len(rates)
        assert all(n_min <= c <= n_max for c in counts)
        assert all(c == n_default for c, p in zip(counts, rates, strict=True) if p is None)


def feasible(b, total, lo, hi):
    for combo in itertools.product(range(lo, hi + 1), repeat=b):
        if sum(combo) == total:
            yield combo


def test_matches_the_brute_force_optimum():
    rng = random.Random(1)
    for _ in range(60):
        rates, n_default, n_min, n_max = random_case(rng, rng.randint(1, 4))
        counts = knapsack_budgets(rates, n_default, n_min, n_max)
        seen = [p for p in rates if p is not None]
        allocations = feasible(len(seen), n_default * len(seen), n_min, n_max)
        best = max((total_value(c, seen) for c in allocations), default=0.0)
        assert total_value(counts, rates) == pytest.approx(best, abs=1e-12)


def test_fallback_is_optimal_for_its_total_and_feeds_unsolved_prompts_first():
    rng = random.Random(2)
    checked = 0
    for _ in range(80):
        rates, n_default, n_min, n_max = random_case(rng, rng.randint(2, 5))
        counts = knapsack_budgets(rates, n_default, n_min, n_max, alpha=0.9)
        valued = [i for i, p in enumerate(rates) if p is not None and 0 < p < 1]
        sub = [rates[i] for i in valued]
        got = [counts[i] for i in valued]
        best = max(total_value(c, sub) for c in feasible(len(sub), sum(got), n_min, n_max))
        assert total_value(got, sub) == pytest.approx(best, abs=1e-12)
        zeros = [counts[i] for i, p in enumerate(rates) if p == 0.0]
        ones = [counts[i] for i, p in enumerate(rates) if p == 1.0]
        if any(c > n_min for c in ones):  # p = 1 prompts get extra only once p = 0 ones are full
            assert all(c == n_max for c in zeros)
        if zeros:
            assert max(zeros) - min(zeros) <= 1  # spread evenly
            checked += 1
    assert checked > 10


def test_all_unseen_or_all_flat_is_uniform_or_even():
    assert knapsack_budgets([None] * 3, 8, 2, 12) == [8, 8, 8]
    assert knapsack_budgets([0.0, 0.0, 1.0], 4, 2, 6) == [5, 5, 2]  # 12 − 2·3 = 6 extra to p = 0


def test_rejects_bad_inputs():
    with pytest.raises(ValueError):
        knapsack_budgets([0.5], 4, 5, 6)  # n_min > n_default
    with pytest.raises(ValueError):
        knapsack_budgets([1.5], 4, 2, 6)
    with pytest.raises(ValueError):
        knapsack_budgets([0.5], 4, 2, 6, alpha=1.0)
