"""Token covariance and per-difficulty means by hand (Entropy Mechanism Eq. 10, §2b)."""

import pytest
import torch

from explorl.algorithms import covariance_by_difficulty, token_covariance


def test_token_covariance_by_hand():
    # valid tokens: logp [-1, -2 | -3] (mean -2), A per token [1, 1 | 0] (mean 2/3)
    # Cov = [(1)(1/3), (0)(1/3), (-1)(-2/3)] = [1/3, 0, 2/3]
    logp = torch.tensor([[-1.0, -2.0, -float("inf")], [-3.0, 7.0, 7.0]], requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    cov = token_covariance(logp, torch.tensor([1.0, 0.0]), mask)
    torch.testing.assert_close(cov, torch.tensor([[1 / 3, 0.0, 0.0], [2 / 3, 0.0, 0.0]]))
    assert not cov.requires_grad
    # per-token advantages give the same
    adv_t = torch.tensor([[1.0, 1.0, 50.0], [0.0, 50.0, 50.0]])
    torch.testing.assert_close(token_covariance(logp, adv_t, mask), cov)


def test_covariance_mean_is_the_batch_covariance():
    g = torch.Generator().manual_seed(0)
    logp, adv = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
    mask = torch.ones(4, 6, dtype=torch.bool)
    expected = torch.cov(torch.stack([logp.flatten(), adv.flatten()]), correction=0)[0, 1]
    torch.testing.assert_close(token_covariance(logp, adv, mask).mean(), expected)


def test_by_difficulty_buckets():
    cov = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0], [5.0, 7.0, 9.0], [4.0, 99.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    # 2/3 and 1/3 exactly (as float32 2-of-3 and 1-of-3) are medium
    acc = torch.tensor([0.9, 2.0, 1.0, 0.25])
    acc[1:3] /= 3
    out = covariance_by_difficulty(cov, mask, acc)
    assert out["cov/by_difficulty/easy"].item() == pytest.approx((1 + 2) / 2)
    assert out["cov/by_difficulty/medium"].item() == pytest.approx(
        (3 + 5 + 7 + 9) / 4
    )  # token-weighted
    assert out["cov/by_difficulty/hard"].item() == pytest.approx(4.0)  # padding 99 ignored


def test_empty_bucket_is_zero():
    out = covariance_by_difficulty(
        torch.ones(2, 2), torch.ones(2, 2, dtype=torch.bool), torch.tensor([0.5, 0.5])
    )
    assert out == {
        "cov/by_difficulty/easy": 0.0,
        "cov/by_difficulty/medium": 1.0,
        "cov/by_difficulty/hard": 0.0,
    }
