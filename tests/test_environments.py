"""Environments (``rollout.environment``): the config checks, state in the worker pool (a failed
call leaves it as it was), one instance per response and per ARPO branch, observations in the
prompt, environments in reward functions, and the docs' example trained end to end."""

from __future__ import annotations

import os
import pickle
import re

import pytest
import torch
from test_tools import TINY_MULTIPLY, USER_TOOLS, _lab, _tools_recipe

from explorl import config as C
from explorl import validation
from explorl.models import Prompt
from explorl.outputs.runlog import read_metrics
from explorl.records import PromptRecord
from explorl.rewards.functions import as_scorer
from explorl.rollout.arpo import ARPOBranching
from explorl.rollout.hf import left_pad
from explorl.rollout.multiturn import ToolEngine
from explorl.rollout.types import Rollouts
from explorl.tools.environments import EnvRunner, EnvSpec, EnvState, methods_of
from explorl.tools.formats import LabFormat

HERE = os.path.dirname(os.path.abspath(__file__))
USER_ENVS = os.path.join(HERE, "user_envs.py")
DOCS = os.path.join(HERE, "..", "docs", "tools.md")


@pytest.fixture(scope="module")
def multiply_model():
    from explorl.lab import lab_model_path

    return lab_model_path("multiply", size="tiny", **TINY_MULTIPLY)


def _runner(cls: str = "Counter", timeout_s: float = 5.0) -> EnvRunner:
    return EnvRunner(EnvSpec(f"{USER_ENVS}:{cls}", max_chars=100), num_workers=1,
                     timeout_s=timeout_s, step_timeout_s=120.0)


def _n(blob: bytes) -> int:  # the trainer never imports the class: load it as rewards do
    return EnvState(f"{USER_ENVS}:Counter", blob).load().n


# ----------------------------------------------------------------------------- the runner


def test_calls_change_the_state_and_a_failed_call_leaves_it_as_it_was():
    runner = _runner(timeout_s=2.0)
    try:
        (obs, blob), = runner.reset([PromptRecord("1*2=", "2", "src", extra={"k": "v"})])
        assert obs is None and _n(blob) == 0
        row = EnvState(f"{USER_ENVS}:Counter", blob).load().row
        assert row == {"prompt": "1*2=", "ground_truth": "2", "answer": "2", "solution": "2",
                       "k": "v", "data_source": "src"}
        out = runner.run([("tally", {"x": "a"})], [blob])
        assert out[0].text == "1" and _n(out[0].state) == 1
        blob = out[0].state
        bad = runner.run([("tally", {"x": "crash"}), ("tally", {"x": "hang"}),
                          ("tally", {"x": "boom"}), ("nope", {"x": ""})], [blob] * 4)
        assert [a.state for a in bad] == [None] * 4  # the engine keeps the bytes it had
        assert "died" in bad[0].error and "timed out" in bad[1].error
        assert "no luck" in bad[2].error and "unknown tool 'nope'" in bad[3].error
        assert runner.run([("tally", {"x": "a"})], [blob])[0].text == "2"  # not 102
    finally:
        runner.close()


def test_a_reset_that_fails_stops_the_run():
    runner = _runner("BadReset")
    try:
        with pytest.raises(RuntimeError, match="failed to reset for 1 of 1 responses, e.g. Key"):
            runner.reset([PromptRecord("1*2=", "2")])
    finally:
        runner.close()


def test_methods_are_the_public_functions_but_reset_and_get_reward():
    from user_envs import Counter, NoTools, Rewarded

    assert methods_of(Counter) == ["tally"] == methods_of(Rewarded)
    assert methods_of(NoTools) == []
    assert [t["function"]["name"] for t in [__import__("explorl").tools.schema(f) for f in
                                             EnvSpec(f"{USER_ENVS}:Counter").load().values()]
            ] == ["tally"]


def test_reward_functions_receive_the_environments_as_trl_passes_them():
    from user_envs import Counter, calls_made

    env = Counter()
    env.reset()
    env.n = 3
    state = EnvState(f"{USER_ENVS}:Counter", pickle.dumps(env))
    score = as_scorer(calls_made)
    assert score("r", "gt", ("p", "src", {}, state)) == 3.0


# ----------------------------------------------------------------------------- the engine


