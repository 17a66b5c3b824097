"""Rollout correction: importance weights for the gap between the engine that sampled and the
trainer (docs/methods/baseline.md §7a; truncated IS "TIS" and masked IS "MIS": verl's rollout
correction, slime's MIS, TRL's vLLM importance-sampling correction).

ℓ_t = old_logp(t) − engine_logp(t), detached: old_logp from the trainer's own forward, the
engine's *processed* log-probs at the sampling temperature. Levels: ``token`` w_t = exp(ℓ_t);
``sequence`` w_i = exp(Σ_t ℓ_t); ``geometric`` w_i = exp(mean_t ℓ_t) (in log space throughout).
Modes: ``truncate`` w ← min(w, upper); ``mask`` drops tokens (token level) or whole responses
(sequence levels) with w ∉ [lower, upper] from the policy loss *and its denominators* (slime
PR 657 fixed a version that zeroed them but kept them in the token-mean denominator); kept ones
keep their true w. ``veto``: a response with any token weight below it leaves the loss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

CORRECTION_MODES = ("token-truncate", "token-mask", "sequence-truncate", "sequence-mask",
                    "geometric-truncate", "geometric-mask")

_MIN_KEYS = ("w_min",)
_MAX_KEYS = ("w_max", "ppl_gap_abs_max")


@dataclass
class Correction:
    """Per-token weights of the policy-gradient term and what stays in the loss."""

    weight: torch.Tensor  # (N, T) float, detached; 0 where ``keep`` is False
    keep: torch.Tensor  # (N, T) bool, valid tokens that stay in the loss and its denominators
    sums: dict[str, float]  # for ``correction_metrics``; additive over ranks (``merge_sums``)


@torch.no_grad()
def rollout_correction(old_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor,
                       mode: str, upper: float, lower: float | None = None,
                       veto: float | None = None) -> Correction:
    """The §7a weights of mode ``mode`` (``CORRECTION_MODES``) for (N, T) log-probs."""
    if mode not in CORRECTION_MODES:
        raise ValueError(f"unknown rollout correction mode {mode!r}; valid: {CORRECTION_MODES}")
    level, kind = mode.split("-")
    mask = mask.bool()
    ell = torch.where(mask, old_logp.double() - engine_logp.double(), 0.0)  # (N, T) log-ratios
    n_tok = mask.sum(-1)  # (N,)
    seq = n_tok > 0  # (N,) responses with a valid token
    if level == "token":
        log_w, units = ell, mask  # (N, T)
    else:
        s = ell.sum(-1) if level == "sequence" else ell.sum(-1) / n_tok.clamp_min(1)  # (N,)
        log_w, units = s[:, None].expand_as(ell), seq  # (N, T), one unit per response
    log_hi = math.log(upper)
    log_lo = math.log(lower if lower is not None else 1.0 / upper)
    if kind == "truncate":
        keep = mask.clone()
        applied = torch.exp(log_w.clamp(max=log_hi))
    else:
        keep = mask & (log_w >= log_lo) & (log_w <= log_hi)
        applied = torch.exp(log_w)
    if veto is not None:  # any token weight below the veto drops its whole response
        vetoed = (mask & (ell < math.log(veto))).any(-1)  # (N,)
        keep = keep & ~vetoed[:, None]
    weight = torch.where(keep, applied, 0.0)  # (N, T)

    # Metrics over units: valid tokens (token level) or responses (sequence levels).
    raw = torch.exp(log_w if level == "token" else log_w[:, 0])[units]  # (n_units,)
    w_unit = weight if level == "token" else weight.max(-1).values  # a kept response: its w
    w_unit = w_unit[units]
    ppl_gap = (ell.sum(-1) / n_tok.clamp_min(1))[seq]  # (n_seq,) log-ppl engine − trainer
    ell_v = ell[mask]
    sums = {
        "tokens": float(mask.sum()), "seqs": float(seq.sum()), "units": float(raw.numel()),
        "w_sum": float(raw.sum()),
        "w_min": float(raw.min()) if raw.numel() else math.inf,
        "w_max": float(raw.max()) if raw.numel() else -math.inf,
        "applied_sum": float(w_unit.sum()), "applied_sq_sum": float(w_unit.square().sum()),
        "truncated": float((raw > upper).sum()) if kind == "truncate" else 0.0,
        "masked_tokens": float((mask & ~keep).sum()),
        "masked_seqs": float((seq & ~keep.any(-1)).sum()),
        "k1_sum": float((-ell_v).sum()), "k3_sum": float((ell_v.exp() - ell_v - 1).sum()),
        "ppl_gap_sum": float(ppl_gap.sum()),
        "ppl_gap_abs_max": float(ppl_gap.abs().max()) if ppl_gap.numel() else 0.0,
    }
    return Correction(weight.to(old_logp.dtype), keep, sums)


def sequence_log_weight(weight: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """log Π_t w_t over each response's kept tokens (N,): the token-level weights of a
    ``Correction`` as one sequence weight, for a loss that folds them into its own (VESPO,
    ``LossSpec.correction = "fold"``). Dropped tokens count 1 (they leave the loss instead)."""
    keep = keep.bool()
    safe = torch.where(keep, weight, torch.ones_like(weight))  # log 0 would be -inf
    return torch.where(keep, safe.log(), torch.zeros_like(weight)).sum(-1)  # (N,)


def response_mean_weight(weight: torch.Tensor, keep: torch.Tensor,
                         mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The token-level weights of a ``Correction`` as one weight per response, for a loss whose
    ratio is the response's (LUSPO, TRL's form): w̄_i = Σ_{t kept} w_t / |o_i| on every valid
    token of a response that keeps a token (dropped tokens count 0), and those responses' valid
    tokens all stay in the loss. Summed over the response, w̄_i·|o_i|·ℓ_i = Σ_t w_t·ℓ_i: the
    value of weighting each token, but the gradient of each token is w̄_i·∇ℓ_{i,t}, not
    w_t·∇ℓ_{i,t}. Returns (weight (N, T), keep (N, T))."""
    mask, keep = mask.bool(), keep.bool() & mask.bool()
    total = torch.where(keep, weight, torch.zeros_like(weight)).sum(-1)  # (N,)
    mean = total / mask.sum(-1).clamp(min=1)  # (N,)
    kept_row = keep.any(-1, keepdim=True)  # (N, 1)
    new_keep = mask & kept_row
    new_weight = torch.where(new_keep, mean[:, None].expand_as(weight), torch.zeros_like(weight))
    return new_weight, new_keep


