"""Numerical and reward trouble is loud: each skipped step warns as it happens, too many skipped
steps stop the run, a collapsed policy gets one warning, and reward functions that fail on every
response stop the run with their own name and first error (docs/failures.md)."""

from __future__ import annotations

import logging
import math

import pytest
import torch
import yaml

from explorl import config as C
from explorl import validation
from explorl.cli import main
from explorl.config.watch_sections import WatchConfig
from explorl.errors import RewardError
from explorl.training.loop import Trainer
from explorl.training.watch import (
    CollapseMonitor,
    NonFiniteGuard,
    RewardFailureGuard,
    TrainingDiverged,
)

# --------------------------------------------------------------------------- non-finite steps


def test_scattered_skipped_steps_stop_the_run_past_the_fraction(caplog):
    guard = NonFiniteGuard(max_bad=3, max_frac=0.25, max_steps=8)  # 2 skips allowed
    ok, bad = {"train/nonfinite_updates": 0.0}, {"train/nonfinite_updates": 1.0, "loss/policy": 1.0}
    r = torch.zeros(4)
    with caplog.at_level(logging.WARNING, logger="explorl"):
        for step, m in enumerate([bad, ok, bad, ok], start=1):
            guard.check(step, dict(m), r)
        assert guard.skipped == 2 and guard.in_a_row == 0
        lines = [x.getMessage() for x in caplog.records]
        assert lines == ["step 1 skipped: non-finite gradient norm (weights not updated; 1 "
                         "skipped so far)", "step 3 skipped: non-finite gradient norm (weights "
                         "not updated; 2 skipped so far)"]
        with pytest.raises(TrainingDiverged, match=r"step 5: 3 steps skipped .* more than "
                                                   r"optim.max_bad_frac=0.25 of the run's 8"):
            guard.check(5, dict(bad), r)
    nan_reward = torch.tensor([0.0, math.nan])
    g = NonFiniteGuard(max_bad=3, max_frac=1.0, max_steps=8)
    with caplog.at_level(logging.WARNING, logger="explorl"):
        g.check(1, dict(ok), nan_reward)
    assert "step 1 skipped: non-finite reward" in caplog.records[-1].getMessage()


def test_a_run_with_nan_on_every_other_step_ends_non_zero(make_config, tmp_path, caplog):
    cfg = make_config({"max_steps": 10, "eval": {"every": 0},
                       "optim": {"max_bad_steps": 3, "max_bad_frac": 0.2}})
    t = Trainer(cfg, tmp_path / "run")
    real = t.update.run
    poison = iter([True, False] * 5)
    t.update.run = lambda ro, adv, k, sb: real(
        ro, adv * float("nan") if next(poison) else adv, k, sb)
    with caplog.at_level(logging.WARNING, logger="explorl"):
        t.train_step()
        t.train_step()
        t.train_step()
        t.train_step()
        with pytest.raises(TrainingDiverged, match="step 5: 3 steps skipped"):
            t.train_step()
    skipped = [x.getMessage() for x in caplog.records if "skipped:" in x.getMessage()]
    assert [s.split(" skipped")[0] for s in skipped] == ["step 1", "step 3", "step 5"]
    t.pool.close()


# --------------------------------------------------------------------------- collapse monitor


def _trace(entropies, accuracies, **cfg):
    mon = CollapseMonitor(WatchConfig(**cfg))
    return [mon.check(i + 1, h, a) for i, (h, a) in enumerate(zip(entropies, accuracies))]


def test_collapse_warns_once_after_n_low_steps_without_accuracy_gain():
    got = _trace([0.001] * 8, [0.2] * 8, collapse_entropy=0.02, collapse_steps=4)
    assert [g is not None for g in got] == [False, False, False, True, False, False, False, False]
    assert "step 4: the policy looks collapsed" in got[3] and "optim.lr" in got[3]
    assert "algorithm.entropy_coef" in got[3] and "algorithm.eps_high" in got[3]
    # a step at or above the floor restarts the count
    got = _trace([0.001, 0.001, 0.001, 0.5, 0.001, 0.001, 0.001, 0.001], [0.2] * 8,
                 collapse_entropy=0.02, collapse_steps=4)
    assert [g is not None for g in got].index(True) == 7
    # accuracy rising by more than collapse_min_gain (second half 0.5 vs first 0.2): no warning
    assert _trace([0.001] * 4, [0.2, 0.2, 0.5, 0.5], collapse_steps=4) == [None] * 4
    # by less: still a collapse
    assert _trace([0.001] * 4, [0.2, 0.2, 0.21, 0.21], collapse_steps=4)[-1] is not None
    assert _trace([0.001] * 8, [0.0] * 8, collapse_entropy=0.0, collapse_steps=4) == [None] * 8


