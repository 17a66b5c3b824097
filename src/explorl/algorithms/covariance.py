"""Token covariance between log-prob and advantage (Entropy Mechanism, Eq. 10;
docs/methods/entropy-mechanism.md §2b).

The mean of this centred cross-product is the covariance that drives the entropy change
under policy gradient (Lemma 1 / Theorem 2). Clip-Cov and KL-Cov select tokens by it.
"""

from __future__ import annotations

import torch

EASY_ABOVE = 2.0 / 3.0
"""Group accuracy above this is an *easy* prompt."""
HARD_BELOW = 1.0 / 3.0
"""Group accuracy below this is a *hard* prompt."""
_BUCKET_TOL = 1e-6
"""Slack on the bucket edges: float32(2/3) > 2/3 in float64, yet 2-of-3 correct is medium."""


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over ``mask`` (0-dim); 0 when the mask is empty, never NaN."""
    mask = mask.bool()
    total = torch.where(mask, x, torch.zeros_like(x)).sum()
    return total / mask.sum().clamp(min=1)


def per_token_advantages(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Broadcast per-response (N,) advantages to per-token (N, T)."""
    if advantages.dim() == 1:
        return advantages[:, None].expand_as(like)
    return advantages


def token_covariance(
    logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Entropy Mechanism Eq. 10: Cov = (logp − mean(logp)) · (A − mean(A)) over valid tokens.

    logp (N, T), advantages (N,) or (N, T), mask (N, T). Means are over the valid tokens
    of the whole batch. Returns (N, T), 0 outside the mask. Detached: it only selects
    tokens and is logged, it is never differentiated.
    """
    mask = mask.bool()
    logp = logp.detach().float()
    adv = per_token_advantages(advantages.detach().float(), logp)  # (N, T)
    # where() instead of multiply: padded logp may be -inf, and -inf * 0 = NaN.
    cov = (logp - masked_mean(logp, mask)) * (adv - masked_mean(adv, mask))  # (N, T)
    return torch.where(mask, cov, torch.zeros_like(cov))


def covariance_by_difficulty(
    cov: torch.Tensor, mask: torch.Tensor, group_accuracy: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Mean token covariance per prompt-difficulty bucket (Entropy Mechanism §3;
    docs/methods/entropy-mechanism.md §2b).

    ``group_accuracy`` (N,) is, per response, the accuracy of its prompt's group. Buckets:
    easy = accuracy > 2/3, hard = accuracy < 1/3, medium otherwise (2/3 and 1/3 themselves
    are medium). Each value is the mean of ``cov`` over the valid tokens of the bucket's
    responses (token-weighted); an empty bucket reports 0.0 rather than NaN, so plots of
    a bucket can show 0 where the batch had no such prompt.
    """
    mask = mask.bool()
    acc = group_accuracy.float()  # (N,)
    easy = acc > EASY_ABOVE + _BUCKET_TOL
    hard = acc < HARD_BELOW - _BUCKET_TOL
    medium = ~easy & ~hard
    return {
        f"cov/by_difficulty/{name}": masked_mean(cov.detach().float(), mask & rows[:, None])
        for name, rows in (("easy", easy), ("medium", medium), ("hard", hard))
    }