class _Script:
    """An engine whose turn k (counted by the calls in its context) writes ``script[k - 1]``;
    log-probs 0, entropy 1."""

    def __init__(self, tok, script: list[str]):
        self.tokenizer, self.script = tok, script
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.close = tok.convert_tokens_to_ids("]")
        self.contexts: list[list[int]] = []

    def generate(self, model, prompt_ids, n_samples, temperature, max_new_tokens,
                 generator=None, seeds=None) -> Rollouts:
        outs, rows = [], []
        for i, (p, n) in enumerate(zip(prompt_ids, n_samples)):
            text = self.script[min(list(p).count(self.close), len(self.script) - 1)]
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            ids = (ids if text.endswith("]") else ids + [self.tokenizer.eos_token_id])
            outs += [ids[:max_new_tokens]] * n
            rows += [i] * n
            self.contexts += [list(p)] * n
        pids, pmask = left_pad([prompt_ids[i] for i in rows], self.pad_id, torch.device("cpu"))
        R = max(len(o) for o in outs)
        ids = torch.full((len(outs), R), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(outs), R), dtype=torch.bool)
        for k, o in enumerate(outs):
            ids[k, : len(o)], mask[k, : len(o)] = torch.as_tensor(o), True
        return Rollouts(prompt_ids=pids, prompt_mask=pmask, response_ids=ids,
                        response_mask=mask, old_logp=torch.zeros(ids.shape),
                        entropy=mask.float(), prompt_index=torch.as_tensor(rows),
                        texts=self.tokenizer.batch_decode(outs), temperature=temperature)


def _prompts(tok, problems=(("34*7=", "238"), ("12*3=", "36"))) -> list[Prompt]:
    def render(p):
        return tok(p, add_special_tokens=False)["input_ids"]
    return [Prompt(render(p), PromptRecord(p, gt), render) for p, gt in problems]


def _results(tok, ro: Rollouts, r: int) -> list[str]:
    """The tool results of row r, in order."""
    ids = ro.response_ids[r][ro.tool_mask[r]].tolist()
    return re.findall(r"\{[^}]*\}", tok.decode(ids))


def test_each_response_has_its_own_instance_and_a_failed_call_keeps_its_state(multiply_model):
    """Every response counts its own calls: {1}, a call that raises after changing the count
    ({?}), then {2}; eight responses to two prompts, none sees another's count."""
    tok, model = _lab(multiply_model)
    runner = _runner()
    try:
        engine = ToolEngine(_Script(tok, ["[1]", "[99]", "[1]", "5"]),
                            LabFormat(tok, "tally", "x"), runner, 4, eos_ids=[tok.eos_token_id])
        ro = engine.generate(model, _prompts(tok), [4, 4], 1.0, 40, seeds=[1, 2])
    finally:
        runner.close()
    assert len(ro) == 8 and ro.environments is not None
    for r in range(8):
        assert _results(tok, ro, r) == ["{1}", "{?}", "{2}"]
        assert _n(ro.environments[r].blob) == 2 and ro.environments[r].load().n == 2
    assert ro.tool_errors.tolist() == [1] * 8


def test_arpo_branches_copy_the_state_at_the_branch_point(multiply_model):
    """β = 1: the one turn-1 response branches after its first result ({1}); each branch then
    counts on its own copy ({2}, {3}), as does its source (shared state would give 2..7)."""
    tok, model = _lab(multiply_model)
    runner = _runner()
    try:
        engine = ToolEngine(_Script(tok, ["[1]", "[1]", "[1]", "5"]),
                            LabFormat(tok, "tally", "x"), runner, 4, eos_ids=[tok.eos_token_id])
        branching = ARPOBranching(1, 3, 1.0, 0.0, vocab_size=model.config.vocab_size)
        ro = engine.generate(model, _prompts(tok)[:1], [3], 1.0, 40, seeds=[1],
                             branching=branching)
    finally:
        runner.close()
    rows = engine.last_rows
    assert len(ro) == 3 and sum(r.branch_of >= 0 for r in rows) == 2
    assert all(r.shared == len(rows[0].ids[: r.shared]) for r in rows)
    for r in range(3):
        assert _results(tok, ro, r) == ["{1}", "{2}", "{3}"]
        assert ro.environments[r].load().n == 3


def test_an_observation_extends_each_responses_prompt(multiply_model):
    """reset's text is appended to the prompt; turn 1 then samples each response from its own
    prompt, and the record holds that prompt."""
    tok, model = _lab(multiply_model)
    runner = _runner("Hint")
    inner = _Script(tok, ["7"])
    try:
        engine = ToolEngine(inner, LabFormat(tok, "tally", "x"), runner, 2,
                            eos_ids=[tok.eos_token_id])
        ro = engine.generate(model, _prompts(tok), [2, 1], 1.0, 8, seeds=[1, 2])
    finally:
        runner.close()
    shown = [tok.decode(ro.prompt_ids[r][ro.prompt_mask[r]]) for r in range(3)]
    assert shown == ["34*7=8", "34*7=8", "12*3=6"]
    assert [tok.decode(c) for c in inner.contexts] == shown  # one context per response


# ----------------------------------------------------------------------------- config


