"""ARPO's entropy-based adaptive rollout against docs/methods/arpo.md's worked example."""

from __future__ import annotations

import math

import pytest
import torch
from test_tools import TINY_MULTIPLY, USER_TOOLS, _lab, _Scripted, _tool_engine, _tools_recipe

from explorl import config as C
from explorl import validation
from explorl.algorithms import LOSSES, LossParams
from explorl.config import AlgorithmConfig
from explorl.control import Knobs
from explorl.outputs.runlog import read_metrics
from explorl.policy.forward import response_logprobs
from explorl.rollout.arpo import ARPOBranching, ARPOSampler, branch_probability, copies
from explorl.rollout.multiturn import _Row
from explorl.rollout.types import Rollouts


def test_branch_rule_worked_example():
    """docs/methods/arpo.md: β = 0.5, α = 0.2, |V| = e^2 (log|V| = 2)."""
    h_init, h_now = 3.0, 5.0  # Σ token entropy over the window, in nats
    dh = (h_now - h_init) / 2.0  # ΔH = 1.0
    assert branch_probability(dh, 0.5, 0.2) == pytest.approx(0.7)
    assert copies(0.65, dh, 0.5, 0.2)  # clip(0.65 − 0.2) = 0.45 ≤ 0.5
    assert not copies(0.75, dh, 0.5, 0.2)  # 0.55 > 0.5
    assert not copies(0.45, -1.0, 0.5, 0.2)  # entropy fell: 0.65 > 0.5
    assert branch_probability(-5.0, 0.5, 0.2) == 0.0 and branch_probability(5.0, 0.5, 0.2) == 1.0
    b = ARPOBranching(2, 3, 0.5, 0.2, vocab_size=round(math.e**2))
    row = _Row(0, 1, window=[3.0, 5.0])
    assert b.delta_h(row) == pytest.approx(2.0 / math.log(round(math.e**2)))


def test_slots_fresh_rows_and_budget():
    """N = 5, M = 2, k = 3, β = 1 (every draw copies): the first source fills k − 1 = 2 slots,
    the second the last one; a prompt with nothing going gets one new row per round."""
    b = ARPOBranching(2, 3, 1.0, 0.0, vocab_size=10)
    assert b.first([5, 3, 1]) == [2, 2, 1]
    rows = [_Row(0, 11, ids=[1, 2], window=[1.0, 1.0], calls=1),
            _Row(0, 12, ids=[3], window=[1.0, 2.0], calls=2),
            _Row(1, 13, ids=[4]), _Row(1, 14, ids=[5]), _Row(2, 15, ids=[6])]
    added = b.expand(rows, [0, 1], [5, 3, 1], seeds=[7, 8, 9], generator=None)
    assert added == [5, 6, 7, 8]
    assert [(r.prompt, r.branch_of, r.shared, r.ids) for r in rows[5:8]] == [
        (0, 0, 2, [1, 2]), (0, 0, 2, [1, 2]), (0, 1, 1, [3])]
    assert (rows[8].prompt, rows[8].ids, rows[8].branch_of) == (1, [], -1)  # prompt 1: a fresh row
    assert len({r.key for r in rows}) == len(rows)  # every row draws on its own
    # the copies carry their sources' calls (1, 1 and 2), which ran once
    assert [r.calls for r in rows[5:8]] == [1, 1, 2]
    # three draws (two for the first source, one for the second), every one copying; ΔH of the
    # draws 0, 0 and (2 − 1)/ln 10: mean 1/(3 ln 10), std over the draws √2/(3 ln 10)
    dh = 1 / math.log(10)
    assert b.pop() == pytest.approx({
        "arpo/branches": 3.0, "arpo/fresh": 1.0, "arpo/shared_calls": 4.0, "arpo/draws": 3.0,
        "arpo/branch_rate": 1.0, "arpo/copy_prob_mean": 1.0, "arpo/delta_h_mean": dh / 3,
        "arpo/delta_h_std": math.sqrt(2) * dh / 3, "arpo/delta_h_zero_frac": 2 / 3})
    assert b.pop()["arpo/draws"] == 0.0  # counted since the last pop
    never = ARPOBranching(2, 3, 0.0, 0.0, vocab_size=10)  # β = 0, α = 0: u ≤ 0 never holds
    rows = [_Row(0, 11, ids=[1], window=[1.0, 1.0])]
    assert never.expand(rows, [0], [4], seeds=[7], generator=None) == []


