"""# 3. advantages: the estimator over the step's global batch, then entropy advantage shaping on
this rank's tokens, and the step's advantage and covariance metrics.

The estimator sees whole groups (a prompt's responses never split across ranks, and every rank
holds ``StepBatch.rows``), so pass@k estimators and group statistics are those of one process.
Shaping (Cheng et al. 2025, docs/methods/wider-field.md §6e) turns this rank's (n,) advantages into
per-token (n, T) ones, A_t + min(α·H_t, |A_t|/κ), with H_t the rollouts' entropy (the policy's at
the sampling temperature from the pass that gave old_logp). AEPO's entropy-aware advantage
(``algorithm.aepo_adv_weight``) scales them instead, A·(1 + w·(H_t − μ)/σ), with μ and σ over
the step's valid tokens on every rank. Every loss takes (n,) or (n, T).
"""

from __future__ import annotations

import torch

from explorl.algorithms import compute_advantages, entropy_advantage_shaping
from explorl.algorithms.shaping import entropy_aware_advantages, entropy_moments, mean_std
from explorl.config import AlgorithmConfig
from explorl.rollout.types import Rollouts
from explorl.training.batch import StepBatch, StepRows, covariance_metrics


def estimator_rewards(a: AlgorithmConfig, rows: StepRows, kl_coef: float) -> torch.Tensor:
    """(N,) what the estimator sees as the reward: the shaped reward, minus kl_coef · Σ_t kl_t
    with ``algorithm.kl_in_reward`` (verl ``use_kl_in_reward``; ``rows.kl_sum`` from
    ``reward_kl.reference_kl_sums``)."""
    r = rows.reward.float()
    if a.kl_in_reward:
        if rows.kl_sum is None:
            raise RuntimeError("algorithm.kl_in_reward: the rows have no kl_sum "
                               "(reward_kl.reference_kl_sums runs before the advantages)")
        r = r - kl_coef * rows.kl_sum.float()
    return r


def step_advantages(a: AlgorithmConfig, sb: StepBatch, ro: Rollouts, dist,
                    kl_coef: float = 0.0) -> tuple[torch.Tensor, dict[str, float]]:
    """This rank's advantages, (n,) or (n, T) with shaping, and the step's metrics (global):
    ``adv/*`` of the estimator and of shaping, and the covariance diagnostics (``cov/*``, on the
    estimator's per-response A and the sampling pass's log-probs, before the update).

    The estimator reads ``estimator_rewards`` (the KL-penalised reward under ``kl_in_reward``,
    β = the step's ``kl_coef`` knob); the pass@k ones read the verifier's correctness
    (``rows.score``, ``reward.accuracy``'s rule) instead; the REINFORCE++ ones whiten with
    the responses' token counts."""
    rows = sb.rows
    adv_all, am = compute_advantages(a.advantage, estimator_rewards(a, rows, kl_coef),
                                     rows.group, eps=a.adv_eps, k=a.passk_k,
                                     correct=rows.score.float(), lengths=rows.length)
    metrics = {k: float(v) for k, v in am.items()}
    if a.kl_in_reward:  # mean Σ_t kl_t per response (the reward's penalty before β)
        metrics["kl/reward_penalty_mean"] = float(rows.kl_sum.mean()) if len(rows.kl_sum) \
            else 0.0
    metrics.update(covariance_metrics(rows, adv_all))
    adv = adv_all[sb.local]
    if a.entropy_shaping_alpha > 0:
        mask = ro.response_mask
        adv, sm = entropy_advantage_shaping(adv.to(ro.entropy.device), ro.entropy, mask,
                                            a.entropy_shaping_alpha, a.entropy_shaping_kappa)
        n = float(mask.sum())  # the shaping means are over this rank's valid tokens: weight and add
        total = dist.sum_dict({"n": n, **{k: float(v) * n for k, v in sm.items()}})
        n_all = total.pop("n")
        metrics.update({k: v / n_all if n_all else 0.0 for k, v in total.items()})
    if a.aepo_adv_weight > 0:
        mask = ro.response_mask
        n, s, s2 = entropy_moments(ro.entropy, mask)
        total = dist.sum_dict({"n": n, "s": s, "s2": s2})  # μ, σ of the whole step
        mean, std = mean_std(total["n"], total["s"], total["s2"])
        adv, sm = entropy_aware_advantages(adv.to(ro.entropy.device), ro.entropy, mask,
                                           a.aepo_adv_weight, mean, std)
        total = dist.sum_dict({"n": n, **{k: float(v) * n for k, v in sm.items()}})
        n_all = total.pop("n")  # token means over every rank's valid tokens
        metrics.update({k: v / n_all if n_all else 0.0 for k, v in total.items()})
    return adv, metrics
