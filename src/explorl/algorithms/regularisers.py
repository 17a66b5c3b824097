"""Per-token KL estimators to a reference policy (Schulman's k1/k2/k3; ALGORITHMS.md §0), and
EntroPIC's confident-token term (§6f).

Used as loss += beta · agg(k). All take logp, ref_logp (N, T) and return (N, T), unmasked;
the trainer masks and aggregates. ``ref_logp`` comes from the frozen reference model.
No clamping: the formulas are exact, as ALGORITHMS.md gives them.
"""

from __future__ import annotations

import torch

from explorl.algorithms.aggregation import Denom, _safe_div
from explorl.algorithms.covariance import masked_mean, per_token_advantages
from explorl.algorithms.losses import _log_ratio


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


ENTROPIC_P_MIN = 0.95
"""EntroPIC acts on tokens whose current probability exceeds this (the official code's 0.95)."""


def entropic_confident_term(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    token_denom: Denom = None,
    p_min: float = ENTROPIC_P_MIN,
    confident: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """EntroPIC's actuator term (arXiv 2511.15248; ``compute_policy_loss_entropic``;
    ALGORITHMS.md §6f): the scalar token-mean of −ratio·|A| over *confident* tokens.

    The trainer adds ``alpha · term`` to the loss, alpha from ``control.laws.EntroPICLaw``.
    Confident = valid ∧ π_θ(token) > p_min (0.95; current policy, detached for the test). ratio =
    exp(logp − old_logp), unclipped (the ±20 log clamp of every loss here). On confident tokens
    this reweights the policy gradient: A > 0 by 1 + α', A < 0 by 1 − α' (α' = α·n_valid/n_conf
    under token-mean), so α > 0 sharpens (entropy too high) and α < 0 flattens.
    The denominator is the confident-token count: ``token_denom`` passes the global count with
    several micro-batches or ranks; default this batch's count (0 tokens -> 0, not NaN).
    ``confident`` (N, T) bool replaces the test (the trainer passes valid ∧ π_old > p_min, from
    the sampling pass, so the global count is known before the update starts).

    Metric: ``loss/entropic_confident_frac`` (confident / valid tokens).
    """
    mask = mask.bool()
    adv = per_token_advantages(advantages.detach(), logp)  # (N, T)
    ratio = torch.exp(_log_ratio(logp, old_logp, mask))  # (N, T)
    if confident is None:
        confident = logp.detach().exp() > p_min
    confident = mask & confident.bool()
    total = torch.where(confident, -ratio * adv.abs(), torch.zeros_like(ratio)).sum()
    term = _safe_div(total, confident.sum() if token_denom is None else token_denom)
    return term, {"loss/entropic_confident_frac": masked_mean(confident.float(), mask)}