def test_arpo_sampler_fills_each_budget_with_branches_that_share_their_source(tmp_path):
    from explorl.lab import lab_model_path

    tok, model = _lab(lab_model_path("multiply", size="tiny", **TINY_MULTIPLY))
    engine, _ = _tool_engine(tok, _Scripted(), max_turns=3)
    parsed, parse = [], engine.fmt.parse
    engine.fmt.parse = lambda text: parsed.append(text) or parse(text)
    cfg = C.ARPOConfig(enabled=True, initial_rollouts=2, beam_size=3, branch_probability=1.0,
                       entropy_weight=0.0)
    sampler = ARPOSampler(engine, cfg, vocab_size=model.config.vocab_size)
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in ("34*7=", "12*3=")]
    ro, m = sampler.sample(model, 0, prompts, [6, 6], 1.0, 24, seeds=[1, 2])
    assert ro.prompt_index.tolist() == [0] * 6 + [1] * 6
    rows = engine.last_rows
    assert m["arpo/branches"] == sum(r.branch_of >= 0 for r in rows) > 0
    assert m["arpo/branches"] + m["arpo/fresh"] == 12 - 4
    # the calls the rows count, less those the branches share, are the calls answered: each
    # call's text is read once (``fmt.parse``), whether it then runs or is answered by an error
    assert m["arpo/shared_calls"] > 0
    assert int(ro.tool_calls.sum()) - m["arpo/shared_calls"] == len(parsed)
    for r in rows:
        if r.branch_of >= 0:  # the shared prefix ends right after a tool result
            assert r.tool[r.shared - 1]
    # token in, token out holds for every row, branches included
    logp, _ = response_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.response_ids,
                                ro.token_mask, 1.0)
    assert torch.allclose(logp[ro.response_mask], ro.old_logp[ro.response_mask], atol=1e-5)


def test_soft_attribution_a_shared_token_weighs_the_sum_of_its_rows_advantages():
    """Two rows share their first token (a branch): at ratio 1 the PPO loss's gradient on it,
    summed over the rows that hold it, is −(Â_1 + Â_2) / (tokens in the batch)."""
    logp = torch.tensor([[-1.0, -2.0], [-1.0, -0.5]], requires_grad=True)
    adv = torch.tensor([1.0, -0.5])
    mask = torch.ones(2, 2, dtype=torch.bool)
    knobs = Knobs(temperature=1.0, eps_high=0.2, entropy_coef=0.0, kl_coef=0.0, n_samples=2,
                  max_response_len=4)
    lcfg = LossParams.build(AlgorithmConfig(), knobs)
    per_tok, _ = LOSSES["ppo"](logp, logp.detach(), adv, mask, lcfg)
    (per_tok.sum() / mask.sum()).backward()
    assert float(logp.grad[:, 0].sum()) == pytest.approx(-(1.0 - 0.5) / 4)


@pytest.mark.parametrize("rollout, key, message", [
    ({"arpo": {"enabled": True}}, "rollout.arpo.enabled", "needs rollout.tools"),
    ({"arpo": {"beam_size": 3}}, "rollout.arpo.beam_size", "nothing reads it"),
])
def test_arpo_config_errors(rollout, key, message):
    with pytest.raises(C.ConfigError, match=key) as e:
        validation.from_dict({"rollout": rollout})
    assert message in str(e.value)


def test_arpo_refuses_eepo(tmp_path):
    from explorl.lab import lab_model_path

    path = lab_model_path("multiply", size="tiny", **TINY_MULTIPLY)
    with pytest.raises(C.ConfigError, match="rollout.arpo.enabled: cannot run with control.eepo"):
        _tools_recipe(path, rollout={"tools": [f"{USER_TOOLS}:boom"], "arpo": {"enabled": True}},
                      control={"eepo": {"enabled": True}})


def test_arpo_recipe_trains(tmp_path):
    from explorl.lab import lab_model_path
    from explorl.training.loop import Trainer

    path = lab_model_path("multiply", size="tiny", **TINY_MULTIPLY)
    cfg = _tools_recipe(path, recipe="lab/arpo", max_steps=2)
    Trainer(cfg, tmp_path / "run").train()
    last = read_metrics(tmp_path / "run")[-1]
    assert {"arpo/branches", "arpo/fresh", "arpo/branch_frac", "arpo/shared_calls",
            "tools/calls_mean"} <= set(last)
    assert 0 <= last["arpo/shared_calls"] <= last["tools/calls_mean"] * last["rollout/n_trained"]
    assert last["rollout/n_samples"] == 4 * 4  # every prompt got its budget


# ---------------------------------------------------------- ΔH after a tool result (scripted)

EOS, OPEN, CLOSE, X, RESULT = 0, 1, 2, 3, 9  # a scripted policy's token ids
CHARS = {EOS: "", OPEN: "[", CLOSE: "]", X: "x", RESULT: "r"}


