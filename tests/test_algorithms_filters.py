"""DAPO dynamic-sampling filter and soft overlong punishment by hand."""

import torch

from explorl.algorithms import informative_groups, overlong_penalty


def test_informative_groups():
    # group 0 = [1, 0] mixed; 5 = [1, 1] and 9 = [0, 0] constant; 3 = [1] size one
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    groups = torch.tensor([0, 5, 9, 5, 0, 9, 3])
    assert informative_groups(rewards, groups).tolist() == [
        True,
        False,
        False,
        False,
        True,
        False,
        False,
    ]


def test_overlong_penalty():
    lengths = torch.tensor([50, 80, 85, 90, 100, 120])
    # expected length 100 - 20 = 80; linear to -1 at 100; capped beyond
    torch.testing.assert_close(
        overlong_penalty(lengths, 100, 20, 1.0), torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0])
    )
    torch.testing.assert_close(
        overlong_penalty(lengths, 100, 20, 0.5), torch.tensor([0.0, 0.0, -0.125, -0.25, -0.5, -0.5])
    )
    assert (overlong_penalty(lengths, 100, 0, 1.0) == 0).all()  # buffer 0 = off


def test_overlong_penalty_counts_the_models_tokens_against_the_room_tools_left():
    """With tools, rollout.max_response_len counts the model's tokens and the results' together;
    the penalty measures the model's own tokens against the room the results left them
    (max_len − tool tokens). max_len 100, buffer 20, penalty 1 (by hand):
      A: 50 model, 0 tool  -> budget 100, free up to 80: 50 ≤ 80                  ->  0
      B: 70 model, 30 tool -> budget  70, free up to 50: 20 over, 20/20 (cut off)  -> -1
      C: 60 model, 30 tool -> budget  70, free up to 50: 10 over, 10/20            -> -0.5
      D: 85 model, 0 tool  -> budget 100, free up to 80:  5 over,  5/20            -> -0.25
    (measured against 100 as without tools, B and C would be 0: a response the budget cut
    would go unpenalised because a tool wrote part of it)."""
    from explorl import config as C
    from explorl.algorithms.filters import model_budgets
    from explorl.rollout.types import Rollouts
    from explorl.training.collect import score_rollouts

    model, tool = [50, 70, 60, 85], [0, 30, 30, 0]
    budgets = model_budgets(100, torch.tensor(tool))
    assert budgets.tolist() == [100, 70, 70, 100]
    want = torch.tensor([0.0, -1.0, -0.5, -0.25])
    torch.testing.assert_close(overlong_penalty(torch.tensor(model), budgets, 20, 1.0), want)
    assert model_budgets(100, None) == 100  # no tools: the one budget

    # the same through the step's scoring: response_mask (the model's) and tool_mask (results)
    R = 100
    mask = torch.zeros(4, R, dtype=torch.bool)
    tmask = torch.zeros(4, R, dtype=torch.bool)
    for i, (m, t) in enumerate(zip(model, tool)):  # model tokens, then the results, interleaved
        mask[i, : m] = True
        tmask[i, m: m + t] = True
    z = torch.zeros(4, R)
    ro = Rollouts(prompt_ids=torch.zeros(4, 1, dtype=torch.long),
                  prompt_mask=torch.ones(4, 1, dtype=torch.bool),
                  response_ids=torch.zeros(4, R, dtype=torch.long), response_mask=mask,
                  old_logp=z, entropy=z, prompt_index=torch.arange(4), texts=[""] * 4,
                  tool_mask=tmask)

    class Res:
        correct, rewards, timeouts, errors, worst_failed = [1.0] * 4, [1.0] * 4, 0, 0, 0.0

    class Rewarder:
        def score(self, pool, texts, records, envs):
            return Res()

    cfg = C.RunConfig()
    cfg.reward.overlong_buffer, cfg.reward.overlong_penalty = 20, 1.0
    _, rewards, _ = score_rollouts(None, Rewarder(), cfg, ro, [None] * 4, 100)
    torch.testing.assert_close(rewards, 1.0 + want)
