"""Tools and multi-turn rollouts: the user's side, the sandbox, token in/token out, the masks,
the metrics, the config checks, and the lab tool recipe (trains, resumes exactly)."""

from __future__ import annotations

import os
import time

import pytest
import torch

from explorl import config as C
from explorl import validation
from explorl.config import builtin
from explorl.outputs.runlog import read_metrics
from explorl.policy.forward import response_logprobs
from explorl.rollout.hf import HFEngine
from explorl.rollout.multiturn import ToolEngine
from explorl.tools import ToolCallError, ToolRunner, ToolSpec, call, schema
from explorl.tools.calculator import calculator
from explorl.tools.formats import LabFormat, make_format
from explorl.training.batch import StepRows
from explorl.training.metrics import tool_metrics

HERE = os.path.abspath(__file__)
USER_TOOLS = os.path.join(os.path.dirname(HERE), "user_tools.py")  # light: workers import it
CALC = "explorl.tools.calculator:calculator"
TINY_PARAMS = {"a_digits": 2, "b_digits": 1, "tool_frac": 0.5}  # some rewards from the start
TINY_MULTIPLY = {"n_train": 64, "n_val": 16, "n_test": 16, "max_steps": 100, "check_every": 1000,
                 **TINY_PARAMS}


def test_schema_is_read_from_type_hints_and_docstring():
    assert schema(calculator) == {"type": "function", "function": {
        "name": "calculator",
        "description": "Evaluate an integer arithmetic expression with + - * / (integer "
                       "division) and brackets.",
        "parameters": {"type": "object", "required": ["expression"], "properties": {
            "expression": {"type": "string", "description": 'The expression, e.g. "347*29".'}}}}}


def test_call_runs_a_tool_and_names_the_closest_one():
    tools = {"calculator": calculator}
    assert call(tools, "calculator", {"expression": "347*29"}) == "10063"
    assert call(tools, "calculator", '{"expression": "(2+3)*4/3"}') == "6"
    with pytest.raises(ToolCallError, match="did you mean 'calculator'"):
        call(tools, "calculater", {"expression": "1"})
    with pytest.raises(ToolCallError, match="missing a required argument"):
        call(tools, "calculator", {"expr": "1"})
    with pytest.raises(ValueError):
        calculator("__import__('os')")


def test_failing_tools_become_counted_error_messages_not_a_stalled_run():
    refs = tuple(f"{USER_TOOLS}:{f}" for f in ("crash", "hang", "huge", "boom"))
    # Each call's own 1 s limit; the turn's budget (step_timeout_s) is wide: a loaded machine
    # restarts workers slowly, and the budget is not what this test checks.
    runner = ToolRunner(ToolSpec(refs + (CALC,), max_chars=100), num_workers=1, timeout_s=1.0,
                        step_timeout_s=120.0)
    try:
        t0 = time.monotonic()
        out = runner.run([("calculator", {"expression": "6*7"}), ("crash", {"x": ""}),
                          ("hang", {"x": ""}), ("huge", {"x": ""}), ("boom", {"x": ""}),
                          ("nope", {"x": ""}), ("calculator", {"expression": "2+2"})])
        assert time.monotonic() - t0 < 60
    finally:
        runner.close()
    assert [a.text for a in out][::6] == ["42", "4"]
    assert out[0].error is None and out[6].error is None
    assert "died" in out[1].error
    assert "timed out" in out[2].error
    assert "too long" in out[3].error and "tool_result_max_chars=100" in out[3].error
    assert "no luck" in out[4].error
    assert "unknown tool 'nope'" in out[5].error


# ----------------------------------------------------------------------------- multi-turn


@pytest.fixture(scope="module")
def multiply_model():
    from explorl.lab import lab_model_path

    return lab_model_path("multiply", size="tiny", **TINY_MULTIPLY)


def _lab(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)


