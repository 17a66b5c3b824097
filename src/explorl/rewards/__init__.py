"""Rule-based rewards: verifiers, the sandboxed verifier pool, and the reward convention."""

from __future__ import annotations

from explorl.rewards.pool import ScoreResult, VerifierPool
from explorl.rewards.verifiers import (
    VERIFIERS,
    addition_verifier,
    countdown_verifier,
    exact_verifier,
    math_verifier,
    resolve_verifier,
)

REWARD_CONVENTIONS = ("binary", "signed")


def to_reward(score: float, convention: str) -> float:
    """Reward for a verifier score in {0, 1}: ``binary`` keeps it, ``signed`` maps it to {−1, 1}
    (the ±1 reward of DAPO and Entropy Scheduling; docs/methods/baseline.md §0)."""
    if convention == "binary":
        return float(score)
    if convention == "signed":
        return 2.0 * float(score) - 1.0
    raise ValueError(
        f"unknown reward convention {convention!r}; valid: {', '.join(REWARD_CONVENTIONS)}"
    )


__all__ = [
    "REWARD_CONVENTIONS",
    "VERIFIERS",
    "ScoreResult",
    "VerifierPool",
    "addition_verifier",
    "countdown_verifier",
    "exact_verifier",
    "math_verifier",
    "resolve_verifier",
    "to_reward",
]
