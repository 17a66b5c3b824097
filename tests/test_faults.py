"""Fault injection: full disks, failing writes, NaN weights, crashes between renames, partial
metrics lines and kill -9, each leaving the previous checkpoint and the metrics usable."""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml

from explorl import config as C
from explorl.cli import main
from explorl.errors import CheckpointError, ExplorlError, NonFiniteError
from explorl.outputs import checkpoint as ckpt_mod
from explorl.outputs.checkpoint import (
    finite_or_raise,
    latest_checkpoint,
    list_checkpoints,
    load_state,
    nonfinite_parameters,
    save_checkpoint,
)
from explorl.outputs.runlog import MetricsLog, read_metrics
from explorl.training.loop import TIME_KEYS, Trainer

ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _save(run, step, model=None, state=None, keep=2):
    return save_checkpoint(
        run,
        step,
        model or torch.nn.Linear(2, 2),
        None,
        state or {"step": step},
        save_model=False,
        keep=keep,
    )


def _error_line(err: str) -> str:
    """The one ``error:`` line of stderr (transformers may print loading bars before it)."""
    (line,) = [ln for ln in err.split("\n") if ln.startswith("error: ")]
    assert "Traceback" not in err
    return line


def _dirs(run) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir())


# ----------------------------------------------------------------------------- checkpoint writes


@pytest.mark.parametrize(
    "error, cause",
    [
        (ENOSPC, "no space left on the device of"),
        # what torch.save says when the disk fills up mid-file
        (
            RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 6016 vs 5904"),
            "unexpected pos 6016 vs 5904 [",
        ),
        (
            PermissionError(errno.EACCES, "Permission denied", "x/trainer_state.pt"),
            "Permission denied (x/",
        ),
    ],
)
def test_failed_write_names_path_and_cause_and_keeps_the_previous_checkpoint(
    tmp_path, monkeypatch, error, cause
):
    first = _save(tmp_path, 1)

    def fail(*a, **k):
        raise error

    monkeypatch.setattr(ckpt_mod.torch, "save", fail)
    with pytest.raises(CheckpointError) as e:
        _save(tmp_path, 2)
    msg = str(e.value)
    assert msg.startswith(f"cannot write checkpoint {tmp_path / 'checkpoints' / 'step-2'}: ")
    assert cause in msg and msg.endswith("earlier checkpoints are untouched")
    if isinstance(error, RuntimeError):
        assert "MiB free on the device of" in msg
    assert isinstance(e.value, (ExplorlError, OSError))
    assert _dirs(tmp_path) == ["step-1"]  # no .step-2.tmp left behind
    assert latest_checkpoint(tmp_path) == first and load_state(first) == {"step": 1}


def test_failed_model_write_removes_the_temp_dir(tmp_path):
    class FullDiskModel(torch.nn.Linear):
        def save_pretrained(self, path, **kwargs):
            (path / "model.safetensors").write_bytes(b"partial")
            raise ENOSPC

    _save(tmp_path, 1)
    with pytest.raises(CheckpointError, match="no space left"):
        save_checkpoint(tmp_path, 2, FullDiskModel(2, 2), None, {"step": 2}, save_model=True)
    assert _dirs(tmp_path) == ["step-1"]


def test_non_finite_weights_are_never_written(tmp_path):
    _save(tmp_path, 1)
    model = torch.nn.Linear(3, 2)
    with torch.no_grad():
        model.weight[0, 1] = float("nan")
        model.bias[1] = float("inf")
    assert nonfinite_parameters(model) == {"weight": 1, "bias": 1}
    with pytest.raises(NonFiniteError) as e:
        _save(tmp_path, 2, model)
    assert str(e.value) == (
        f"refusing to write checkpoint {tmp_path / 'checkpoints' / 'step-2'} (the "
        "last one written is step-1): 2 weights of 2 parameters are NaN or "
        "infinite (weight, bias)"
    )
    assert _dirs(tmp_path) == ["step-1"]
    finite_or_raise(torch.nn.Linear(2, 2), "fine")  # no error


