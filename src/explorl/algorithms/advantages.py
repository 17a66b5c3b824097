"""Group-relative advantage estimators (ALGORITHMS.md §0).

Every estimator has one signature, ``fn(rewards, group_index, eps) -> advantages``:
``rewards`` is (N,) float, ``group_index`` is (N,) long with arbitrary group ids (not
necessarily contiguous or sorted; groups may have unequal sizes). All statistics are
computed with ``index_add_`` / ``scatter_reduce`` over groups, never a Python loop.

Shared rule **(ours)**: a response whose group has size 1 or identical rewards gets exactly
A = 0. Such a group carries no learning signal, and the rule keeps us from dividing by a
std of ~0 (or of a single sample, where the unbiased std is undefined).
"""

from __future__ import annotations

import torch

ZERO_TOL = 1e-8
"""|A| below this counts as a zero advantage in the ``adv/*zero*`` metrics."""


def group_inverse(group_index: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Map arbitrary group ids to contiguous ids 0..G-1; returns (inverse (N,), G)."""
    ids, inverse = torch.unique(group_index, return_inverse=True)  # (G,), (N,)
    return inverse, ids.numel()


def _group_sum(values: torch.Tensor, inverse: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Per-group sum of ``values`` (N,) -> (G,)."""
    return values.new_zeros(num_groups).index_add_(0, inverse, values)


def degenerate_groups(rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """True (N,) for responses whose group has size 1 or all-equal rewards (DAPO's filter)."""
    return _degenerate(rewards.float(), *group_inverse(group_index))


def _degenerate(r: torch.Tensor, inverse: torch.Tensor, G: int) -> torch.Tensor:
    gmax = r.new_full((G,), -torch.inf).scatter_reduce(0, inverse, r, "amax")  # (G,)
    gmin = r.new_full((G,), torch.inf).scatter_reduce(0, inverse, r, "amin")  # (G,)
    # max == min is exact for equal rewards, unlike std < tol (a float mean of equal
    # values can differ from them by one ulp, which std/eps would blow up).
    return (gmax == gmin)[inverse]  # (N,)


def _group_mean_count(rewards: torch.Tensor, group_index: torch.Tensor):
    """Per-response group mean, group size and the degenerate mask, all (N,)."""
    inverse, G = group_inverse(group_index)
    r = rewards.float()
    count = _group_sum(torch.ones_like(r), inverse, G)  # (G,)
    mean = _group_sum(r, inverse, G) / count  # (G,)
    return r, inverse, G, mean[inverse], count[inverse], _degenerate(r, inverse, G)


def grpo_advantages(rewards: torch.Tensor, group_index: torch.Tensor, eps: float) -> torch.Tensor:
    """GRPO (DeepSeekMath §4.1.2, outcome supervision): A_i = (r_i − mean_g) / (std_g + eps).

    std is the unbiased (n − 1) sample std, as ``torch.std`` in verl and TRL.
    """
    r, inverse, G, mean, count, degenerate = _group_mean_count(rewards, group_index)
    centred = r - mean  # (N,)
    var = _group_sum(centred**2, inverse, G)[inverse] / (count - 1).clamp(min=1)  # (N,)
    adv = centred / (var.sqrt() + eps)
    return torch.where(degenerate, torch.zeros_like(adv), adv)


def dr_grpo_advantages(
    rewards: torch.Tensor, group_index: torch.Tensor, eps: float
) -> torch.Tensor:
    """Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero"): A_i = r_i − mean_g, no std division.

    ``eps`` is unused (one signature for all estimators).
    """
    r, _, _, mean, _, degenerate = _group_mean_count(rewards, group_index)
    adv = r - mean  # (N,)
    return torch.where(degenerate, torch.zeros_like(adv), adv)


def rloo_advantages(rewards: torch.Tensor, group_index: torch.Tensor, eps: float) -> torch.Tensor:
    """RLOO (Ahmadian et al. 2024): A_i = r_i − mean of the other n − 1 rewards (eps unused)."""
    r, _, _, mean, count, degenerate = _group_mean_count(rewards, group_index)
    # (sum − r_i)/(n − 1); size-1 groups are degenerate, the clamp only avoids 0/0.
    loo_mean = (mean * count - r) / (count - 1).clamp(min=1)  # (N,)
    adv = r - loo_mean
    return torch.where(degenerate, torch.zeros_like(adv), adv)


def reinforce_pp_advantages(
    rewards: torch.Tensor, group_index: torch.Tensor, eps: float
) -> torch.Tensor:
    """REINFORCE++-baseline (Hu et al. 2025): x = r − mean_g, then (x − mean(x)) / (std(x) + eps).

    Mean and unbiased std are over all N responses of the batch (per response, not per
    token as in OpenRLHF, because this function sees no lengths).
    """
    r, _, _, mean, _, degenerate = _group_mean_count(rewards, group_index)
    x = torch.where(degenerate, torch.zeros_like(r), r - mean)  # (N,)
    n = x.numel()
    if n == 0:
        return x
    centred = x - x.mean()
    std = (centred.pow(2).sum() / max(n - 1, 1)).sqrt()  # N = 1: std 0, not torch.std's NaN
    adv = centred / (std + eps)
    # Σx = 0 by construction, so this only removes float noise from the no-signal groups.
    return torch.where(degenerate, torch.zeros_like(adv), adv)


ADVANTAGES = {
    "grpo": grpo_advantages,
    "dr_grpo": dr_grpo_advantages,
    "rloo": rloo_advantages,
    "reinforce_pp": reinforce_pp_advantages,
}


def compute_advantages(
    name: str, rewards: torch.Tensor, group_index: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Advantages by estimator ``name`` (ALGORITHMS.md §0) plus zero-advantage metrics.

    Metrics (0-dim tensors):
      ``adv/zero_frac``: fraction of responses with |A| < 1e-8;
      ``adv/zero_group_frac``: fraction of groups whose advantages are all |A| < 1e-8.
    """
    if name not in ADVANTAGES:
        raise ValueError(f"unknown advantage estimator {name!r}; valid: {sorted(ADVANTAGES)}")
    adv = ADVANTAGES[name](rewards, group_index, eps)  # (N,)
    zero = (adv.abs() < ZERO_TOL).float()  # (N,)
    inverse, G = group_inverse(group_index)
    nonzero_per_group = _group_sum(1.0 - zero, inverse, G)  # (G,)
    metrics = {
        "adv/zero_frac": zero.mean() if zero.numel() else zero.new_zeros(()),
        "adv/zero_group_frac": (nonzero_per_group == 0).float().mean() if G else zero.new_zeros(()),
    }
    return adv, metrics
