"""DAPO batch filters and reward shaping (DAPO §3.2 dynamic sampling, §3.4 overlong shaping)."""

from __future__ import annotations

import torch

from explorl.algorithms.advantages import degenerate_groups


def informative_groups(rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """DAPO dynamic sampling: True (N,) where the group's rewards are not all equal.

    A size-1 group is never informative (its rewards are trivially all equal). Group ids
    are arbitrary ints, groups may have unequal sizes.
    """
    return ~degenerate_groups(rewards, group_index)  # (N,)


def overlong_penalty(
    lengths: torch.Tensor, max_len: int | torch.Tensor, buffer: int, penalty: float
) -> torch.Tensor:
    """DAPO soft overlong punishment (R_length), added to the reward; (N,) float.

    0 if length ≤ max_len − buffer, then linear down to −penalty at max_len, and −penalty
    beyond. buffer = 0 turns the shaping off (all zeros), as ``rewards.overlong_buffer``.
    ``max_len``: one budget, or each response's own (N,): with tools, the model's tokens are
    measured against the room the results left them (``model_budgets``).
    """
    lengths = lengths.float()  # (N,)
    if buffer <= 0:
        return torch.zeros_like(lengths)
    excess = lengths - (max_len - buffer)  # (N,)
    return -(excess / buffer).clamp(0.0, 1.0) * penalty


def model_budgets(max_len: int, tool_tokens: torch.Tensor | None) -> int | torch.Tensor:
    """Each response's budget of its own tokens: ``max_len`` (``rollout.max_response_len``, which
    counts the model's tokens and the tool results' together) less its results' tokens (N,);
    ``max_len`` itself without tools. So a response the budget cut is at its limit, whatever
    share of it the tools wrote, and a tool result never counts as the model's length."""
    if tool_tokens is None:
        return max_len
    return max_len - tool_tokens.long()  # (N,)
