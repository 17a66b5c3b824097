"""Pass@k advantage estimators (docs/methods/wider-field.md §6d) against the worked example and
brute-force enumeration of every k-subset of a group."""

import math
from itertools import combinations

import pytest
import torch

from explorl.algorithms import ADVANTAGES, compute_advantages
from explorl.algorithms.advantages import TAKES_K, pkpo_s

R = torch.tensor([1.0, 0.0, 0.0, 0.0])
G0 = torch.zeros(4, dtype=torch.long)


def adv(name, r, g, k=None, eps=1e-6):
    return compute_advantages(name, r, g, eps=eps, k=k)[0]


# --------------------------------------------------------------------------- worked example


def test_worked_example_n4_one_correct_k2():
    # §6d: N = 4, r = [1,0,0,0], k = 2: R̄ = 0.5, σ = 0.5.
    torch.testing.assert_close(adv("passk_training", R, G0, 2, eps=0.0),
                               torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]))
    torch.testing.assert_close(pkpo_s(R, G0, 2), torch.tensor([1 / 2, 1 / 6, 1 / 6, 1 / 6]))
    torch.testing.assert_close(adv("pkpo", R, G0, 2), torch.tensor([1 / 2, 1 / 6, 1 / 6, 1 / 6]))
    torch.testing.assert_close(adv("pkpo_loo", R, G0, 2),
                               torch.tensor([1 / 2, -5 / 18, -5 / 18, -5 / 18]))
    torch.testing.assert_close(adv("pkpo_loo_minus_one", R, G0, 2),
                               torch.tensor([1 / 2, 0.0, 0.0, 0.0]))
    # (c): Bessel std of [1,0,0,0] = 0.5 -> 1/(0.5 + 1e-6) ≈ 2.0 for the best, 0 for the rest
    torch.testing.assert_close(adv("grpo_passk", R, G0), torch.tensor([1 / (0.5 + 1e-6), 0, 0, 0]))


def test_worked_example_two_correct_grpo_passk_is_zero():
    r = torch.tensor([1.0, 1.0, 0.0, 0.0])
    assert adv("grpo_passk", r, G0).tolist() == [0.0] * 4  # r_max − r_2nd = 0


# --------------------------------------------------------------------------- brute force


def subsets_max(g, k):
    return [max(g[j] for j in s) for s in combinations(range(len(g)), k)]


def brute_s(g, k):
    """C(n,k)⁻¹ Σ_{|I|=k, I∋i} max_I g."""
    n = len(g)
    return [sum(max(g[j] for j in s) for s in combinations(range(n), k) if i in s) / math.comb(n, k)
            for i in range(n)]


def brute_loo(g, k):
    """s_i − (n−1)⁻¹ Σ_{j≠i} S(j, k, [n]∖i)."""
    n = len(g)
    out = []
    for i in range(n):
        rest = [g[j] for j in range(n) if j != i]
        out.append(brute_s(g, k)[i] - sum(brute_s(rest, k)) / (n - 1))
    return out


def brute_loo_minus_one(g, k):
    """C(n,k)⁻¹ Σ_{|I|=k, I∋i} (max_I g − max_{I∖i} g)."""
    n = len(g)
    out = []
    for i in range(n):
        tot = 0.0
        for s in combinations(range(n), k):
            if i in s:
                tot += max(g[j] for j in s) - max(g[j] for j in s if j != i)
        out.append(tot / math.comb(n, k))
    return out


def brute_passk_training(g, k, eps):
    """(E over the group's k-subsets containing i of pass, − R̄)/(σ + eps), binary r > 0."""
    b = [1.0 if x > 0 else 0.0 for x in g]
    n, c = len(b), int(sum(b))
    if c == 0 or n - c < k:
        return [0.0] * n
    r_bar = sum(subsets_max(b, k)) / math.comb(n, k)
    sigma = math.sqrt(r_bar * (1 - r_bar))
    out = []
    for i in range(n):
        others = [b[j] for j in range(n) if j != i]
        with_i = [max([b[i]] + [others[j] for j in s]) for s in combinations(range(n - 1), k - 1)]
        out.append((sum(with_i) / len(with_i) - r_bar) / (sigma + eps))
    return out


def random_groups(seed, binary):
    """Uneven, interleaved groups of sizes 4..7 with arbitrary ids; rewards with ties."""
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(4, 8, (6,), generator=gen)
    ids = torch.randperm(100, generator=gen)[:6] - 50
    groups = ids.repeat_interleave(sizes)
    perm = torch.randperm(len(groups), generator=gen)
    groups = groups[perm]
    if binary:
        rewards = torch.randint(0, 2, (len(groups),), generator=gen).float()
    else:  # few distinct values, so ties happen
        rewards = torch.randint(0, 4, (len(groups),), generator=gen).float() / 3 - 0.2
    return rewards, groups


def per_group(rewards, groups, fn):
    out = torch.zeros(len(rewards), dtype=torch.float64)
    for gid in groups.unique().tolist():
        idx = (groups == gid).nonzero().squeeze(-1)
        g = rewards[idx].tolist()
        if len(set(g)) == 1:
            continue  # the shared zero rule (tested separately)
        out[idx] = torch.tensor(fn(g), dtype=torch.float64)
    return out.float()


BRUTE = {
    "pkpo": brute_s,
    "pkpo_loo": brute_loo,
    "pkpo_loo_minus_one": brute_loo_minus_one,
}


