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
    assert b.pop() == {"arpo/branches": 3.0, "arpo/fresh": 1.0, "arpo/shared_calls": 4.0}
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
