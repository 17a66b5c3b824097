"""Entropy-based advantage shaping (Cheng et al. 2025, "Reasoning with Exploration: An Entropy
Perspective", arXiv 2506.14758; ALGORITHMS.md §6e). Runs after the advantage estimator and
before the surrogate, on per-token advantages."""

from __future__ import annotations

import torch

from explorl.algorithms.covariance import masked_mean, per_token_advantages


def entropy_advantage_shaping(
    advantages: torch.Tensor,
    entropy: torch.Tensor,
    mask: torch.Tensor,
    alpha: float,
    kappa: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A_t ← A_t + ψ_t with ψ_t = min(α·sg(H_t), |A_t|/κ) on valid tokens (Cheng et al.).

    ``advantages`` (N,) or (N, T); ``entropy`` (N, T) at the sampling temperature; returns
    per-token advantages (N, T), unchanged (A) outside the mask. κ > 1 keeps the sign: A > 0
    grows by at most |A|/κ, A < 0 shrinks by at most |A|/κ, A = 0 stays 0. Quoted defaults:
    α = 0.4 (GRPO) / 0.1 (PPO), κ = 2.

    Metrics (0-dim, over valid tokens): ``adv/entropy_shaping_mean`` (mean ψ) and
    ``adv/entropy_shaping_capped_frac`` (fraction where the cap |A|/κ < α·H binds).
    """
    if kappa <= 0 or alpha < 0:
        raise ValueError(f"entropy shaping: need alpha ≥ 0 and kappa > 0, got {alpha}, {kappa}")
    mask = mask.bool()
    adv = per_token_advantages(advantages.detach(), entropy)  # (N, T)
    bonus = alpha * entropy.detach()  # sg(H): the shaping term carries no gradient
    cap = adv.abs() / kappa
    psi = torch.where(mask, torch.minimum(bonus, cap), torch.zeros_like(adv))  # (N, T)
    metrics = {
        "adv/entropy_shaping_mean": masked_mean(psi, mask),
        "adv/entropy_shaping_capped_frac": masked_mean((cap < bonus).float(), mask),
    }
    return adv + psi, metrics
