"""Losses that never cut a token's gradient: CISPO (a clipped stop-gradient weight) and SAPO (a
smooth gate on the ratio), each with its ``LossSpec``."""

from __future__ import annotations

import torch

from explorl.algorithms.covariance import masked_mean, per_token_advantages, token_covariance
from explorl.algorithms.loss_terms import log_ratio, loss_metrics
from explorl.algorithms.spec import LossSpec


def cispo_loss(logp, old_logp, advantages, mask, cfg, generator=None, selection=None):
    """CISPO (MiniMax-M1, arXiv 2506.13585 Eq. 4–6; docs/methods/wider-field.md §6b): REINFORCE with
    a clipped, stop-gradient importance weight, so no token ever loses its gradient.

    w = sg(min(ratio, w_max)) with ``cfg.cispo_w_max`` an *absolute* cap on the ratio (TRL's
    form; verl's clip_ratio_high = 0.2 is w_max = 1.2), per-token loss = −w·A·logp. With
    ``cfg.cispo_mask`` (Eq. 6, off in the paper's main runs) tokens with A > 0 ∧ ratio > w_max
    or A < 0 ∧ ratio < 1 − eps_low get loss 0. The paper aggregates by token-mean over the
    global batch (Eq. 4). On-policy (w = 1) the gradient equals PPO's, the value −A·logp does not.
    """
    mask = mask.bool()
    adv = per_token_advantages(advantages.detach(), logp)  # (N, T)
    ratio = torch.exp(log_ratio(logp, old_logp, mask)).detach()  # (N, T)
    w = ratio.clamp(max=cfg.cispo_w_max)
    logp_v = torch.where(mask, logp, torch.zeros_like(logp))  # padding may be -inf
    loss = -w * adv * logp_v
    dropped = torch.zeros_like(mask)
    if cfg.cispo_mask:
        dropped = ((adv > 0) & (ratio > cfg.cispo_w_max)) | ((adv < 0) & (ratio < 1 - cfg.eps_low))
        dropped &= mask
    loss = torch.where(mask & ~dropped, loss, torch.zeros_like(loss))
    capped = (ratio > cfg.cispo_w_max) & mask
    cov = token_covariance(logp, adv, mask)  # (N, T)
    no = torch.zeros_like(mask)
    metrics = loss_metrics(ratio, mask, capped, no, cov, no)
    metrics["loss/cispo_masked_frac"] = masked_mean(dropped.float(), mask)
    return loss, metrics


def sapo_loss(logp, old_logp, advantages, mask, cfg, generator=None, selection=None):
    """SAPO (Gao et al. 2025, arXiv 2511.20347 Eq. 6–7; TRL ``loss_type="sapo"``): a smooth,
    temperature-controlled gate on the token ratio in place of PPO's hard clip.

    f(r) = (4/τ)·σ(τ·(r − 1)), τ = ``cfg.sapo_tau_pos`` if A > 0 else ``cfg.sapo_tau_neg``;
    per-token loss = −f(ratio)·A. Its gradient is −A·w·ratio·∇logp with w = 4σ(1 − σ): w = 1
    on policy (the plain policy gradient, as PPO's) and fades smoothly as the ratio leaves 1, on
    both sides, faster for larger τ; no token's gradient is ever cut to exactly 0. No eps, no
    clip: ``loss/clip_frac`` is 0. The paper and TRL aggregate by seq-mean-token-mean.
    """
    mask = mask.bool()
    adv = per_token_advantages(advantages.detach(), logp)  # (N, T)
    ratio = torch.exp(log_ratio(logp, old_logp, mask))  # (N, T)
    tau = torch.where(adv > 0, torch.full_like(adv, cfg.sapo_tau_pos),
                      torch.full_like(adv, cfg.sapo_tau_neg))  # (N, T)
    gate = torch.sigmoid(tau * (ratio - 1.0))  # (N, T)
    loss = -(4.0 / tau) * gate * adv
    loss = torch.where(mask, loss, torch.zeros_like(loss))
    cov = token_covariance(logp, adv, mask)  # (N, T)
    no = torch.zeros_like(mask)
    metrics = loss_metrics(ratio, mask, no, no, cov, no)
    g = gate.detach()
    metrics["loss/sapo_gate_mean"] = masked_mean(4.0 * g * (1.0 - g), mask)
    return loss, metrics


CISPO = LossSpec(
    name="cispo", fn=cispo_loss,
    docs="methods/wider-field.md#6b-cispo-clipped-importance-sampling-weights",
    reads=frozenset({"cispo_w_max", "cispo_mask", "eps_low"}),  # eps_low: the Eq. 6 mask only
    ranges={"cispo_w_max": "(0, inf)"},
    why_not={"eps_high": "CISPO caps its weight with algorithm.cispo_w_max, never eps_high"},
)
SAPO = LossSpec(
    name="sapo", fn=sapo_loss,
    docs="methods/wider-field.md#6k-sapo-soft-gate-instead-of-the-clip",
    reads=frozenset({"sapo_tau_pos", "sapo_tau_neg"}),
    ranges={"sapo_tau_pos": "(0, inf)", "sapo_tau_neg": "(0, inf)"},  # 4/τ: τ = 0 divides by 0
    agg="seq-mean-token-mean",  # the paper's and TRL's
    why_not={"eps_high": ("SAPO has no clip bounds: its soft gate is shaped by "
                          "algorithm.sapo_tau_pos/neg")},
)
