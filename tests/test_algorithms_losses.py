"""PPO-clip, Clip-Cov and KL-Cov per-token losses by hand (docs/methods/baseline.md §0,
docs/methods/entropy-mechanism.md §2c, §2d)."""

import math
from types import SimpleNamespace

import pytest
import torch

from explorl.algorithms import LOSSES, clip_cov_loss, kl_cov_loss, ppo_loss
from explorl.algorithms.losses import REQUIRED_AGG

LN = math.log


def make_cfg(**kw):
    base = {
        "eps_low": 0.2,
        "eps_high": 0.28,
        "clip_c": None,
        "clip_cov_ratio": 0.25,
        "clip_cov_lb": 1.0,
        "clip_cov_ub": 5.0,
        "kl_cov_ratio": 0.25,
        "kl_cov_coef": 1.0,
        "agg": "seq-mean-token-mean",  # GSPO's required mode (LUSPO's: REQUIRED_AGG)
        "cispo_w_max": 1.2,
        "cispo_mask": False,
        "sapo_tau_pos": 1.0,
        "sapo_tau_neg": 1.05,
        "vespo_k_pos": 2.0,
        "vespo_lambda_pos": 3.0,
        "vespo_k_neg": 3.0,
        "vespo_lambda_neg": 2.0,
    }
    base.update(kw)
    return SimpleNamespace(**base)


def leaf(x):
    return torch.tensor(x, dtype=torch.float32, requires_grad=True)


def grad_of(loss, logp):
    (g,) = torch.autograd.grad(loss.sum(), logp)
    return g


# --------------------------------------------------------------------------- PPO

RATIOS = [0.5, 0.9, 1.0, 1.25, 1.5]


def ppo_inputs():
    # Row 0: A = +1, row 1: A = -1, same ratios; old_logp = 0 so ratio = exp(logp).
    logp = leaf([[LN(r) for r in RATIOS]] * 2)
    old = torch.zeros(2, 5)
    adv = torch.tensor([1.0, -1.0])
    mask = torch.ones(2, 5, dtype=torch.bool)
    return logp, old, adv, mask


def test_ppo_clip_higher_by_hand():
    logp, old, adv, mask = ppo_inputs()
    loss, m = ppo_loss(logp, old, adv, mask, make_cfg(eps_low=0.2, eps_high=0.28))
    # A=+1: max(-r, -clip(r, .8, 1.28)); only r=1.5 is cut to -1.28 (1.25 < 1.28 survives).
    # A=-1: max(r, clip(r)); only r=.5 is raised to .8 (r=1.5 > 1.28 keeps its own loss).
    expected = torch.tensor([[-0.5, -0.9, -1.0, -1.25, -1.28], [0.8, 0.9, 1.0, 1.25, 1.5]])
    torch.testing.assert_close(loss, expected)
    # d/dlogp(-A·r) = -A·r where unclipped, 0 where the clip is active.
    torch.testing.assert_close(
        grad_of(loss, logp),
        torch.tensor([[-0.5, -0.9, -1.0, -1.25, 0.0], [0.0, 0.9, 1.0, 1.25, 1.5]]),
    )
    assert m["loss/clip_frac"].item() == pytest.approx(2 / 10)
    assert m["loss/ratio_mean"].item() == pytest.approx(sum(RATIOS) / 5)


def test_ppo_symmetric_clip_cuts_what_clip_higher_keeps():
    logp, old, adv, mask = ppo_inputs()
    loss, m = ppo_loss(logp, old, adv, mask, make_cfg(eps_low=0.2, eps_high=0.2))
    assert loss[0, 3].item() == pytest.approx(-1.2)  # r = 1.25 now clipped at 1.2
    assert grad_of(loss, logp)[0, 3].item() == 0.0
    assert m["loss/clip_frac"].item() == pytest.approx(3 / 10)


def test_clip_frac_counts_only_active_clipping():
    # A=+1 with r=0.5 is outside [0.8, 1.28] but the unclipped term wins: still trains.
    logp, old, adv, mask = ppo_inputs()
    loss, m = ppo_loss(logp[:, :1], old[:, :1], adv, mask[:, :1], make_cfg())
    assert m["loss/clip_frac"].item() == pytest.approx(1 / 2)  # only A=-1, r=0.5
    assert grad_of(loss, logp)[0, 0].item() == pytest.approx(-0.5)


