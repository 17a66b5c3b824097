"""pass@k (docs/methods/baseline.md §0): product form vs brute-force enumeration and exact
binomials."""

import itertools
import math
from fractions import Fraction

import pytest

import explorl.eval
from explorl.eval import mean_at_n, pass_at_k, pass_at_k_batch


def brute_force(n: int, c: int, k: int) -> float:
    """Fraction of k-subsets of n samples (the first c correct) holding a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


def exact(n: int, c: int, k: int) -> Fraction:
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


def test_matches_enumeration_of_all_k_subsets():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(brute_force(n, c, k), abs=1e-12), (
                    n,
                    c,
                    k,
                )


@pytest.mark.parametrize("c", [0, 1, 2, 7, 100, 512, 1000, 1023, 1024])
@pytest.mark.parametrize("k", [1, 2, 16, 64, 256, 1024])
def test_n1024_matches_exact_fractions(c, k):
    got = pass_at_k(1024, c, k)
    assert math.isfinite(got)
    assert got == pytest.approx(float(exact(1024, c, k)), rel=1e-12, abs=1e-300)


def test_small_values_keep_relative_precision():
    # 1 − ratio with ratio ≈ 1: naive 1 − prod would lose digits here
    assert pass_at_k(1024, 1, 1) == pytest.approx(1 / 1024, rel=1e-14)
    assert pass_at_k(4096, 1, 1) == pytest.approx(1 / 4096, rel=1e-14)


def test_edge_cases():
    assert pass_at_k(8, 0, 3) == 0.0
    assert pass_at_k(8, 8, 3) == 1.0
    assert pass_at_k(8, 6, 3) == 1.0  # n − c < k: every 3-subset has a correct sample
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)
    assert pass_at_k(1, 1, 1) == 1.0 and pass_at_k(1, 0, 1) == 0.0


@pytest.mark.parametrize("n,c,k,msg", [
    (4, 1, 5, "pass@5 needs at least k=5"),
    (4, 5, 1, "c=5"),
    (4, -1, 1, "c=-1"),
    (4, 1, 0, "k must be"),
    (0, 0, 1, "n=0"),
])
def test_invalid_arguments_raise(n, c, k, msg):
    with pytest.raises(ValueError, match=msg):
        pass_at_k(n, c, k)


def test_batch_is_mean_over_problems_with_different_n():
    n_list, c_list = [4, 8, 16], [1, 0, 16]
    want = (pass_at_k(4, 1, 2) + 0.0 + 1.0) / 3
    assert pass_at_k_batch(n_list, c_list, 2) == pytest.approx(want)
    assert pass_at_k_batch(n_list, c_list, 2) == pytest.approx(
        (float(exact(4, 1, 2)) + float(exact(8, 0, 2)) + float(exact(16, 16, 2))) / 3)


def test_batch_short_problems_raise_or_are_skipped():
    with pytest.raises(ValueError, match="problem 0 has only n=4"):
        pass_at_k_batch([4, 8], [1, 2], 8)
    assert pass_at_k_batch([4, 8], [1, 2], 8, skip_short=True) == 1.0  # n−c=6 < 8
    with pytest.raises(ValueError, match="no problem"):
        pass_at_k_batch([4, 4], [1, 2], 8, skip_short=True)
    with pytest.raises(ValueError, match="2 problems"):
        pass_at_k_batch([4, 4], [1], 1)
    with pytest.raises(ValueError, match="empty"):
        pass_at_k_batch([], [], 1)


def test_mean_at_n_equals_pass_at_1():
    n_list, c_list = [4, 8, 3], [1, 6, 0]
    assert mean_at_n(n_list, c_list) == pytest.approx((1 / 4 + 6 / 8 + 0) / 3)
    assert mean_at_n(n_list, c_list) == pytest.approx(pass_at_k_batch(n_list, c_list, 1))
    with pytest.raises(ValueError, match="problem 1"):
        mean_at_n([4, 2], [1, 3])


def test_public_api():
    assert sorted(explorl.eval.__all__) == [
        "mean_at_n", "pass_at_k", "pass_at_k_batch", "plot_passk", "summarize", "write_eval_json"]
    assert explorl.eval.pass_at_k is pass_at_k
