"""Pure tensor math for RLVR: advantages (incl. pass@k), policy losses (incl. GSPO, CISPO, SAPO,
LUSPO, VESPO, AEPO) and
the parameters they read (``LossParams``),
aggregation, log-probs, entropy, covariance, KL estimators, DAPO filters, the forking-token
mask, entropy advantage shaping and Knapsack RL budgets. Imports torch only
(docs/architecture.md#rules-that-keep-it-this-way)."""

from explorl.algorithms.advantages import (
    ADVANTAGES,
    compute_advantages,
    dr_grpo_advantages,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)
from explorl.algorithms.aggregation import AGG_MODES, aggregate
from explorl.algorithms.contract import LossParams
from explorl.algorithms.covariance import covariance_by_difficulty, masked_mean, token_covariance
from explorl.algorithms.filters import informative_groups, overlong_penalty
from explorl.algorithms.knapsack import knapsack_budgets
from explorl.algorithms.logprobs import (
    logprobs_from_hidden,
    logprobs_from_logits,
    naive_logprobs,
)
from explorl.algorithms.losses import (
    LOSSES,
    aepo_loss,
    cispo_loss,
    clip_cov_loss,
    gspo_loss,
    kl_cov_loss,
    luspo_loss,
    ppo_loss,
    sapo_loss,
    vespo_loss,
)
from explorl.algorithms.regularisers import KL_ESTIMATORS, entropic_confident_term, kl_estimate
from explorl.algorithms.shaping import entropy_advantage_shaping, entropy_aware_advantages
from explorl.algorithms.token_masks import TokenMask, forking_token_mask

__all__ = [
    "ADVANTAGES",
    "AGG_MODES",
    "KL_ESTIMATORS",
    "LOSSES",
    "LossParams",
    "TokenMask",
    "aepo_loss",
    "aggregate",
    "cispo_loss",
    "clip_cov_loss",
    "compute_advantages",
    "covariance_by_difficulty",
    "dr_grpo_advantages",
    "entropic_confident_term",
    "entropy_advantage_shaping",
    "entropy_aware_advantages",
    "forking_token_mask",
    "grpo_advantages",
    "gspo_loss",
    "informative_groups",
    "kl_cov_loss",
    "kl_estimate",
    "knapsack_budgets",
    "luspo_loss",
    "logprobs_from_hidden",
    "logprobs_from_logits",
    "masked_mean",
    "naive_logprobs",
    "overlong_penalty",
    "ppo_loss",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "sapo_loss",
    "token_covariance",
    "vespo_loss",
]
