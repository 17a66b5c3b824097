"""The field's remaining corrections by hand (docs/methods/baseline.md §7c): seq-mean-token-sum,
plain REINFORCE++ and its verl baseline variant, batch-std scaling, and pass@k estimators reading
correctness instead of a shaped reward (§6d)."""

import math

import pytest
import torch

from explorl.algorithms import aggregate, compute_advantages
from explorl.algorithms.advantages import READS_CORRECTNESS, TAKES_K


def test_seq_mean_token_sum_by_hand():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 99.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    # (1/N_seq)·Σ_i Σ_t ℓ = (6 + 9)/2; token-mean 15/5; seq-mean-token-mean (2 + 4.5)/2
    assert aggregate(loss, mask, "seq-mean-token-sum").item() == pytest.approx(7.5)
    assert aggregate(loss, mask, "token-mean").item() == pytest.approx(3.0)
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx(3.25)
    # global denominators: this micro-batch is 2 of 4 sequences
    assert aggregate(loss, mask, "seq-mean-token-sum", seq_denom=4).item() == pytest.approx(3.75)


def test_plain_reinforce_plus_plus_whitens_over_tokens_without_a_group_baseline():
    # R = [1, 0, 0, 1], lengths [1, 2, 3, 2]: 8 tokens, μ = (1 + 2)/8 = 3/8.
    # Σ w (R − μ)² = 3·(5/8)² + 5·(3/8)² = 120/64 = 15/8; unbiased σ² = (15/8)/7 = 15/56.
    r = torch.tensor([1.0, 0.0, 0.0, 1.0])
    lengths = torch.tensor([1, 2, 3, 2])
    sigma = math.sqrt(15 / 56)
    expected = torch.tensor([5 / 8, -3 / 8, -3 / 8, 5 / 8]) / sigma
    for groups in (torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 2, 3])):  # groups ignored
        adv, _ = compute_advantages("reinforce_plus_plus", r, groups, eps=0.0, lengths=lengths)
        torch.testing.assert_close(adv, expected)
    # a constant group is not zeroed (no group baseline), unlike every group estimator
    adv, _ = compute_advantages("reinforce_plus_plus", r, torch.tensor([0, 1, 1, 0]), eps=0.0,
                                lengths=lengths)
    assert adv[1] != 0 and adv[2] != 0
    # without lengths: one weight per response, μ = 1/2, σ² = 1/3
    adv, _ = compute_advantages("reinforce_plus_plus", r, torch.zeros(4, dtype=torch.long),
                                eps=0.0)
    torch.testing.assert_close(adv, torch.tensor([1, -1, -1, 1]) * 0.5 / math.sqrt(1 / 3))


def test_reinforce_plus_plus_baseline_as_verl():
    # groups a = [1, 0], b = [0, 1], c = [1] (size 1: verl's mean 0, x = R)
    # x = [.5, −.5, −.5, .5, 1], lengths [1, 2, 3, 2, 4]: μ = (.5 − 1 − 1.5 + 1 + 4)/12 = 1/4
    # x − μ = [.25, −.75, −.75, .25, .75]; Σ w d² = .0625 + 1.125 + 1.6875 + .125 + 2.25 = 5.25
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0])
    groups = torch.tensor([5, 5, 9, 9, 2])
    sigma = math.sqrt(5.25 / 11)
    adv, _ = compute_advantages("reinforce_plus_plus_baseline", r, groups, eps=0.0,
                                lengths=torch.tensor([1, 2, 3, 2, 4]))
    torch.testing.assert_close(adv, torch.tensor([0.25, -0.75, -0.75, 0.25, 0.75]) / sigma)


def test_grpo_batch_std_divides_by_the_std_of_every_reward():
    # group 0 = [1, 0] (mean .5), group 1 = [.5, .5] (constant -> 0).
    # batch std of [1, 0, .5, .5]: Σ(r − .5)² = .5, unbiased var .5/3 = 1/6.
    r = torch.tensor([1.0, 0.0, 0.5, 0.5])
    g = torch.tensor([0, 0, 1, 1])
    adv, _ = compute_advantages("grpo_batch_std", r, g, eps=0.0)
    s = math.sqrt(1 / 6)
    torch.testing.assert_close(adv, torch.tensor([0.5 / s, -0.5 / s, 0.0, 0.0]))
    grpo, _ = compute_advantages("grpo", r, g, eps=0.0)  # group std √(1/2): a different scale
    torch.testing.assert_close(grpo, torch.tensor([0.5 / math.sqrt(0.5), -0.5 / math.sqrt(0.5),
                                                   0.0, 0.0]))


# A format credit of 0.1: the shaped reward is [1, .1, .1, 0]; only the first is correct.
SHAPED = torch.tensor([1.0, 0.1, 0.1, 0.0])
CORRECT = torch.tensor([1.0, 0.0, 0.0, 0.0])
GROUP = torch.zeros(4, dtype=torch.long)


def test_passk_reads_correctness_not_the_shaped_reward():
    # docs/methods/wider-field.md §6d: N = 4, c = 1, k = 2: R̄ = 0.5, σ = 0.5 → [1, −1/3, −1/3,
    # −1/3].
    adv, _ = compute_advantages("passk_training", SHAPED, GROUP, eps=0.0, k=2, correct=CORRECT)
    torch.testing.assert_close(adv, torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]))
    # the shaped reward read as correctness: "3 of 4 correct", N − c < k → every advantage 0
    wrong, _ = compute_advantages("passk_training", SHAPED, GROUP, eps=0.0, k=2)
    assert wrong.abs().max() == 0


@pytest.mark.parametrize("name", sorted(READS_CORRECTNESS))
def test_every_passk_estimator_reads_correct_when_given(name):
    k = {"k": 2} if name in TAKES_K else {}
    got, _ = compute_advantages(name, SHAPED, GROUP, eps=1e-6, correct=CORRECT, **k)
    want, _ = compute_advantages(name, CORRECT, GROUP, eps=1e-6, **k)
    torch.testing.assert_close(got, want)
    assert not torch.equal(got, compute_advantages(name, SHAPED, GROUP, eps=1e-6, **k)[0])


def test_group_estimators_ignore_correct():
    got, _ = compute_advantages("grpo", SHAPED, GROUP, correct=CORRECT)
    torch.testing.assert_close(got, compute_advantages("grpo", SHAPED, GROUP)[0])
