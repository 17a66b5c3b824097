"""KL estimators k1/k2/k3 by hand (ALGORITHMS.md §0)."""

import math

import pytest
import torch

from explorl.algorithms import KL_ESTIMATORS, kl_estimate

LOGP = torch.tensor([[math.log(0.5), -1.0, -3.0]])
REF = torch.tensor([[math.log(0.25), -2.0, -3.0]])


def test_k1():
    torch.testing.assert_close(
        kl_estimate(LOGP, REF, "k1"), torch.tensor([[math.log(2), 1.0, 0.0]])
    )


def test_k2():
    torch.testing.assert_close(
        kl_estimate(LOGP, REF, "k2"), torch.tensor([[0.5 * math.log(2) ** 2, 0.5, 0.0]])
    )


def test_k3():
    # d = ref - logp: [ln(1/2), -1, 0] -> e^d - d - 1 = [1/2 + ln 2 - 1, e^-1 + 1 - 1, 0]
    torch.testing.assert_close(
        kl_estimate(LOGP, REF, "k3"), torch.tensor([[0.5 + math.log(2) - 1, math.exp(-1), 0.0]])
    )


def test_k3_is_nonnegative_and_default():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(50, generator=g), torch.randn(50, generator=g)
    assert (kl_estimate(a, b) >= 0).all()
    torch.testing.assert_close(kl_estimate(a, b), kl_estimate(a, b, "k3"))


def test_registry_and_unknown():
    assert sorted(KL_ESTIMATORS) == ["k1", "k2", "k3"]
    with pytest.raises(ValueError, match="k1.*k2.*k3"):
        kl_estimate(LOGP, REF, "k4")
