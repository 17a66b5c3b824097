"""Issue 13: bf16 mixed precision over fp32 master weights, trainer-side old log-probs, and the
method fixes (Clip-Cov without dual clip, dynamic sampling on accuracy)."""

from __future__ import annotations

import pytest
import torch

from explorl import config as C
from explorl import validation
from explorl.training.loop import Trainer


def _weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_bf16_compute_keeps_fp32_master_weights_and_small_updates(make_config, tmp_path):
    cfg = make_config({"max_steps": 1, "eval": {"every": 0}, "model": {"dtype": "bfloat16"},
                       "optim": {"lr": 1e-6}, "algorithm": {"old_logp": "recompute"}})
    t = Trainer(cfg, tmp_path / "run")
    assert all(p.dtype == torch.float32 for p in t.policy.parameters())
    before = _weights(t.policy)
    m = t.train_step()
    assert m["train/optimizer_steps"] == 1
    after = _weights(t.policy)
    changed = sum(int((before[n] != after[n]).sum()) for n in before)
    total = sum(v.numel() for v in before.values())
    assert changed / total >= 0.99  # pure bf16 weights keep ~2% of the updates at this lr
    assert m["rollout/logp_diff_max"] > 1e-4  # bf16 sampler vs trainer: the gap recompute removes
    t.pool.close()


def test_pure_low_precision_is_an_explicit_opt_in(make_config, tmp_path):
    cfg = make_config({"max_steps": 1, "eval": {"every": 0},
                       "model": {"dtype": "bfloat16", "pure_low_precision": True}})
    t = Trainer(cfg, tmp_path / "run")
    assert all(p.dtype == torch.bfloat16 for p in t.policy.parameters())
    t.pool.close()


@pytest.mark.parametrize("loss", ["ppo", "kl_cov"])
def test_recomputed_old_logp_makes_the_on_policy_ratio_one_under_bf16(make_config, tmp_path, loss):
    # One mini-batch in one micro-batch: the update's first forward sees exactly the recompute's
    # layout, so logp == old_logp: the PPO ratio is 1 and KL-Cov's |logp − old_logp| is 0 on
    # every selected token (kl_cov_ratio 1 selects them all), so no token gets a ±λ push.
    cfg = make_config({"max_steps": 1, "eval": {"every": 0}, "model": {"dtype": "bfloat16"},
                       "algorithm": {"loss": loss, "old_logp": "recompute", "kl_cov_ratio": 1.0,
                                     "kl_cov_tol": 0.0}})
    t = Trainer(cfg, tmp_path / "run")
    seen = {}
    run = t.update.run

    def spy(ro, adv, knobs, sb):
        with torch.no_grad():
            lp, _ = t.scorer(
                ro.prompt_ids,
                ro.prompt_mask,
                ro.response_ids,
                ro.response_mask,
                knobs.temperature,
                chunk_size=cfg.algorithm.logprob_chunk,
                with_entropy=False,
            )
        seen["gap"] = float(((lp - ro.old_logp).abs() * ro.response_mask).max())
        return run(ro, adv, knobs, sb)

    t.update.run = spy
    m = t.train_step()
    assert seen["gap"] <= 1e-6
    assert m["loss/clip_frac"] == 0.0
    t.pool.close()


def test_auto_keeps_the_fp32_hf_samplers_logprobs(make_config, tmp_path):
    t = Trainer(make_config({"max_steps": 1, "eval": {"every": 0}}), tmp_path / "run")
    assert not t.recompute and "rollout/logp_diff_max" not in t.train_step()
    t.pool.close()


def test_clip_cov_with_dual_clip_is_rejected():
    with pytest.raises(C.ConfigError, match="algorithm.clip_c: .*no dual clip"):
        validation.from_dict({"algorithm": {"loss": "clip_cov", "clip_c": 3.0}})


def test_dynamic_sampling_filters_on_accuracy_not_on_the_overlong_penalty():
    from explorl.algorithms import informative_groups

    # an all-wrong group with one overlong response: rewards [0, 0, 0, −0.75], scores all 0
    scores = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    rewards = scores.clone()
    rewards[3] = -0.75
    group = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    cfg = validation.from_dict({"algorithm": {"dynamic_sampling": True}})
    rows = {"score": scores, "reward": rewards}
    kept = informative_groups(rows[cfg.algorithm.dynamic_sampling_metric], group)
    assert kept.tolist() == [False] * 4 + [True] * 4
    # the explicit option keeps the old behaviour
    assert informative_groups(rows["reward"], group)[:4].all()


def test_dynamic_sampling_in_a_run_drops_the_overlong_all_wrong_group(make_config, tmp_path):
    from explorl.rollout.fake import FakeEngine

    cfg = make_config({"max_steps": 1, "eval": {"every": 0},
                       "algorithm": {"dynamic_sampling": True, "max_gen_rounds": 1},
                       "reward": {"overlong_buffer": 2, "overlong_penalty": 1.0}})
    t = Trainer(cfg, tmp_path / "run")
    ids = t.prompts.ids_of(t.train_data, "train")
    truth = {tuple(ids(i)): r.ground_truth for i, r in enumerate(t.train_data)}
    # every answer wrong; sample 0 of each prompt runs to the length limit (overlong penalty)
    t.engine = FakeEngine(t.tokenizer, lambda p, j: "9" * 10 if j == 0 else "x")
    m = t.train_step()
    assert truth and m["rollout/filtered_frac"] == 1.0 and m["rollout/n_trained"] == 0
    t.pool.close()
