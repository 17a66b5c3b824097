"""PPO-clip and the losses built on its clipped surrogate: AEPO's entropy-balanced clip, Clip-Cov
and KL-Cov (the Entropy Mechanism's), each with its ``LossSpec``."""

from __future__ import annotations

import torch

from explorl.algorithms.covariance import masked_mean, per_token_advantages, token_covariance
from explorl.algorithms.loss_terms import (
    clipped_surrogate,
    log_ratio,
    loss_metrics,
    num_selected,
    ppo_terms,
)
from explorl.algorithms.spec import LossSpec


def ppo_loss(logp, old_logp, advantages, mask, cfg, generator=None, selection=None):
    """PPO-clip surrogate (Schulman et al. 2017, L^CLIP), DAPO clip-higher, optional dual clip.

    loss = max(−A·ratio, −A·clip(ratio, 1−eps_low, 1+eps_high)); if clip_c is set and
    A < 0: min(loss, −A·clip_c). ``generator`` and ``selection`` are unused (one signature
    for all losses).
    """
    mask = mask.bool()
    adv = per_token_advantages(advantages.detach(), logp)  # (N, T)
    loss, ratio, clip_active, dual_active = ppo_terms(logp, old_logp, adv, mask, cfg)
    cov = token_covariance(logp, adv, mask)  # (N, T)
    loss = torch.where(mask, loss, torch.zeros_like(loss))
    selected = torch.zeros_like(mask)
    return loss, loss_metrics(ratio, mask, clip_active, dual_active, cov, selected)


def aepo_loss(logp, old_logp, advantages, mask, cfg, generator=None, selection=None):
    """AEPO's entropy-balanced clipping (Dong et al. 2025, arXiv 2510.14545 §4.2; the authors'
    ``compute_policy_loss_entropy_balanced_clipping``): PPO-clip whose upper bound carries a
    stop-gradient, so a token clipped above keeps a gradient, rescaled to the bound.

    The upper bound is (1 + eps_high)·ratio/sg(ratio): its value is 1 + eps_high, its gradient
    (1 + eps_high)·∇logp. loss = max(−A·ratio, −A·clip(ratio, 1 − eps_low, that bound)), plus
    the dual clip as ``ppo_loss``. Only A > 0 ∧ ratio > 1 + eps_high changes: PPO's gradient 0
    becomes −A·(1 + eps_high)·∇logp, where high-entropy tokens, whose ratios move most, are
    clipped. The lower bound stays constant, as in the authors' code.
    """
    mask = mask.bool()
    adv = per_token_advantages(advantages.detach(), logp)  # (N, T)
    ratio = torch.exp(log_ratio(logp, old_logp, mask))  # (N, T)
    high = (1.0 + cfg.eps_high) * ratio / ratio.detach()  # value 1 + eps_high, with a gradient
    clipped = torch.where(ratio > 1.0 + cfg.eps_high, high,
                          ratio.clamp(min=1.0 - cfg.eps_low))  # (N, T)
    loss, clip_active, dual_active = clipped_surrogate(-adv * ratio, -adv * clipped, adv, mask,
                                                       cfg)
    loss = torch.where(mask, loss, torch.zeros_like(loss))
    cov = token_covariance(logp, adv, mask)  # (N, T)
    metrics = loss_metrics(ratio, mask, clip_active, dual_active, cov, torch.zeros_like(mask))
    kept = (adv > 0) & (ratio.detach() > 1.0 + cfg.eps_high) & mask
    metrics["loss/aepo_kept_frac"] = masked_mean(kept.float(), mask)
    return loss, metrics


def clip_cov_select(logp, old_logp, advantages, mask, cfg, generator=None):
    """Clip-Cov's token selection: returns (selected (N, T) bool, cov (N, T)).

    Candidates are valid tokens with clip_cov_lb < Cov < clip_cov_ub whose PPO gradient is
    not already cut (clip or dual clip active). Of them, max(1, floor(clip_cov_ratio · n_valid))
    are drawn uniformly without replacement with ``generator`` (fewer if there are fewer
    candidates). ``logp`` is used detached.
    """
    mask = mask.bool()
    logp = logp.detach()
    adv = per_token_advantages(advantages.detach(), logp)  # (N, T)
    _, _, clip_active, dual_active = ppo_terms(logp, old_logp, adv, mask, cfg)
    cov = token_covariance(logp, adv, mask)  # (N, T)
    candidates = mask & ~clip_active & ~dual_active
    candidates &= (cov > cfg.clip_cov_lb) & (cov < cfg.clip_cov_ub)
    cand_idx = candidates.flatten().nonzero().squeeze(-1)  # (C,)
    k = num_selected(cfg.clip_cov_ratio, int(mask.sum()))
    gen_device = generator.device if generator is not None else "cpu"
    perm = torch.randperm(cand_idx.numel(), generator=generator, device=gen_device)
    chosen = cand_idx[perm[:k].to(cand_idx.device)]
    selected = torch.zeros(mask.numel(), dtype=torch.bool, device=mask.device)
    selected[chosen] = True
    return selected.view_as(mask), cov


