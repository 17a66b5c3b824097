"""Advantage estimators against hand-computed values (docs/methods/baseline.md §0)."""

import math

import pytest
import torch

from explorl.algorithms import ADVANTAGES, compute_advantages

# The group-baseline estimators of §0; the pass@k ones (§6d) need k and have their own tests
# (tests/test_algorithms_passk.py).
BASELINES = ["dr_grpo", "grpo", "reinforce_pp", "rloo"]

# One batch, groups of uneven sizes with arbitrary, unsorted, interleaved ids:
#   group 7  = [1, 0, 0, 1]  (n=4, mean 1/2)
#   group -2 = [1, 1, 0]     (n=3, mean 2/3)
#   group 3  = [1]           (size 1 -> A = 0)
#   group 40 = [0, 0]        (zero variance -> A = 0)
REWARDS = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0])
GROUPS = torch.tensor([7, -2, 7, 3, 40, 7, -2, -2, 40, 7])
# Per position: which group and the reward, to read the expectations below.
#   pos:   0     1     2    3    4    5    6     7     8    9
#   grp:   7    -2     7    3   40    7   -2    -2    40    7
#   r:     1     1     0    1    0    0    1     0     0    1


def _expected(g7_pos, g7_neg, gm2_pos, gm2_neg):
    return torch.tensor([g7_pos, gm2_pos, g7_neg, 0.0, 0.0, g7_neg, gm2_pos, gm2_neg, 0.0, g7_pos])


def test_grpo_by_hand_unbiased_std():
    # group 7: deviations ±1/2, unbiased var = 4·(1/4)/3 = 1/3 -> A = ±(1/2)/√(1/3) = ±√3/2
    # group -2: deviations [1/3, 1/3, -2/3], var = (1/9+1/9+4/9)/2 = 1/3
    #           -> A = [1/3, -2/3]·√3 = [0.5774, -1.1547]
    s3 = math.sqrt(3)
    adv, _ = compute_advantages("grpo", REWARDS, GROUPS, eps=0.0)
    torch.testing.assert_close(adv, _expected(s3 / 2, -s3 / 2, s3 / 3, -2 * s3 / 3))


def test_grpo_eps_is_added_to_std():
    adv, _ = compute_advantages("grpo", REWARDS, GROUPS, eps=0.5)
    std = 1 / math.sqrt(3)  # both informative groups have var 1/3
    torch.testing.assert_close(
        adv,
        _expected(
            0.5 / (std + 0.5), -0.5 / (std + 0.5), (1 / 3) / (std + 0.5), (-2 / 3) / (std + 0.5)
        ),
    )


def test_dr_grpo_by_hand():
    adv, _ = compute_advantages("dr_grpo", REWARDS, GROUPS)
    torch.testing.assert_close(adv, _expected(0.5, -0.5, 1 / 3, -2 / 3))


def test_rloo_by_hand():
    # group 7: 1 - (0+0+1)/3 = 2/3, 0 - (1+0+1)/3 = -2/3
    # group -2: 1 - (1+0)/2 = 1/2, 0 - (1+1)/2 = -1
    adv, _ = compute_advantages("rloo", REWARDS, GROUPS)
    torch.testing.assert_close(adv, _expected(2 / 3, -2 / 3, 0.5, -1.0))


def test_reinforce_pp_by_hand():
    # x = r - group mean = [±1/2 (g7), 1/3, 1/3, -2/3 (g-2), 0 (size 1), 0, 0 (zero var)]
    # Σx = 0, Σx² = 1 + 2/3 = 5/3, unbiased batch var = (5/3)/9 = 5/27.
    std = math.sqrt(5 / 27)
    adv, _ = compute_advantages("reinforce_pp", REWARDS, GROUPS, eps=0.0)
    torch.testing.assert_close(adv, _expected(0.5 / std, -0.5 / std, (1 / 3) / std, (-2 / 3) / std))


