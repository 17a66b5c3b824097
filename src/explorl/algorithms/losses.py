"""Per-token policy losses: PPO-clip, Clip-Cov, KL-Cov, GSPO, CISPO (ALGORITHMS.md §0, §2, §6a-b),
SAPO, LUSPO, VESPO (TRL 1.16's ``loss_type`` names), AEPO's entropy-balanced clip.

One signature, as in verl's ``core_algos``::

    fn(logp, old_logp, advantages, mask, cfg, generator=None, selection=None)
        -> (per_token_loss, metrics)

logp, old_logp (N, T); advantages (N,) or (N, T); mask (N, T) bool. ``cfg`` is any object
with ``eps_low, eps_high, clip_c, clip_cov_ratio, clip_cov_lb, clip_cov_ub, kl_cov_ratio,
kl_cov_coef`` (and optionally ``kl_cov_tol``, default 0); GSPO and LUSPO also read ``agg``,
CISPO ``cispo_w_max`` and ``cispo_mask``, SAPO ``sapo_tau_pos/neg``, VESPO ``vespo_k_pos/neg``
and ``vespo_lambda_pos/neg`` (``READS`` lists each loss's fields). VESPO alone takes one more
keyword, ``behaviour_log_weight`` (``FOLDS_CORRECTION``). The loss is 0 outside the mask;
reduce it with ``aggregation.aggregate``.

Metrics (0-dim tensors, means over the valid tokens):
  ``loss/clip_frac``: fraction of valid tokens whose PPO clip is *active*, i.e. the clipped
      term −A·clip(ratio) is strictly greater than −A·ratio, so the token gets no gradient
      (verl's ``pg_clipfrac``). Tokens outside [1−eps_low, 1+eps_high] on the side where the
      unclipped term wins still train and do not count. KL-Cov, SAPO and VESPO do not clip:
      always 0. GSPO and LUSPO: the same test on the sequence ratio s_i (a clipped sequence is
      counted per token).
      CISPO: the fraction of valid tokens whose weight hit the cap, ratio > w_max (they still
      train, with weight w_max). AEPO: the PPO test; its upper-clipped tokens count and train.
  ``loss/dual_clip_frac``: fraction of valid tokens where the dual clip −A·clip_c (A < 0)
      is strictly below the PPO term and so replaces it. 0 when ``clip_c`` is None.
  ``loss/cov_selected_frac``: tokens selected by Clip-Cov/KL-Cov / valid tokens (0 for PPO).
  ``loss/ratio_mean``: mean of ratio = exp(logp − old_logp) (GSPO, LUSPO: of s_i, per token;
      VESPO: of its sequence weight W, per token, with the folded behaviour weight).
  ``loss/seq_log_ratio_abs_mean`` (GSPO, LUSPO): mean over valid tokens of |log s_i| of their
      response, i.e. the token-weighted mean |mean_t(logp − old_logp)|.
  ``loss/sapo_gate_mean`` (SAPO only): mean over valid tokens of the gradient's gate
      4σ(1 − σ), σ = σ(τ(ratio − 1)): the share of the plain policy gradient −A·ratio·∇logp
      a token keeps (1 on policy, → 0 far from it).
  ``loss/vespo_phi_mean`` (VESPO only): mean over valid tokens of φ(W) of their response (1 on
      policy; each response counts by its number of tokens).
  ``loss/cispo_masked_frac`` (CISPO only): fraction of valid tokens dropped by the Eq. 6 mask.
  ``loss/aepo_kept_frac`` (AEPO only): fraction of valid tokens with A > 0 and ratio >
      1 + eps_high, clipped above, whose gradient AEPO keeps (PPO would give them none).
  ``cov/mean``: mean of ``token_covariance`` (the batch covariance of logp and A).
  ``cov/selected_mean``: mean covariance of the selected tokens (0 if none / PPO).

Token selection happens over the whole (N, T) batch passed in, or is passed in precomputed
(``selection=``, from ``SELECTORS``) — the trainer selects over a whole mini-batch even when
it splits it into micro-batches **(ours: per mini-batch; verl selects per micro-batch)**.
"""

from __future__ import annotations

import math

import torch

from explorl.algorithms.covariance import masked_mean, per_token_advantages, token_covariance
from explorl.algorithms.rollout_correction import response_mean_weight, sequence_log_weight