class _Scripted:
    """A runner that answers every call with the product (no pool), recording the calls."""

    def __init__(self):
        self.calls = []

    def run(self, calls):
        from explorl.tools.runner import ToolAnswer

        self.calls += calls
        return [ToolAnswer("77") for _ in calls]


class _Recording:
    """An engine wrapper that records what every call sampled."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def generate(self, model, prompt_ids, n, *args, **kw):
        ro = self.engine.generate(model, prompt_ids, n, *args, **kw)
        self.calls.append(([list(p) for p in prompt_ids], [
            ro.response_ids[i, : int(ro.response_mask[i].sum())].tolist() for i in range(len(ro))]))
        return ro


def _tool_engine(tok, runner, max_turns=3):
    fmt = LabFormat(tok, "calculator", "expression")
    inner = _Recording(HFEngine(tok, eos_ids=[tok.eos_token_id] + fmt.stop_ids, static=False))
    return ToolEngine(inner, fmt, runner, max_turns, eos_ids=[tok.eos_token_id]), inner


def test_model_tokens_across_turns_are_the_sampled_tokens(multiply_model):
    """Token in, token out: each turn's context is the prompt plus the record's tokens so far,
    the record's model tokens are exactly what each turn sampled, and their log-probs are the
    trainer's forward over the whole multi-turn sequence (tool results attended to)."""
    tok, model = _lab(multiply_model)
    engine, inner = _tool_engine(tok, _Scripted())
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in ("347*29=", "12*34=")]
    ro = engine.generate(model, prompts, [12, 12], 1.0, 24, seeds=[5, 6])
    assert int(ro.tool_calls.sum()) > 0 and int(ro.turns.max()) >= 2  # some rows took turns
    sampled = {i: [] for i in range(len(ro))}  # row -> its tokens, turn by turn, as sampled
    first_prompts, first = inner.calls[0]
    live = list(range(len(ro)))
    for k, toks in enumerate(first):
        sampled[k].append(toks)
    for ctx, outs in inner.calls[1:]:
        live = [r for r in live if int(ro.turns[r]) > len(sampled[r])]
        assert len(live) == len(ctx)
        for r, c, toks in zip(live, ctx, outs):
            row = ro.response_ids[r, : int(ro.token_mask[r].sum())].tolist()
            p = prompts[int(ro.prompt_index[r])]
            assert c[: len(p)] == p and row[: len(c) - len(p)] == c[len(p):]  # ids, not text
            sampled[r].append(toks)
    for r in range(len(ro)):
        own = ro.response_ids[r][ro.response_mask[r]].tolist()
        flat = [t for turn in sampled[r] for t in turn]
        assert own == flat[: len(own)]
        if len(own) < len(flat):  # only the response budget cuts what a turn sampled
            assert int(ro.token_mask[r].sum()) == 24 and ro.truncated[r]
        assert int(ro.turns[r]) == len(sampled[r])
    # the tool results: between turns, out of the policy's mask, log-prob and entropy 0
    assert not (ro.tool_mask & ro.response_mask).any()
    assert (ro.old_logp[ro.tool_mask] == 0).all() and (ro.entropy[ro.tool_mask] == 0).all()
    # "{77}" per answered call, "{?}" per call the format could not read, cut by the budget
    full = 4 * (ro.tool_calls - ro.tool_errors) + 3 * ro.tool_errors
    n_tool = ro.tool_mask.sum(-1)
    assert (n_tool <= full).all() and (n_tool[~ro.truncated] == full[~ro.truncated]).all()
    logp, ent = response_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.response_ids,
                                  ro.token_mask, 1.0)
    m = ro.response_mask
    assert torch.allclose(logp[m], ro.old_logp[m], atol=1e-5)
    assert torch.allclose(ent[m], ro.entropy[m], atol=1e-5)


