"""Per-token policy losses: PPO-clip, Clip-Cov, KL-Cov, GSPO, CISPO (docs/methods/baseline.md §0,
docs/methods/entropy-mechanism.md §2, docs/methods/wider-field.md §6a-b), SAPO, LUSPO, VESPO (TRL
1.16's ``loss_type`` names), AEPO's entropy-balanced clip; and their registry, ``LOSS_SPECS``: one
``spec.LossSpec`` per loss, declared beside its function (``clip_losses``, ``sequence_losses``,
``weighted_losses``). Every table below is derived from it.

One signature, as in verl's ``core_algos``::

    fn(logp, old_logp, advantages, mask, cfg, generator=None, selection=None)
        -> (per_token_loss, metrics)

logp, old_logp (N, T); advantages (N,) or (N, T); mask (N, T) bool. ``cfg`` is any object
with ``eps_low, eps_high, clip_c, clip_cov_ratio, clip_cov_lb, clip_cov_ub, kl_cov_ratio,
kl_cov_coef`` (and optionally ``kl_cov_tol``, default 0); GSPO and LUSPO also read ``agg``,
CISPO ``cispo_w_max`` and ``cispo_mask``, SAPO ``sapo_tau_pos/neg``, VESPO ``vespo_k_pos/neg``
and ``vespo_lambda_pos/neg`` (``READS`` lists each loss's fields). VESPO alone takes one more
keyword, ``behaviour_log_weight`` (``take_correction``). The loss is 0 outside the mask;
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

import torch

from explorl.algorithms.clip_losses import (
    AEPO,
    CLIP_COV,
    KL_COV,
    PPO,
    aepo_loss,
    clip_cov_loss,
    clip_cov_select,
    kl_cov_loss,
    kl_cov_select,
    ppo_loss,
)
from explorl.algorithms.loss_terms import LOG_RATIO_CLAMP
from explorl.algorithms.rollout_correction import response_mean_weight, sequence_log_weight
from explorl.algorithms.sequence_losses import (
    GSPO,
    GSPO_LOG_RATIO_MAX,
    LUSPO,
    VESPO,
    VESPO_LOG_W_MIN,
    gspo_loss,
    luspo_loss,
    vespo_loss,
)
from explorl.algorithms.spec import LossSpec, owned_ranges
from explorl.algorithms.weighted_losses import CISPO, SAPO, cispo_loss, sapo_loss

LOSS_SPECS: dict[str, LossSpec] = {s.name: s for s in (
    PPO, CLIP_COV, KL_COV, GSPO, CISPO, SAPO, LUSPO, VESPO, AEPO,
)}
"""``algorithm.loss`` -> its spec: the one registration of each loss."""

LOSSES = {name: s.fn for name, s in LOSS_SPECS.items()}
"""Name -> loss function."""

READS = {name: s.reads for name, s in LOSS_SPECS.items()}
"""The ``cfg`` fields each loss (and its selector) reads (docs/methods/combining.md §7d; a test
records every attribute each one touches). KL-Cov has no clip, CISPO caps with ``cispo_w_max``,
SAPO's gate and VESPO's φ(W) are smooth: none reads eps_high, so a controller moving eps_high does
nothing to them."""

REQUIRED_AGG = {name: s.agg for name, s in LOSS_SPECS.items() if s.aggs == (s.agg,)}
"""Losses that are only correct under one aggregation mode (checked when the loss runs and, for
``algorithm.agg``, at load)."""

AGG_WHY = {name: s.agg_why for name, s in LOSS_SPECS.items() if name in REQUIRED_AGG}
"""Why each ``REQUIRED_AGG`` loss needs its mode, for the error."""

FOLDS_CORRECTION = {name: s.correction_modes for name, s in LOSS_SPECS.items()
                    if s.correction == "fold"}
"""Losses that take the rollout correction into their own weight instead of having their
per-token loss multiplied by it (``algorithm.rollout_correction``, §7a), with the correction
modes they accept: VESPO multiplies its sequence weight W by Π_t w_t (the update passes
``behaviour_log_weight``); dropped tokens (mask modes) still leave the loss and its
denominators."""

SELECTORS = {name: s.selector for name, s in LOSS_SPECS.items() if s.selector is not None}
"""Losses that select tokens over a batch; the trainer runs these over a whole mini-batch."""

LOSS_RANGES = owned_ranges(LOSS_SPECS.values())
"""``algorithm.<field>`` -> interval of every field a loss owns (checked at load)."""


def loss_agg(loss: str, agg: str | None) -> str:
    """The aggregation mode of the policy term: ``agg`` when set, else the loss's own."""
    return agg if agg is not None else LOSS_SPECS[loss].agg


def entropy_agg(loss: str, agg: str) -> str:
    """The aggregation mode of the entropy bonus under ``loss`` whose policy term uses ``agg``:
    the loss's own ``entropy_agg`` (LUSPO: token-mean, not its per-response token sums, which
    would multiply the bonus by the mean length), else ``agg``."""
    return LOSS_SPECS[loss].entropy_agg or agg


def take_correction(loss: str, weight: torch.Tensor, keep: torch.Tensor, mask: torch.Tensor):
    """How ``loss`` takes the rollout correction's token weights and kept tokens (N, T)
    (``LossSpec.correction``): returns (the weight to multiply its per-token loss by, None when
    it folds them in; the valid tokens that stay in the loss and its denominators; the extra
    keyword arguments of the loss call). ``fold`` (VESPO): log Π_t w_t into its sequence weight;
    ``response-mean`` (LUSPO, TRL's form): the response's mean weight on each of its tokens."""
    form = LOSS_SPECS[loss].correction
    if form == "fold":
        return None, keep, {"behaviour_log_weight": sequence_log_weight(weight, keep)}
    if form == "response-mean":
        weight, keep = response_mean_weight(weight, keep, mask)
    return weight, keep, {}


__all__ = [
    "AGG_WHY", "FOLDS_CORRECTION", "GSPO_LOG_RATIO_MAX", "LOG_RATIO_CLAMP", "LOSSES",
    "LOSS_RANGES", "LOSS_SPECS", "READS", "REQUIRED_AGG", "SELECTORS", "VESPO_LOG_W_MIN",
    "aepo_loss", "cispo_loss", "clip_cov_loss", "clip_cov_select", "entropy_agg", "gspo_loss",
    "kl_cov_loss", "kl_cov_select", "loss_agg", "luspo_loss", "ppo_loss", "sapo_loss",
    "take_correction", "vespo_loss",
]
