"""GSPO and CISPO against docs/methods/wider-field.md §6a/§6b's worked examples and a direct
autograd of each paper's formula as written (sequence-level GSPO; CISPO's REINFORCE with a
stop-gradient weight)."""

import math
from types import SimpleNamespace

import pytest
import torch

from explorl.algorithms import aggregate
from explorl.algorithms.losses import REQUIRED_AGG, cispo_loss, gspo_loss, ppo_loss

E = math.exp


def cfg(**kw):
    base = {
        "eps_low": 3e-4,  # GSPO paper §5.1 / verl test_gspo_3b_math.sh
        "eps_high": 4e-4,
        "clip_c": None,
        "agg": "seq-mean-token-mean",
        "cispo_w_max": 1.2,  # verl run_cispo_qwen2_5_0_5b_gsm8k.sh: clip_ratio_high = 0.2
        "cispo_mask": False,
    }
    return SimpleNamespace(**{**base, **kw})


def leaf(x):
    return torch.tensor(x, dtype=torch.float64, requires_grad=True)


def grad(x, wrt):
    (g,) = torch.autograd.grad(x, wrt)
    return g


def random_batch(seed, n=6, t=7):
    """Random log-probs, uneven lengths (every row ≥ 1 valid token), -inf in the padding."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t + 1, (n,), generator=gen)
    mask = torch.arange(t)[None, :] < lengths[:, None]  # (N, T)
    base = -torch.rand(n, t, generator=gen, dtype=torch.float64) * 3
    logp = torch.where(mask, base, torch.full_like(base, -math.inf)).requires_grad_(True)
    delta = (torch.rand(n, t, generator=gen, dtype=torch.float64) - 0.5) * 0.6
    old = torch.where(mask, base - delta, torch.zeros_like(base))
    adv = torch.randn(n, generator=gen, dtype=torch.float64)
    return logp, old, adv, mask


# --------------------------------------------------------------------------- GSPO


def test_gspo_worked_example_positive_advantage_trains():
    # §6a: logp − old = [0.1, −0.3] -> s = e^-0.1 = 0.905; A = +1 -> loss −0.905, grad flows.
    logp = leaf([[0.1, -0.3]])
    old = torch.zeros(1, 2, dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, m = gspo_loss(logp, old, torch.tensor([1.0], dtype=torch.float64), mask, cfg())
    torch.testing.assert_close(loss, torch.full((1, 2), -E(-0.1), dtype=torch.float64))
    agg = aggregate(loss, mask, "seq-mean-token-mean")
    assert agg.item() == pytest.approx(-0.904837, abs=1e-6)
    # d/dlogp_t of −s with s = exp(mean_t Δ): −s/|o| per token
    expected = torch.full((1, 2), -E(-0.1) / 2, dtype=torch.float64)
    torch.testing.assert_close(grad(agg, logp), expected)
    assert m["loss/clip_frac"].item() == 0.0
    assert m["loss/ratio_mean"].item() == pytest.approx(E(-0.1))
    assert m["loss/seq_log_ratio_abs_mean"].item() == pytest.approx(0.1)


def test_gspo_worked_example_negative_advantage_is_clipped():
    # A = −1: max(0.905, 0.9997) -> clipped at 1 − 3e-4, zero gradient.
    logp = leaf([[0.1, -0.3]])
    old = torch.zeros(1, 2, dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, m = gspo_loss(logp, old, torch.tensor([-1.0], dtype=torch.float64), mask, cfg())
    torch.testing.assert_close(loss, torch.full((1, 2), 0.9997, dtype=torch.float64))
    assert (grad(loss.sum(), logp) == 0).all()
    assert m["loss/clip_frac"].item() == 1.0


def sequence_level_gspo(logp, old, adv, mask, eps_low, eps_high):
    """GSPO Eq. 5 as written: J = mean_i min(s_i A_i, clip(s_i) A_i), s_i = (π/π_old)^(1/|o_i|),
    with full autograd through s_i (no stop-gradient trick)."""
    lp = torch.where(mask, logp, torch.zeros_like(logp))
    s = torch.exp(torch.where(mask, lp - old, torch.zeros_like(lp)).sum(-1) / mask.sum(-1))
    obj = torch.minimum(s * adv, s.clamp(1 - eps_low, 1 + eps_high) * adv)
    return -obj.mean()


@pytest.mark.parametrize("seed", [0, 2, 3, 4, 5])  # seeds with clipped and unclipped rows
def test_gspo_token_form_equals_sequence_level_gspo(seed):
    """verl's GSPO-token loss under seq-mean-token-mean = sequence-level GSPO, in value and
    gradient, with uneven lengths, -inf padding and sequences clipped on both sides."""
    logp, old, adv, mask = random_batch(seed)
    c = cfg(eps_low=0.02, eps_high=0.03)
    loss, m = gspo_loss(logp, old, adv, mask, c)
    ours = aggregate(loss, mask, "seq-mean-token-mean")
    ref = sequence_level_gspo(logp, old, adv, mask, 0.02, 0.03)
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(grad(ours, logp), grad(ref, logp))
    assert 0 < m["loss/clip_frac"].item() < 1  # the seeds exercise both regimes


def test_gspo_clip_frac_and_log_ratio_metric_are_token_weighted():
    # row 0: 2 tokens, Δ = [0.2, 0.2] -> log s = 0.2 (clipped for A = +1 with eps_high 0.1);
    # row 1: 1 token (+ padding), Δ = −0.05 -> log s = −0.05 (inside [0.9, 1.1]).
    logp = leaf([[0.2, 0.2], [-0.05, 0.0]])
    old = torch.zeros(2, 2, dtype=torch.float64)
    mask = torch.tensor([[True, True], [True, False]])
    _, m = gspo_loss(logp, old, torch.tensor([1.0, 1.0], dtype=torch.float64), mask,
                     cfg(eps_low=0.1, eps_high=0.1))
    assert m["loss/clip_frac"].item() == pytest.approx(2 / 3)
    assert m["loss/seq_log_ratio_abs_mean"].item() == pytest.approx((0.2 + 0.2 + 0.05) / 3)
    assert m["loss/ratio_mean"].item() == pytest.approx((2 * E(0.2) + E(-0.05)) / 3)


def test_gspo_per_token_log_ratio_is_clamped_at_10():
    # mean Δ = (30 + 0.1)/2 = 15.05 > 10: s_{i,t} = e^10 and no gradient through the clamp
    # (the per-token ±20 clamp of every loss here caps Δ = 30 at 20 first).
    logp = leaf([[30.0, 0.1]])
    old = torch.zeros(1, 2, dtype=torch.float64)
    loss, _ = gspo_loss(logp, old, torch.tensor([-1.0], dtype=torch.float64),
                        torch.ones(1, 2, dtype=torch.bool), cfg())
    torch.testing.assert_close(loss, torch.full((1, 2), E(10.0), dtype=torch.float64))
    assert (grad(loss.sum(), logp) == 0).all()


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum-norm"])
def test_gspo_rejects_other_aggregation_modes(agg):
    logp, old, adv, mask = random_batch(0)
    assert REQUIRED_AGG["gspo"] == "seq-mean-token-mean"
    with pytest.raises(ValueError, match="seq-mean-token-mean"):
        gspo_loss(logp, old, adv, mask, cfg(agg=agg))


# --------------------------------------------------------------------------- CISPO


def test_cispo_worked_example():
    # §6b: logp −1, old −1.5 -> ratio e^0.5 = 1.649 -> w = 1.2; A = 2 -> loss 2.4, ∂/∂logp −2.4.
    logp = leaf([[-1.0]])
    old = torch.tensor([[-1.5]], dtype=torch.float64)
    mask = torch.ones(1, 1, dtype=torch.bool)
    loss, m = cispo_loss(logp, old, torch.tensor([2.0], dtype=torch.float64), mask, cfg())
    assert loss.item() == pytest.approx(2.4)
    assert grad(loss.sum(), logp).item() == pytest.approx(-2.4)
    assert m["loss/clip_frac"].item() == 1.0  # ratio > w_max, yet the token trains
    assert m["loss/ratio_mean"].item() == pytest.approx(E(0.5))
    assert m["loss/cispo_masked_frac"].item() == 0.0


def test_cispo_has_no_lower_bound_and_keeps_every_gradient():
    # ratios 0.1 (A < 0) and 5 (A > 0): PPO would cut both; CISPO weights them 0.1 and 1.2.
    logp = leaf([[math.log(0.1), math.log(5.0)]])
    old = torch.zeros(1, 2, dtype=torch.float64)
    adv = torch.tensor([[-1.0, 1.0]], dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, m = cispo_loss(logp, old, adv, mask, cfg())
    expected = torch.tensor([[0.1, -1.2]], dtype=torch.float64)
    torch.testing.assert_close(grad(loss.sum(), logp), expected)
    assert m["loss/clip_frac"].item() == pytest.approx(1 / 2)
    # the Eq. 6 mask drops both: A < 0 ∧ ratio < 1 − eps_low, A > 0 ∧ ratio > w_max
    loss, m = cispo_loss(logp, old, adv, mask, cfg(cispo_mask=True, eps_low=0.2))
    assert (loss == 0).all() and (grad(loss.sum(), logp) == 0).all()
    assert m["loss/cispo_masked_frac"].item() == 1.0


def cispo_as_written(logp, old, adv, mask, w_max):
    """MiniMax-M1 Eq. 4: J = 1/Σ|o_i| · Σ_i Σ_t sg(r̂_{i,t}) Â_i log π(o_{i,t}),
    r̂ = min(r, w_max)."""
    lp = torch.where(mask, logp, torch.zeros_like(logp))
    r = torch.exp(lp - old).detach()
    w = torch.minimum(r, torch.full_like(r, w_max))
    terms = torch.where(mask, w * adv[:, None] * lp, torch.zeros_like(lp))
    return -terms.sum() / mask.sum()


@pytest.mark.parametrize("seed", range(5))
def test_cispo_gradient_equals_the_formula_as_written(seed):
    logp, old, adv, mask = random_batch(seed)
    c = cfg(cispo_w_max=1.1)
    loss, m = cispo_loss(logp, old, adv, mask, c)
    ours = aggregate(loss, mask, "token-mean")
    ref = cispo_as_written(logp, old, adv, mask, 1.1)
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(grad(ours, logp), grad(ref, logp))
    assert 0 < m["loss/clip_frac"].item() < 1


@pytest.mark.parametrize("seed", range(3))
def test_cispo_on_policy_gradient_equals_ppo_but_not_its_value(seed):
    logp, _, adv, mask = random_batch(seed)
    old = torch.where(mask, logp.detach(), torch.zeros_like(logp))
    c = cfg(eps_low=0.2, eps_high=0.28)
    ours = aggregate(cispo_loss(logp, old, adv, mask, c)[0], mask, "token-mean")
    ppo = aggregate(ppo_loss(logp, old, adv, mask, c)[0], mask, "token-mean")
    torch.testing.assert_close(grad(ours, logp), grad(ppo, logp))
    assert abs(ours.item() - ppo.item()) > 1e-3  # −A·logp vs −A·1
