"""Pure tensor math for RLVR: advantages, policy losses, aggregation, log-probs, entropy,
covariance, KL estimators and DAPO filters. Imports torch only (see STYLE.md)."""

from explorl.algorithms.advantages import (
    ADVANTAGES,
    compute_advantages,
    dr_grpo_advantages,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)
from explorl.algorithms.aggregation import AGG_MODES, aggregate
from explorl.algorithms.covariance import covariance_by_difficulty, masked_mean, token_covariance
from explorl.algorithms.filters import informative_groups, overlong_penalty
from explorl.algorithms.logprobs import (
    logprobs_from_hidden,
    logprobs_from_logits,
    naive_logprobs,
)
from explorl.algorithms.losses import LOSSES, clip_cov_loss, kl_cov_loss, ppo_loss
from explorl.algorithms.regularisers import KL_ESTIMATORS, kl_estimate

__all__ = [
    "ADVANTAGES",
    "AGG_MODES",
    "KL_ESTIMATORS",
    "LOSSES",
    "aggregate",
    "clip_cov_loss",
    "compute_advantages",
    "covariance_by_difficulty",
    "dr_grpo_advantages",
    "grpo_advantages",
    "informative_groups",
    "kl_cov_loss",
    "kl_estimate",
    "logprobs_from_hidden",
    "logprobs_from_logits",
    "masked_mean",
    "naive_logprobs",
    "overlong_penalty",
    "ppo_loss",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "token_covariance",
]