def test_collapse_monitor_state_resumes():
    cfg = WatchConfig(collapse_steps=4)
    a = CollapseMonitor(cfg)
    for i in range(3):
        a.check(i + 1, 0.0, 0.0)
    b = CollapseMonitor(cfg)
    b.load_state_dict(a.state_dict())
    assert b.check(4, 0.0, 0.0) is not None


def test_a_collapsed_tiny_run_warns_and_a_healthy_one_does_not(make_config, tmp_path, caplog):
    # Sampling at T = 0.02 collapses the policy by construction (entropy at the sampling
    # temperature ~0); collapse_min_gain 1 makes the accuracy rule certain on 6 noisy steps.
    collapsed = make_config({"max_steps": 6, "eval": {"every": 0}, "rollout": {"temperature": 0.02},
                             "watch": {"collapse_steps": 6, "collapse_min_gain": 1.0}})
    with caplog.at_level(logging.WARNING, logger="explorl"):
        Trainer(collapsed, tmp_path / "a").train()
    hits = [x.getMessage() for x in caplog.records if "looks collapsed" in x.getMessage()]
    assert len(hits) == 1 and "step 6" in hits[0]
    caplog.clear()
    healthy = make_config({"max_steps": 6, "eval": {"every": 0},
                           "watch": {"collapse_steps": 6, "collapse_min_gain": 1.0}})
    with caplog.at_level(logging.WARNING, logger="explorl"):
        Trainer(healthy, tmp_path / "b").train()
    assert not [x for x in caplog.records if "looks collapsed" in x.getMessage()]


@pytest.mark.slow
def test_no_collapse_warning_on_the_quickstart(tmp_path, caplog):
    cfg = validation.load("quickstart", ["max_steps=20", "eval.every=0", "log.progress=false",
                                "log.plots=false", "log.checkpoint_every=0"])
    with caplog.at_level(logging.WARNING, logger="explorl"):
        t = Trainer(cfg, tmp_path / "q")
        t.train()
    assert not [x for x in caplog.records if "looks collapsed" in x.getMessage()]
    assert t.watch.collapse.low.maxlen == cfg.watch.collapse_steps and not t.watch.collapse.warned


# --------------------------------------------------------------------------- broken rewards


def test_reward_guard_rules():
    cfg = WatchConfig(reward_fail_steps=3, reward_fail_frac=0.5, reward_fail_window=4)
    g = RewardFailureGuard(cfg)
    g.check(1, {"reward/verify_failed_frac": 1.0}, "verifier f.py:f: ValueError: first")
    g.check(2, {"reward/verify_failed_frac": 1.0}, "verifier f.py:f: ValueError: second")
    with pytest.raises(RewardError, match=r"step 3: every response's verification failed .* 3 "
                                          r"steps in a row.*First error: verifier f.py:f: "
                                          r"ValueError: first"):
        g.check(3, {"reward/verify_failed_frac": 1.0}, "verifier f.py:f: ValueError: third")
    g = RewardFailureGuard(cfg)  # scattered: 0.9, 0, 0.9, 0.9 → mean 0.675 > 0.5 at step 4
    for step, f in enumerate([0.9, 0.0, 0.9], start=1):
        g.check(step, {"reward/verify_failed_frac": f}, "why")
    with pytest.raises(RewardError, match="68% of the verifications of the last 4 steps"):
        g.check(4, {"reward/verify_failed_frac": 0.9}, "why")
    g = RewardFailureGuard(cfg)  # 40% failing forever: trains on
    for step in range(1, 20):
        g.check(step, {"reward/verify_failed_frac": 0.4}, "why")


BAD_REWARDS = '''
import time

def nan(response, ground_truth):
    return float("nan")

def string(response, ground_truth):
    return "1.0"

def hangs(response, ground_truth):
    time.sleep(60)
    return 1.0

def raises(response, ground_truth):
    if len(response) % 2:
        raise RuntimeError("boom")
    return 1.0

def always_raises(response, ground_truth):
    raise RuntimeError("boom")
'''


