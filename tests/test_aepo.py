"""AEPO against docs/methods/aepo.md's worked example: the penalised branch rule, entropy
pre-monitoring, the entropy-balanced clip's gradients and the entropy-aware advantage."""

from __future__ import annotations

import math
import re

import pytest
import torch
from test_tools import TINY_MULTIPLY, _lab, _Scripted, _tool_engine, _tools_recipe
from test_trainer import _documented_metric_patterns

from explorl import config as C
from explorl import validation
from explorl.algorithms import LOSSES, aepo_loss, ppo_loss
from explorl.algorithms.shaping import entropy_aware_advantages, entropy_moments, mean_std
from explorl.outputs.runlog import read_metrics
from explorl.policy.forward import response_logprobs
from explorl.rollout.aepo import (
    AEPOBranching,
    AEPOSampler,
    aepo_branch_probability,
    aepo_copies,
    initial_rollouts,
    penalty_factor,
)
from explorl.rollout.multiturn import _Row


class Cfg:
    eps_low, eps_high, clip_c = 0.2, 0.2, None


def test_branch_rule_worked_example():
    """β = 0.5, α = 0.2, λ = 0.05, ΔH = 1.0 (ARPO's example's entropy rise)."""
    assert aepo_branch_probability(1.0, 0.5, 0.2, 0, 0.05) == pytest.approx(0.7)  # ARPO's 0.7
    assert aepo_copies(0.35, 1.0, 0.5, 0.2, 0, 0.05)  # (0.35 + 0.2)·1 = 0.55 ≥ 0.5
    assert penalty_factor(2, 0.05) == pytest.approx(0.9)
    assert aepo_branch_probability(1.0, 0.5, 0.2, 2, 0.05) == pytest.approx(1 - 0.5 / 0.9 + 0.2)
    assert not aepo_copies(0.35, 1.0, 0.5, 0.2, 2, 0.05)  # 0.55·0.9 = 0.495 < 0.5
    assert aepo_copies(0.40, 1.0, 0.5, 0.2, 2, 0.05)  # 0.60·0.9 = 0.54
    assert penalty_factor(20, 0.05) == 0.0 and aepo_branch_probability(1.0, 0.5, 0.2, 20, 0.05) == 0
    assert not aepo_copies(0.999, 5.0, 0.5, 0.2, 20, 0.05)  # after 20 rounds: never
    # the probability is the rule's: a fine grid of u agrees with it
    for c in (0, 2, 7):
        grid = [(k + 0.5) / 2000 for k in range(2000)]
        frac = sum(aepo_copies(u, 1.0, 0.5, 0.2, c, 0.05) for u in grid) / len(grid)
        assert frac == pytest.approx(aepo_branch_probability(1.0, 0.5, 0.2, c, 0.05), abs=1e-3)


def test_branch_penalty_acts_on_consecutive_rounds():
    """β = 1e-9, α = 0 (every draw copies at f > 0), λ = 1 (f = 0 after one round): a prompt that
    branched in a round cannot branch in the next; one that got nothing starts again at c = 0."""
    b = AEPOBranching(1, 2, 1e-9, 0.0, vocab_size=10, branch_penalty=1.0)
    assert b.first([4, 4]) == [1, 1] and b.streak == [0, 0]
    rows = [_Row(0, 11, ids=[1], window=[1.0]), _Row(1, 12, ids=[2], window=[1.0])]
    assert b.expand(rows, [0], [4, 4], seeds=[7, 8], generator=None) == [2, 3]
    assert [(r.prompt, r.branch_of) for r in rows[2:]] == [(0, 0), (1, -1)]  # a copy, a new row
    assert b.streak == [1, 1]  # both grew (a new response counts, as the authors')
    # both prompts have a response going (no new rows) and c = 1: f = 0, no copy
    assert b.expand(rows, [0, 1], [4, 4], seeds=[7, 8], generator=None) == []
    assert b.streak == [0, 0]  # a round that added nothing resets the run
    assert b.pop()["aepo/penalised_draws"] == 2.0  # the two draws of the blocked round
    # c = 0 again: prompt 0 branches, prompt 1 (nothing going) gets a new response
    assert b.expand(rows, [0], [4, 4], seeds=[7, 8], generator=None) == [4, 5]


