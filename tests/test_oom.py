"""Out of memory in the update (training/memory.py): one retry at half the micro-batch, kept for
the rest of the run and across a resume; a second one stops the run naming the key to lower,
with the last checkpoint kept. The error is injected from the loss's forward, so the test runs
without a GPU (``torch.OutOfMemoryError`` exists on every build)."""

from __future__ import annotations

import pytest
import torch

from explorl.errors import ExplorlError, OutOfMemory
from explorl.outputs.checkpoint import latest_checkpoint
from explorl.outputs.runlog import read_metrics
from explorl.training.loop import Trainer
from explorl.training.memory import OOM_ERRORS, MemoryGuard

OOM = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)


def _inject(t: Trainer, fail_on: set[int]) -> list[int]:
    """Make the loss's forward raise OOM on these calls (1-based); returns each call's size."""
    original, sizes = t.update.passes.micro_loss, []

    def micro_loss(ro, *args, **kw):
        sizes.append(len(ro))
        if len(sizes) in fail_on:
            raise OOM("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
        return original(ro, *args, **kw)

    t.update.passes.micro_loss = micro_loss
    return sizes


def _strip(rows):
    return [{k: v for k, v in r.items() if not k.startswith("time/")
             and k != "train/oom_retries"} for r in rows]


def test_the_oom_class_is_caught():
    assert OOM in OOM_ERRORS and issubclass(OutOfMemory, ExplorlError)


def test_limits_halve_once_and_name_the_key():
    class Optim:
        micro_batch_size, micro_batch_tokens = 9, None

    g = MemoryGuard(Optim())
    assert g.limits() == (9, None) and g.key() == ("optim.micro_batch_size", 9)
    g.on_oom(OOM("out of memory"), step=3)
    assert g.limits() == (4, None) and g.metrics() == {"train/oom_retries": 1.0}
    with pytest.raises(OutOfMemory, match=r"step 5: .*again.*optim\.micro_batch_size below 4"):
        g.on_oom(OOM("out of memory"), step=5)
    Optim.micro_batch_tokens = 1000
    assert MemoryGuard(Optim()).key() == ("optim.micro_batch_tokens", 1000)


def test_several_processes_stop_at_the_first_oom():
    class Optim:
        micro_batch_size, micro_batch_tokens = None, 4096

    with pytest.raises(OutOfMemory, match="one of 2 processes.*optim.micro_batch_tokens"):
        MemoryGuard(Optim(), world_size=2).on_oom(OOM("out of memory"), step=1)


def test_one_oom_retries_at_half_the_micro_batch_and_keeps_it(make_config, tmp_path, capsys):
    sets = {"max_steps": 3, "eval": {"every": 0}, "optim": {"micro_batch_size": 8}}
    t = Trainer(make_config(sets), tmp_path / "oom")
    sizes = _inject(t, fail_on={1})
    t.train()
    assert "out of memory in the update" in capsys.readouterr().out
    assert sizes[0] == 8 and max(sizes[1:]) == 4  # the failed call, then micro-batches of ≤ 4
    rows = read_metrics(tmp_path / "oom")
    assert [r["train/oom_retries"] for r in rows] == [1.0, 1.0, 1.0]
    # the same run as one planned with micro-batches of 4 from the start
    ref = Trainer(make_config({**sets, "optim": {"micro_batch_size": 4}}), tmp_path / "ref")
    ref.train()
    ref_rows = read_metrics(tmp_path / "ref")
    assert [r["train/oom_retries"] for r in ref_rows] == [0.0, 0.0, 0.0]
    assert _strip(rows) == _strip(ref_rows)
    for a, b in zip(t.policy.parameters(), ref.policy.parameters()):
        assert torch.equal(a, b)


def test_a_second_oom_stops_with_the_last_checkpoint_kept(make_config, tmp_path):
    cfg = make_config({"max_steps": 4, "eval": {"every": 0}, "log": {"checkpoint_every": 1},
                       "optim": {"micro_batch_size": 8}})
    t = Trainer(cfg, tmp_path / "run")
    steps_done = []
    original = t.train_step

    def step():  # OOM twice in step 2: the retry and the stop
        if t.step == 1:
            _inject(t, fail_on={1, 2})
        out = original()
        steps_done.append(t.step)
        return out

    t.train_step = step
    with pytest.raises(OutOfMemory, match=r"optim.micro_batch_size below 4.*the last "
                       r"checkpoint, .*step-1, is kept"):
        t.train()
    assert steps_done == [1]
    assert latest_checkpoint(tmp_path / "run").name == "step-1"


def test_a_resumed_run_keeps_the_halved_micro_batch(make_config, tmp_path):
    cfg = make_config({"max_steps": 2, "eval": {"every": 0}, "log": {"checkpoint_every": 1},
                       "optim": {"micro_batch_size": 8}})
    t = Trainer(cfg, tmp_path / "run")
    _inject(t, fail_on={1})
    original = t.train_step

    def one_step():
        out = original()
        t._stop = True  # as a Ctrl-C during step 1
        return out

    t.train_step = one_step
    t.train()
    resumed = Trainer(cfg, tmp_path / "run", resume=True)
    assert resumed.update.memory.limits() == (4, None)
    sizes = _inject(resumed, fail_on=set())
    resumed.train()
    assert max(sizes) == 4
    assert read_metrics(tmp_path / "run")[-1]["train/oom_retries"] == 1.0


def test_an_oom_in_a_mini_batch_whose_forward_the_recompute_ran(make_config, tmp_path):
    """With a recompute the first mini-batch's forward runs in it and the update reuses it
    (``PolicyUpdate.recompute``); an OOM there drops that forward and the retry runs the
    mini-batch again in halved micro-batches: the run goes on as one planned at half."""
    sets = {"max_steps": 3, "eval": {"every": 0}, "algorithm": {"old_logp": "recompute"},
            "optim": {"micro_batch_size": 16}}
    t = Trainer(make_config(sets), tmp_path / "oom")
    sizes, forwards = _inject(t, fail_on={1}), []
    original = t.update.passes.micro_loss

    def spy(ro, *a, **kw):
        forwards.append(kw.get("forward") is not None)
        return original(ro, *a, **kw)

    t.update.passes.micro_loss = spy
    t.train()
    assert sizes[0] == 16 and max(sizes[1:]) == 8
    assert forwards[0] is True and not any(forwards[1:])  # reused once, then too big to fold
    rows = read_metrics(tmp_path / "oom")
    assert [r["train/oom_retries"] for r in rows] == [1.0, 1.0, 1.0]
    ref = Trainer(make_config({**sets, "optim": {"micro_batch_size": 8}}), tmp_path / "ref")
    ref.train()
    for a, b in zip(read_metrics(tmp_path / "ref"), rows):
        for k in ("reward/mean", "loss/policy", "grad/norm"):
            assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-6), k
