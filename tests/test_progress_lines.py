"""Progress off a terminal: plain lines per step / evaluation batch, and a line at least every
``log.progress_every_s`` seconds of a long phase (a fake clock, not real time)."""

from __future__ import annotations

import time

import pytest

from explorl.eval import run as eval_run
from explorl.outputs import progress_lines as PL
from explorl.outputs.runlog import ProgressBar, step_fields
from explorl.rollout import progress
from explorl.training.loop import Trainer


class FakeClock:
    """Every call moves time on by ``tick`` seconds."""

    def __init__(self, tick: float):
        self.now, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


@pytest.fixture
def fake_clock(monkeypatch):
    def make(tick: float) -> FakeClock:
        c = FakeClock(tick)
        monkeypatch.setattr(PL, "clock", c)
        monkeypatch.setattr(PL, "TICK_S", 0)  # no thread: lines come from decode steps alone
        return c
    return make


def test_durations():
    assert [PL.duration(s) for s in (0, 44.6, 65, 3599, 7620)] == \
        ["0s", "45s", "1m05s", "59m59s", "2h07m"]


def test_phase_count_responses_rate_and_eta():
    c = PL.PhaseCount(progress.Phase("validation at step 0", 40), now=0.0)
    for t in (1, 2):  # a first call of 16 rows, 2 of 8 decode steps; a second call starts
        c(t, 8, 16)
    c(1, 8, 16)
    c(2, 8, 16)
    # 16 responses of the finished call; the running one half done (16 rows × 2/8 → 4):
    # 20 of 40 after 10 s → ETA 10 s; 64 tokens in 10 s
    assert c.done == 16 and c.tokens == 64
    assert c.text(10.0) == ("validation at step 0: 16/40 responses, decode 2/8, 6 tok/s, "
                            "ETA 10s, 10s so far")
    assert PL.PhaseCount(None, 0.0).text(3.0) == "sampling: 3s so far"
    first = PL.PhaseCount(progress.Phase("v", 40), now=0.0)
    first(1, 8, 10)
    first(2, 8, 10)  # no call finished yet: 10 × 2/8 = 2.5 of 40 after 5 s, at most 75 s more
    assert first.text(5.0) == "v: 0/40 responses, decode 2/8, 4 tok/s, ETA ≤1m15s, 5s so far"
    assert "tok/s" not in first.text(0.5)  # no rate, no ETA within the first second


def test_lines_every_interval_during_a_phase_and_per_item(fake_clock):
    clock = fake_clock(10.0)
    out: list[str] = []
    lines = PL.ProgressLines("step", 4, every_s=30.0, item="step", write=out.append)  # t = 10
    with progress.phase("step 1 sampling"):
        for t in range(1, 9):  # one decode step every 10 s: a line once 30 s have passed
            progress.step(t, 8, 20)
    # the phase's count starts at its first decode step (t = 20); lines at t = 40 and 70
    assert out == ["step 0/4 done; step 1 sampling: decode 3/8, 3 tok/s, 20s so far",
                   "step 0/4 done; step 1 sampling: decode 6/8, 2 tok/s, 50s so far"]
    lines.done(1, ["reward 0.500"])  # t = 100: 90 s for the first step → ETA 3 × 90 s
    assert out[-1] == "step 1/4  reward 0.500  elapsed 1m30s  ETA 4m30s"
    clock.now += 100
    lines.tick()  # no phase (an update): how long the step has run
    assert out[-1] == "step 1/4 done; step 2 running for 1m50s"
    lines.done(4, [])  # the last step: what runs after it (the checkpoint) is no step
    clock.now += 100
    lines.tick()
    assert out[-1].startswith("step 4/4 done; finishing for ")
    lines.close()
    progress.step(1, 8, 2)  # closed: no longer listening
    assert len(out) == 6


def test_the_thread_writes_while_nothing_decodes(monkeypatch):
    monkeypatch.setattr(PL, "TICK_S", 0.01)
    out: list[str] = []
    with PL.ProgressLines("step", 2, every_s=0.05, write=out.append):
        deadline = time.monotonic() + 5
        while not out and time.monotonic() < deadline:
            time.sleep(0.01)
    assert out and out[0].startswith("step 0/2 done; the next running for")