LOG_RATIO_CLAMP = 20.0
"""|logp − old_logp| is clamped here before exp (as verl): e^20 ≈ 5e8 is already no trust
region, and an inf ratio would turn the whole batch's gradient into NaN."""


def _log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """logp − old_logp on valid tokens, 0 on padding (whose values may be garbage or -inf)."""
    diff = logp - old_logp.detach()
    diff = torch.where(mask, diff, torch.zeros_like(diff))  # (N, T)
    return diff.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _ppo_terms(logp, old_logp, adv, mask, cfg):
    """PPO-clip (+ dual clip) per token: returns (loss, ratio, clip_active, dual_active)."""
    ratio = torch.exp(_log_ratio(logp, old_logp, mask))  # (N, T)
    pg1 = -adv * ratio
    pg2 = -adv * ratio.clamp(1.0 - cfg.eps_low, 1.0 + cfg.eps_high)
    loss = torch.maximum(pg1, pg2)
    clip_active = (pg2 > pg1) & mask
    dual_active = torch.zeros_like(clip_active)
    if cfg.clip_c is not None:
        # Dual clip (Ye et al. 2020, verl): for A < 0 cap the loss at −A·c so a huge ratio
        # on a bad token cannot dominate the update.
        pg3 = -adv * cfg.clip_c
        dual_active = (adv < 0) & (pg3 < loss) & mask
        loss = torch.where(adv < 0, torch.minimum(loss, pg3), loss)
    return loss, ratio, clip_active, dual_active


def _metrics(ratio, mask, clip_active, dual_active, cov, selected) -> dict[str, torch.Tensor]:
    n_sel = selected.sum()
    return {
        "loss/clip_frac": masked_mean(clip_active.float(), mask).detach(),
        "loss/dual_clip_frac": masked_mean(dual_active.float(), mask).detach(),
        "loss/cov_selected_frac": (n_sel / mask.sum().clamp(min=1)).float(),
        "loss/ratio_mean": masked_mean(ratio.detach(), mask),
        "cov/mean": masked_mean(cov, mask),
        "cov/selected_mean": masked_mean(cov, selected),
    }


def _num_selected(ratio: float, n_valid: int) -> int:
    """max(1, floor(ratio · n_valid)); the 1e-9 keeps floor(0.29 · 100) = 29, not 28."""
    return max(1, math.floor(ratio * n_valid + 1e-9))


def ppo_loss(logp, old_logp, advantages, mask, cfg, generator=None, selection=None):
    """PPO-clip surrogate (Schulman et al. 2017, L^CLIP), DAPO clip-higher, optional dual clip.

    loss = max(−A·ratio, −A·clip(ratio, 1−eps_low, 1+eps_high)); if clip_c is set and
    A < 0: min(loss, −A·clip_c). ``generator`` and ``selection`` are unused (one signature
    for all losses).
    """
    mask = mask.bool()
    adv = per_token_advantages(advantages.detach(), logp)  # (N, T)
    loss, ratio, clip_active, dual_active = _ppo_terms(logp, old_logp, adv, mask, cfg)
    cov = token_covariance(logp, adv, mask)  # (N, T)
    loss = torch.where(mask, loss, torch.zeros_like(loss))
    selected = torch.zeros_like(mask)
    return loss, _metrics(ratio, mask, clip_active, dual_active, cov, selected)


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
    ratio = torch.exp(_log_ratio(logp, old_logp, mask))  # (N, T)
    high = (1.0 + cfg.eps_high) * ratio / ratio.detach()  # value 1 + eps_high, with a gradient
    clipped = torch.where(ratio > 1.0 + cfg.eps_high, high,
                          ratio.clamp(min=1.0 - cfg.eps_low))  # (N, T)
    pg1, pg2 = -adv * ratio, -adv * clipped
    loss = torch.maximum(pg1, pg2)
    clip_active = (pg2 > pg1) & mask
    dual_active = torch.zeros_like(clip_active)
    if cfg.clip_c is not None:
        pg3 = -adv * cfg.clip_c
        dual_active = (adv < 0) & (pg3 < loss) & mask
        loss = torch.where(adv < 0, torch.minimum(loss, pg3), loss)
    loss = torch.where(mask, loss, torch.zeros_like(loss))
    cov = token_covariance(logp, adv, mask)  # (N, T)
    metrics = _metrics(ratio, mask, clip_active, dual_active, cov, torch.zeros_like(mask))
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
    _, _, clip_active, dual_active = _ppo_terms(logp, old_logp, adv, mask, cfg)
    cov = token_covariance(logp, adv, mask)  # (N, T)
    candidates = mask & ~clip_active & ~dual_active
    candidates &= (cov > cfg.clip_cov_lb) & (cov < cfg.clip_cov_ub)
    cand_idx = candidates.flatten().nonzero().squeeze(-1)  # (C,)
    k = _num_selected(cfg.clip_cov_ratio, int(mask.sum()))
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
    loss, ratio, clip_active, dual_active = _ppo_terms(logp, old_logp, adv, mask, cfg)
    if selection is None:
        selection = clip_cov_select(logp, old_logp, advantages, mask, cfg, generator)
    selected, cov = selection

    detached, *_ = _ppo_terms(logp.detach(), old_logp, adv, mask, cfg)
    loss = torch.where(selected, detached, loss)
    loss = torch.where(mask, loss, torch.zeros_like(loss))
    return loss, _metrics(ratio, mask, clip_active, dual_active, cov, selected)


