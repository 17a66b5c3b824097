"""Hostile tools cannot hurt the trainer: a tool that hangs, raises, segfaults, kills its
worker's parent or its own process group, forks, prints a flood, returns too much or not text,
leaves a detached grandchild, or an environment whose state or observation is huge. Each case
trains the lab tool task for a step on the tiny model, and ends with training going on (or a
clean stop with a checkpoint), the failure logged once, nothing of the tool's left running, and
the tool's module never imported by the trainer."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import psutil
import pytest
from test_tools import CALC, TINY_MULTIPLY, _tools_recipe
from test_tools import _cfg as _multiply_cfg

from explorl.errors import EnvironmentFailed
from explorl.outputs.checkpoint import latest_checkpoint
from explorl.outputs.runlog import read_metrics
from explorl.rewards import pool as pool_mod
from explorl.rewards.processes import marked

HERE = os.path.dirname(os.path.abspath(__file__))
HOSTILE = os.path.join(HERE, "hostile_tools.py")
STATE_LIMIT = 65536  # rollout.env_state_max_bytes in the huge-state case


@pytest.fixture(scope="module")
def multiply_model():
    from explorl.lab import lab_model_path

    return lab_model_path("multiply", size="tiny", **TINY_MULTIPLY)


@pytest.fixture
def tokens(monkeypatch):
    """Every pool worker's mark started during the test (to find what its tree left)."""
    seen: list[str] = []
    real = pool_mod.VerifierPool._start_worker

    def start(self):
        w = real(self)
        seen.append(w.token)
        return w
    monkeypatch.setattr(pool_mod.VerifierPool, "_start_worker", start)
    return seen


def _ours() -> set[int]:
    """This process's descendants but multiprocessing's own helpers, its direct children (the
    fork server, which a tool may kill and multiprocessing restarts, and the resource
    tracker). A pool's workers and what they fork count: they are the fork server's children."""
    me = psutil.Process()
    helpers = set()
    for p in me.children():
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if "multiprocessing.forkserver" in cmd or "multiprocessing.resource_tracker" in cmd:
            helpers.add(p.pid)
    return {p.pid for p in me.children(recursive=True)} - helpers


def _marked(tokens: list[str], but: set[int] = frozenset()) -> list[int]:
    """What carries a mark of the test's workers (name or environment), anywhere, but the pids
    ``but``, once those killed have had 5 s to go (a SIGKILL is delivered asynchronously)."""
    gone, alive = psutil.wait_procs([p for p in marked(tokens) if p.pid not in but], timeout=5)
    return [p.pid for p in alive if p.status() != psutil.STATUS_ZOMBIE]


N = 8  # responses a step: 2 prompts × 4 samples (test_tools' recipe)


def _train(model, out, steps=1, tool=None, environment=None, timeout_s=1.0, workers=2,
           **rollout):
    from explorl.training.loop import Trainer

    ro = {"tools": [f"{HOSTILE}:{tool}"] if tool else [], "environment": environment,
          "max_turns": 2, **rollout}
    cfg = _tools_recipe(model, max_steps=steps, rollout=ro,
                        data={"prompts_per_step": 2},
                        reward={"timeout_s": timeout_s, "num_workers": workers,
                                "step_timeout_s": 30.0},
                        eval={"every": 0})
    t = Trainer(cfg, out)
    return t, t.train()


def _hostile_imported() -> bool:
    return any(getattr(m, "__file__", None) == HOSTILE for m in list(sys.modules.values()))


CASES = {  # tool -> what a call gives the model (None: answered)
    "crash": "RuntimeError: hostile tool raised",
    "segfault": "the worker died",
    "kill_parent": "the worker died",
    "killpg": "the worker died",
    "fork_bomb": None,
    "noisy": None,
    "huge_result": "tool_result_max_chars=",
    "not_text": "returned a bytes, not text",
    "detached": None,
    "hang": "timed out after 0.5 s",
}


