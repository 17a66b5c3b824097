"""KL estimators k1/k2/k3/low_var_kl by hand (docs/methods/baseline.md §0, §7b), and what each one's
gradient optimises as a loss term (exact sums over a 6-way softmax)."""

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
    assert sorted(KL_ESTIMATORS) == ["k1", "k2", "k3", "low_var_kl"]
    with pytest.raises(ValueError, match="k1.*k2.*k3.*low_var_kl"):
        kl_estimate(LOGP, REF, "k4")


def test_low_var_kl_equals_k3_below_the_clamp_and_clamps_above():
    """verl low_var_kl: d = ref − logp clamped to [−20, 20], k3, result clamped to [−10, 10]."""
    torch.testing.assert_close(kl_estimate(LOGP, REF, "low_var_kl"), kl_estimate(LOGP, REF, "k3"))
    logp = torch.tensor([0.0, -15.0, -40.0, 0.0], requires_grad=True)
    ref = torch.tensor([-15.0, 0.0, 0.0, -0.5])
    # d = [−15, 15, 40 → 20, −0.5]: k3 = [14.0000003, e^15 − 16 ≈ 3.27e6, ...] → [10, 10, 10, ·]
    k3 = kl_estimate(logp.detach(), ref, "k3")
    assert k3[1] == pytest.approx(math.exp(15) - 16, rel=1e-6)  # unclamped k3 at a ratio of e^15
    out = kl_estimate(logp, ref, "low_var_kl")
    small = math.exp(-0.5) + 0.5 - 1
    torch.testing.assert_close(out.detach(), torch.tensor([10.0, 10.0, 10.0, small]))
    out.sum().backward()
    assert logp.grad[:3].abs().max() == 0  # clamped: no gradient
    assert logp.grad[3] == pytest.approx(1 - math.exp(-0.5), abs=1e-6)  # d/dlogp k3 = 1 − e^d


def _expected_gradient(kind: str, theta: torch.Tensor, ref_logits: torch.Tensor) -> torch.Tensor:
    """E_{y~π}[∇θ k(y)] exactly: Σ_y sg(π(y)) · ∇θ k(logπ(y), logref(y)) (samples fixed)."""
    theta = theta.clone().requires_grad_(True)
    logp = torch.log_softmax(theta, -1)
    ref = torch.log_softmax(ref_logits, -1)
    loss = (logp.exp().detach() * kl_estimate(logp, ref, kind)).sum()
    (g,) = torch.autograd.grad(loss, theta)
    return g


def _grad(fn, theta: torch.Tensor) -> torch.Tensor:
    theta = theta.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(fn(theta), theta)
    return g


def test_what_each_estimator_gradient_optimises():
    """§7b: E[∇k1] = 0; E[∇k2] = ∇KL(π‖ref); E[∇k3] = ∇KL(ref‖π) (and low_var_kl where it
    does not clamp)."""
    g = torch.Generator().manual_seed(3)
    theta, ref_logits = torch.randn(6, generator=g, dtype=torch.float64), torch.randn(
        6, generator=g, dtype=torch.float64)
    ref = torch.log_softmax(ref_logits, -1)

    def reverse(t):  # KL(π‖ref)
        lp = torch.log_softmax(t, -1)
        return (lp.exp() * (lp - ref)).sum()

    def forward(t):  # KL(ref‖π)
        return (ref.exp() * (ref - torch.log_softmax(t, -1))).sum()

    assert _expected_gradient("k1", theta, ref_logits).abs().max() < 1e-12
    torch.testing.assert_close(_expected_gradient("k2", theta, ref_logits), _grad(reverse, theta))
    torch.testing.assert_close(_expected_gradient("k3", theta, ref_logits), _grad(forward, theta))
    torch.testing.assert_close(_expected_gradient("low_var_kl", theta, ref_logits),
                               _grad(forward, theta))
    # the two directions differ here, so the tests above tell them apart
    assert (_grad(reverse, theta) - _grad(forward, theta)).abs().max() > 1e-2