@pytest.mark.parametrize("name", BASELINES)
def test_degenerate_groups_are_exactly_zero_even_without_eps(name):
    # 0.1 three times: its float mean is not exactly 0.1, so r - mean is ~1e-9, and with
    # eps = 0 a naive (r - mean)/std would be 0/0 or noise/noise.
    r = torch.tensor([0.1, 0.1, 0.1, 0.7, 1.0, 0.0])
    g = torch.tensor([0, 0, 0, 1, 2, 2])
    adv = ADVANTAGES[name](r, g, 0.0)
    assert torch.isfinite(adv).all()
    assert (adv[:4] == 0).all()
    assert (adv[4:] != 0).all()


@pytest.mark.parametrize("name", BASELINES)
def test_single_response_batch_is_zero_not_nan(name):
    adv, m = compute_advantages(name, torch.tensor([1.0]), torch.tensor([0]))
    assert adv.tolist() == [0.0]
    assert m["adv/zero_frac"].item() == 1.0


def _loop_reference(name, rewards, groups, eps):
    """Straightforward per-group loop, to check the vectorised estimators."""
    out = torch.zeros_like(rewards)
    for gid in groups.unique().tolist():
        idx = (groups == gid).nonzero().squeeze(-1)
        r = rewards[idx]
        if len(r) < 2 or bool((r == r[0]).all()):
            continue
        if name == "grpo":
            out[idx] = (r - r.mean()) / (r.std() + eps)
        elif name == "rloo":
            out[idx] = torch.stack([r[i] - (r.sum() - r[i]) / (len(r) - 1) for i in range(len(r))])
        else:  # dr_grpo and the first step of reinforce_pp
            out[idx] = r - r.mean()
    if name == "reinforce_pp":
        out = (out - out.mean()) / (out.std() + eps)
    return out


@pytest.mark.parametrize("name", BASELINES)
def test_vectorised_equals_loop(name):
    gen = torch.Generator().manual_seed(0)
    sizes = torch.randint(1, 9, (40,), generator=gen)  # uneven, includes size 1
    ids = torch.randperm(1000, generator=gen)[:40] - 500  # arbitrary, negative too
    groups = ids.repeat_interleave(sizes)
    perm = torch.randperm(len(groups), generator=gen)
    groups = groups[perm]  # interleaved, unsorted
    rewards = torch.randint(
        0, 2, (len(groups),), generator=gen
    ).float()  # 0/1: many constant groups
    rewards[::7] = torch.rand(len(rewards[::7]), generator=gen)  # and some non-binary ones
    adv = ADVANTAGES[name](rewards, groups, 1e-6)
    torch.testing.assert_close(
        adv, _loop_reference(name, rewards, groups, 1e-6), atol=1e-5, rtol=1e-5
    )


def test_metrics_zero_frac_and_zero_group_frac():
    _, m = compute_advantages("grpo", REWARDS, GROUPS)
    assert m["adv/zero_frac"].item() == pytest.approx(3 / 10)  # size-1 + two zero-var responses
    assert m["adv/zero_group_frac"].item() == pytest.approx(2 / 4)  # groups 3 and 40
    assert m["adv/zero_frac"].dim() == 0 and m["adv/zero_group_frac"].dim() == 0


def test_zero_frac_counts_responses_zero_group_frac_needs_all_zero():
    # dr_grpo on [0, 0.5, 1]: the middle response has A = 0, its group does not.
    _, m = compute_advantages("dr_grpo", torch.tensor([0.0, 0.5, 1.0]), torch.tensor([4, 4, 4]))
    assert m["adv/zero_frac"].item() == pytest.approx(1 / 3)
    assert m["adv/zero_group_frac"].item() == 0.0


def test_unknown_estimator_lists_valid_names():
    with pytest.raises(ValueError, match="dr_grpo.*grpo.*reinforce_pp.*rloo"):
        compute_advantages("ppo", REWARDS, GROUPS)