@pytest.mark.parametrize("tool", list(CASES))
def test_a_hostile_tool_cannot_hurt_the_trainer(multiply_model, tmp_path, tool, tokens, caplog,
                                                capfd):
    before = _ours()
    with caplog.at_level(logging.WARNING, logger="explorl.tools.runner"):
        t, summary = _train(multiply_model, tmp_path / "run", tool=tool,
                            **({"timeout_s": 0.5, "workers": 4} if tool == "hang" else {}))
    rows = [r for r in read_metrics(tmp_path / "run") if "tools/calls_mean" in r]
    assert summary["steps"] == 1 and not summary["interrupted"] and len(rows) == 1
    assert latest_checkpoint(tmp_path / "run") is not None
    calls = sum(r["tools/calls_mean"] for r in rows)
    assert calls > 0, "the tiny model made no call: the case tested nothing"
    failed = [r.message for r in caplog.records if "failed:" in r.message]
    if CASES[tool] is None:  # (tools/errors may count the model's own malformed calls)
        assert not failed, failed
    else:  # every call failed, counted; the first failure logged once, with its message
        assert sum(r["tools/errors"] for r in rows) == pytest.approx(calls * N)
        assert len(failed) == 1 and CASES[tool] in failed[0], failed
        assert f"tool '{tool}' failed" in failed[0]
    assert not _hostile_imported()  # the trainer never imported the tool's module
    assert "NOISE" not in capfd.readouterr().out + capfd.readouterr().err
    assert "NOISE" not in (tmp_path / "run" / "train.log").read_text() if (
        tmp_path / "run" / "train.log").exists() else True
    assert _ours() <= before  # no descendant left behind
    assert _marked(tokens) == []  # nor anything a worker's tree started, detached or not


def test_a_huge_environment_state_is_an_error_result_and_stays_bounded(multiply_model, tmp_path,
                                                                       tokens):
    """Each call would grow the state by 8 MB: past rollout.env_state_max_bytes it is an error
    the model reads, and the response keeps its state as before the call (a few bytes)."""
    t, summary = _train(multiply_model, tmp_path / "run",
                        environment=f"{HOSTILE}:Hoarder", env_state_max_bytes=STATE_LIMIT)
    rows = [r for r in read_metrics(tmp_path / "run") if "tools/calls_mean" in r]
    calls = sum(r["tools/calls_mean"] for r in rows)
    assert summary["steps"] == 1 and calls > 0
    assert sum(r["tools/errors"] for r in rows) == pytest.approx(calls * N)
    kept = [len(r.env) for r in t.engine.last_rows]
    assert kept and max(kept) < 1024  # every response kept its reset state
    assert _marked(tokens) == []


def test_a_huge_reset_observation_stops_the_run_cleanly(multiply_model, tmp_path):
    """A reset past rollout.env_observation_max_chars is the environment's fault: the run stops
    with an error naming the environment and the limit, after a checkpoint."""
    with pytest.raises(EnvironmentFailed) as e:
        _train(multiply_model, tmp_path / "run", environment=f"{HOSTILE}:Chatty")
    msg = str(e.value)
    assert "hostile_tools.py:Chatty" in msg and "rollout.env_observation_max_chars=2000" in msg
    assert "20000 characters" in msg
    assert latest_checkpoint(tmp_path / "run") is not None


def test_a_reset_observation_past_the_prompt_limit_stops_the_run_cleanly(multiply_model,
                                                                         tmp_path):
    """data.max_prompt_len is checked for each prompt at setup; reset's observation joins it
    later. Past the limit it is the environment's fault, named with the row and both lengths,
    before any engine sees an over-long prompt, and the run stops after a checkpoint."""
    with pytest.raises(EnvironmentFailed) as e:
        _train(multiply_model, tmp_path / "run", environment=f"{HOSTILE}:Wordy")
    msg = str(e.value)
    assert "the prompt with reset's observation has" in msg
    assert "more than data.max_prompt_len=1024" in msg and "problem" in msg
    assert latest_checkpoint(tmp_path / "run") is not None
    # characters the tokenizer refuses (outside a lab model's alphabet): the same
    with pytest.raises(EnvironmentFailed) as e:
        _train(multiply_model, tmp_path / "run2", environment=f"{HOSTILE}:Foreign")
    assert "reset's observation cannot join the prompt" in str(e.value)
    assert "outside the lab model's alphabet" in str(e.value)
    assert latest_checkpoint(tmp_path / "run2") is not None


def _tagged(mark: str) -> list:
    """The processes whose environment carries HOSTILE_TEST=mark (a script's, and what it
    started: multiprocessing's helpers and the pool's workers inherit it)."""
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("HOSTILE_TEST") == mark:
                out.append(p)
        except psutil.Error:
            pass
    return out