class _Tok:
    def decode(self, ids, skip_special_tokens=False):
        return "".join(CHARS[i] for i in ids)

    def batch_decode(self, seqs, skip_special_tokens=False):
        return [self.decode(s) for s in seqs]


class _Fmt:
    stop_ids = [CLOSE]

    def parse(self, text):
        assert text.startswith("x") and text.endswith("[x]")  # the whole turn, look-ahead included
        return "calc", {}

    def result_ids(self, text, error):
        return [RESULT], False


class _Runner:
    def __init__(self):
        self.calls = 0

    def run(self, calls):
        from explorl.tools.runner import ToolAnswer

        self.calls += len(calls)
        return [ToolAnswer("r") for _ in calls]


class _ScriptedPolicy:
    """Turn 1 (no result in the context) is ``x x [ x ]`` with token entropy ``h_first``; a turn
    after a result is 5 ``x`` then EOS, with token entropy ``h_after(prompt)``. The tokens of a
    turn depend only on how many of them the context already holds, so a look-ahead and the
    call that goes on after it sample exactly the turn a single call would."""

    FIRST, AFTER = [X, X, OPEN, X, CLOSE], [X] * 5 + [EOS]
    pad_id, tokenizer = EOS, _Tok()

    def __init__(self, h_first, h_after):
        self.h_first, self.h_after, self.sampled = h_first, h_after, 0

    def generate(self, model, prompt_ids, n_samples, temperature, max_new_tokens,
                 generator=None, seeds=None):
        ctxs = [list(p) for p, n in zip(prompt_ids, n_samples) for _ in range(n)]
        outs, ents = [], []
        for ctx in ctxs:
            if RESULT in ctx:
                done = len(ctx) - 1 - ctx[::-1].index(RESULT)
                turn, h = self.AFTER[len(ctx) - 1 - done:], self.h_after(ctx[0])
            else:
                turn, h = self.FIRST[len(ctx) - 1:], self.h_first
            outs.append(turn[:max_new_tokens])
            ents.append([h] * len(outs[-1]))
        self.sampled += sum(map(len, outs))
        R = max(map(len, outs))
        ids = torch.tensor([o + [EOS] * (R - len(o)) for o in outs])
        mask = torch.tensor([[j < len(o) for j in range(R)] for o in outs])
        ent = torch.tensor([e + [0.0] * (R - len(e)) for e in ents])
        return Rollouts(prompt_ids=torch.tensor([c[:1] for c in ctxs]),
                        prompt_mask=torch.ones(len(ctxs), 1, dtype=torch.bool),
                        response_ids=ids, response_mask=mask, old_logp=torch.zeros_like(ent),
                        entropy=ent, prompt_index=torch.arange(len(ctxs)),
                        texts=[""] * len(ctxs))


def _scripted_sample(entropy_at, h_first, h_after, prompts, window=2, beta=0.5, alpha=0.2):
    from explorl.rollout.multiturn import ToolEngine

    policy, runner = _ScriptedPolicy(h_first, h_after), _Runner()
    engine = ToolEngine(policy, _Fmt(), runner, max_turns=3, eos_ids=[EOS])
    cfg = C.ARPOConfig(enabled=True, initial_rollouts=1, beam_size=2, branch_probability=beta,
                       entropy_weight=alpha, entropy_window=window, entropy_at=entropy_at)
    sampler = ARPOSampler(engine, cfg, vocab_size=7)
    ids = [[100 + p] for p in range(prompts)]  # a prompt is one token: its number
    ro, m = sampler.sample(None, 0, ids, [2] * prompts, 1.0, 32, seeds=list(range(prompts)))
    return engine, policy, runner, ro, m


def test_after_result_hand_worked_example():
    """docs/methods/arpo.md: w = 2, first-turn token entropies 0.5 (H_init·log|V| = 1.0), after
    the result 2.0 (H·log|V| = 4.0), |V| = 7: ΔH = 3/ln 7 = 1.542 at the response's first call,
    P(copy) = 0.5 + 0.2·1.542 = 0.808. With ``call_turn`` the same policy gives ΔH = 0, P = 0.5."""
    dh = 3.0 / math.log(7)
    _, _, _, _, m = _scripted_sample("after_result", 0.5, lambda p: 2.0, prompts=4)
    assert m["arpo/draws"] == 4.0  # one draw per prompt (N = 2, M = 1, k = 2)
    assert m["arpo/delta_h_mean"] == pytest.approx(dh)
    assert m["arpo/delta_h_std"] == pytest.approx(0.0, abs=1e-12)
    assert m["arpo/delta_h_zero_frac"] == 0.0
    assert m["arpo/copy_prob_mean"] == pytest.approx(0.5 + 0.2 * dh)
    _, _, _, _, m = _scripted_sample("call_turn", 0.5, lambda p: 2.0, prompts=4)
    assert m["arpo/delta_h_mean"] == 0.0 and m["arpo/delta_h_zero_frac"] == 1.0
    assert m["arpo/copy_prob_mean"] == pytest.approx(0.5)