def _cfg(model_dir, reward=None, **rollout):
    return {"model": {"path": str(model_dir)}, "data": {"train": ["lab:multiply"]},
            "lab": {"n_train": 64, "n_val": 16, "n_test": 16}, "rollout": rollout,
            **({"reward": reward} if reward else {})}


@pytest.mark.parametrize("rollout, reward, key, message", [
    ({"environment": f"{USER_ENVS}:Countr"}, None, "rollout.environment",
     "did you mean '.*user_envs.py:Counter'"),
    ({"environment": f"{USER_ENVS}:not_a_class"}, None, "rollout.environment", "not a class"),
    ({"environment": f"{USER_ENVS}:NoReset"}, None, "rollout.environment", "no reset method"),
    ({"environment": f"{USER_ENVS}:NoTools"}, None, "rollout.environment", "no tool methods"),
    ({"environment": f"{USER_ENVS}:Untyped"}, None, "rollout.environment", "no type hint"),
    ({"environment": f"{USER_ENVS}:NeedsArgs"}, None, "rollout.environment",
     "must take no arguments"),
    ({"environment": f"{USER_ENVS}:Rewarded"}, None, "rollout.environment",
     "defines get_reward, and no reward function reads it"),
    ({"environment": f"{USER_ENVS}:Counter",
      "tools": ["explorl.tools.calculator:calculator"]}, None, "rollout.environment",
     "calls one tool, and the run has 2: tally and rollout.tools"),
    ({"environment": "Counter"}, None, "rollout.environment", "not an environment reference"),
    ({"environment": f"{USER_ENVS}:Counter", "engine": "vllm"}, None, "rollout.environment",
     "rollout.engine: hf"),
    ({}, {"functions": [{"name": "explorl.tools.environments:get_reward"}]},
     r"reward.functions\[0\].name", "rollout.environment is null"),
])
def test_config_errors_name_the_key(multiply_model, rollout, reward, key, message):
    with pytest.raises(C.ConfigError) as e:
        validation.from_dict(_cfg(multiply_model, reward, **rollout))
    line = str(e.value)
    assert "\n" not in line and re.match(key, line) and re.search(message, line), line


def test_max_turns_is_read_with_an_environment(multiply_model):
    cfg = validation.from_dict(_cfg(multiply_model, environment=f"{USER_ENVS}:Counter",
                                    max_turns=3))
    assert cfg.rollout.environment.endswith("user_envs.py:Counter")


# ----------------------------------------------------------------------------- the docs example


def _docs_example(tmp_path) -> str:
    """The environment of docs/tools.md's "Environments" section, written to a file."""
    text = open(DOCS).read()
    code = re.search(r"```python\n(from explorl.tools.calculator .*?class Register.*?)```",
                     text, re.S).group(1)
    path = tmp_path / "register.py"
    path.write_text(code)
    return f"{path}:Register"


def test_docs_example_trains_with_its_environment(multiply_model, tmp_path):
    """The docs' Register on the lab multiply model: 2 steps with the environment's reward
    beside the task's checker, every response's environment read without an error."""
    from explorl.training.loop import Trainer

    env = _docs_example(tmp_path)
    cfg = _tools_recipe(multiply_model, max_steps=2,
                        rollout={"tools": [], "environment": env, "max_turns": 3},
                        reward={"functions": [
                            {"name": "lab:multiply"},
                            {"name": "explorl.tools.environments:get_reward", "weight": 0.5},
                            # the tiny model rarely multiplies right: mixed rewards from the start
                            {"name": f"{USER_TOOLS}:called_tool"}]})
    t = Trainer(cfg, tmp_path / "run")
    before = {k: v.clone() for k, v in t.policy.named_parameters()}
    t.train()
    rows = read_metrics(tmp_path / "run")
    assert any(r.get("tools/calls_mean", 0) > 0 for r in rows)
    steps = [r for r in rows if "reward/verify_errors" in r]
    assert len(steps) == 2 and all(r["reward/verify_errors"] == 0 for r in steps)
    assert any(not torch.equal(before[k], v) for k, v in t.policy.named_parameters())


def test_get_reward_reads_the_docs_example_state(tmp_path):
    from explorl.refs import load_ref
    from explorl.tools.environments import get_reward

    ref = _docs_example(tmp_path)
    env = load_ref(ref)()
    env.reset(ground_truth="10063")
    assert env.add("347*29") == "10063" and env.add("1") == "10064"
    score = as_scorer(get_reward)
    ctx = ("347*29=", "lab/multiply", {}, EnvState(ref, pickle.dumps(env)))
    assert score("[347*29]{10063}[1]{10064}10064", "10063", ctx) == 0.0  # total ≠ target
    env.total = 10063
    assert score("", "10063", (*ctx[:3], EnvState(ref, pickle.dumps(env)))) == 1.0