def kl_cov_select(logp, old_logp, advantages, mask, cfg, generator=None):
    """KL-Cov's token selection: the k = max(1, floor(kl_cov_ratio · n_valid)) valid tokens with
    the largest Cov. Returns (selected (N, T) bool, cov (N, T)); ``generator`` is unused
    (top-k is deterministic)."""
    mask = mask.bool()
    logp = logp.detach()
    adv = per_token_advantages(advantages.detach(), logp)  # (N, T)
    cov = token_covariance(logp, adv, mask)  # (N, T)
    n_valid = int(mask.sum())
    k = min(_num_selected(cfg.kl_cov_ratio, n_valid), n_valid)
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
    log_ratio = _log_ratio(logp, old_logp, mask)  # (N, T)
    ratio = torch.exp(log_ratio)
    pg = -adv * ratio
    if selection is None:
        selection = kl_cov_select(logp, old_logp, advantages, mask, cfg, generator)
    selected, cov = selection

    dist = log_ratio.abs()
    dist = torch.where(dist > getattr(cfg, "kl_cov_tol", 0.0), dist, torch.zeros_like(dist))
    loss = torch.where(selected, pg + cfg.kl_cov_coef * dist, pg)
    loss = torch.where(mask, loss, torch.zeros_like(loss))
    no_clip = torch.zeros_like(mask)
    return loss, _metrics(ratio, mask, no_clip, no_clip, cov, selected)


GSPO_LOG_RATIO_MAX = 10.0
"""Upper clamp of GSPO's per-token log s_{i,t} (verl ``compute_policy_loss_gspo``)."""


def _gspo_terms(logp, old_logp, adv, mask, cfg):
    """GSPO-token per-token loss (0 on padding), its metrics, and log s_i (N,)."""
    # where() first: padded logp may be -inf, and -inf − (-inf) would be NaN in value and grad.
    logp_v = torch.where(mask, logp, torch.zeros_like(logp))  # (N, T)
    seq_len = mask.sum(-1).clamp(min=1)  # (N,)
    log_s = _log_ratio(logp_v, old_logp, mask).detach().sum(-1) / seq_len  # (N,) log s_i
    log_s_tok = (logp_v - logp_v.detach() + log_s[:, None]).clamp(max=GSPO_LOG_RATIO_MAX)
    s = torch.exp(log_s_tok)  # (N, T)
    pg1 = -adv * s
    pg2 = -adv * s.clamp(1.0 - cfg.eps_low, 1.0 + cfg.eps_high)
    loss = torch.maximum(pg1, pg2)
    clip_active = (pg2 > pg1) & mask
    loss = torch.where(mask, loss, torch.zeros_like(loss))
    cov = token_covariance(logp, adv, mask)  # (N, T)
    no = torch.zeros_like(mask)
    metrics = _metrics(s, mask, clip_active, no, cov, no)
    # token-weighted like every loss metric (the trainer sums metric × valid tokens)
    metrics["loss/seq_log_ratio_abs_mean"] = masked_mean(log_s.abs()[:, None].expand_as(s), mask)
    return loss, metrics, log_s