def test_ppo_dual_clip_by_hand():
    ratios = [2.0, 3.5, 5.0]
    logp = leaf([[LN(r) for r in ratios]] * 2)
    old, mask = torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)
    adv = torch.tensor([-1.0, 1.0])
    loss, m = ppo_loss(logp, old, adv, mask, make_cfg(eps_low=0.2, eps_high=0.2, clip_c=3.0))
    # A=-1: PPO gives max(r, 1.2) = r; dual clip min(r, 3) -> [2, 3, 3].
    # A=+1: dual clip never applies; every r > 1.2 is clipped -> -1.2.
    torch.testing.assert_close(loss, torch.tensor([[2.0, 3.0, 3.0], [-1.2, -1.2, -1.2]]))
    torch.testing.assert_close(
        grad_of(loss, logp), torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    )
    assert m["loss/dual_clip_frac"].item() == pytest.approx(2 / 6)
    assert m["loss/clip_frac"].item() == pytest.approx(3 / 6)
    _, m_off = ppo_loss(logp, old, adv, mask, make_cfg(eps_low=0.2, eps_high=0.2, clip_c=None))
    assert m_off["loss/dual_clip_frac"].item() == 0.0


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_zero_outside_mask_and_no_nan_from_padding(name):
    logp = leaf([[-1.0, -2.0, -math.inf], [-0.5, -math.inf, -math.inf]])
    old = torch.tensor([[-1.1, -1.9, 0.0], [-0.5, -math.inf, 5.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    loss, metrics = LOSSES[name](
        logp,
        old,
        torch.tensor([1.0, -1.0]),
        mask,
        make_cfg(clip_c=3.0, agg=REQUIRED_AGG.get(name, "seq-mean-token-mean")),
        torch.Generator().manual_seed(0),
    )
    assert torch.isfinite(loss).all() and (loss[~mask] == 0).all()
    g = grad_of(loss, logp)
    assert torch.isfinite(g).all() and (g[~mask] == 0).all()
    assert all(torch.isfinite(v) and v.dim() == 0 for v in metrics.values())


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_per_response_and_per_token_advantages_agree(name):
    logp, old, adv, mask = ppo_inputs()
    c = make_cfg(agg=REQUIRED_AGG.get(name, "seq-mean-token-mean"))
    a, _ = LOSSES[name](logp, old, adv, mask, c, torch.Generator().manual_seed(1))
    b, _ = LOSSES[name](
        logp, old, adv[:, None].expand(2, 5), mask, c, torch.Generator().manual_seed(1)
    )
    torch.testing.assert_close(a, b)


def test_ppo_reports_no_selection():
    logp, old, adv, mask = cov_grid()
    _, m = ppo_loss(logp, old, adv, mask, make_cfg())
    assert m["loss/cov_selected_frac"].item() == 0.0
    assert m["cov/selected_mean"].item() == 0.0
    assert m["cov/mean"].item() == pytest.approx(1.5)


# --------------------------------------------------------------------------- covariance grid
# Row 0: A = +1, row 1: A = -1 (batch mean of A is 0). Valid logp sum to -24 (mean -3),
# so Cov = (logp + 3)·A:
#   row 0 logp [0, -1, -2, -3] -> Cov [3, 2, 1, 0]
#   row 1 logp [-7, -5, -4, -2] -> Cov [4, 2, 1, -1]
# Column 4 is padding; as a valid token of row 1 its Cov would be 2, a candidate.
# With lb = 1, ub = 5 (strict) the Cov candidates are (0,0)=3, (0,1)=2, (1,0)=4, (1,1)=2.
# old_logp makes (1,0) an already-clipped token (A=-1, ratio 0.5: clip raises the loss)
# and (0,1) a token outside the clip range whose clip is NOT active (A=+1, ratio 0.5).
# Final candidates: (0,0), (0,1), (1,1).
COV = torch.tensor([[3.0, 2.0, 1.0, 0.0, 0.0], [4.0, 2.0, 1.0, -1.0, 0.0]])
CANDIDATES = {(0, 0), (0, 1), (1, 1)}


def cov_grid(delta=None):
    logp = leaf([[0.0, -1.0, -2.0, -3.0, -5.0], [-7.0, -5.0, -4.0, -2.0, -5.0]])
    log_ratio = torch.zeros(2, 5)
    log_ratio[1, 0] = LN(0.5)
    log_ratio[0, 1] = LN(0.5)
    if delta is not None:
        log_ratio = delta
    old = logp.detach() - log_ratio
    mask = torch.ones(2, 5, dtype=torch.bool)
    mask[:, 4] = False
    return logp, old, torch.tensor([1.0, -1.0]), mask


def selected_by_gradient(ratio, seed):
    """Tokens Clip-Cov detached: zero gradient where PPO alone would give one."""
    logp, old, adv, mask = cov_grid()
    loss, m = clip_cov_loss(
        logp, old, adv, mask, make_cfg(clip_cov_ratio=ratio), torch.Generator().manual_seed(seed)
    )
    g = grad_of(loss, logp)
    zero = {(i, j) for i, j in (g == 0).nonzero().tolist() if mask[i, j]}
    return zero - {(1, 0)}, zero, loss, m


def test_clip_cov_detaches_exactly_k_candidates():
    # k = max(1, floor(0.25 · 8)) = 2 of the 3 candidates.
    sel, zero, _loss, m = selected_by_gradient(0.25, seed=0)
    assert len(sel) == 2 and sel <= CANDIDATES
    # every other valid token trains, except (1,0) which PPO already clipped
    assert zero == sel | {(1, 0)}
    assert m["loss/cov_selected_frac"].item() == pytest.approx(2 / 8)
    assert m["cov/mean"].item() == pytest.approx(12 / 8)  # (3+2+1+0+4+2+1-1)/8
    assert m["cov/selected_mean"].item() == pytest.approx(sum(COV[i, j].item() for i, j in sel) / 2)
    assert m["loss/clip_frac"].item() == pytest.approx(1 / 8)


def test_clip_cov_keeps_ppo_values_only_gradient_changes():
    logp, old, adv, mask = cov_grid()
    ref, _ = ppo_loss(logp, old, adv, mask, make_cfg())
    _, _, loss, _ = selected_by_gradient(0.25, seed=0)
    torch.testing.assert_close(loss, ref)


def test_clip_cov_takes_all_candidates_when_k_exceeds_them_and_at_least_one():
    sel, _, _, m = selected_by_gradient(1.0, seed=0)  # k = 8 > 3 candidates
    assert sel == CANDIDATES  # never padding (1,4), never the clipped (1,0), never Cov = 1
    assert m["cov/selected_mean"].item() == pytest.approx((3 + 2 + 2) / 3)
    sel, _, _, _ = selected_by_gradient(1e-4, seed=0)  # floor(8e-4) = 0 -> max(1, 0) = 1
    assert len(sel) == 1


def test_clip_cov_floor_is_robust_to_float_rounding():
    # 0.29 · 100 = 28.999999999999996 in floating point; floor must still give 29.
    logp = leaf([[-float(i) / 10 for i in range(100)]])
    adv = torch.ones(1, 100)
    adv[0, :50] = -1.0
    _, m = clip_cov_loss(
        logp,
        logp.detach(),
        adv,
        torch.ones(1, 100, dtype=torch.bool),
        make_cfg(clip_cov_ratio=0.29, clip_cov_lb=-1e9, clip_cov_ub=1e9),
    )
    assert m["loss/cov_selected_frac"].item() == pytest.approx(0.29)


def test_clip_cov_is_reproducible_with_a_seed_and_random_across_seeds():
    first = selected_by_gradient(0.25, seed=123)[0]
    assert selected_by_gradient(0.25, seed=123)[0] == first
    seen = {frozenset(selected_by_gradient(0.25, seed=s)[0]) for s in range(20)}
    assert len(seen) > 1 and all(s <= CANDIDATES for s in seen)


# --------------------------------------------------------------------------- KL-Cov


def test_kl_cov_on_policy_equals_plain_policy_gradient():
    logp, _, adv, mask = cov_grid()
    old = logp.detach().clone()
    loss, m = kl_cov_loss(logp, old, adv, mask, make_cfg(kl_cov_ratio=0.25, kl_cov_coef=1.0))
    a = adv[:, None].expand(2, 5)
    pg = torch.where(mask, -a * torch.exp(logp - old), torch.zeros(2, 5))
    torch.testing.assert_close(loss, pg)
    torch.testing.assert_close(grad_of(loss, logp), torch.where(mask, -a, torch.zeros(2, 5)))
    assert m["loss/cov_selected_frac"].item() == pytest.approx(2 / 8)  # selected, but |Δ| = 0


def test_kl_cov_ignores_float_noise_on_the_on_policy_pass():
    """Sampler and trainer log-probs of one policy differ by ~1e-7 (measured on the lab model:
    98% of tokens, at most 3e-6). Without a tolerance |Δ|'s gradient is ±λ on every selected
    token, decided by the noise's sign; with ``kl_cov_tol`` it is the plain policy gradient."""
    logp, _, adv, mask = cov_grid()
    noise = torch.tensor([[2e-6, -2e-6, 3e-6, 2e-6, 0.0], [-2e-6, 2e-6, -3e-6, 2e-6, 0.0]])
    old = logp.detach() - noise
    delta = logp.detach() - old  # the noise as float32 represents it (|Δ| ≈ 2e-6, signs kept)
    assert (delta[mask].abs() > 1e-6).all()
    a = torch.where(mask, -adv[:, None].expand(2, 5) * torch.exp(delta), torch.zeros(2, 5))
    loss, _ = kl_cov_loss(
        logp, old, adv, mask, make_cfg(kl_cov_ratio=0.25, kl_cov_coef=1.0, kl_cov_tol=1e-4)
    )
    torch.testing.assert_close(grad_of(loss, logp), a)
    loss, _ = kl_cov_loss(
        logp, old, adv, mask, make_cfg(kl_cov_ratio=0.25, kl_cov_coef=1.0, kl_cov_tol=0.0)
    )
    g = grad_of(loss, logp)
    # the top-2 covariance tokens (1,0) and (0,0) get sign(noise)·λ on top: −1 and +1
    assert g[1, 0].item() == pytest.approx(a[1, 0].item() - 1.0, abs=1e-5)
    assert g[0, 0].item() == pytest.approx(a[0, 0].item() + 1.0, abs=1e-5)


def test_kl_cov_penalises_exactly_the_top_k_tokens():
    delta = torch.tensor([[0.1, 0.5, 0.05, 0.0, 0.0], [-0.3, 0.2, 0.1, -0.1, 0.0]])
    logp, old, adv, mask = cov_grid(delta)
    lam = 0.5
    loss, m = kl_cov_loss(logp, old, adv, mask, make_cfg(kl_cov_ratio=0.25, kl_cov_coef=lam))
    # k = 2: the two largest Cov are (1,0)=4 and (0,0)=3.
    e = math.exp
    expected = torch.tensor(
        [
            [-e(0.1) + lam * 0.1, -e(0.5), -e(0.05), -1.0, 0.0],  # (0,1): ratio 1.65, not clipped
            [e(-0.3) + lam * 0.3, e(0.2), e(0.1), e(-0.1), 0.0],
        ]
    )
    torch.testing.assert_close(loss, expected)
    expected_grad = torch.tensor(
        [
            [-e(0.1) + lam, -e(0.5), -e(0.05), -1.0, 0.0],  # d|Δ|/dlogp = sign(Δ)
            [e(-0.3) - lam, e(0.2), e(0.1), e(-0.1), 0.0],
        ]
    )
    torch.testing.assert_close(grad_of(loss, logp), expected_grad)
    assert m["loss/cov_selected_frac"].item() == pytest.approx(2 / 8)
    assert m["cov/selected_mean"].item() == pytest.approx((4 + 3) / 2)
    assert m["cov/mean"].item() == pytest.approx(1.5)
    assert m["loss/clip_frac"].item() == 0.0  # KL-Cov never clips
    assert m["loss/ratio_mean"].item() == pytest.approx(
        sum(e(d) for d in [0.1, 0.5, 0.05, 0.0, -0.3, 0.2, 0.1, -0.1]) / 8
    )


def test_kl_cov_k_is_at_least_one():
    logp, old, adv, mask = cov_grid()
    _, m = kl_cov_loss(logp, old, adv, mask, make_cfg(kl_cov_ratio=1e-6))
    assert m["loss/cov_selected_frac"].item() == pytest.approx(1 / 8)
    assert m["cov/selected_mean"].item() == pytest.approx(4.0)


def test_losses_dict():
    from explorl.algorithms.losses import (
        aepo_loss,
        cispo_loss,
        gspo_loss,
        luspo_loss,
        sapo_loss,
        vespo_loss,
    )

    assert LOSSES == {
        "ppo": ppo_loss,
        "clip_cov": clip_cov_loss,
        "kl_cov": kl_cov_loss,
        "gspo": gspo_loss,
        "cispo": cispo_loss,
        "sapo": sapo_loss,
        "luspo": luspo_loss,
        "vespo": vespo_loss,
        "aepo": aepo_loss,
    }


@pytest.mark.parametrize("name", ["ppo", "clip_cov", "kl_cov"])  # GSPO/CISPO: their own tests
def test_log_ratio_is_clamped_at_20(name):
    # A 30-nat jump would give ratio e^30; clamped to e^20 the loss stays finite and no
    # gradient flows through the clamped token (the trust region is long gone there).
    logp = leaf([[30.0, 0.1]])
    old = torch.zeros(1, 2)
    loss, m = LOSSES[name](
        logp,
        old,
        torch.tensor([-1.0]),
        torch.ones(1, 2, dtype=torch.bool),
        make_cfg(eps_low=0.2, eps_high=0.28, kl_cov_ratio=1.0),  # KL-Cov penalises both
    )
    assert loss[0, 0].item() == pytest.approx(math.exp(20.0) + (20.0 if name == "kl_cov" else 0.0))
    assert grad_of(loss, logp)[0, 0].item() == 0.0
    assert m["loss/ratio_mean"].item() == pytest.approx((math.exp(20.0) + math.exp(0.1)) / 2)


def test_selection_over_a_whole_batch_applies_to_its_rows():
    """The trainer selects over a mini-batch (SELECTORS) and passes each micro-batch its rows'
    share: row 0 alone would select its own top token (0,0); the batch-wide top-2 are (1,0) and
    (0,0), so row 1 gets its penalty at (1,0) and row 0 at (0,0)."""
    from explorl.algorithms.losses import SELECTORS, kl_cov_select

    assert set(SELECTORS) == {"clip_cov", "kl_cov"}
    delta = torch.tensor([[0.1, 0.5, 0.05, 0.0, 0.0], [-0.3, 0.2, 0.1, -0.1, 0.0]])
    logp, old, adv, mask = cov_grid(delta)
    cfg = make_cfg(kl_cov_ratio=0.25, kl_cov_coef=0.5)
    sel, cov = kl_cov_select(logp, old, adv, mask, cfg)
    assert {tuple(x) for x in sel.nonzero().tolist()} == {(0, 0), (1, 0)}
    torch.testing.assert_close(cov[mask], COV[mask])
    whole, _ = kl_cov_loss(logp, old, adv, mask, cfg)
    for r in range(2):
        part, m = kl_cov_loss(logp[r:r + 1], old[r:r + 1], adv[r:r + 1], mask[r:r + 1], cfg,
                              selection=(sel[r:r + 1], cov[r:r + 1]))
        torch.testing.assert_close(part, whole[r:r + 1])
        assert m["cov/selected_mean"].item() == pytest.approx(COV[r, 0].item())
    # Without the batch's selection, row 1 on its own picks k = max(1, floor(0.25·4)) = 1 token
    # by its own centred covariance, whose value differs from the batch's.
    _, m = kl_cov_loss(logp[1:], old[1:], adv[1:], mask[1:], cfg)
    assert m["cov/selected_mean"].item() != pytest.approx(COV[1, 0].item())
