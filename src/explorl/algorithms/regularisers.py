"""Per-token KL estimators to a reference policy (Schulman's k1/k2/k3, verl's ``low_var_kl``;
docs/methods/baseline.md §0, §7b), and EntroPIC's confident-token term (docs/methods/wider-field.md
§6f).

Used as loss += beta · agg(k), or in the reward (``algorithm.kl_in_reward``). All take logp,
ref_logp (N, T) and return (N, T), unmasked; the trainer masks and aggregates. ``ref_logp``
comes from the frozen reference model. With d = ref_logp − logp on tokens y ~ π:

- the *values* of k1 and k3 are unbiased estimates of KL(π‖ref) (k2 is biased, low-variance);
- the *gradients* of the loss term (samples fixed) are not what the value suggests:
  E[∇k1] = 0 (no regularisation at all), E[∇k2] = ∇KL(π‖ref) (reverse KL),
  E[∇k3] = ∇KL(ref‖π) (forward KL). So k1 is refused as a loss term (it belongs in the reward).
"""

from __future__ import annotations

import torch

from explorl.algorithms.aggregation import Denom, _safe_div
from explorl.algorithms.covariance import masked_mean, per_token_advantages
from explorl.algorithms.loss_terms import log_ratio


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 = logp − ref_logp: an unbiased value of KL(π‖ref), high variance, can be negative; its
    expected gradient as a loss is 0 (only meaningful in the reward)."""
    return logp - ref_logp  # (N, T)


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k2 = ½ (logp − ref_logp)²: a biased, low-variance value, ≥ 0; as a loss its expected
    gradient is ∇KL(π‖ref) (the reverse KL)."""
    return 0.5 * (logp - ref_logp) ** 2  # (N, T)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 = exp(ref − logp) − (ref − logp) − 1 (GRPO's, DeepSeekMath Eq. 4): an unbiased value of
    KL(π‖ref), ≥ 0; as a loss its expected gradient is ∇KL(ref‖π) (the forward KL). Unclamped:
    e^15 ≈ 3.3e6 at a log-ratio of −15 (see ``kl_low_var``)."""
    d = ref_logp - logp  # (N, T)
    return torch.exp(d) - d - 1


LOW_VAR_KL_LOG_CLAMP = 20.0
"""verl ``low_var_kl``: |ref − logp| clamped here before exp."""
LOW_VAR_KL_CLAMP = 10.0
"""verl ``low_var_kl``: the k3 value clamped to [−10, 10]."""


def kl_low_var(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """verl's ``low_var_kl``: k3 with d = ref − logp clamped to [−20, 20] and the result to
    [−10, 10] (so a token the policy made far likelier than the reference adds at most 10, and
    no gradient once clamped). Equals k3 wherever k3 ≤ 10."""
    d = (ref_logp - logp).clamp(-LOW_VAR_KL_LOG_CLAMP, LOW_VAR_KL_LOG_CLAMP)  # (N, T)
    return (torch.exp(d) - d - 1).clamp(-LOW_VAR_KL_CLAMP, LOW_VAR_KL_CLAMP)


KL_ESTIMATORS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3, "low_var_kl": kl_low_var}

ZERO_GRADIENT_KL = frozenset({"k1"})
"""Estimators whose expected gradient as a loss term is 0 (refused as a loss term)."""


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token KL(π‖π_ref) estimate of ``kind`` ∈ ``KL_ESTIMATORS`` (docs/methods/baseline.md §0,
    §7b)."""
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
    docs/methods/wider-field.md §6f): the scalar token-mean of −ratio·|A| over *confident* tokens.

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
    ratio = torch.exp(log_ratio(logp, old_logp, mask))  # (N, T)
    if confident is None:
        confident = logp.detach().exp() > p_min
    confident = mask & confident.bool()
    total = torch.where(confident, -ratio * adv.abs(), torch.zeros_like(ratio)).sum()
    term = _safe_div(total, confident.sum() if token_denom is None else token_denom)
    return term, {"loss/entropic_confident_frac": masked_mean(confident.float(), mask)}
