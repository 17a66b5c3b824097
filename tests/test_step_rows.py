"""``StepRows``: the typed per-response columns every rank gathers (``training/batch.py``)."""

import dataclasses
import pickle

import pytest
import torch

import explorl.config as C
from explorl.rollout.types import Rollouts
from explorl.training.advantages import estimator_rewards
from explorl.training.batch import StepRows, response_stats

COLUMNS = {  # name: dtype (every column is (N,))
    "group": torch.int64, "reward": torch.float64, "score": torch.float64,
    "length": torch.int64, "prompt_length": torch.int64, "entropy_sum": torch.float64,
    "logp_sum": torch.float64, "truncated": torch.bool, "stage": torch.int64,
    "own": torch.bool, "rank": torch.int64,
}


def tiny_rollouts(first_prompt: int = 0) -> Rollouts:
    """Two prompts × 2 responses; response lengths 3, 1, 2, 0; prompts of 2 and 1 tokens; EEPO
    stages 1, 2, 1, 2; the last response truncated."""
    response_mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [0, 0, 0]], dtype=torch.bool)
    prompt_mask = torch.tensor([[1, 1], [1, 1], [0, 1], [0, 1]], dtype=torch.bool)
    entropy = torch.tensor([[0.5, 1.0, 1.5], [2.0, 9.0, 9.0], [0.25, 0.25, 9.0], [9.0, 9.0, 9.0]])
    return Rollouts(
        prompt_ids=torch.zeros(4, 2, dtype=torch.long), prompt_mask=prompt_mask,
        response_ids=torch.zeros(4, 3, dtype=torch.long), response_mask=response_mask,
        old_logp=-entropy, entropy=entropy,
        prompt_index=torch.tensor([0, 0, 1, 1]) + first_prompt, texts=[""] * 4,
        stage=torch.tensor([1, 2, 1, 2]), truncated=torch.tensor([False, False, False, True]))


def test_response_stats_columns_by_hand():
    ro = tiny_rollouts()
    rows = response_stats(ro, torch.tensor([1.0, 0.0, 0.0, 1.0]),
                          torch.tensor([1.0, -0.5, 0.0, 1.0]), rank=3, stage2_own=False)
    cols = rows.columns()
    optional = ["kl_sum", "turns", "tool_calls", "tool_errors", "tool_tokens"]
    assert list(cols) == [*COLUMNS, *optional]  # kl_sum: reward_kl's; the rest: tool turns'
    assert all(cols[k] is None for k in optional)
    for name, dtype in COLUMNS.items():
        assert cols[name].shape == (4,) and cols[name].dtype == dtype, name
    assert len(rows) == 4
    assert rows.group.tolist() == [0, 0, 1, 1]
    assert rows.reward.tolist() == [1.0, -0.5, 0.0, 1.0]
    assert rows.score.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert rows.length.tolist() == [3, 1, 2, 0]
    assert rows.prompt_length.tolist() == [2, 2, 1, 1]
    assert rows.entropy_sum.tolist() == [3.0, 2.0, 0.5, 0.0]  # padding (9.0) left out
    assert rows.logp_sum.tolist() == [-3.0, -2.0, -0.5, 0.0]
    assert rows.truncated.tolist() == [False, False, False, True]
    assert rows.stage.tolist() == [1, 2, 1, 2]
    assert rows.own.tolist() == [True, False, True, False]  # stage 2 from an unlearned copy
    assert rows.rank.tolist() == [3] * 4
    own = response_stats(ro, torch.zeros(4), torch.zeros(4), rank=0).own
    assert own.tolist() == [True] * 4  # stage 2 sampled by the policy itself