def test_after_result_copy_rate_follows_the_entropy_after_the_result():
    """Even prompts: entropy 2.0 after the result (P = clip(0.5 + 0.2·(4.0 − 0.2)/ln 7) = 0.891);
    odd: 0.0 (P = 0.5 + 0.2·(0 − 0.2)/ln 7 = 0.479). Over 400 draws each the copy rates land
    near those; ``call_turn`` copies either kind at β = 0.5, ΔH being 0 at a first call."""
    hi, lo = 0.5 + 0.2 * 3.8 / math.log(7), 0.5 - 0.2 * 0.2 / math.log(7)

    def rates(entropy_at):
        engine, _, _, _, m = _scripted_sample(entropy_at, 0.1, lambda p: 2.0 * (p % 2 == 0),
                                              prompts=800)
        copied = {r.prompt for r in engine.last_rows if r.branch_of >= 0}
        even = sum(p in copied for p in range(0, 800, 2)) / 400
        odd = sum(p in copied for p in range(1, 800, 2)) / 400
        return even, odd, m

    even, odd, m = rates("after_result")
    assert even == pytest.approx(hi, abs=0.05) and odd == pytest.approx(lo, abs=0.07)
    assert m["arpo/branch_rate"] == pytest.approx((even + odd) / 2)
    assert m["arpo/copy_prob_mean"] == pytest.approx((hi + lo) / 2)
    even, odd, m = rates("call_turn")
    assert even == pytest.approx(0.5, abs=0.07) and odd == pytest.approx(0.5, abs=0.07)
    assert m["arpo/delta_h_zero_frac"] == 1.0


def test_the_look_ahead_tokens_are_the_responses_own_and_copies_start_before_them():
    """Nothing sampled is thrown away: the look-ahead's w tokens are the first of the source's
    next turn, the call after it samples the rest, and a copy starts right after the result
    with its own whole turn. Every sampled token is in the record; every call runs once."""
    engine, policy, runner, ro, m = _scripted_sample("after_result", 0.5, lambda p: 2.0,
                                                     prompts=6, beta=1.0, alpha=0.0)
    first, after = _ScriptedPolicy.FIRST, _ScriptedPolicy.AFTER
    assert m["arpo/branches"] == 6.0  # β = 1: every source copied once
    for r in engine.last_rows:
        assert r.ids == first + [RESULT] + after and r.turns == 2 and r.calls == 1
        assert r.window == pytest.approx([1.0, 4.0])  # each turn's first w = 2 entropies
        if r.branch_of >= 0:
            assert r.shared == len(first) + 1  # up to and with the result
    assert policy.sampled == int(ro.response_mask.sum()) - int(m["arpo/branches"]) * len(first)
    assert runner.calls == m["tools/calls_run"] == 6  # the copies' calls ran once
    assert int(ro.tool_calls.sum()) - m["arpo/shared_calls"] == m["tools/calls_run"]


def test_h_init_is_each_responses_own_in_each_batch():
    """The same branching object over two batches: each batch's ΔH is against its own responses'
    first turns (0.5 then 1.0 per token here), never a row number's earlier value."""
    from explorl.rollout.multiturn import ToolEngine

    policy = _ScriptedPolicy(0.5, lambda p: 2.0)
    engine = ToolEngine(policy, _Fmt(), _Runner(), max_turns=3, eos_ids=[EOS])
    cfg = C.ARPOConfig(enabled=True, initial_rollouts=1, beam_size=2, entropy_window=2)
    sampler = ARPOSampler(engine, cfg, vocab_size=7)
    _, m1 = sampler.sample(None, 0, [[100], [101]], [2, 2], 1.0, 32, seeds=[0, 1])
    policy.h_first = 1.0
    _, m2 = sampler.sample(None, 0, [[100], [101]], [2, 2], 1.0, 32, seeds=[0, 1])
    assert m1["arpo/delta_h_mean"] == pytest.approx(3.0 / math.log(7))
    assert m2["arpo/delta_h_mean"] == pytest.approx(2.0 / math.log(7))


def test_entropy_at_is_validated():
    with pytest.raises(C.ConfigError, match="rollout.arpo.entropy_at"):
        validation.from_dict({"rollout": {"arpo": {"entropy_at": "after_call"}}})
    with pytest.raises(ValueError, match="entropy_at"):
        ARPOBranching(1, 2, 0.5, 0.2, vocab_size=7, entropy_at="after")
