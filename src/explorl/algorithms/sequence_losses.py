"""Losses whose weight is the response's: GSPO and LUSPO (the sequence ratio s_i and its clip),
VESPO (a Gamma-shaped sequence importance weight), each with its ``LossSpec``."""

from __future__ import annotations

import math

import torch

from explorl.algorithms.covariance import masked_mean, per_token_advantages, token_covariance
from explorl.algorithms.loss_terms import LOG_RATIO_CLAMP, log_ratio, loss_metrics
from explorl.algorithms.spec import LossSpec

GSPO_LOG_RATIO_MAX = 10.0
"""Upper clamp of GSPO's per-token log s_{i,t} (verl ``compute_policy_loss_gspo``)."""


def _gspo_terms(logp, old_logp, adv, mask, cfg):
    """GSPO-token per-token loss (0 on padding), its metrics, and log s_i (N,)."""
    # where() first: padded logp may be -inf, and -inf − (-inf) would be NaN in value and grad.
    logp_v = torch.where(mask, logp, torch.zeros_like(logp))  # (N, T)
    seq_len = mask.sum(-1).clamp(min=1)  # (N,)
    log_s = log_ratio(logp_v, old_logp, mask).detach().sum(-1) / seq_len  # (N,) log s_i
    log_s_tok = (logp_v - logp_v.detach() + log_s[:, None]).clamp(max=GSPO_LOG_RATIO_MAX)
    s = torch.exp(log_s_tok)  # (N, T)
    pg1 = -adv * s
    pg2 = -adv * s.clamp(1.0 - cfg.eps_low, 1.0 + cfg.eps_high)
    loss = torch.maximum(pg1, pg2)
    clip_active = (pg2 > pg1) & mask
    loss = torch.where(mask, loss, torch.zeros_like(loss))
    cov = token_covariance(logp, adv, mask)  # (N, T)
    no = torch.zeros_like(mask)
    metrics = loss_metrics(s, mask, clip_active, no, cov, no)
    # token-weighted like every loss metric (the trainer sums metric × valid tokens)
    metrics["loss/seq_log_ratio_abs_mean"] = masked_mean(log_s.abs()[:, None].expand_as(s), mask)
    return loss, metrics, log_s


def gspo_loss(logp, old_logp, advantages, mask, cfg, generator=None, selection=None):
    """GSPO (Zheng et al. 2025, arXiv 2507.18071 Eq. 5), GSPO-token form as verl
    (docs/methods/wider-field.md §6a).

    s_i = exp(mean_t(logp − old_logp)) over the valid tokens of response i (length ≥ 1);
    log s_{i,t} = logp_t − sg(logp_t) + sg(log s_i), clamped ≤ 10, so s_{i,t} = s_i in value
    and ∇s_{i,t} = s_i·∇logp_t; loss = max(−A·s_{i,t}, −A·clip(s_{i,t}, 1−eps_low, 1+eps_high)).
    Aggregated with seq-mean-token-mean and one A per response this is sequence-level GSPO in
    value and gradient, so ``cfg.agg`` must be seq-mean-token-mean (verl silently forces it;
    ours: an error). The paper's eps are tiny (3e-4, 4e-4): they bound a sequence's mean ratio.
    """
    _check_agg(GSPO, cfg)
    mask = mask.bool()
    adv = per_token_advantages(advantages.detach(), logp)  # (N, T)
    loss, metrics, _ = _gspo_terms(logp, old_logp, adv, mask, cfg)
    return loss, metrics


def luspo_loss(logp, old_logp, advantages, mask, cfg, generator=None, selection=None):
    """LUSPO (Liu et al. 2026, arXiv 2602.05261; TRL ``loss_type="luspo"``): GSPO with each
    response's sequence-level loss scaled by its length |o_i|.

    The per-token loss is GSPO's (``gspo_loss``, GSPO-token form); summed over a response's
    tokens it is |o_i|·max(−A·s_i, −A·clip(s_i, 1−eps_low, 1+eps_high)) in value and gradient,
    so ``cfg.agg`` must be seq-mean-token-sum (Σ_i Σ_t ℓ_{i,t} / N_seq, TRL's
    ``(per_token_loss * mask).sum(-1).mean()``). GSPO's 1/|o_i| gives a long response the same
    weight as a short one, so its many clipped negative-advantage sequences push towards short
    answers; LUSPO's weight |o_i| removes that bias. Same s_i, clip and metrics as GSPO. Its
    spec takes a token-level rollout correction as each response's mean weight (TRL's form,
    ``losses.take_correction``) and its entropy bonus as the token mean.
    """
    _check_agg(LUSPO, cfg)
    mask = mask.bool()
    adv = per_token_advantages(advantages.detach(), logp)  # (N, T)
    loss, metrics, _ = _gspo_terms(logp, old_logp, adv, mask, cfg)
    return loss, metrics