def test_step_fields_mean_what_they_say():
    m = {"reward/mean": 0.25, "entropy/mean": 1.5, "rollout/n_trained": 64.0,
         "response/length_mean": 30.0, "time/generate_s": 40.0, "time/step_s": 65.0}
    # 64 responses × 30 tokens in 40 s of sampling
    assert step_fields(m) == ["reward 0.250", "entropy 1.500", "48 tok/s", "step 1m05s"]
    assert step_fields({"val/accuracy": 0.125}) == ["val 0.125"]  # the step-0 row


def test_a_lab_run_off_a_terminal_writes_a_line_at_least_every_minute(
        make_config, tmp_path, fake_clock, capsys, monkeypatch):
    fake_clock(7.0)  # a slow run: 7 s pass between any two looks at the clock
    seen: list[tuple[float, str]] = []
    real_write = PL.ProgressLines.write

    def write(self, text, now):
        seen.append((now, text))
        real_write(self, text, now)

    monkeypatch.setattr(PL.ProgressLines, "write", write)
    cfg = make_config({"log": {"progress": True, "progress_every_s": 30}})
    Trainer(cfg, tmp_path / "run").train()
    err = capsys.readouterr().err
    texts = [t for _, t in seen]
    assert all(t in err for t in texts)  # written to stderr as plain lines
    assert texts[0].startswith("step 0/2 done; validation at step 0: ")
    assert any(t.startswith("step 0/2  val ") for t in texts)
    assert any(" step 1 sampling: decode " in t for t in texts)
    step1 = next(t for t in texts if t.startswith("step 1/2  reward "))
    assert " entropy " in step1 and " tok/s " in step1 and " ETA " in step1
    assert any(t.startswith("step 2/2  reward ") and " val " in t for t in texts)
    times = [0.0] + [t for t, _ in seen]
    assert max(b - a for a, b in zip(times, times[1:])) <= 60


def test_eval_off_a_terminal_writes_plain_lines(tiny_model, tmp_path, fake_clock, capsys):
    fake_clock(7.0)
    eval_run.run_eval(model=str(tiny_model), data=["lab:addition"], out_dir=tmp_path, n=2,
                      k_list=[1, 2], max_problems=4, batch_problems=2,
                      overrides=["log.progress_every_s=20"])
    err = capsys.readouterr().err
    assert "eval problems 2/4  " in err and "eval problems 4/4  " in err and " tok/s" in err
    assert "eval problems 0/4 done; sampling 2 problems: " in err  # a heartbeat in the batch


def test_the_bar_stays_on_a_terminal():
    from rich.console import Console

    from explorl.config import LogConfig
    log = LogConfig(progress=True)
    bar = ProgressBar(3, 0, log, console=Console(force_terminal=True, force_interactive=True))
    try:
        assert bar.lines is None and bar.progress is not None
    finally:
        bar.close()
    plain = ProgressBar(3, 0, log, console=Console(force_terminal=False))
    try:
        assert plain.lines is not None and plain.lines.every_s == log.progress_every_s
    finally:
        plain.close()
    assert ProgressBar(3, 0, LogConfig(progress=False)).lines is None  # off: neither
    assert not ProgressBar(3, 0, log, enabled=False, console=Console(force_terminal=False)).enabled


def test_explorl_train_to_a_file_prints_a_line_per_step(tiny_model, tmp_path, capsys):
    import yaml
    from conftest import tiny_config

    from explorl import config as C
    from explorl.cli import main

    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(yaml.safe_dump(C.to_dict(tiny_config(tiny_model, {"max_steps": 2}))))
    assert main(["train", str(recipe), "--out", str(tmp_path / "run"),
                 "--set", "log.progress=true"]) == 0
    err = capsys.readouterr().err
    assert "step 0/2  val " in err and "step 1/2  reward " in err and "step 2/2  reward " in err
    assert "━" not in err  # no bar drawn into the file
