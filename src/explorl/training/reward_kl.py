"""KL in the reward (verl ``use_kl_in_reward``; docs/methods/baseline.md §7c): each response's Σ_t
kl_t to the frozen reference, computed before the advantages.

The token reward becomes −β·kl_t with the outcome R at the last token; every outcome estimator
sums it, so it sees R − β·Σ_t kl_t (``advantages.estimator_rewards``). kl_t compares the sampling
pass's log-probs (old_logp, after the trainer's recompute when there is one) with the
reference's at the sampling temperature, by ``algorithm.kl_estimator``; no gradient flows through
a reward. One no-grad reference forward per micro-batch of this rank's rows, one gather.
"""

from __future__ import annotations

import torch

from explorl.algorithms import kl_estimate
from explorl.policy.forward import response_logprobs
from explorl.rollout.types import Rollouts
from explorl.training.batch import StepBatch


@torch.no_grad()
def reference_kl_sums(ref: torch.nn.Module, ro: Rollouts, sb: StepBatch, dist, *, kind: str,
                      temperature: float, sizes: list[int], chunk_size: int, amp,
                      fused: bool = True) -> None:
    """Fill ``sb.rows.kl_sum`` (N,) with Σ_t kl_t of every response of the global batch;
    ``sizes``: this rank's micro-batches (``optim.micro_batch_size`` / ``_tokens``)."""
    mask = ro.response_mask
    sums = []
    for idx in torch.arange(len(ro)).split(sizes):  # host: row indices
        sub = ro.select(idx)
        with amp():
            ref_logp, _ = response_logprobs(ref, sub.prompt_ids, sub.prompt_mask,
                                            sub.response_ids, sub.token_mask, temperature,
                                            chunk_size=chunk_size, with_entropy=False,
                                            fused=fused)
        kl = kl_estimate(sub.old_logp.float(), ref_logp.float(), kind)  # (n_mb, T)
        sums.append(torch.where(mask[idx], kl, torch.zeros_like(kl)).sum(-1).cpu().double())
    local = torch.cat(sums) if sums else torch.zeros(0, dtype=torch.float64)  # host
    out = torch.zeros(len(sb.rows.reward), dtype=torch.float64)  # host: a StepRows column
    for part in dist.gather({"local": sb.local.cpu(), "kl": local}):
        out[part["local"]] = part["kl"]
    sb.rows.kl_sum = out