def test_entropy_pre_monitoring_worked_example():
    """N = 8, s = 0.5, log|V| = 2: a probe whose three turns' windows sum 6, 1 and 1 nats has
    H = 3, 0.5, 0.5; the reverse 1, 6, 6 nats."""
    h = [3.0, 0.5, 0.5]
    assert initial_rollouts(8, h[0], sum(h) / 3, 0.5) == 6  # ⌊8·σ(0.8333)⌋ + 1 = ⌊5.58⌋ + 1
    h = [0.5, 3.0, 3.0]
    assert initial_rollouts(8, h[0], sum(h) / 3, 0.5) == 3  # ⌊8·σ(−0.8333)⌋ + 1 = ⌊2.42⌋ + 1
    assert initial_rollouts(8, 1.0, 1.0, 0.5) == 5  # equal entropies: ⌊4⌋ + 1
    assert initial_rollouts(8, 50.0, 0.0, 0.5) == 8 and initial_rollouts(8, 0.0, 50.0, 0.5) == 1
    b = AEPOBranching(4, 2, 0.5, 0.2, vocab_size=round(math.e**2))
    b.initial = [6, 3]
    assert b.first([8, 2]) == [6, 2] and b.initial is None  # capped by the budget, used once
    assert b.first([8, 2]) == [4, 2]


def _grad_table(loss_fn):
    """Five tokens (A, ratio): the per-token loss's gradient on logp, by hand below."""
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0, 1.0])
    ratio = torch.tensor([1.5, 1.1, 1.5, 0.5, 0.5])
    old = torch.zeros(5, 1)
    logp = ratio.log()[:, None].clone().requires_grad_(True)
    per_tok, m = loss_fn(logp, old, adv, torch.ones(5, 1, dtype=torch.bool), Cfg())
    per_tok.sum().backward()
    return per_tok.detach()[:, 0], logp.grad[:, 0], m


def test_stop_gradient_keeps_and_rescales_the_clipped_tokens_gradient():
    """eps 0.2. d(−A·r)/dlogp = −A·r. Token 1 (A = 1, r = 1.5) is clipped above: PPO gives it
    value −1.2 and gradient 0; AEPO the same value and gradient −A·(1 + eps_high) = −1.2."""
    value, grad, m = _grad_table(aepo_loss)
    assert value.tolist() == pytest.approx([-1.2, -1.1, 1.5, 0.8, -0.5])
    assert grad.tolist() == pytest.approx([-1.2, -1.1, 1.5, 0.0, -0.5])
    ppo_value, ppo_grad, ppo_m = _grad_table(ppo_loss)
    assert ppo_value.tolist() == pytest.approx(value.tolist())  # the same loss value
    assert ppo_grad.tolist() == pytest.approx([0.0, -1.1, 1.5, 0.0, -0.5])
    assert m["loss/aepo_kept_frac"].item() == pytest.approx(1 / 5)  # token 1
    assert m["loss/clip_frac"].item() == pytest.approx(2 / 5) == ppo_m["loss/clip_frac"].item()
    assert LOSSES["aepo"] is aepo_loss


def test_entropy_aware_advantage_worked_example():
    """Rows A = 1 (H 0.5, 1.5) and A = −1 (H 1.0, one token): μ = 1, σ = 0.5 (unbiased)."""
    ent = torch.tensor([[0.5, 1.5], [1.0, 9.0]])
    mask = torch.tensor([[True, True], [True, False]])
    mean, std = mean_std(*entropy_moments(ent, mask))
    assert (mean, std) == pytest.approx((1.0, 0.5))
    assert std == pytest.approx(ent[mask].std().item())  # torch.std's, as the authors
    adv, m = entropy_aware_advantages(torch.tensor([1.0, -1.0]), ent, mask, 0.2, mean, std)
    assert adv.flatten().tolist() == pytest.approx([0.8, 1.2, -1.0, -1.0])  # padding keeps A
    assert m["adv/aepo_scale_dev_mean"].item() == pytest.approx(0.4 / 3)
    assert m["adv/aepo_flip_frac"].item() == 0.0
    adv, m = entropy_aware_advantages(torch.tensor([1.0, -1.0]), ent, mask, 1.5, mean, std)
    assert adv[0].tolist() == pytest.approx([-0.5, 2.5])  # scale 1 − 1.5 < 0: the sign flips
    assert m["adv/aepo_flip_frac"].item() == pytest.approx(1 / 3)
    same, _ = entropy_aware_advantages(torch.tensor([2.0]), torch.ones(1, 3),
                                       torch.ones(1, 3, dtype=torch.bool), 0.2, 1.0, 0.0)
    assert same.tolist() == [[2.0, 2.0, 2.0]]  # σ = 0 counts as 1: nothing moves