def test_no_call_is_the_single_turn_engine(multiply_model):
    """With max_turns 1 a tool call's end stops the row and nothing else changes: the same
    draws as the plain engine up to that token."""
    tok, model = _lab(multiply_model)
    engine, _ = _tool_engine(tok, _Scripted(), max_turns=1)
    prompts = [tok("347*29=", add_special_tokens=False)["input_ids"]]
    ro = engine.generate(model, prompts, [6], 1.0, 24, seeds=[3])
    plain = HFEngine(tok, static=False).generate(model, prompts, [6], 1.0, 24, seeds=[3])
    for r in range(6):
        own = ro.response_ids[r][ro.response_mask[r]].tolist()
        assert plain.response_ids[r, : len(own)].tolist() == own
    assert int(ro.tool_calls.sum()) == 0 and (ro.turns == 1).all()


def test_a_context_that_fills_the_engine_ends_its_response(multiply_model):
    """An engine with a context limit (vllm's max_model_len, prompt included) is never asked to
    continue a context that reached it: such a response ends there, truncated."""
    tok, model = _lab(multiply_model)
    engine, inner = _tool_engine(tok, _Scripted(), max_turns=3)
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in ("347*29=", "12*34=")]
    free = engine.generate(model, prompts, [12, 12], 1.0, 24, seeds=[5, 6])
    longest = int((free.prompt_mask.sum(-1) + free.token_mask.sum(-1)).max())
    inner.calls.clear()
    inner.max_len = limit = longest - 4
    ro = engine.generate(model, prompts, [12, 12], 1.0, 24, seeds=[5, 6])
    assert all(len(c) < limit for ctx, _ in inner.calls[1:] for c in ctx)
    total = ro.prompt_mask.sum(-1) + ro.token_mask.sum(-1)
    ended = (total >= limit) & (ro.turns < free.turns)
    assert ended.any() and ro.truncated[ended].all()


def test_tool_metrics_by_hand():
    rows = StepRows(group=torch.tensor([0, 0, 1]), reward=torch.zeros(3, dtype=torch.float64),
                    score=torch.zeros(3, dtype=torch.float64), length=torch.tensor([5, 3, 4]),
                    prompt_length=torch.tensor([2, 2, 2]),
                    entropy_sum=torch.zeros(3, dtype=torch.float64),
                    logp_sum=torch.zeros(3, dtype=torch.float64),
                    truncated=torch.zeros(3, dtype=torch.bool), stage=torch.zeros(3).long(),
                    own=torch.ones(3, dtype=torch.bool), rank=torch.zeros(3).long(),
                    turns=torch.tensor([1, 3, 2]), tool_calls=torch.tensor([0, 2, 1]),
                    tool_errors=torch.tensor([0, 1, 1]), tool_tokens=torch.tensor([0, 8, 3]))
    assert tool_metrics(rows) == {"tools/calls_mean": 1.0, "tools/call_frac": 2 / 3,
                                  "tools/errors": 2.0, "tools/turns": 2.0,
                                  "tokens/model_mean": 4.0, "tokens/tool_mean": 11 / 3}
    rows.turns = None
    assert tool_metrics(rows) == {}


def test_lab_format_reads_calls_and_shows_errors(multiply_model):
    tok, _ = _lab(multiply_model)
    fmt = make_format("auto", tok, {"calculator": calculator})
    assert fmt.name == "lab" and fmt.stop_ids == tok.convert_tokens_to_ids(["]"])
    assert fmt.parse("12[3*4]") == ("calculator", {"expression": "3*4"})
    with pytest.raises(ToolCallError):
        fmt.parse("3*4]")
    assert tok.decode(fmt.result_ids("12", None)[0]) == "{12}"
    assert fmt.result_ids("x", None)[1] and tok.decode(fmt.result_ids("x", None)[0]) == "{?}"


# ----------------------------------------------------------------------------- config


def _cfg(model_dir, **rollout):
    return {"model": {"path": str(model_dir)}, "data": {"train": ["lab:multiply"]},
            "lab": {"n_train": 64, "n_val": 16, "n_test": 16}, "rollout": rollout}


