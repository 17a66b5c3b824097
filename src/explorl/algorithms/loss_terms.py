"""Terms the policy losses share: the clamped log-ratio, PPO's clipped surrogate, the common
metrics (``losses`` module docstring) and the token count of a covariance selection."""

from __future__ import annotations

import math

import torch

from explorl.algorithms.covariance import masked_mean

LOG_RATIO_CLAMP = 20.0
"""|logp − old_logp| is clamped here before exp (as verl): e^20 ≈ 5e8 is already no trust
region, and an inf ratio would turn the whole batch's gradient into NaN."""


def log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """logp − old_logp on valid tokens, 0 on padding (whose values may be garbage or -inf)."""
    diff = logp - old_logp.detach()
    diff = torch.where(mask, diff, torch.zeros_like(diff))  # (N, T)
    return diff.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def ppo_terms(logp, old_logp, adv, mask, cfg):
    """PPO-clip (+ dual clip) per token: returns (loss, ratio, clip_active, dual_active)."""
    ratio = torch.exp(log_ratio(logp, old_logp, mask))  # (N, T)
    loss, clip_active, dual_active = clipped_surrogate(
        -adv * ratio, -adv * ratio.clamp(1.0 - cfg.eps_low, 1.0 + cfg.eps_high), adv, mask, cfg)
    return loss, ratio, clip_active, dual_active


def clipped_surrogate(pg1, pg2, adv, mask, cfg):
    """max(pg1, pg2) (the unclipped and clipped surrogates), then the dual clip (Ye et al. 2020,
    verl): for A < 0 the loss is capped at −A·c so a huge ratio on a bad token cannot dominate
    the update. Returns (loss, clip_active, dual_active)."""
    loss = torch.maximum(pg1, pg2)
    clip_active = (pg2 > pg1) & mask
    dual_active = torch.zeros_like(clip_active)
    if cfg.clip_c is not None:
        pg3 = -adv * cfg.clip_c
        dual_active = (adv < 0) & (pg3 < loss) & mask
        loss = torch.where(adv < 0, torch.minimum(loss, pg3), loss)
    return loss, clip_active, dual_active


def loss_metrics(ratio, mask, clip_active, dual_active, cov, selected) -> dict[str, torch.Tensor]:
    n_sel = selected.sum()
    return {
        "loss/clip_frac": masked_mean(clip_active.float(), mask).detach(),
        "loss/dual_clip_frac": masked_mean(dual_active.float(), mask).detach(),
        "loss/cov_selected_frac": (n_sel / mask.sum().clamp(min=1)).float(),
        "loss/ratio_mean": masked_mean(ratio.detach(), mask),
        "cov/mean": masked_mean(cov, mask),
        "cov/selected_mean": masked_mean(cov, selected),
    }


def num_selected(ratio: float, n_valid: int) -> int:
    """max(1, floor(ratio · n_valid)); the 1e-9 keeps floor(0.29 · 100) = 29, not 28."""
    return max(1, math.floor(ratio * n_valid + 1e-9))