def test_a_trainer_killed_with_sigkill_leaves_no_worker(tmp_path):
    """kill -9 of the process that owns a pool whose workers hang in a call: the fork server sees
    its owner gone and exits, and the workers die with it (they no longer hold the fork
    server's pipe, which kept all of them alive)."""
    import time

    mark = f"hostile-kill-{os.getpid()}-{tmp_path.name}"
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f"""
        from explorl.tools import ToolRunner, ToolSpec
        r = ToolRunner(ToolSpec(({HOSTILE + ':hang'!r},)), num_workers=2, timeout_s=100.0)
        print("go", flush=True)
        r.run([("hang", {{"x": "1"}})] * 2)
    """))
    p = subprocess.Popen([sys.executable, str(script)], env={**os.environ, "HOSTILE_TEST": mark},
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "go"
        deadline = time.monotonic() + 30
        while len(_tagged(mark)) < 4 and time.monotonic() < deadline:  # server + 2 workers
            time.sleep(0.1)
    finally:
        p.kill()
        p.wait()
    gone, alive = psutil.wait_procs(_tagged(mark), timeout=10)
    for q in alive:  # not ours to leave running, whatever the verdict
        q.kill()
    assert alive == []


def test_a_detached_grandchild_keeps_nothing_alive(tmp_path):
    """A script whose tool leaves a detached (setsid) grandchild exits at once, its stdout
    pipe closed, and leaves no process behind: not the grandchild, not the forkserver (a
    grandchild used to hold the forkserver's pipe open)."""
    mark = f"hostile-{os.getpid()}-{tmp_path.name}"
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f"""
        from explorl.tools import ToolRunner, ToolSpec
        r = ToolRunner(ToolSpec(({HOSTILE + ':detached'!r},)), num_workers=1, timeout_s=5.0)
        print(r.run([("detached", {{"x": "1"}})] * 2)[0].text)
    """))  # no close: the pool's exit hook stops it
    env = {**os.environ, "HOSTILE_TEST": mark}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "7", done.stderr

    gone, alive = psutil.wait_procs(_tagged(mark), timeout=5)
    for q in alive:
        q.kill()
    assert alive == []


def test_workers_that_died_idle_never_answer_a_bare_zero():
    """Every worker of a pool killed between two calls (as a tool that kills the fork server
    does): the next call is answered by new workers, every result text, none the pool's 0.0."""
    import signal

    from explorl.tools import ToolRunner, ToolSpec

    runner = ToolRunner(ToolSpec((CALC,)), num_workers=2, timeout_s=5.0, step_timeout_s=60.0)
    try:
        assert runner.run([("calculator", {"expression": "1+1"})])[0].text == "2"
        for w in runner._pool._workers:
            os.kill(w.proc.pid, signal.SIGKILL)
            w.proc.join(5)
        out = runner.run([("calculator", {"expression": "6*7"})] * 3)
    finally:
        runner.close()
    assert [(a.text, a.error) for a in out] == [("42", None)] * 3


@pytest.mark.parametrize("top, message", [
    ("import os\nos._exit(3)\n", "the worker died"),
    ("raise SystemExit('bye')\n", "SystemExit: bye"),
])
def test_a_tool_module_is_imported_in_a_worker_and_its_failure_names_the_key(
        multiply_model, tmp_path, top, message):
    """The config check imports a tool's module in a sandboxed worker: a module whose top level
    kills its process or exits fails the check with the key, and the trainer lives on."""
    from explorl import config as C
    from explorl import validation

    path = tmp_path / "bad_tools.py"
    path.write_text(top + 'def calc(x: str) -> str:\n    """Echo.\n\n    Args:\n'
                    '        x: Anything.\n    """\n    return x\n')
    with pytest.raises(C.ConfigError, match=r"rollout\.tools") as e:
        validation.from_dict(_multiply_cfg(multiply_model, tools=[f"{path}:calc"]))
    assert message in str(e.value)


def test_what_a_dead_workers_tree_left_is_found_and_killed(tokens):
    """A call that detaches a grandchild and then kills its worker: the grandchild is no longer
    in any tree the pool knows; the pool finds it by its worker's mark and kills it at once."""
    from explorl.tools import ToolRunner, ToolSpec

    runner = ToolRunner(ToolSpec((f"{HOSTILE}:detach_and_crash",)), num_workers=1,
                        timeout_s=5.0, step_timeout_s=60.0)
    try:
        out = runner.run([("detach_and_crash", {"x": "1"})])
        assert "the worker died" in out[0].error
        live = {w.proc.pid for w in runner._pool._workers}  # its replacement
        assert _marked(tokens, but=live) == []  # before the pool closes
    finally:
        runner.close()


@pytest.mark.parametrize("tool", ["fork_bomb", "detached"])
def test_nothing_a_call_starts_outlives_the_call(tool, tokens):
    """The pool still open, its workers idle after the call: the call's forks (a bounded fork
    bomb's 15, a setsid grandchild) are gone, only the workers themselves are left."""
    from explorl.tools import ToolRunner, ToolSpec

    before = _ours()
    runner = ToolRunner(ToolSpec((f"{HOSTILE}:{tool}",)), num_workers=1, timeout_s=10.0,
                        step_timeout_s=60.0)
    try:
        assert [a.text for a in runner.run([(tool, {"x": "1"})] * 2)] == ["7", "7"]
        workers = {w.proc.pid for w in runner._pool._workers}
        assert _ours() - before == workers
        assert _marked(tokens, but=workers) == []
    finally:
        runner.close()
    assert _ours() <= before and _marked(tokens) == []
