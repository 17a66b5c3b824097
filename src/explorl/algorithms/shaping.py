"""Entropy-based advantage shaping (Cheng et al. 2025, "Reasoning with Exploration: An Entropy
Perspective", arXiv 2506.14758; docs/methods/wider-field.md §6e) and AEPO's entropy-aware advantage
(Dong et al. 2025, arXiv 2510.14545). Runs after the advantage estimator and before the surrogate,
on per-token advantages."""

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


def entropy_aware_advantages(
    advantages: torch.Tensor,
    entropy: torch.Tensor,
    mask: torch.Tensor,
    weight: float,
    mean: float,
    std: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """AEPO's entropy-aware advantage (Dong et al. 2025, arXiv 2510.14545 §4.2; the authors'
    ``compute_policy_loss_entropy_balanced_clipping``): Ã_t = A·(1 + w·(H_t − μ)/σ).

    ``advantages`` (N,) or (N, T); ``entropy`` (N, T), detached; μ, σ: the mean and (unbiased)
    standard deviation of H over the batch's valid tokens, passed in so that a batch split over
    ranks shares them (``entropy_moments``); σ = 0 counts as 1. Authors' w = 0.2. Returns
    per-token advantages (N, T), A outside the mask. A token of average entropy keeps A; one a
    standard deviation above gets A·(1 + w). The sign of A flips where (H − μ)/σ < −1/w.

    Metrics (0-dim, over valid tokens): ``adv/aepo_scale_dev_mean``, the mean of |scale − 1|
    = w·|H − μ|/σ (how far the advantages move; the scale's own mean is 1 by construction), and
    ``adv/aepo_flip_frac``, the fraction whose scale is < 0 (the advantage's sign reversed).
    """
    mask = mask.bool()
    adv = per_token_advantages(advantages.detach(), entropy)  # (N, T)
    z = (entropy.detach() - mean) / (std if std > 0 else 1.0)  # (N, T)
    scale = torch.where(mask, 1.0 + weight * z, torch.ones_like(z))  # (N, T)
    metrics = {"adv/aepo_scale_dev_mean": masked_mean((scale - 1.0).abs(), mask),
               "adv/aepo_flip_frac": masked_mean((scale < 0).float(), mask)}
    return adv * scale, metrics


def entropy_moments(entropy: torch.Tensor, mask: torch.Tensor) -> tuple[float, float, float]:
    """(n, ΣH, ΣH²) over the valid tokens: add them over ranks, then ``mean_std``."""
    h = entropy.detach().double()[mask.bool()]
    return float(h.numel()), float(h.sum()), float((h * h).sum())


def mean_std(n: float, s: float, s2: float) -> tuple[float, float]:
    """Mean and unbiased standard deviation (torch.std's) from (n, ΣH, ΣH²)."""
    if n < 1:
        return 0.0, 1.0
    mean = s / n
    var = max(0.0, (s2 - n * mean * mean) / (n - 1)) if n > 1 else 0.0
    return mean, var ** 0.5