@pytest.mark.parametrize("rollout, key, message", [
    ({"max_turns": 3}, "rollout.max_turns", "rollout.tools is empty"),
    ({"tools": [CALC], "engine": "vllm", "async": {"enabled": True}}, "rollout.tools",
     "asynchronous rollout worker"),
    ({"tools": [CALC], "engine": "vllm", "vllm": {"recompute": False}, "arpo": {"enabled": True}},
     "rollout.vllm.recompute", "no ARPO"),
    ({"tools": ["explorl.tools.calculator:calculater"]}, "rollout.tools[0]",
     "did you mean 'explorl.tools.calculator:calculator'"),
    ({"tools": [f"{USER_TOOLS}:untyped"]}, "rollout.tools[0]", "no type hint"),
    ({"tools": [CALC, f"{USER_TOOLS}:boom"]}, "rollout.tools", "one tool"),
])
def test_config_errors_name_the_key(multiply_model, rollout, key, message):
    with pytest.raises(C.ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")) as e:
        validation.from_dict(_cfg(multiply_model, **rollout))
    assert pytest.importorskip("re").search(message, str(e.value))


def test_vllm_serves_tool_turns_with_and_without_arpo(multiply_model):
    """The vllm engine takes tool turns (tests/test_vllm_tools.py samples them), ARPO included;
    with recompute off only ARPO is refused (above): the trainer recomputes the entropy."""
    for extra in ({}, {"arpo": {"enabled": True}}, {"vllm": {"recompute": False}}):
        cfg = validation.from_dict(_cfg(multiply_model, tools=[CALC], engine="vllm", **extra))
        assert cfg.rollout.engine == "vllm" and cfg.rollout.tools == [CALC]


# ----------------------------------------------------------------------------- the recipe


def _tools_recipe(model_dir, recipe: str = "lab/tools", **top) -> C.RunConfig:
    d = C.to_dict(validation.load(builtin.resolve(recipe), env=False))
    d["model"]["path"] = str(model_dir)
    d["lab"].update(n_train=64, n_val=16, n_test=16, params=dict(TINY_PARAMS))
    d["data"]["prompts_per_step"] = 4
    d["rollout"]["n_samples"] = 4
    d["reward"]["num_workers"] = 1
    # The tiny model rarely multiplies right; a reward for an answered call gives mixed groups.
    d["reward"]["functions"] = [{"name": f"{USER_TOOLS}:called_tool"}]
    d["eval"].update(every=2, n_samples=2, k=[1, 2], max_problems=4)
    d["log"].update(progress=False, plots=False, checkpoint_every=0)
    for k, v in top.items():
        C._deep_update(d, {k: v}) if isinstance(v, dict) else d.__setitem__(k, v)
    return validation.from_dict(d)


def test_tools_recipe_trains_and_resumes_exactly(multiply_model, tmp_path):
    from explorl.training.loop import Trainer

    cfg = _tools_recipe(multiply_model, max_steps=3)
    a = Trainer(cfg, tmp_path / "a")
    before = {k: v.clone() for k, v in a.policy.named_parameters()}
    a.train()
    rows = read_metrics(tmp_path / "a")
    last = rows[-1]
    for k in ("tools/calls_mean", "tools/call_frac", "tools/errors", "tools/turns",
              "tokens/model_mean", "tokens/tool_mean"):
        assert k in last
    assert last["tokens/model_mean"] == last["response/length_mean"]
    assert any(r.get("tools/calls_mean", 0) > 0 for r in rows)
    for r in (r for r in rows if "tools/calls_mean" in r):  # each call run, in a response
        assert r["tools/calls_run"] == pytest.approx(r["tools/calls_mean"] * r["rollout/n_trained"])
    assert any(0 < r.get("reward/mean", 0) < 1 for r in rows)
    assert any(not torch.equal(before[k], v) for k, v in a.policy.named_parameters())

    b = Trainer(cfg, tmp_path / "b")
    real = b.train_step

    def step_then_stop():
        out = real()
        if b.step == 2:
            b._stop = True
        return out
    b.train_step = step_then_stop
    assert b.train()["interrupted"]
    b = Trainer(cfg, tmp_path / "b", resume=True)
    assert b.step == 2
    b.train()

    def strip(rs):
        return [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/"))} for r in rs]
    assert strip(read_metrics(tmp_path / "b")) == strip(rows)
    wa, wb = dict(a.policy.named_parameters()), dict(b.policy.named_parameters())
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_real_tools_recipe_trains_on_the_lab_tool_model(multiply_model, tmp_path):
    """real/tools with the lab's multiply model and task swapped in (as tests/test_recipes.py
    trains real/grpo on the lab's addition model): its tool settings run as written."""
    from explorl.training.loop import Trainer

    cfg = _tools_recipe(multiply_model, "real/tools", max_steps=2,
                        data={"train": ["lab:multiply"]})
    assert (cfg.rollout.tool_format, cfg.rollout.max_turns) == ("lab", 2)
    Trainer(cfg, tmp_path / "run").train()
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert "val/accuracy" in rows[-1] and "tools/call_frac" in rows[-1]
    assert any(r.get("tools/calls_mean", 0) > 0 for r in rows)


QWEN_LIKE = (
    "{% if tools %}<|im_start|>system\nTools: {{ tools | map(attribute='function.name') | "
    "join(',') }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n"
    "{{ m.content }}\n</tool_response><|im_end|>\n{% else %}<|im_start|>{{ m.role }}\n"
    "{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _chat_tokenizer():
    import string

    from explorl.lab.tokenizer import lab_tokenizer

    tok = lab_tokenizer(256, alphabet=string.printable[:-5] + "\n\u2063")
    tok.add_special_tokens({"additional_special_tokens": [
        "<tool_call>", "</tool_call>", "<|im_start|>", "<|im_end|>"]})
    tok.chat_template = QWEN_LIKE
    tok.init_kwargs.pop("explorl_alphabet")  # a chat model's tokenizer, not a lab model's
    return tok


def test_chat_format_reads_the_template_tool_role():
    from explorl.models import render_prompt
    from explorl.tools.formats import ChatFormat, prompt_schemas

    tok = _chat_tokenizer()
    fmt = make_format("auto", tok, {"calculator": calculator})
    assert isinstance(fmt, ChatFormat)
    assert fmt.stop_ids == tok.convert_tokens_to_ids(["</tool_call>"])
    text = 'Let me compute.<tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}' \
           "</tool_call>"
    assert fmt.parse(text) == ("calculator", {"expression": "2*3"})
    with pytest.raises(ToolCallError, match="not JSON"):
        fmt.parse("<tool_call>{oops</tool_call>")
    ids, failed = fmt.result_ids("6", None)
    assert not failed and tok.decode(ids) == (
        "<|im_end|>\n<|im_start|>user\n<tool_response>\n6\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n")
    ids, failed = fmt.result_ids("", "timed out after 5 s")
    assert failed and "Error: timed out after 5 s" in tok.decode(ids)
    rollout = C.RolloutConfig(tools=[CALC])
    schemas = prompt_schemas(rollout, tok)
    assert [s["function"]["name"] for s in schemas] == ["calculator"]
    prompt = tok.decode(render_prompt(tok, "2*3?", True, schemas))
    assert prompt.startswith("<|im_start|>system\nTools: calculator<|im_end|>")


def test_multiply_task_traces_and_checker():
    from explorl.lab import TASKS, make_splits

    check = TASKS["multiply"].check
    recs = make_splits("multiply", seed=0, n_train=200, n_val=10, n_test=10)["train"]
    traces = [r for r in recs if r.extra["solution"].startswith("[")]
    assert 0.15 < len(traces) / len(recs) < 0.45  # tool_frac 0.3
    for r in recs:
        a, b = map(int, r.prompt.rstrip("=").split("*"))
        assert r.ground_truth == str(a * b) and check(r.extra["solution"], r.ground_truth) == 1.0
    r = traces[0]
    a, b = r.prompt.rstrip("=").split("*")
    assert r.extra["solution"] == f"[{a}*{b}]{{{r.ground_truth}}}{r.ground_truth}"
    assert check(f"[{a}*{b}]{{{r.ground_truth}}}1", r.ground_truth) == 0.0  # the answer counts
    assert check(f"[{a}*{b}]{{?}}{r.ground_truth}", r.ground_truth) == 1.0


# ----------------------------------------------------------------------------- evaluation


def test_tool_summary_by_hand():
    from explorl.eval.evaluate import tool_summary

    # problem 0: calls 1, 1, 0 (right, right, wrong); problem 1: calls 2, 0 (right, wrong)
    got = tool_summary([[1, 1, 0], [2, 0]], [[True, True, False], [True, False]])
    assert got == {"calls_per_response": 4 / 5, "call_frac": 3 / 5, "calls_per_correct": 4 / 3,
                   "calls_per_correct_response": 4 / 3, "n_calls": 4, "n_responses": 5,
                   "n_correct": 3}
    none_right = tool_summary([[1, 0]], [[False, False]])
    assert none_right["calls_per_correct"] is None and none_right["call_frac"] == 0.5
    with pytest.raises(ValueError):
        tool_summary([[1, 0]], [[True]])


def test_eval_records_the_tool_calls_of_each_response(multiply_model, tmp_path):
    """``explorl eval`` with tools: problems.jsonl has each response's calls beside its score,
    eval.json's ``tools`` sums them; without tools neither appears."""
    import json

    from explorl.eval.run import run_eval

    sets = [f"lab.{k}={v}" for k, v in TINY_MULTIPLY.items() if k in ("n_train", "n_val", "n_test")]
    sets += [f"lab.params.{k}={v}" for k, v in TINY_PARAMS.items()] + ["data.train=[lab:multiply]"]
    tools = sets + [f"rollout.tools=[{CALC}]", "rollout.max_turns=2", "reward.num_workers=0"]
    got = run_eval(model=str(multiply_model), data=["lab:multiply"], out_dir=tmp_path / "t", n=4,
                   k_list=[1, 4], max_problems=6, overrides=tools, progress=False,
                   max_new_tokens=24)
    rows = [json.loads(x) for x in (tmp_path / "t" / "problems.jsonl").read_text().splitlines()]
    calls = [c for r in rows for c in r["tool_calls"]]
    scores = [s for r in rows for s in r["scores"]]
    assert all(len(r["tool_calls"]) == len(r["scores"]) == 4 for r in rows)
    for r in rows:  # a call answered shows its result, {…}, in the response
        assert all("{" in t for c, t in zip(r["tool_calls"], r["responses"]) if c > 0)
    right = [c for c, s in zip(calls, scores) if s > 0]
    assert got["tools"]["calls_per_response"] == sum(calls) / 24 > 0
    assert got["tools"]["call_frac"] == sum(c > 0 for c in calls) / 24
    assert got["tools"]["n_correct"] == len(right)
    assert json.loads((tmp_path / "t" / "eval.json").read_text())["tools"] == got["tools"]

    plain = run_eval(model=str(multiply_model), data=["lab:multiply"], out_dir=tmp_path / "p",
                     n=2, k_list=[1], max_problems=2, overrides=sets, progress=False,
                     max_new_tokens=24)
    assert "tools" not in plain
    row = json.loads((tmp_path / "p" / "problems.jsonl").read_text().splitlines()[0])
    assert "tool_calls" not in row
