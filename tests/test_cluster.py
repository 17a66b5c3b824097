"""Runs on a cluster: SIGTERM/SIGUSR1 stop after a checkpoint and resume exactly, checkpoints by
the clock, resumes that list and record what they change, and stops of the run's own that keep
its last finite weights (docs/failures.md, "Running on a cluster")."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml

from explorl import config as C
from explorl.cli import main
from explorl.outputs.checkpoint import checkpoint_step, latest_checkpoint, list_checkpoints
from explorl.outputs.runlog import read_metrics
from explorl.training import preemption
from explorl.training import state as run_state
from explorl.training.loop import TIME_KEYS, Trainer


def _recipe(tmp_path, cfg: C.RunConfig) -> str:
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(C.to_dict(cfg)))
    return str(path)


def _strip(rows):
    return [{k: v for k, v in r.items() if not k.startswith(TIME_KEYS)} for r in rows]


def _error_line(err: str) -> str:
    (line,) = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert "Traceback" not in err
    return line


# ----------------------------------------------------------------------------- signals


def test_sigterm_and_sigusr1_checkpoint_exit_75_and_resume_exactly(make_config, tmp_path):
    """The step under way finishes, a checkpoint is written although none is due by steps or
    minutes, the exit status is 75 with a line saying how to resume, and the resumed run's
    metrics equal the uninterrupted run's."""
    # 30 steps: the signal, sent once step 1's metrics exist, lands well before the last step
    # (with 5, a loaded machine sometimes ran them all first, and a finished run exits 0)
    cfg = make_config({"max_steps": 30, "eval": {"every": 0}, "data": {"max_train_prompts": 8},
                       "log": {"checkpoint_every": 0, "checkpoint_every_minutes": 0}})
    Trainer(cfg, tmp_path / "ref").train()
    ref = _strip(read_metrics(tmp_path / "ref"))
    recipe = _recipe(tmp_path, cfg)
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        out = tmp_path / sig.name
        proc = subprocess.Popen([sys.executable, "-m", "explorl", "train", recipe, "--out",
                                 str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        deadline = time.monotonic() + 300
        while not read_metrics(out) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(proc.pid, sig)
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == preemption.PREEMPTED == 75, stderr
        step = checkpoint_step(latest_checkpoint(out))
        assert 1 <= step < 30 and [r["step"] for r in read_metrics(out)] == list(range(1, step + 1))
        assert f"stopped by {sig.name} after step {step}; checkpoint {out}" in stdout
        assert f"continue with: explorl train --resume {out}" in stdout
        assert f"{sig.name}: finishing this step" in stdout + stderr
        assert main(["train", "--resume", str(out)]) == 0
        assert _strip(read_metrics(out)) == ref


def test_a_second_signal_aborts_without_a_checkpoint():
    requests = preemption.StopRequests(0)
    said = []
    with preemption.stop_on_signals(requests, said.append):
        os.kill(os.getpid(), signal.SIGUSR1)
        assert requests.pending == "SIGUSR1" and said
        with pytest.raises(preemption.SignalAbort) as got:
            os.kill(os.getpid(), signal.SIGTERM)
    assert got.value.code == 128 + signal.SIGTERM  # a shell's status for death by SIGTERM
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored


def test_ranks_agree_on_the_stop_and_the_checkpoint_timer(monkeypatch):
    """Each rank's flags summed (what ``dist.sum_dict`` does): one rank's signal or due timer
    stops or checkpoints every rank."""
    now = [0.0]
    monkeypatch.setattr(preemption, "clock", lambda: now[0])
    a, b = preemption.StopRequests(1.0), preemption.StopRequests(1.0)
    a.on_signal(signal.SIGTERM)
    now[0] = 61.0
    b.last_save = 30.0  # b saved later: not due on its own clock
    fa, fb = a.flags(), b.flags()
    total = {k: fa[k] + fb[k] for k in fa}
    assert b.merge(dict(total)) and b.agreed == "SIGTERM" and b.save_due
    assert a.merge(dict(total)) and a.save_due


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc")
def test_verifier_workers_and_their_forkserver_ignore_the_stop_signals():
    """SLURM's ``--signal`` reaches every process of the job: the workers must live on to
    score the step the trainer finishes (the forkserver too: the workers die with it)."""
    from explorl.rewards.pool import VerifierPool

    def ignored(pid: int) -> set[int]:
        line = next(x for x in open(f"/proc/{pid}/status") if x.startswith("SigIgn"))
        mask = int(line.split()[1], 16)
        return {s for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT) if mask >> (s - 1) & 1}

    pool = VerifierPool(1, 5.0)
    try:
        worker = pool._workers[0].proc.pid
        server = int(open(f"/proc/{worker}/stat").read().split()[3])
        assert ignored(worker) == ignored(server) == {signal.SIGTERM, signal.SIGUSR1,
                                                      signal.SIGINT}
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the trainer's own: unchanged
    finally:
        pool.close()


# ----------------------------------------------------------------------------- by the clock


def test_a_checkpoint_by_the_clock_when_none_is_due_by_steps(make_config, tmp_path, monkeypatch):
    now = [0.0]
    monkeypatch.setattr(preemption, "clock", lambda: now[0])
    saved, real_save = [], run_state.save_checkpoint

    def counting(run_dir, step, *a, **k):
        saved.append(step)
        return real_save(run_dir, step, *a, **k)

    monkeypatch.setattr(run_state, "save_checkpoint", counting)
    cfg = make_config({"max_steps": 4, "eval": {"every": 0},
                       "log": {"checkpoint_every": 1000, "checkpoint_every_minutes": 1.0}})
    t = Trainer(cfg, tmp_path / "run")
    real_step = t.train_step

    def step_of_35_seconds():
        now[0] += 35.0
        return real_step()

    t.train_step = step_of_35_seconds
    t.train()
    assert saved == [2, 4]  # 70 s after the start, then 70 s after step 2's checkpoint
    assert C.LogConfig().checkpoint_every_minutes == 30.0


# ----------------------------------------------------------------------------- resume changes


def _two_steps(make_config, tmp_path):
    cfg = make_config({"max_steps": 2, "eval": {"every": 0}})
    out = tmp_path / "run"
    assert main(["train", _recipe(tmp_path, cfg), "--out", str(out)]) == 0
    return out


def test_a_resume_lists_and_records_what_it_changes(make_config, tmp_path, capsys):
    out = _two_steps(make_config, tmp_path)
    capsys.readouterr()
    assert main(["train", "--resume", str(out), "--max-steps", "3",
                 "--set", "optim.lr=0.002"]) == 0
    printed = capsys.readouterr().out
    assert "resuming" in printed and "max_steps: 2 → 3" in printed
    assert "optim.lr: 0.001 → 0.002" in printed
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["optim"]["lr"] == 0.002
    (first,) = saved["resumes"]
    assert first["step"] == 2 and first["time"].endswith("+00:00")
    assert first["changes"] == {"max_steps": {"from": 2, "to": 3},
                                "optim.lr": {"from": 0.001, "to": 0.002}}
    assert main(["train", "--resume", str(out), "--max-steps", "4"]) == 0  # it loads back
    assert "max_steps: 3 → 4" in capsys.readouterr().out
    history = yaml.safe_load((out / "config.yaml").read_text())["resumes"]
    assert [r["step"] for r in history] == [2, 3] and history[0] == first


def test_a_resume_with_another_loss_needs_allow_changes(make_config, tmp_path, capsys,
                                                        monkeypatch):
    out = _two_steps(make_config, tmp_path)
    capsys.readouterr()

    def no_model(*a, **k):
        raise AssertionError("the model loaded before the refusal")

    with monkeypatch.context() as m:
        m.setattr(Trainer, "_setup_model", no_model)
        code = main(["train", "--resume", str(out), "--max-steps", "3",
                     "--set", "algorithm.loss=kl_cov"])
    err = _error_line(capsys.readouterr().err)
    assert code == 2 and "algorithm.loss: 'ppo' → 'kl_cov'" in err and "--allow-changes" in err
    assert "resumes" not in yaml.safe_load((out / "config.yaml").read_text())
    assert main(["train", "--resume", str(out), "--max-steps", "3", "--allow-changes",
                 "--set", "algorithm.loss=kl_cov"]) == 0
    (entry,) = yaml.safe_load((out / "config.yaml").read_text())["resumes"]
    assert entry["changes"]["algorithm.loss"] == {"from": "ppo", "to": "kl_cov"}


# ----------------------------------------------------------------------------- own stops


def test_a_stop_before_the_first_checkpoint_keeps_the_last_finite_weights(
        make_config, tmp_path, capsys, monkeypatch):
    """The issue's lab/grpo at optim.lr=10: step 2's gradient is not finite, the guard stops
    the run before step 2's checkpoint was due; the skipped update left step 1's weights."""
    cfg = make_config({"max_steps": 8, "eval": {"every": 0},
                       "log": {"checkpoint_every": 2, "checkpoint_every_minutes": 0},
                       "optim": {"max_bad_steps": 3, "max_bad_frac": 0.1}})
    real_run, after_step_1 = Trainer.__init__, {}

    def poisoned_from_step_2(self, *a, **k):
        real_run(self, *a, **k)
        run = self.update.run

        def update(ro, adv, knobs, sb):
            if self.step == 0:
                after = run(ro, adv, knobs, sb)
                after_step_1.update({n: p.detach().clone()
                                     for n, p in self.policy.named_parameters()})
                return after
            return run(ro, adv * float("nan"), knobs, sb)
        self.update.run = update

    monkeypatch.setattr(Trainer, "__init__", poisoned_from_step_2)
    out = tmp_path / "run"
    assert main(["train", _recipe(tmp_path, cfg), "--out", str(out)]) == 2
    err = _error_line(capsys.readouterr().err)
    ckpt = out / "checkpoints" / "step-2"
    assert err.startswith("error: step 2: 1 step skipped for a non-finite")
    assert err.endswith(f"checkpoint {ckpt} holds the last finite weights (step 2)")
    assert "intact" not in err
    assert list_checkpoints(out) == [ckpt]
    from safetensors.torch import load_file
    weights = load_file(ckpt / "model.safetensors")
    assert all(bool(torch.isfinite(w).all()) for w in weights.values())
    same = [k for k in weights if k in after_step_1]
    assert same and all(torch.equal(weights[k], after_step_1[k]) for k in same)
