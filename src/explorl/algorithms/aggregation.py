"""Loss aggregation over tokens and sequences (docs/methods/baseline.md §0, verl's ``agg_loss``).

Kept apart from the losses so every loss kind works with every mode. Denominators can be
passed in: with gradient accumulation over micro-batches or several data-parallel ranks
the trainer passes the *global* counts, so the summed gradients equal one big batch.
"""

from __future__ import annotations

import torch

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")

Denom = int | float | torch.Tensor | None


def _safe_div(total: torch.Tensor, denom) -> torch.Tensor:
    """total / denom, and 0 (not NaN/inf) when denom is 0, e.g. an all-padding micro-batch."""
    denom = torch.as_tensor(denom, dtype=total.dtype, device=total.device)
    return torch.where(denom != 0, total / torch.where(denom != 0, denom, 1), 0 * total)


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    token_denom: Denom = None,
    seq_denom: Denom = None,
    max_len: int | None = None,
) -> torch.Tensor:
    """Reduce a (N, T) per-token loss to a scalar (docs/methods/baseline.md §0: DAPO / GRPO /
    Dr.GRPO).

    - ``token-mean`` (DAPO): Σ loss·mask / token_denom; default token_denom = mask.sum().
    - ``seq-mean-token-mean`` (GRPO): Σ_i [Σ_t loss·mask / |o_i|] / seq_denom.
    - ``seq-mean-token-sum`` (verl): Σ_i Σ_t loss·mask / seq_denom (a response's loss is its
      token sum, so long responses weigh more).
    - ``seq-mean-token-sum-norm`` (Dr.GRPO): Σ loss·mask / max_len / seq_denom; ``max_len``
      (the constant generation budget) is required.

    Default seq_denom = number of sequences with at least one valid token (= N unless
    some rows are all padding), as in verl; padding rows do not dilute the mean. A zero
    denominator gives 0, never NaN.
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; valid: {list(AGG_MODES)}")
    mask = mask.bool()
    # where() rather than multiply: a NaN/inf in padding must not leak into the sum.
    masked = torch.where(mask, per_token, torch.zeros_like(per_token))  # (N, T)
    if mode == "token-mean":
        return _safe_div(masked.sum(), mask.sum() if token_denom is None else token_denom)

    seq_len = mask.sum(-1)  # (N,)
    if seq_denom is None:
        seq_denom = (seq_len > 0).sum()
    if mode == "seq-mean-token-mean":
        seq_mean = masked.sum(-1) / seq_len.clamp(min=1)  # (N,)
        return _safe_div(seq_mean.sum(), seq_denom)
    if mode == "seq-mean-token-sum":
        return _safe_div(masked.sum(), seq_denom)
    if max_len is None:
        raise ValueError("seq-mean-token-sum-norm needs max_len (Dr.GRPO's constant length)")
    return _safe_div(masked.sum() / max_len, seq_denom)
