"""The public API of explorl.algorithms is locked, and it imports torch only."""

import ast
from pathlib import Path

import explorl.algorithms as A


def test_public_names():
    assert sorted(A.__all__) == [
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
        "logprobs_from_hidden",
        "logprobs_from_logits",
        "luspo_loss",
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
    assert all(hasattr(A, n) for n in A.__all__)


def test_registries():
    assert set(A.ADVANTAGES) == {
        "grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_plus_plus",
        "reinforce_plus_plus_baseline", "grpo_batch_std", "passk_training", "pkpo", "pkpo_loo",
        "pkpo_loo_minus_one", "grpo_passk",
    }
    assert set(A.LOSSES) == {"ppo", "clip_cov", "kl_cov", "gspo", "cispo", "sapo",
                             "luspo", "vespo", "aepo"}
    assert A.AGG_MODES == ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                           "seq-mean-token-sum-norm")


def test_imports_torch_only():
    # Static check (no subprocess): every module imports only torch, the standard library
    # and explorl.algorithms itself, so the math is testable without the model stack.
    allowed = {"torch", "explorl", "math", "typing", "collections", "dataclasses", "__future__"}
    for path in Path(A.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in allowed, f"{path.name} imports {name}"
                if name.startswith("explorl"):
                    assert name.startswith("explorl.algorithms"), f"{path.name} imports {name}"