def merge_sums(parts: list[dict[str, float]]) -> dict[str, float]:
    """Several ranks' ``Correction.sums`` as one batch's."""
    out: dict[str, float] = {}
    for p in parts:
        for k, v in p.items():
            if k in _MIN_KEYS:
                out[k] = min(out.get(k, math.inf), v)
            elif k in _MAX_KEYS:
                out[k] = max(out.get(k, -math.inf), v)
            else:
                out[k] = out.get(k, 0.0) + v
    return out


def correction_metrics(sums: dict[str, float]) -> dict[str, float]:
    """``rollout_corr/*`` metrics (docs/metrics.md) from a batch's sums.

    Units are valid tokens at token level and responses at the sequence levels. weight_mean/
    min/max: the raw w = exp(ℓ) before truncation or masking. ess: (Σw')²/(n·Σw'²) of the
    applied weights w' over every unit (0 for dropped ones; 1 when all are equal).
    truncated_frac: units with w > upper (truncate modes). masked_token_frac / masked_seq_frac:
    valid tokens / responses that left the loss (mask modes, veto). mismatch_k1 = mean over
    tokens of engine_logp − old_logp; mismatch_k3 = mean of e^ℓ − ℓ − 1 (both estimate
    KL(engine ‖ trainer) on the engine's samples). log_ppl_gap: mean over responses of
    log-ppl(engine) − log-ppl(trainer) = mean_t ℓ; log_ppl_gap_abs_max: its largest |·|.
    """
    units, tokens, seqs = sums["units"], sums["tokens"], sums["seqs"]
    if units == 0:
        return {}
    return {
        "rollout_corr/weight_mean": sums["w_sum"] / units,
        "rollout_corr/weight_min": sums["w_min"],
        "rollout_corr/weight_max": sums["w_max"],
        "rollout_corr/ess": (sums["applied_sum"] ** 2 / (units * sums["applied_sq_sum"])
                             if sums["applied_sq_sum"] > 0 else 0.0),
        "rollout_corr/truncated_frac": sums["truncated"] / units,
        "rollout_corr/masked_token_frac": sums["masked_tokens"] / max(tokens, 1.0),
        "rollout_corr/masked_seq_frac": sums["masked_seqs"] / max(seqs, 1.0),
        "rollout_corr/mismatch_k1": sums["k1_sum"] / max(tokens, 1.0),
        "rollout_corr/mismatch_k3": sums["k3_sum"] / max(tokens, 1.0),
        "rollout_corr/log_ppl_gap": sums["ppl_gap_sum"] / max(seqs, 1.0),
        "rollout_corr/log_ppl_gap_abs_max": sums["ppl_gap_abs_max"],
    }
