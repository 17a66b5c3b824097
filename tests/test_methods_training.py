"""Issue 18's loss-side methods inside the trainer: each is wired where it acts (a switched-off
setting trains exactly as GRPO, a switched-on one changes the update) and logs what it did."""

from __future__ import annotations

import re

import pytest
import torch

from explorl.config import builtin
from explorl.outputs.runlog import read_metrics
from explorl.training.loop import Trainer

BASE = {"max_steps": 2, "eval": {"every": 0}, "optim": {"mini_batches": 2, "micro_batch_size": 3}}


def _train(make_config, tmp_path, name, extra):
    cfg = make_config({**BASE, **extra})
    t = Trainer(cfg, tmp_path / name)
    t.train()
    weights = {k: v.detach().clone() for k, v in t.policy.state_dict().items()}
    return weights, read_metrics(tmp_path / name)


def _same(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def grpo(make_config, tmp_path):
    return _train(make_config, tmp_path, "grpo", {})


def test_forking_mask_keeps_the_top_rho_and_rho_one_is_grpo(make_config, tmp_path, grpo):
    w_all, rows_all = _train(make_config, tmp_path, "rho1",
                             {"algorithm": {"entropy_mask_ratio": 1.0}})
    assert _same(w_all, grpo[0])  # every token kept, denominators unchanged: GRPO exactly
    assert all(r["entropy/mask_kept_frac"] == 1.0 for r in rows_all)
    w, rows = _train(make_config, tmp_path, "rho", {"algorithm": {"entropy_mask_ratio": 0.2}})
    assert not _same(w, grpo[0])
    for r in rows:
        # k = ceil(0.2·n_valid) per mini-batch (8 responses of ≤ 6 tokens): kept ∈ [0.2, 0.2 + 1/n)
        assert 0.2 <= r["entropy/mask_kept_frac"] < 0.34
        assert (r["entropy/mask_kept_mean"] >= r["entropy/mask_threshold"]
                >= r["entropy/mask_dropped_mean"])


def test_entropic_term_acts_only_through_alpha(make_config, tmp_path, grpo):
    off, rows_off = _train(make_config, tmp_path, "off",
                           {"control": {"entropic": {"enabled": True, "target": -1.0}}})
    assert _same(off, grpo[0])  # α = 0: the term is computed and logged, but adds nothing
    assert all(r["control/pos_neg_weight"] == 0.0 and 0 < r["loss/entropic_confident_frac"] < 1
               for r in rows_off)
    on, rows_on = _train(make_config, tmp_path, "on",
                         {"control": {"entropic": {"enabled": True, "target": 0.1}}})
    assert not _same(on, grpo[0])
    # α is decided from the step's own entropy (no lag): clip(H_1 − 0.1, −1, 1) at step 1
    h1 = rows_on[0]["entropy/mean"]
    assert rows_on[0]["control/pos_neg_weight"] == pytest.approx(min(1.0, h1 - 0.1), abs=1e-9)


def test_entropy_shaping_changes_the_update_and_zero_alpha_is_grpo(make_config, tmp_path, grpo):
    w, rows = _train(make_config, tmp_path, "shaped", {"algorithm": {"entropy_shaping_alpha": 0.4}})
    assert not _same(w, grpo[0])
    assert all(r["adv/entropy_shaping_mean"] > 0 and 0 <= r["adv/entropy_shaping_capped_frac"] <= 1
               for r in rows)
    # the same first batch; cov/* use the estimator's A, not the shaped one
    assert rows[0]["cov/mean"] == grpo[1][0]["cov/mean"]


def test_entropy_coefficient_controller_sets_the_bonus(make_config, tmp_path):
    _, rows = _train(make_config, tmp_path, "coef", {
        "control": {"entropy_coef": {"enabled": True, "target": 10.0, "init": 0.01, "delta": 0.01,
                                     "max": 0.05}}})
    # entropy always below 10: c grows by Δ per step, then the bonus applies it (update, apply)
    assert [r["control/entropy_coef"] for r in rows] == pytest.approx([0.02, 0.03])
    assert [r["control/entropy_coef_next"] for r in rows] == pytest.approx([0.02, 0.03])
    assert all("loss/entropy_bonus" in r for r in rows)


def test_corrections_train_kl_in_reward_mask_truncated_reinforce_plus_plus(make_config,
                                                                             tmp_path, grpo):
    """§7c in the trainer: the KL in the reward (k1, from the reference's forward), overlong
    filtering, plain REINFORCE++ and seq-mean-token-sum run and change the update."""
    w, rows = _train(make_config, tmp_path, "corr", {"algorithm": {
        "kl_in_reward": True, "kl_coef": 0.05, "kl_estimator": "k1", "mask_truncated": True,
        "advantage": "reinforce_plus_plus", "agg": "seq-mean-token-sum"}})
    assert not _same(w, grpo[0])
    for r in rows:
        assert "kl/reward_penalty_mean" in r and "kl/ref_mean" not in r  # in the reward only
        assert r["kl/reward_penalty_mean"] == r["kl/reward_penalty_mean"]  # finite, not NaN
        assert abs(r["loss/policy"]) < 1e3


@pytest.mark.parametrize("sets,message", [
    # agg unset is the loss's own; one the loss cannot take is refused
    (["algorithm.loss=gspo", "algorithm.agg=token-mean"],
     "algorithm.agg: loss 'gspo' needs agg 'seq-mean-token-mean'"),
    (["algorithm.loss=luspo", "algorithm.agg=seq-mean-token-mean"],
     "algorithm.agg: loss 'luspo' needs agg 'seq-mean-token-sum'"),
    (["algorithm.loss=sapo", "control.adaptive.enabled=true"],
     "control.adaptive drives eps_high, which nothing reads with loss 'sapo'"),
    (["algorithm.loss=vespo", "rollout.engine=vllm",
      "algorithm.rollout_correction.mode=sequence-mask"],
     "algorithm.rollout_correction.mode: loss 'vespo' folds the rollout correction"),
    (["algorithm.advantage=pkpo"], "algorithm.passk_k: advantage 'pkpo' optimises pass@k"),
    (["algorithm.advantage=pkpo", "algorithm.passk_k=9"], "algorithm.passk_k: must be ≤ 8"),
    (["algorithm.advantage=pkpo_loo", "algorithm.passk_k=8"], "pkpo_loo needs k < n"),
    (["algorithm.advantage=passk_training", "algorithm.passk_k=6", "control.budget.enabled=true"],
     "algorithm.passk_k: must be ≤ 4"),  # the budget may give a prompt n_min_limit = 4
    (["algorithm.entropy_mask_ratio=1.5"], "algorithm.entropy_mask_ratio: must be in [0, 1]"),
    (["algorithm.entropy_shaping_kappa=0.5"], "algorithm.entropy_shaping_kappa: must be ≥ 1"),
    (["control.budget.knapsack_alpha=1.0"], "control.budget.knapsack_alpha: must be in (0, 1)"),
    (["control.entropy_coef.init=0.1"], "control.entropy_coef.init: need"),
    (["control.entropic.enabled=true", "control.adaptive.enabled=true"], "fight"),
    (["algorithm.loss=cispo", "control.adaptive.enabled=true"],
     "control.adaptive.actuator: control.adaptive drives eps_high, which nothing reads"),
    (["algorithm.kl_coef=0.1", "algorithm.kl_estimator=k1"], "zero expected gradient"),
    (["control.entropy_coef.enabled=true", "control.adaptive.enabled=true",
      "control.adaptive.actuator=entropy_coef"], "fight"),
])
def test_config_rejects_impossible_method_settings(sets, message):

    from explorl import validation
    grpo = builtin.find("lab/grpo")
    with pytest.raises(ValueError, match=re.escape(message)):  # ConfigError or ControlError
        validation.load(grpo, sets, env=False)
