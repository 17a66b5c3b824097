"""The high-entropy "forking token" mask (Wang et al. 2025, "Beyond the 80/20 Rule", arXiv
2506.01939; docs/methods/wider-field.md §6c): keep the policy gradient only on the top ρ of tokens
by entropy.

A pure function usable with any loss: multiply the per-token policy loss by ``weight`` before
``aggregate`` (the entropy bonus and the KL stay unmasked). The threshold is global over every
valid token of the mini-batch on every rank **(ours)**, which avoids the three bugs seen
elsewhere: padding in the quantile (TRL #3709), a per-GPU threshold (TRL #3833) and a hang when
one rank has no tokens (TRL #4041: here every rank always joins the gather).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

Gather = Callable[[torch.Tensor], list[torch.Tensor]]
"""``gather(x)`` returns every rank's ``x`` in rank order; every rank must call it, also with an
empty ``x``. ``x`` is a 1-D float32 CPU tensor (e.g.
``explorl.training.distributed``'s ``gather``)."""


@dataclass
class TokenMask:
    """The forking mask of one batch (shapes as the entropy passed in)."""

    keep: torch.Tensor  # (N, T) bool: valid tokens among the global top k by entropy
    weight: torch.Tensor  # (N, T) float: keep, × n_valid/k with renorm_kept (global counts)
    metrics: dict[str, torch.Tensor]


def _num_kept(rho: float, n_valid: int) -> int:
    """k = max(1, ceil(ρ·n_valid)); the 1e-9 keeps ceil(0.7·10) = 7, not 8."""
    return min(n_valid, max(1, math.ceil(rho * n_valid - 1e-9)))


def forking_token_mask(
    entropy: torch.Tensor,
    mask: torch.Tensor,
    rho: float,
    *,
    renorm_kept: bool = False,
    gather: Gather | None = None,
    rank: int = 0,
) -> TokenMask:
    """Keep the k = max(1, ceil(ρ·n_valid)) highest-entropy valid tokens of the whole batch.

    ``entropy`` (N, T) is detached (the sheet: from the pass that computed old_logp, at the
    sampling temperature); ``mask`` (N, T) marks valid tokens; padding never enters the count or
    the threshold. With ``gather`` (and this process's ``rank``) the batch is the union of every
    rank's valid tokens: all ranks get the same threshold and metrics, equal to one process
    holding the rank-ordered concatenation. Ties at the threshold are broken by position in that
    concatenation (row-major within a rank), so exactly k tokens are kept.

    ``renorm_kept`` reproduces the official code's token-mean over the *kept* tokens: weight =
    n_valid/k on kept tokens, so token-mean over valid tokens becomes a mean over kept ones
    (≈ 1/ρ = 5× larger steps at ρ = 0.2). Off (TRL's rule): denominators unchanged.

    Metrics (0-dim, global): ``entropy/mask_threshold`` (the k-th largest entropy),
    ``entropy/mask_kept_frac`` (k/n_valid ≈ ρ), ``entropy/mask_kept_mean`` and
    ``entropy/mask_dropped_mean`` (mean entropy of kept / dropped tokens; 0 when none). All
    are 0 and nothing is kept when no rank has a valid token.
    """
    if not 0 < rho <= 1:
        raise ValueError(f"forking mask: need 0 < rho ≤ 1, got {rho}")
    mask = mask.bool()
    local = entropy.detach().float()[mask]  # (n_local,), row-major
    parts = gather(local.cpu()) if gather is not None else [local]
    all_h = torch.cat([p.to(local.device) for p in parts])  # (n_valid,) global, rank order
    n_valid = all_h.numel()
    keep = torch.zeros_like(mask)
    zero = entropy.new_zeros((), dtype=torch.float32)
    if n_valid == 0:
        names = ("threshold", "kept_frac", "kept_mean", "dropped_mean")
        return TokenMask(keep, keep.float(), {f"entropy/mask_{n}": zero for n in names})

    k = _num_kept(rho, n_valid)
    top = torch.topk(all_h, k).values  # (k,) descending
    thr = top[-1]
    # Exactly k kept: every token above thr, then tokens equal to thr in global order.
    ties_needed = k - int((all_h > thr).sum())
    ties_before = int(sum((p.to(local.device) == thr).sum() for p in parts[:rank]))
    tie = local == thr
    tie_pos = torch.cumsum(tie.long(), 0) - 1 + ties_before
    keep[mask] = (local > thr) | (tie & (tie_pos < ties_needed))

    scale = n_valid / k if renorm_kept else 1.0
    kept_sum = top.sum()
    dropped = (all_h.sum() - kept_sum) / (n_valid - k) if k < n_valid else zero
    metrics = {
        "entropy/mask_threshold": thr,
        "entropy/mask_kept_frac": zero + k / n_valid,
        "entropy/mask_kept_mean": kept_sum / k,
        "entropy/mask_dropped_mean": dropped,
    }
    return TokenMask(keep, keep.float() * scale, metrics)