# k = 1 of s^(loo−1) is RLOO (its own test below)
CASES = [(n, k) for n in sorted(BRUTE) for k in (1, 2, 3) if (n, k) != ("pkpo_loo_minus_one", 1)]


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("name, k", CASES)
def test_pkpo_equals_subset_enumeration(name, k, seed, binary):
    rewards, groups = random_groups(seed, binary)
    expected = per_group(rewards, groups, lambda g: BRUTE[name](g, k))
    torch.testing.assert_close(adv(name, rewards, groups, k), expected, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("k", [1, 2, 3])
def test_passk_training_equals_subset_enumeration(k, seed):
    rewards, groups = random_groups(seed, binary=False)  # r > 0 binarises
    expected = per_group(rewards, groups, lambda g: brute_passk_training(g, k, 1e-6))
    got = adv("passk_training", rewards, groups, k)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", range(4))
def test_pkpo_s_has_no_zero_rule_and_matches_enumeration_everywhere(seed):
    rewards, groups = random_groups(seed, binary=True)
    expected = torch.zeros(len(rewards))
    for gid in groups.unique().tolist():
        idx = (groups == gid).nonzero().squeeze(-1)
        expected[idx] = torch.tensor(brute_s(rewards[idx].tolist(), 2))
    torch.testing.assert_close(pkpo_s(rewards, groups, 2), expected)


def test_passk_training_identity_with_pkpo_s():
    # §6d: (a) = ((n/k)·s_i − R̄)/σ, checked on one group with c = 3 of n = 7, k = 3.
    r = torch.tensor([1.0, 0, 0, 1, 0, 1, 0])
    g = torch.zeros(7, dtype=torch.long)
    n, k = 7, 3
    r_bar = 1 - math.comb(4, 3) / math.comb(7, 3)
    sigma = math.sqrt(r_bar * (1 - r_bar))
    expected = ((n / k) * pkpo_s(r, g, k) - r_bar) / sigma
    torch.testing.assert_close(adv("passk_training", r, g, k, eps=0.0), expected)


def test_passk_training_binarises_minus_one_and_is_zero_sum():
    # ±1 convention: −1 is wrong. The reference code would keep −1 as a third class.
    r01 = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0])
    rpm = 2 * r01 - 1
    g = torch.zeros(5, dtype=torch.long)
    a = adv("passk_training", rpm, g, 2)
    torch.testing.assert_close(a, adv("passk_training", r01, g, 2))
    assert abs(a.sum().item()) < 1e-5


def test_passk_training_all_zero_when_every_k_subset_passes():
    # n = 5, c = 4, k = 2: n − c = 1 < k, every pair holds a correct response.
    r = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0])
    assert adv("passk_training", r, torch.zeros(5, dtype=torch.long), 2).tolist() == [0.0] * 5


def test_grpo_passk_equals_loo_minus_one_with_k_equal_n():
    rewards, groups = random_groups(7, binary=False)
    got = ADVANTAGES["grpo_passk"](rewards, groups, 1e-6, norm_by_std=False)
    # k = n per group: compare group by group (group sizes differ)
    for gid in groups.unique().tolist():
        idx = (groups == gid).nonzero().squeeze(-1)
        g = rewards[idx].tolist()
        torch.testing.assert_close(got[idx], torch.tensor(brute_loo_minus_one(g, len(g))).float())


def test_grpo_passk_std_is_bessel_and_ties_for_best_give_zero():
    r = torch.tensor([0.2, 0.9, 0.5, 0.9, 0.1, 0.7, 0.3])
    g = torch.tensor([0, 0, 0, 0, 1, 1, 1])
    a = adv("grpo_passk", r, g, eps=0.0)
    std1 = torch.tensor([0.1, 0.7, 0.3]).std().item()  # unbiased
    expected = torch.tensor([0, 0, 0, 0, 0, (0.7 - 0.3) / std1, 0])
    torch.testing.assert_close(a, expected)


def test_grpo_passk_rejects_groups_of_one():
    with pytest.raises(ValueError, match="at least 2"):
        adv("grpo_passk", torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0, 0, 1]))


@pytest.mark.parametrize("name", sorted(TAKES_K))
def test_k_is_required_and_bounded(name):
    r, g = torch.tensor([1.0, 0.0, 0.0]), torch.zeros(3, dtype=torch.long)
    with pytest.raises(ValueError, match="needs k"):
        compute_advantages(name, r, g)
    with pytest.raises(ValueError, match="k"):
        compute_advantages(name, r, g, k=4 if name != "pkpo_loo" else 3)  # pkpo_loo: k < n


@pytest.mark.parametrize("name", sorted(TAKES_K))
def test_constant_groups_are_exactly_zero(name):
    r = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.3, 0.3, 0.3])
    g = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])
    a, m = compute_advantages(name, r, g, k=2)
    assert a.tolist() == [0.0] * 9
    assert m["adv/zero_group_frac"].item() == 1.0


def test_loo_minus_one_with_k1_is_rloo():
    rewards, groups = random_groups(3, binary=False)
    torch.testing.assert_close(adv("pkpo_loo_minus_one", rewards, groups, 1),
                               adv("rloo", rewards, groups))


def test_large_groups_stay_finite_and_exact():
    # n = 64, k = 32: C(64, 32) ≈ 1.8e18 would lose integers in float64; the log form holds.
    r = torch.zeros(64)
    r[:5] = 1.0
    g = torch.zeros(64, dtype=torch.long)
    a = adv("pkpo_loo_minus_one", r, g, 32)
    # binary closed form: C(n−c, k−1)/C(n, k) for correct, 0 for wrong
    exact = math.comb(59, 31) / math.comb(64, 32)
    torch.testing.assert_close(a[:5], torch.full((5,), exact))
    assert (a[5:] == 0).all()
