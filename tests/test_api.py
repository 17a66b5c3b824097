"""The Python API (issue 16): ``explorl.train`` from a plain script, with no main guard, a reward
callable and a ``datasets.Dataset``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import explorl
from explorl import config as C

SCRIPT = """
import explorl
from datasets import Dataset

def short_answer(completions, **columns):      # TRL's signature: one score per completion
    return [1.0 if len(c.strip()) <= 2 else 0.0 for c in completions]

rows = [{{"prompt": f"{{a}}+{{b}}=", "answer": str(a + b)}} \
for a in range(1, 7) for b in range(1, 4)]
summary = explorl.train(
    {recipe!r}, out={out!r},
    overrides={{"max_steps": 3, "eval.every": 0, "reward.num_workers": 1, "log.progress": False,
               "log.plots": False, "data.prompts_per_step": 4}},
    reward_funcs=["math", short_answer], reward_weights=[1.0, 0.5],
    train_dataset=Dataset.from_list(rows), val_dataset=Dataset.from_list(rows[:4]))
print("SUMMARY", summary["steps"])
"""


def test_plain_script_without_main_guard_trains_three_steps(make_config, tmp_path):
    recipe = tmp_path / "tiny.yaml"
    cfg = C.to_dict(make_config())
    recipe.write_text(json.dumps(cfg))  # JSON is YAML
    out = tmp_path / "run"
    script = tmp_path / "train_script.py"
    script.write_text(textwrap.dedent(SCRIPT.format(recipe=str(recipe), out=str(out))))
    env = {k: v for k, v in os.environ.items()}
    env["PYTHONPATH"] = str(Path(explorl.__file__).resolve().parents[1])
    res = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "SUMMARY 3" in res.stdout and res.stdout.count("SUMMARY") == 1  # trained once
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if r["step"] >= 1]
    assert [r["step"] for r in trained] == [1, 2, 3]
    assert all(r["reward/verify_errors"] == 0 for r in trained)
    saved = C.load_yaml((out / "config.yaml").read_text())
    names = [f["name"] for f in saved["reward"]["functions"]]
    assert names[0] == "math" and names[1].endswith("train_script.py:short_answer")


def test_overrides_and_recipe_forms(make_config, tmp_path):
    cfg = make_config()
    with pytest.raises(C.ConfigError, match="algorithm.eps_hihg"):
        explorl.train(C.to_dict(cfg), out=tmp_path / "x", overrides={"algorithm.eps_hihg": 0.3})
    with pytest.raises(C.ConfigError, match="reward_weights"):
        explorl.train(cfg, out=tmp_path / "x", reward_funcs=["addition"], reward_weights=[1.0, 2.0])
    summary = explorl.train(cfg, out=tmp_path / "run", overrides={"max_steps": 1, "eval.every": 0})
    assert summary["steps"] == 1
    with pytest.raises(explorl.ConfigError.__mro__[1], match="already holds a run"):
        explorl.train(cfg, out=tmp_path / "run")


def test_train_frees_the_trainer_when_it_returns(make_config, tmp_path, monkeypatch):
    """Nothing of a finished run stays alive: its model, optimizer state and the sampler's static
    buffers are freed before ``explorl.train`` returns (on a GPU a sweep in one process would
    otherwise keep each run's device memory until the cycle collector happened to run)."""
    import gc
    import weakref

    from explorl.training import loop

    made = []
    real_init = loop.Trainer.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        made.append((weakref.ref(self), weakref.ref(self.policy)))

    monkeypatch.setattr(loop.Trainer, "__init__", init)
    gc.disable()  # a collection the test did not ask for would hide a missing one
    try:
        summary = explorl.train(make_config(), out=tmp_path / "run",
                                overrides={"max_steps": 1, "eval.every": 0,
                                           "rollout.hf.static": True})
        alive = [ref() is not None for pair in made for ref in pair]
    finally:
        gc.enable()
    assert summary["steps"] == 1 and len(made) == 1
    assert alive == [False, False]
