"""The no-signal check of a run's first steps (``watch.signal_steps``): its rule, the figures of
what the responses lacked, and the warning on the lab model with a reward that is always 0."""

from __future__ import annotations

import logging

import pytest

from explorl.config.watch_sections import WatchConfig
from explorl.training.loop import Trainer
from explorl.training.no_signal import NoSignalMonitor, ResponseShapes, zero_signal_share


def test_response_shapes_count_boxes_and_readable_answers():
    texts = ["The answer is \\boxed{8}.",  # a box with an answer
             "77 - 69 = 8",  # a number in the middle of a sentence: no answer
             "Answer: 8",  # an answer line
             "8",  # a bare answer
             "So \\boxed{} is it.",  # an empty box: a box, no answer
             "\\boxed{8",  # an unclosed box: neither
             ""]
    assert ResponseShapes.of(texts) == ResponseShapes(responses=7, boxed=2, answer=3)
    assert ResponseShapes.of([]) == ResponseShapes()


def test_zero_signal_share_counts_filtered_groups_as_zero():
    assert zero_signal_share({"adv/zero_group_frac": 0.5}) == 0.5
    # dynamic sampling kept half the groups, and half of those were zero: 0.5 + 0.5 · 0.5
    assert zero_signal_share({"adv/zero_group_frac": 0.5, "rollout/filtered_frac": 0.5}) == 0.75
    assert zero_signal_share({}) == 0.0


def _metrics(zero, reward=0.0, n=4, length=10.0, truncated=0.0, accuracy=0.0, uniform=None):
    """A step's metrics; ``uniform``: the share of groups all wrong (default: ``zero``)."""
    return {"adv/zero_group_frac": zero, "reward/mean": reward, "rollout/n_trained": float(n),
            "response/length_mean": length, "response/truncated_frac": truncated,
            "reward/accuracy": accuracy, "rollout/all_correct_frac": 0.0,
            "rollout/all_wrong_frac": zero if uniform is None else uniform}


def test_warns_once_at_the_end_of_the_window_with_the_window_figures(caplog):
    m = NoSignalMonitor(WatchConfig(signal_steps=2, signal_zero_frac=0.9))
    caplog.set_level(logging.WARNING, logger="explorl")
    assert m.check(1, _metrics(1.0, reward=0.0, length=10, truncated=1.0),
                   ["77 - 69 = 8"] * 3 + ["\\boxed{8}"]) is None  # decided at the window's end
    text = m.check(2, _metrics(0.8, reward=0.2, length=30, truncated=0.5),
                   ["Answer: 8", "no", "no", "no"])
    # zero share (1.0 + 0.8) / 2 = 0.9 ≥ 0.9; 8 responses, 1 boxed, 2 with an answer; means
    # weighted by each step's 4 responses: reward 0.1, length 20, truncated 0.75
    assert text is not None and "90% of the prompt groups" in text
    assert "12% hold a \\boxed{}, 25% an answer" in text
    assert "mean reward 0.100" in text and "mean length 20.0 tokens" in text
    assert "75% cut off" in text and "larger rollout.max_response_len" in text
    assert "docs/real-models.md#getting-a-learning-signal" in text
    assert text in caplog.text
    assert m.check(3, _metrics(1.0), ["x"]) is None  # once, and only in the window
    assert m.shapes == ResponseShapes(8, 1, 2)


@pytest.mark.parametrize("zeros", [[1.0, 0.79], [0.5, 0.5]])
def test_no_warning_below_the_share_and_none_after_the_window(zeros):
    m = NoSignalMonitor(WatchConfig(signal_steps=2, signal_zero_frac=0.9))
    assert [m.check(s, _metrics(z), ["x"]) for s, z in enumerate(zeros, 1)] == [None, None]
    assert m.warned and m.check(3, _metrics(1.0), ["x"]) is None  # the window is over


def test_off_and_all_right_groups_get_their_own_advice():
    off = NoSignalMonitor(WatchConfig(signal_steps=0))
    assert off.check(1, _metrics(1.0), ["x"]) is None and off.zero == []
    easy = NoSignalMonitor(WatchConfig(signal_steps=1))
    text = easy.check(1, _metrics(1.0, reward=1.0, accuracy=1.0), ["\\boxed{8}"])
    assert "too easy" in text and "docs/real-models.md" not in text


def test_zero_advantages_of_groups_whose_rewards_differ_name_the_estimator():
    m = NoSignalMonitor(WatchConfig(signal_steps=1))
    # every group zero, yet only 10% all wrong or all right: the estimator zeroed them
    text = m.check(1, _metrics(1.0, reward=0.4, accuracy=0.4, uniform=0.1), ["\\boxed{8}"])
    assert "only 10% of the groups were all right or all wrong" in text
    assert "algorithm.advantage" in text and "docs/real-models.md" not in text
    # the uniform share at half the zero share is still uniform groups: the format advice
    m = NoSignalMonitor(WatchConfig(signal_steps=1))
    assert "docs/real-models.md" in m.check(1, _metrics(1.0, uniform=0.5), ["x"])


def test_state_round_trip_keeps_the_window():
    a = NoSignalMonitor(WatchConfig(signal_steps=2))
    a.check(1, _metrics(1.0, reward=0.0), ["\\boxed{1}"])
    b = NoSignalMonitor(WatchConfig(signal_steps=2))
    b.load_state_dict(a.state_dict())
    assert b.check(2, _metrics(1.0), ["x"]) is not None and b.shapes == ResponseShapes(2, 1, 1)


def test_the_lab_model_with_an_always_zero_reward_is_diagnosed(make_config, tmp_path, caplog):
    (tmp_path / "zero_reward.py").write_text("def zero(response, ground_truth):\n"
                                             "    return 0.0\n")
    cfg = make_config({"max_steps": 3, "eval": {"every": 0},
                       "reward": {"functions": [{"name": str(tmp_path / "zero_reward.py")
                                                 + ":zero"}]},
                       "watch": {"signal_steps": 2}})
    caplog.set_level(logging.WARNING, logger="explorl")
    t = Trainer(cfg, tmp_path / "run")
    rows = [t.train_step() for _ in range(3)]
    t.pool.close()
    assert all(r["adv/zero_group_frac"] == 1.0 for r in rows)
    warnings = [r.getMessage() for r in caplog.records if "no learning signal" in r.getMessage()]
    assert len(warnings) == 1 and "100% of the prompt groups" in warnings[0]
    assert "mean reward 0.000" in warnings[0] and t.watch.signal.shapes.responses == 32


def test_a_run_with_signal_is_not_warned(make_config, tmp_path, caplog):
    cfg = make_config({"max_steps": 2, "eval": {"every": 0}, "watch": {"signal_steps": 2}})
    caplog.set_level(logging.WARNING, logger="explorl")
    t = Trainer(cfg, tmp_path / "run")
    from test_trainer import _answer_engine
    t.engine = _answer_engine(t, lambda i, j: j == 0)  # one right answer in every group
    rows = [t.train_step() for _ in range(2)]
    t.pool.close()
    assert all(r["adv/zero_group_frac"] == 0.0 for r in rows)
    assert "no learning signal" not in caplog.text and t.watch.signal.warned


def test_the_response_figures_are_summed_over_ranks():
    class TwoRanks:  # the other rank holds responses shaped like this one's
        world_size = 2

        def sum_dict(self, d):
            return {k: 2 * v for k, v in d.items()}

    m = NoSignalMonitor(WatchConfig(signal_steps=1))
    m.check(1, _metrics(1.0), ["\\boxed{3}", "no"], TwoRanks())
    assert m.shapes == ResponseShapes(4, 2, 2)
