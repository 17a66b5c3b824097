"""Unbiased pass@k and mean@n from per-problem sample counts (docs/methods/baseline.md §0).

pass@k = 1 − C(n−c, k) / C(n, k) for n samples of which c are correct (Chen et al., 2021,
"Evaluating Large Language Models Trained on Code", Eq. 1). The binomials overflow floats
long before n = 1024, so the ratio is computed as a product of n-sized terms in log space.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def _check(n: int, c: int, k: int) -> None:
    if n < 1:
        raise ValueError(f"pass@k needs at least one sample per problem, got n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"number of correct samples c={c} must be in [0, n={n}]")
    if k < 1:
        raise ValueError(f"k must be ≥ 1, got k={k}")
    if k > n:
        raise ValueError(f"pass@{k} needs at least k={k} samples per problem, got n={n}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with n samples, c correct (Chen et al. 2021, Eq. 1).

    C(n−c, k)/C(n, k) = prod_{i=n−c+1}^{n} (1 − k/i); the product is summed as log1p terms
    and turned back with expm1, so 1 − ratio keeps full relative precision even when the
    ratio is close to 1 (e.g. n=1024, c=1, k=1 gives exactly 1/1024).
    Raises ``ValueError`` for k > n, c ∉ [0, n], n < 1 or k < 1.
    """
    _check(n, c, k)
    if n - c < k:  # every k-subset contains a correct sample
        return 1.0
    log_ratio = math.fsum(math.log1p(-k / i) for i in range(n - c + 1, n + 1))
    return -math.expm1(log_ratio)


def pass_at_k_batch(
    n_list: Sequence[int], c_list: Sequence[int], k: int, skip_short: bool = False
) -> float:
    """Mean unbiased pass@k over problems that may have different sample counts n_i.

    A problem with fewer than k samples has no unbiased pass@k. By default that raises
    ``ValueError`` naming the problem; with ``skip_short=True`` such problems are left out of
    the mean (and it raises if none remain).
    """
    if len(n_list) != len(c_list):
        raise ValueError(f"n_list has {len(n_list)} problems but c_list has {len(c_list)}")
    if not n_list:
        raise ValueError("pass@k of an empty set of problems is undefined")
    values = []
    for i, (n, c) in enumerate(zip(n_list, c_list)):
        if k > n and skip_short:
            continue
        if k > n:
            raise ValueError(
                f"problem {i} has only n={n} samples, pass@{k} needs ≥ {k} "
                "(sample more, or pass skip_short=True to leave such problems out)"
            )
        values.append(pass_at_k(n, c, k))
    if not values:
        raise ValueError(f"no problem has the ≥ {k} samples pass@{k} needs")
    return math.fsum(values) / len(values)


def mean_at_n(n_list: Sequence[int], c_list: Sequence[int]) -> float:
    """mean@n: per-problem accuracy c_i/n_i averaged over problems (equals pass@1)."""
    if len(n_list) != len(c_list):
        raise ValueError(f"n_list has {len(n_list)} problems but c_list has {len(c_list)}")
    if not n_list:
        raise ValueError("mean@n of an empty set of problems is undefined")
    for i, (n, c) in enumerate(zip(n_list, c_list)):
        if n < 1 or not 0 <= c <= n:
            raise ValueError(f"problem {i}: need n ≥ 1 and 0 ≤ c ≤ n, got n={n}, c={c}")
    return math.fsum(c / n for n, c in zip(n_list, c_list)) / len(n_list)