def test_gather_and_cat_keep_rank_order_and_select_keeps_the_given_order():
    # as the all-gather does: each rank's rows pickled, then joined in rank order
    parts = [pickle.loads(pickle.dumps(response_stats(tiny_rollouts(2 * r), torch.zeros(4),
                                                      torch.arange(4.0) + 4 * r, rank=r)))
             for r in range(3)]
    rows = StepRows.cat(parts)
    assert len(rows) == 12
    assert rows.rank.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert rows.group.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    assert rows.reward.tolist() == [float(i) for i in range(12)]
    assert rows.kl_sum is None
    sub = rows.select(torch.tensor([7, 2, 5]))
    assert sub.reward.tolist() == [7.0, 2.0, 5.0] and sub.rank.tolist() == [1, 0, 1]
    kept = rows.select(rows.group % 2 == 1)  # a (N,) bool mask, as dynamic sampling keeps groups
    assert kept.reward.tolist() == [2.0, 3.0, 6.0, 7.0, 10.0, 11.0]
    kept.reward[0] = -1.0  # new tensors: the source is untouched
    assert rows.reward[2] == 2.0


def test_optional_column_follows_cat_and_select_and_must_be_set_on_every_part():
    a = response_stats(tiny_rollouts(), torch.zeros(4), torch.zeros(4), rank=0)
    b = dataclasses.replace(a, kl_sum=torch.tensor([0.5, 1.0, 1.5, 2.0], dtype=torch.float64))
    c = dataclasses.replace(a, kl_sum=torch.zeros(4, dtype=torch.float64))
    assert StepRows.cat([b, c]).kl_sum.tolist() == [0.5, 1.0, 1.5, 2.0, 0.0, 0.0, 0.0, 0.0]
    assert b.select(torch.tensor([3, 0])).kl_sum.tolist() == [2.0, 0.5]
    with pytest.raises(ValueError, match="'kl_sum' is set on some parts only"):
        StepRows.cat([a, b])


def test_an_unknown_column_is_an_error_not_a_default():
    rows = response_stats(tiny_rollouts(), torch.zeros(4), torch.zeros(4), rank=0)
    with pytest.raises(AttributeError):
        rows.rewards  # noqa: B018 (a misspelt read)
    with pytest.raises(AttributeError):
        rows.kl_sums = torch.zeros(4)  # a misspelt write does not add a column
    with pytest.raises(AttributeError):
        getattr(rows, "accuracy")  # as ``algorithm.dynamic_sampling_metric`` is read


def test_kl_in_reward_without_kl_sum_is_a_clear_error():
    rows = response_stats(tiny_rollouts(), torch.zeros(4), torch.ones(4), rank=0)
    a = C.AlgorithmConfig(kl_in_reward=True)
    with pytest.raises(RuntimeError, match="no kl_sum"):
        estimator_rewards(a, rows, kl_coef=0.1)
    rows.kl_sum = torch.tensor([0.0, 1.0, 2.0, 3.0], dtype=torch.float64)
    assert estimator_rewards(a, rows, 0.5).tolist() == [1.0, 0.5, 0.0, -0.5]


def test_tool_columns_by_hand():
    """A multi-turn record: the tool result tokens count in ``tool_tokens``, never in
    ``length`` or the entropy and log-prob sums."""
    ro = tiny_rollouts()
    tool = torch.tensor([[0, 0, 0], [0, 1, 1], [0, 0, 1], [0, 0, 0]], dtype=torch.bool)
    ro = dataclasses.replace(ro, tool_mask=tool, turns=torch.tensor([1, 2, 2, 1]),
                             tool_calls=torch.tensor([0, 1, 1, 0]),
                             tool_errors=torch.tensor([0, 0, 1, 0]))
    rows = response_stats(ro, torch.zeros(4), torch.zeros(4), rank=0)
    assert rows.tool_tokens.tolist() == [0, 2, 1, 0]
    assert rows.turns.tolist() == [1, 2, 2, 1] and rows.tool_errors.tolist() == [0, 0, 1, 0]
    assert rows.length.tolist() == [3, 1, 2, 0]  # the policy's tokens only
    assert rows.entropy_sum.tolist() == [3.0, 2.0, 0.5, 0.0]
    assert len(StepRows.cat([rows, rows]).tool_calls) == 8
