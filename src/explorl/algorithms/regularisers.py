"""Per-token KL estimators to a reference policy (Schulman's k1/k2/k3; ALGORITHMS.md §0).

Used as loss += beta · agg(k). All take logp, ref_logp (N, T) and return (N, T), unmasked;
the trainer masks and aggregates. ``ref_logp`` comes from the frozen reference model.
No clamping: the formulas are exact, as ALGORITHMS.md gives them.
"""

from __future__ import annotations

import torch


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 = logp − ref_logp (unbiased, high variance, can be negative)."""
    return logp - ref_logp  # (N, T)


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k2 = ½ (logp − ref_logp)² (biased, low variance, ≥ 0)."""
    return 0.5 * (logp - ref_logp) ** 2  # (N, T)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 = exp(ref − logp) − (ref − logp) − 1 (unbiased, ≥ 0; GRPO's DeepSeekMath Eq. 4)."""
    d = ref_logp - logp  # (N, T)
    return torch.exp(d) - d - 1


KL_ESTIMATORS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token KL(π‖π_ref) estimate of ``kind`` ∈ {k1, k2, k3} (ALGORITHMS.md §0)."""
    if kind not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {kind!r}; valid: {sorted(KL_ESTIMATORS)}")
    return KL_ESTIMATORS[kind](logp, ref_logp)