def _check_agg(spec: LossSpec, cfg) -> None:
    if cfg.agg not in spec.aggs:
        raise ValueError(f"loss {spec.name!r} needs algorithm.agg = {spec.agg!r} "
                         f"(got {cfg.agg!r}): {spec.agg_why}")


VESPO_LOG_W_MIN = math.log(1e-8)
"""Lower clamp of VESPO's log W (TRL ``get_gamma_weights``, after the official code): W below
1e-8 is a response the policy has all but abandoned; its φ is ~0 either way."""


def vespo_loss(logp, old_logp, advantages, mask, cfg, generator=None, selection=None,
               behaviour_log_weight=None):
    """VESPO (Shen et al. 2026, arXiv 2602.10693; TRL ``loss_type="vespo"``): REINFORCE with a
    stop-gradient, Gamma-shaped weight of the *sequence* importance weight W.

    log W_i = Σ_t (logp − old_logp) over response i's valid tokens (each term clamped to ±20;
    a sum, not GSPO's mean: no length normalisation) + ``behaviour_log_weight`` (N,) when the
    update folds the rollout correction in (the log of Π_t w_t, w the §7a token weight
    π_old/μ), clamped to [log 1e-8, 20]. φ(W) = W^k·exp(λ(1 − W)), computed as
    exp(λ + k·log W − λ·W), with (k, λ) = (``vespo_k_pos``, ``vespo_lambda_pos``) where A ≥ 0
    and (``vespo_k_neg``, ``vespo_lambda_neg``) where A < 0; φ(1) = 1, its peak is at W = k/λ,
    it vanishes as W → 0 (k) and W → ∞ (λ). Per-token loss = −sg(φ)·A·logp, so on policy
    (W = 1) the gradient is the plain policy gradient. No eps, no clip: ``loss/clip_frac`` is 0.
    TRL aggregates by token-mean over the global batch.
    """
    mask = mask.bool()
    adv = per_token_advantages(advantages.detach(), logp)  # (N, T)
    log_w = log_ratio(logp, old_logp, mask).detach().sum(-1)  # (N,)
    if behaviour_log_weight is not None:
        log_w = log_w + behaviour_log_weight.to(log_w)
    log_w = log_w.clamp(VESPO_LOG_W_MIN, LOG_RATIO_CLAMP)[:, None]  # (N, 1)
    w = torch.exp(log_w)  # (N, 1)
    pos = adv >= 0
    k = torch.where(pos, torch.full_like(adv, cfg.vespo_k_pos),
                    torch.full_like(adv, cfg.vespo_k_neg))  # (N, T)
    lam = torch.where(pos, torch.full_like(adv, cfg.vespo_lambda_pos),
                      torch.full_like(adv, cfg.vespo_lambda_neg)).clamp(min=1e-4)  # (N, T)
    phi = torch.exp(lam + k * log_w - lam * w).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    logp_v = torch.where(mask, logp, torch.zeros_like(logp))  # padding may be -inf
    loss = -phi * adv * logp_v
    loss = torch.where(mask, loss, torch.zeros_like(loss))
    cov = token_covariance(logp, adv, mask)  # (N, T)
    no = torch.zeros_like(mask)
    metrics = loss_metrics(w.expand_as(logp), mask, no, no, cov, no)
    metrics["loss/vespo_phi_mean"] = masked_mean(phi, mask)
    return loss, metrics


GSPO = LossSpec(
    name="gspo", fn=gspo_loss,
    docs="methods/wider-field.md#6a-gspo-sequence-level-importance-ratio",
    reads=frozenset({"eps_low", "eps_high", "agg"}),
    agg="seq-mean-token-mean", aggs=("seq-mean-token-mean",),
    agg_why="only then is the GSPO-token loss the sequence-level GSPO objective",
)
LUSPO = LossSpec(
    name="luspo", fn=luspo_loss,
    docs="methods/wider-field.md#6l-luspo-gspo-without-its-length-bias",
    reads=frozenset({"eps_low", "eps_high", "agg"}),
    agg="seq-mean-token-sum", aggs=("seq-mean-token-sum",),
    agg_why="only then is each response's GSPO loss scaled by its length",
    entropy_agg="token-mean",  # its token sums would multiply the bonus by the mean length
    correction="response-mean",  # TRL's form
)
VESPO = LossSpec(
    name="vespo", fn=vespo_loss,
    docs="methods/wider-field.md#6m-vespo-gamma-shaped-sequence-weight",
    reads=frozenset({"vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"}),
    # λ: TRL clamps it ≥ 1e-4; 0 is no damping of W > 1
    ranges={"vespo_k_pos": "[0, inf)", "vespo_lambda_pos": "(0, inf)",
            "vespo_k_neg": "[0, inf)", "vespo_lambda_neg": "(0, inf)"},
    # sequence-level weights would count twice in W (TRL refuses them as well)
    correction="fold", correction_modes=("token-truncate", "token-mask"),
    why_not={"eps_high": ("VESPO has no clip bounds: its sequence weight φ(W) is shaped by "
                          "algorithm.vespo_k_*/vespo_lambda_*")},
)
