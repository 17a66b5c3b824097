"""SmolLM2-135M-Instruct, the real model (``explorl models get smollm2-135m``): two steps at a
tiny shape through its chat template, and an interrupted run resumed to the same weights and
metrics. Marked ``real``: only ``make test-real`` (``pytest -m real``) runs it, once the
model is in the model cache."""

from __future__ import annotations

import json

import pytest
import torch

from explorl import model_store, validation
from explorl.outputs.runlog import read_metrics
from explorl.training.loop import TIME_KEYS, Trainer

NAME = "smollm2-135m"
pytestmark = [
    pytest.mark.real,
    pytest.mark.skipif(model_store.fetched(NAME) is None,
                       reason=f"{NAME} is not fetched: explorl models get {NAME}"),
]


def _config(tmp_path, max_steps: int = 2):
    rows = [{"prompt": f"What is {a} + {b}? Give the final answer as \\boxed{{number}}.",
             "answer": str(a + b)} for a, b in [(12, 7), (3, 30), (25, 17), (8, 9)]]
    data = tmp_path / "add.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return validation.from_dict({
        "name": "real-tiny", "max_steps": max_steps, "seed": 0,
        "model": {"path": NAME, "cpu_threads": 1},
        "data": {"train": [str(data)], "prompts_per_step": 2},
        "rollout": {"n_samples": 2, "max_response_len": 8},
        # Eight tokens rarely reach a \boxed{} answer: a reward that differs between samples
        # gives the two steps a gradient, so the resume is checked on a real update.
        "reward": {"verifier": "gguf_helpers:varied", "num_workers": 1},
        "optim": {"lr": 1e-5},
        "eval": {"every": 0, "before_training": False},
        "log": {"progress": False, "plots": False}})


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _strip(rows):
    return [{k: v for k, v in r.items() if not k.startswith(TIME_KEYS)} for r in rows]


def _stop_after_one_step(t: Trainer) -> None:
    """Make ``t`` behave as if Ctrl-C arrived during its first step."""
    step = t.train_step

    def step_then_stop():
        out = step()
        t._stop = True  # what the SIGINT handler does
        return out

    t.train_step = step_then_stop


def test_two_steps_then_an_interrupted_run_resumes_exactly(tmp_path):
    cfg = _config(tmp_path)
    a = Trainer(cfg, tmp_path / "a")
    assert a.base_path == model_store.fetched(NAME)
    assert a.vocab_size == 49152 and a.tokenizer.eos_token == "<|im_end|>"
    prompt = a.tokenizer.decode(a.prompts.ids_of(a.train_data, "train")(0))
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    a.train()
    reference, wa = read_metrics(tmp_path / "a"), _weights(a.policy)
    assert [r["step"] for r in reference] == [1, 2]
    assert all(r["adv/zero_frac"] < 1 and r["grad/norm"] > 0 for r in reference)
    del a

    b = Trainer(cfg, tmp_path / "b")
    _stop_after_one_step(b)
    assert b.train()["interrupted"] and b.step == 1
    del b
    c = Trainer(cfg, tmp_path / "b", resume=True)
    assert c.step == 1
    c.train()
    assert _strip(read_metrics(tmp_path / "b")) == _strip(reference)
    wc = _weights(c.policy)
    assert all(torch.equal(wa[k], wc[k]) for k in wa)


def test_real_tools_recipe_calls_the_calculator(tmp_path):
    """real/tools at a small shape: SmolLM2 calls the calculator in the lab tool format from the
    prompt's worked example (~36% of replies), so 16 replies hold calls and their results."""
    from explorl import config as C
    from explorl.config import builtin

    d = C.to_dict(validation.load(builtin.resolve("real/tools"), env=False))
    d.update(max_steps=1)
    d["model"]["cpu_threads"] = 1
    d["lab"].update(n_train=16, n_val=4, n_test=4)
    d["data"]["prompts_per_step"] = 2
    d["reward"]["num_workers"] = 1
    d["eval"].update(every=0, before_training=False)
    d["log"].update(progress=False, plots=False, checkpoint_every=0)
    Trainer(validation.from_dict(d), tmp_path / "run").train()
    (row,) = read_metrics(tmp_path / "run")
    assert row["tools/calls_mean"] > 0 and row["tokens/tool_mean"] > 0
    assert row["tools/errors"] < row["tools/calls_mean"] * 16