def gspo_loss(logp, old_logp, advantages, mask, cfg, generator=None, selection=None):
    """GSPO (Zheng et al. 2025, arXiv 2507.18071 Eq. 5), GSPO-token form as verl (ALGORITHMS §6a).

    s_i = exp(mean_t(logp − old_logp)) over the valid tokens of response i (length ≥ 1);
    log s_{i,t} = logp_t − sg(logp_t) + sg(log s_i), clamped ≤ 10, so s_{i,t} = s_i in value
    and ∇s_{i,t} = s_i·∇logp_t; loss = max(−A·s_{i,t}, −A·clip(s_{i,t}, 1−eps_low, 1+eps_high)).
    Aggregated with seq-mean-token-mean and one A per response this is sequence-level GSPO in
    value and gradient, so ``cfg.agg`` must be seq-mean-token-mean (verl silently forces it;
    ours: an error). The paper's eps are tiny (3e-4, 4e-4): they bound a sequence's mean ratio.
    """
    _check_agg("gspo", cfg)
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
    answers; LUSPO's weight |o_i| removes that bias. Same s_i, clip and metrics as GSPO.
    """
    _check_agg("luspo", cfg)
    mask = mask.bool()
    adv = per_token_advantages(advantages.detach(), logp)  # (N, T)
    loss, metrics, _ = _gspo_terms(logp, old_logp, adv, mask, cfg)
    return loss, metrics


def cispo_loss(logp, old_logp, advantages, mask, cfg, generator=None, selection=None):
    """CISPO (MiniMax-M1, arXiv 2506.13585 Eq. 4–6; ALGORITHMS §6b): REINFORCE with a clipped,
    stop-gradient importance weight, so no token ever loses its gradient.

    w = sg(min(ratio, w_max)) with ``cfg.cispo_w_max`` an *absolute* cap on the ratio (TRL's
    form; verl's clip_ratio_high = 0.2 is w_max = 1.2), per-token loss = −w·A·logp. With
    ``cfg.cispo_mask`` (Eq. 6, off in the paper's main runs) tokens with A > 0 ∧ ratio > w_max
    or A < 0 ∧ ratio < 1 − eps_low get loss 0. The paper aggregates by token-mean over the
    global batch (Eq. 4). On-policy (w = 1) the gradient equals PPO's, the value −A·logp does not.
    """
    mask = mask.bool()
    adv = per_token_advantages(advantages.detach(), logp)  # (N, T)
    ratio = torch.exp(_log_ratio(logp, old_logp, mask)).detach()  # (N, T)
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
    metrics = _metrics(ratio, mask, capped, no, cov, no)
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
    ratio = torch.exp(_log_ratio(logp, old_logp, mask))  # (N, T)
    tau = torch.where(adv > 0, torch.full_like(adv, cfg.sapo_tau_pos),
                      torch.full_like(adv, cfg.sapo_tau_neg))  # (N, T)
    gate = torch.sigmoid(tau * (ratio - 1.0))  # (N, T)
    loss = -(4.0 / tau) * gate * adv
    loss = torch.where(mask, loss, torch.zeros_like(loss))
    cov = token_covariance(logp, adv, mask)  # (N, T)
    no = torch.zeros_like(mask)
    metrics = _metrics(ratio, mask, no, no, cov, no)
    g = gate.detach()
    metrics["loss/sapo_gate_mean"] = masked_mean(4.0 * g * (1.0 - g), mask)
    return loss, metrics


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
    log_w = _log_ratio(logp, old_logp, mask).detach().sum(-1)  # (N,)
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
    metrics = _metrics(w.expand_as(logp), mask, no, no, cov, no)
    metrics["loss/vespo_phi_mean"] = masked_mean(phi, mask)
    return loss, metrics


REQUIRED_AGG = {"gspo": "seq-mean-token-mean", "luspo": "seq-mean-token-sum"}
"""Losses that are only correct under one aggregation mode (checked when the loss runs and, for
``algorithm.agg``, at load)."""

AGG_WHY = {
    "gspo": "only then is the GSPO-token loss the sequence-level GSPO objective",
    "luspo": "only then is each response's GSPO loss scaled by its length",
}
"""Why each ``REQUIRED_AGG`` loss needs its mode, for the error."""

DEFAULT_AGG = {**REQUIRED_AGG, "sapo": "seq-mean-token-mean"}
"""Each loss's own aggregation where it is not token-mean: what ``algorithm.agg`` left unset
means (SAPO: the paper's and TRL's mean over responses of their token means)."""

ENTROPY_AGG = {"luspo": "token-mean"}
"""Losses whose entropy bonus is not aggregated like their policy term: LUSPO's token sums would
multiply the bonus by the mean response length, so it takes TRL's token mean."""

CORRECTION_FORM = {"vespo": "fold", "luspo": "response-mean"}
"""How a loss takes the rollout correction's token weights w_t where not by multiplying each
token's loss by its own w_t: ``fold`` (VESPO: into its sequence weight W, ``FOLDS_CORRECTION``),
``response-mean`` (LUSPO, TRL's form: each response's loss times the mean of its tokens'
weights, ``rollout_correction.response_mean_weight``)."""


def _check_agg(name: str, cfg) -> None:
    if cfg.agg != REQUIRED_AGG[name]:
        raise ValueError(
            f"loss {name!r} needs algorithm.agg = {REQUIRED_AGG[name]!r} (got {cfg.agg!r}): "
            f"{AGG_WHY[name]}"
        )


def loss_agg(loss: str, agg: str | None) -> str:
    """The aggregation mode of the policy term: ``agg`` when set, else the loss's own."""
    return agg if agg is not None else DEFAULT_AGG.get(loss, "token-mean")


def entropy_agg(loss: str, agg: str) -> str:
    """The aggregation mode of the entropy bonus under ``loss`` whose policy term uses ``agg``."""
    return ENTROPY_AGG.get(loss, agg)


LOSSES = {
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

READS = {
    "ppo": frozenset({"eps_low", "eps_high", "clip_c"}),
    "clip_cov": frozenset({"eps_low", "eps_high", "clip_c", "clip_cov_ratio", "clip_cov_lb",
                           "clip_cov_ub"}),
    "kl_cov": frozenset({"kl_cov_ratio", "kl_cov_coef", "kl_cov_tol"}),
    "gspo": frozenset({"eps_low", "eps_high", "agg"}),
    "cispo": frozenset({"cispo_w_max", "cispo_mask", "eps_low"}),  # eps_low: the Eq. 6 mask only
    "sapo": frozenset({"sapo_tau_pos", "sapo_tau_neg"}),
    "luspo": frozenset({"eps_low", "eps_high", "agg"}),
    "vespo": frozenset({"vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"}),
    "aepo": frozenset({"eps_low", "eps_high", "clip_c"}),
}
"""The ``cfg`` fields each loss (and its selector) reads (ALGORITHMS §7d; a test records every
attribute each one touches). KL-Cov has no clip, CISPO caps with ``cispo_w_max``, SAPO's gate
and VESPO's φ(W) are smooth: none reads eps_high, so a controller moving eps_high does nothing
to them."""

FOLDS_CORRECTION = {"vespo": ("token-truncate", "token-mask")}
"""Losses that take the rollout correction into their own weight instead of having their
per-token loss multiplied by it (``algorithm.rollout_correction``, §7a), with the correction
modes they accept: VESPO multiplies its sequence weight W by Π_t w_t (the update passes
``behaviour_log_weight``); dropped tokens (mask modes) still leave the loss and its
denominators. Sequence-level weights would count twice in W (TRL refuses them as well)."""



def take_correction(loss: str, weight: torch.Tensor, keep: torch.Tensor, mask: torch.Tensor):
    """How ``loss`` takes the rollout correction's token weights and kept tokens (N, T)
    (``CORRECTION_FORM``): returns (the weight to multiply its per-token loss by, None when it
    folds them in; the valid tokens that stay in the loss and its denominators; the extra
    keyword arguments of the loss call)."""
    form = CORRECTION_FORM.get(loss, "token")
    if form == "fold":
        return None, keep, {"behaviour_log_weight": sequence_log_weight(weight, keep)}
    if form == "response-mean":
        weight, keep = response_mean_weight(weight, keep, mask)
    return weight, keep, {}


SELECTORS = {"clip_cov": clip_cov_select, "kl_cov": kl_cov_select}
"""Losses that select tokens over a batch; the trainer runs these over a whole mini-batch."""