def test_same_step_is_replaced_only_once_the_new_one_is_complete(tmp_path, monkeypatch):
    _save(tmp_path, 2, state={"v": "old"})
    _save(tmp_path, 2, state={"v": "new"})
    assert _dirs(tmp_path) == ["step-2"] and load_state(latest_checkpoint(tmp_path)) == {"v": "new"}

    real_replace, calls = os.replace, []

    def crash_on_second_rename(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:  # old checkpoint moved aside, new one not yet in place
            raise KeyboardInterrupt("killed between the two renames")
        real_replace(src, dst)

    monkeypatch.setattr(ckpt_mod.os, "replace", crash_on_second_rename)
    with pytest.raises(KeyboardInterrupt):
        _save(tmp_path, 2, state={"v": "newer"})
    monkeypatch.setattr(ckpt_mod.os, "replace", real_replace)
    # step 2 never disappeared: the previous version stands in until the next save
    (only,) = list_checkpoints(tmp_path)
    assert only.name == ".step-2.old" and load_state(only) == {"v": "new"}
    _save(tmp_path, 3)
    assert [p.name for p in list_checkpoints(tmp_path)] == [".step-2.old", "step-3"]


def test_rotation_never_deletes_the_checkpoint_just_written(tmp_path):
    for step in (1, 2, 3):
        _save(tmp_path, step)
    assert _dirs(tmp_path) == ["step-2", "step-3"]
    _save(tmp_path, 1, keep=1)  # an earlier step written last (e.g. a run restarted by hand)
    assert _dirs(tmp_path) == ["step-1"]
    (tmp_path / "checkpoints" / ".step-9.tmp").mkdir()  # left by a crash mid-write
    _save(tmp_path, 2)
    assert _dirs(tmp_path) == ["step-1", "step-2"]


# ----------------------------------------------------------------------------- metrics.jsonl


def test_partial_last_metrics_line_is_dropped_on_resume(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": 1, "reward/mean": 0.5}, {"step": 2, "reward/mean": 0.25}]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    path.write_bytes(text.encode() + b'{"step": 3, "reward/mean": 0.1, "entr' + b"\xc3")
    assert read_metrics(tmp_path) == rows
    log = MetricsLog(path, truncate_after=2)
    log.write({"step": 3, "reward/mean": 1.0})
    log.close()
    assert read_metrics(tmp_path) == [*rows, {"step": 3, "reward/mean": 1.0}]


def test_corrupt_metrics_line_before_the_end_is_a_clear_error(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(CheckpointError, match=r"metrics.jsonl: line 2 is not valid JSON"):
        MetricsLog(tmp_path / "metrics.jsonl", truncate_after=2)


def test_failed_metrics_write_names_the_file(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write({"step": 1})

    class FullDisk:
        def write(self, text):
            raise ENOSPC

        def close(self):
            pass

    log._fh = FullDisk()
    with pytest.raises(
        CheckpointError, match=rf"cannot write {tmp_path / 'metrics.jsonl'}: No space left"
    ):
        log.write({"step": 2})
    assert read_metrics(tmp_path) == [{"step": 1}]


# ----------------------------------------------------------------------------- in a run


def test_last_step_is_saved_once(make_config, tmp_path, monkeypatch):
    import explorl.training.state

    saved = []
    real = explorl.training.state.save_checkpoint

    def counting(run_dir, step, *a, **k):
        saved.append(step)
        return real(run_dir, step, *a, **k)

    monkeypatch.setattr(explorl.training.state, "save_checkpoint", counting)
    Trainer(
        make_config({"max_steps": 4, "log": {"checkpoint_every": 2}, "eval": {"every": 0}}),
        tmp_path / "a",
    ).train()
    assert saved == [2, 4]
    saved.clear()
    Trainer(
        make_config({"max_steps": 3, "log": {"checkpoint_every": 2}, "eval": {"every": 0}}),
        tmp_path / "b",
    ).train()
    assert saved == [2, 3]


def _recipe(tmp_path, cfg: C.RunConfig):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(C.to_dict(cfg)))
    return path


def test_disk_full_mid_run_exits_2_and_loses_nothing(make_config, tmp_path, monkeypatch, capsys):
    cfg = make_config({"max_steps": 3, "log": {"checkpoint_every": 1}, "eval": {"every": 0}})
    out = tmp_path / "run"
    real_save, calls = torch.save, []

    def full_at_step_2(obj, f, *a, **k):
        calls.append(f)
        if len(calls) == 2:
            raise ENOSPC
        return real_save(obj, f, *a, **k)

    monkeypatch.setattr(ckpt_mod.torch, "save", full_at_step_2)
    assert main(["train", str(_recipe(tmp_path, cfg)), "--out", str(out)]) == 2
    err = _error_line(capsys.readouterr().err)
    assert err.startswith(
        f"error: cannot write checkpoint {out / 'checkpoints' / 'step-2'}: no space left"
    )
    assert _dirs(out) == ["step-1"]
    assert [r["step"] for r in read_metrics(out)] == [1, 2]

    monkeypatch.setattr(ckpt_mod.torch, "save", real_save)  # space freed: resume from step 1
    assert main(["train", "--resume", str(out)]) == 0
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3] and _dirs(out) == [
        "step-2",
        "step-3",
    ]


def test_nan_weights_are_not_checkpointed_and_the_run_stops(
    make_config, tmp_path, monkeypatch, capsys
):
    cfg = make_config({"max_steps": 4, "log": {"checkpoint_every": 1}, "eval": {"every": 0}})
    out = tmp_path / "run"
    real_step = Trainer.train_step

    def step_then_poison(self):
        metrics = real_step(self)
        if self.step == 2:
            with torch.no_grad():
                next(self.policy.parameters()).fill_(float("nan"))
        return metrics

    monkeypatch.setattr(Trainer, "train_step", step_then_poison)
    assert main(["train", str(_recipe(tmp_path, cfg)), "--out", str(out)]) == 2
    err = _error_line(capsys.readouterr().err)  # from Trainer.save or save_checkpoint
    assert "step 2" in err or "step-2" in err
    assert "not finite" in err or "NaN or infinite" in err
    assert _dirs(out) == ["step-1"]
    state = load_state(out / "checkpoints" / "step-1")
    assert state["step"] == 1


# ----------------------------------------------------------------------------- kill -9


def _strip(rows):
    return [{k: v for k, v in r.items() if not k.startswith(TIME_KEYS)} for r in rows]


@pytest.mark.slow
def test_kill_9_at_a_random_point_resumes_exactly(make_config, tmp_path):
    """Every controller but the temperature scheduler (it excludes the adaptive one) on; the
    process is killed at a random moment after step 2 is logged, possibly mid-checkpoint."""
    cfg = make_config(
        {
            "max_steps": 6,
            "log": {"checkpoint_every": 1},
            "eval": {"every": 3},
            "data": {"max_train_prompts": 8},
            "control": {
                "budget": {"enabled": True},
                "eepo": {"enabled": True, "alpha": 10.0},
                "adaptive": {"enabled": True, "warmup": 1},
                "curriculum": {"enabled": True, "start_ratio": 0.5, "n_samples": 6},
            },
        }
    )
    Trainer(cfg, tmp_path / "ref").train()
    ref = _strip(read_metrics(tmp_path / "ref"))

    out, recipe = tmp_path / "run", _recipe(tmp_path, cfg)
    cmd = [sys.executable, "-m", "explorl", "train", str(recipe), "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while len(read_metrics(out)) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(random.Random(17).uniform(0.0, 1.0))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert latest_checkpoint(out) is not None
    done = subprocess.run(
        [sys.executable, "-m", "explorl", "train", "--resume", str(out)],
        capture_output=True,
        check=False,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert _strip(read_metrics(out)) == ref