def _broken(make_config, tmp_path, monkeypatch, fn: str, *extra: str):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad_rewards.py").write_text(BAD_REWARDS)
    cfg = make_config({"max_steps": 4, "eval": {"every": 0}})
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(C.to_dict(cfg)))
    return main(["train", "r.yaml", "--out", "run", "--set",
                 f"reward.verifier=bad_rewards.py:{fn}", *extra])


@pytest.mark.parametrize("fn, why", [("nan", "ValueError: reward is not finite: nan"),
                                     ("string", "ValueError: reward '1.0' is a str, not a number")])
def test_a_reward_that_fails_on_every_response_stops_the_run(make_config, tmp_path, monkeypatch,
                                                             capsys, fn, why):
    code = _broken(make_config, tmp_path, monkeypatch, fn)
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and "RewardSpec" not in err
    (last,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert last.startswith("error: step 3: every response's verification failed or timed out")
    assert f"First error: verifier bad_rewards.py:{fn}: {why}" in last
    assert f"verifier bad_rewards.py:{fn}: 16 of 16 responses failed, e.g." in err


def test_a_hanging_reward_times_out_loudly_and_stops_the_run(make_config, tmp_path, monkeypatch,
                                                             capsys):
    code = _broken(make_config, tmp_path, monkeypatch, "hangs", "--set", "reward.timeout_s=0.2",
                   "--set", "reward.step_timeout_s=0.5")
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "verifier bad_rewards.py:hangs: 16 of 16 responses timed out after" in err
    (last,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert "First error: verifier bad_rewards.py:hangs: timed out after reward.timeout_s" in last


def test_a_reward_that_fails_on_some_responses_trains_on_and_says_how_many(
        make_config, tmp_path, monkeypatch, capsys):
    code = _broken(make_config, tmp_path, monkeypatch, "raises")
    err = capsys.readouterr().err
    assert code == 0 and "error:" not in err
    lines = [x for x in err.splitlines() if x.startswith("verifier bad_rewards.py:raises: ")]
    assert lines and all(" of 16 responses failed, e.g. RuntimeError: boom (scored 0)" in x
                         for x in lines)


# ------------------------------------------------------------- the same as reward.functions


def _broken_function(make_config, tmp_path, monkeypatch, fn: str, *extra: str):
    """``bad_rewards.py:fn`` as the run's only reward function; the verifier (``auto``: the lab
    task's checker) still measures accuracy, and works."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad_rewards.py").write_text(BAD_REWARDS)
    cfg = make_config({"max_steps": 4, "eval": {"every": 0}})
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(C.to_dict(cfg)))
    return main(["train", "r.yaml", "--out", "run", "--set",
                 f"reward.functions=[{{name: bad_rewards.py:{fn}}}]", *extra])


@pytest.mark.parametrize("fn, why, extra", [
    ("nan", "ValueError: reward is not finite: nan", ()),
    ("string", "ValueError: reward '1.0' is a str, not a number", ()),
    ("always_raises", "RuntimeError: boom", ()),
    ("hangs", "timed out after reward.timeout_s=0.2 s",
     ("--set", "reward.timeout_s=0.2", "--set", "reward.step_timeout_s=0.5")),
])
def test_a_reward_function_that_fails_on_every_response_stops_the_run(
        make_config, tmp_path, monkeypatch, capsys, fn, why, extra):
    code = _broken_function(make_config, tmp_path, monkeypatch, fn, *extra)
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    (last,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert last.startswith("error: step 3: every response's verification failed or timed out")
    assert f"First error: reward function bad_rewards.py:{fn}: {why}" in last
    assert last.endswith("holds the last finite weights (step 3)")


def test_a_reward_function_that_fails_on_some_responses_trains_on(make_config, tmp_path,
                                                                  monkeypatch, capsys):
    code = _broken_function(make_config, tmp_path, monkeypatch, "raises")
    err = capsys.readouterr().err
    assert code == 0 and "error:" not in err
    lines = [x for x in err.splitlines() if x.startswith("reward function bad_rewards.py:raises")]
    assert lines and all(" of 16 responses failed, e.g. RuntimeError: boom (scored 0)" in x
                         for x in lines)