def test_aepo_sampler_fills_each_budget_after_pre_monitoring():
    from explorl.lab import lab_model_path

    tok, model = _lab(lab_model_path("multiply", size="tiny", **TINY_MULTIPLY))
    engine, _ = _tool_engine(tok, _Scripted(), max_turns=3)
    parsed, parse = [], engine.fmt.parse
    engine.fmt.parse = lambda text: parsed.append(text) or parse(text)
    cfg = C.ARPOConfig(enabled=True, mode="aepo", initial_rollouts=2, beam_size=3,
                       branch_probability=0.3, entropy_weight=0.2, dynamic_initial=True)
    sampler = AEPOSampler(engine, cfg, vocab_size=model.config.vocab_size)
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in ("34*7=", "12*3=")]
    ro, m = sampler.sample(model, 0, prompts, [6, 5], 1.0, 24, seeds=[1, 2])
    # every call answered is counted once, the probes' included (each call's text is read once)
    assert m["tools/calls_run"] == len(parsed) > 0
    assert m["tools/calls_run"] == (int(ro.tool_calls.sum()) - m["arpo/shared_calls"]
                                    + m["aepo/probe_calls"])
    assert ro.prompt_index.tolist() == [0] * 6 + [1] * 5  # the probes are not in the batch
    assert 1 <= m["aepo/initial_mean"] <= 5.5
    assert m["arpo/branches"] + m["arpo/fresh"] == 11 - 2 * m["aepo/initial_mean"]
    rows = engine.last_rows
    assert m["arpo/branches"] == sum(r.branch_of >= 0 for r in rows)
    logp, _ = response_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.response_ids,
                                ro.token_mask, 1.0)
    assert torch.allclose(logp[ro.response_mask], ro.old_logp[ro.response_mask], atol=1e-5)
    again, _ = AEPOSampler(engine, cfg, model.config.vocab_size).sample(
        model, 0, prompts, [6, 5], 1.0, 24, seeds=[1, 2])
    assert torch.equal(again.response_ids, ro.response_ids)  # a function of the seeds


@pytest.mark.parametrize("data, key, message", [
    ({"rollout": {"arpo": {"mode": "aepo"}}}, "rollout.arpo.mode", "nothing reads it"),
    ({"rollout": {"tools": ["explorl.tools.calculator:calculator"],
                  "arpo": {"enabled": True, "branch_penalty": 0.1}}},
     "rollout.arpo.branch_penalty", "rollout.arpo.mode is 'arpo'"),
    ({"rollout": {"tools": ["explorl.tools.calculator:calculator"],
                  "arpo": {"enabled": True, "mode": "aepo", "budget_sharpness": 1.0}}},
     "rollout.arpo.budget_sharpness", "dynamic_initial is false"),
    ({"rollout": {"arpo": {"enabled": True, "mode": "aepo"}}}, "rollout.arpo.enabled",
     "needs rollout.tools"),
    ({"algorithm": {"aepo_adv_weight": 0.2, "entropy_shaping_alpha": 0.4}},
     "algorithm.aepo_adv_weight", "cannot run with algorithm.entropy_shaping_alpha"),
])
def test_aepo_config_errors(data, key, message):
    with pytest.raises(C.ConfigError, match=key) as e:
        validation.from_dict(data, env=False)
    assert message in str(e.value)


def test_aepo_policy_side_needs_no_tools():
    cfg = validation.from_dict({"algorithm": {"loss": "aepo", "aepo_adv_weight": 0.2}}, env=False)
    assert cfg.algorithm.loss == "aepo"


def test_aepo_recipe_trains(tmp_path):
    from explorl.lab import lab_model_path
    from explorl.training.loop import Trainer

    path = lab_model_path("multiply", size="tiny", **TINY_MULTIPLY)
    cfg = _tools_recipe(path, recipe="lab/aepo", max_steps=2)
    assert (cfg.rollout.arpo.mode, cfg.algorithm.loss) == ("aepo", "aepo")
    Trainer(cfg, tmp_path / "run").train()
    rows = read_metrics(tmp_path / "run")
    patterns = [re.compile(p + "$") for p in _documented_metric_patterns()]
    logged = {k for row in rows for k in row}
    assert not [k for k in logged if not any(p.match(k) for p in patterns)]  # docs/metrics.md
    last = rows[-1]
    assert {"arpo/branches", "aepo/penalised_draws", "aepo/initial_mean", "loss/aepo_kept_frac",
            "adv/aepo_scale_dev_mean", "adv/aepo_flip_frac", "aepo/probe_calls",
            "tools/calls_run"} <= set(last)
    shared = last["arpo/shared_calls"]
    assert last["tools/calls_run"] == pytest.approx(
        last["tools/calls_mean"] * last["rollout/n_trained"] - shared + last["aepo/probe_calls"])
    assert last["rollout/n_samples"] == 4 * 4  # every prompt got its budget
    assert 1 <= last["aepo/initial_mean"] <= 4
    assert 0 <= last["loss/aepo_kept_frac"] <= last["loss/clip_frac"] + 1e-9