def clip_cov_loss(logp, old_logp, advantages, mask, cfg, generator=None, selection=None):
    """Clip-Cov (Entropy Mechanism Eq. 11–12): detach a random few high-covariance tokens.

    The tokens come from ``clip_cov_select`` on this batch, or ``selection`` = (selected, cov)
    computed by it over a larger batch this one is part of. A selected token keeps its PPO
    loss *value* but computed from detached logp, so it contributes no gradient; all other
    tokens get the PPO loss of ``ppo_loss``.
    """
    mask = mask.bool()
    adv = per_token_advantages(advantages.detach(), logp)  # (N, T)
    loss, ratio, clip_active, dual_active = ppo_terms(logp, old_logp, adv, mask, cfg)
    if selection is None:
        selection = clip_cov_select(logp, old_logp, advantages, mask, cfg, generator)
    selected, cov = selection

    detached, *_ = ppo_terms(logp.detach(), old_logp, adv, mask, cfg)
    loss = torch.where(selected, detached, loss)
    loss = torch.where(mask, loss, torch.zeros_like(loss))
    return loss, loss_metrics(ratio, mask, clip_active, dual_active, cov, selected)


def kl_cov_select(logp, old_logp, advantages, mask, cfg, generator=None):
    """KL-Cov's token selection: the k = max(1, floor(kl_cov_ratio · n_valid)) valid tokens with
    the largest Cov. Returns (selected (N, T) bool, cov (N, T)); ``generator`` is unused
    (top-k is deterministic)."""
    mask = mask.bool()
    logp = logp.detach()
    adv = per_token_advantages(advantages.detach(), logp)  # (N, T)
    cov = token_covariance(logp, adv, mask)  # (N, T)
    n_valid = int(mask.sum())
    k = min(num_selected(cfg.kl_cov_ratio, n_valid), n_valid)
    top = cov.masked_fill(~mask, -torch.inf).flatten().topk(k).indices  # (k,)
    selected = torch.zeros(mask.numel(), dtype=torch.bool, device=mask.device)
    selected[top] = True
    return selected.view_as(mask), cov


def kl_cov_loss(logp, old_logp, advantages, mask, cfg, generator=None, selection=None):
    """KL-Cov (Entropy Mechanism Eq. 13–14): KL penalty on the top-k covariance tokens, no clip.

    The tokens come from ``kl_cov_select`` on this batch, or ``selection`` = (selected, cov)
    computed by it over a larger batch. Selected tokens get −A·ratio + kl_cov_coef·|logp −
    old_logp|; all others −A·ratio. On the first on-policy pass logp == old_logp, so this
    equals the plain policy gradient (|·|' at 0 is 0) **(ours: |Δ| ≤ ``kl_cov_tol`` counts as
    0, because in floating point the sampler's and the trainer's log-probs of the same policy
    differ by ~1e-6 and sign(Δ) would turn that noise into a ±λ push)**.
    """
    mask = mask.bool()
    adv = per_token_advantages(advantages.detach(), logp)  # (N, T)
    lr = log_ratio(logp, old_logp, mask)  # (N, T)
    ratio = torch.exp(lr)
    pg = -adv * ratio
    if selection is None:
        selection = kl_cov_select(logp, old_logp, advantages, mask, cfg, generator)
    selected, cov = selection

    dist = lr.abs()
    dist = torch.where(dist > getattr(cfg, "kl_cov_tol", 0.0), dist, torch.zeros_like(dist))
    loss = torch.where(selected, pg + cfg.kl_cov_coef * dist, pg)
    loss = torch.where(mask, loss, torch.zeros_like(loss))
    no_clip = torch.zeros_like(mask)
    return loss, loss_metrics(ratio, mask, no_clip, no_clip, cov, selected)


CLIP = {"eps_low": "[0, 1]", "eps_high": "[0, 100]", "clip_c": "(1, inf)"}
"""PPO's clip and dual clip, owned by ``ppo`` and read by the losses built on its surrogate."""

PPO = LossSpec(
    name="ppo", fn=ppo_loss,
    docs="methods/baseline.md#formulas-0",
    reads=frozenset(CLIP), ranges=CLIP,
)
AEPO = LossSpec(
    name="aepo", fn=aepo_loss, docs="methods/aepo.md#the-rules", reads=frozenset(CLIP),
)
CLIP_COV = LossSpec(
    name="clip_cov", fn=clip_cov_loss,
    docs="methods/entropy-mechanism.md#2c-clip-cov",
    reads=frozenset({*CLIP, "clip_cov_ratio", "clip_cov_lb", "clip_cov_ub"}),
    ranges={"clip_cov_ratio": "(0, 1]", "clip_cov_lb": "(-inf, inf)",
            "clip_cov_ub": "(-inf, inf)"},
    selector=clip_cov_select,
)
KL_COV = LossSpec(
    name="kl_cov", fn=kl_cov_loss,
    docs="methods/entropy-mechanism.md#2d-kl-cov",
    reads=frozenset({"kl_cov_ratio", "kl_cov_coef", "kl_cov_tol"}),
    ranges={"kl_cov_ratio": "(0, 1]", "kl_cov_coef": "[0, inf)", "kl_cov_tol": "[0, inf)"},
    selector=kl_cov_select, why_not={"eps_high": "KL-Cov has no PPO clip"},
)
