"""explorl.integrations.verl at function level: explorl's registered losses and estimators give
the same values and gradients as explorl's own functions, and as verl's where verl has the method
(make test-integrations; skipped where verl is not installed: verl cannot train on a CPU)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

pytest.importorskip("verl.trainer.ppo.core_algos")

from omegaconf import OmegaConf  # noqa: E402
from verl.trainer.ppo import core_algos as va  # noqa: E402
from verl.workers.config import ActorConfig, PolicyLossConfig  # noqa: E402

from explorl.algorithms import ADVANTAGES, LOSSES, aggregate  # noqa: E402
from explorl.algorithms.losses import REQUIRED_AGG, clip_cov_select  # noqa: E402
from explorl.config import (  # noqa: E402
    EntroPICControlConfig,
    EntropyCoefControlConfig,
    TemperatureControlConfig,
)
from explorl.control import (  # noqa: E402
    EntroPICController,
    EntropyCoefController,
    TemperatureScheduler,
)
from explorl.errors import ControlError  # noqa: E402
from explorl.integrations import verl as ev  # noqa: E402

pytestmark = pytest.mark.integrations


def _actor(**kw) -> ActorConfig:
    pl = PolicyLossConfig(**kw.pop("policy_loss", {}))
    base = dict(strategy="fsdp", ppo_micro_batch_size_per_gpu=1, rollout_n=1,
                clip_ratio_low=0.2, clip_ratio_high=0.28, policy_loss=pl)
    return ActorConfig(**{**base, **kw})


def _tensors(seed=0, B=6, T=7, spread=0.3):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(B, T, generator=g) * 3).requires_grad_()
    old = logp.detach() + spread * torch.randn(B, T, generator=g)
    adv = torch.randn(B, generator=g)[:, None].expand(B, T).clone()
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, 4:] = False
    mask[3, 2:] = False
    return logp, old, adv, mask


def _run(fn, logp, old, adv, mask, mode, config, seed=0):
    torch.manual_seed(seed)
    logp.grad = None
    loss, metrics = fn(old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask,
                       loss_agg_mode=mode, config=config)
    loss.backward()
    return loss.detach(), logp.grad.clone(), metrics


MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


@pytest.mark.parametrize("name", list(LOSSES))
@pytest.mark.parametrize("mode", [*MODES, "seq-mean-token-sum"])
def test_registered_loss_equals_explorls_own(name, mode):
    if name in REQUIRED_AGG and mode != REQUIRED_AGG[name]:
        pytest.skip(f"{name} is defined under {REQUIRED_AGG[name]} only")
    config = _actor(policy_loss={"clip_cov_ratio": 0.1, "kl_cov_ratio": 0.1})
    logp, old, adv, mask = _tensors()
    assert va.get_policy_loss_fn(f"explorl_{name}") is ev.POLICY_LOSSES[f"explorl_{name}"]
    got, got_grad, metrics = _run(ev.POLICY_LOSSES[f"explorl_{name}"], logp, old, adv, mask,
                                  mode, config)
    cfg = ev.explorl_loss_config(config, name)
    torch.manual_seed(0)
    logp.grad = None
    per_token, _ = LOSSES[name](logp, old, adv, mask, cfg)
    want = aggregate(per_token, mask, mode, max_len=mask.shape[-1])
    want.backward()
    assert torch.allclose(got, want.detach(), atol=1e-6)
    assert torch.allclose(got_grad, logp.grad, atol=1e-6)
    assert "actor/pg_clipfrac" in metrics and "actor/loss/ratio_mean" in metrics


@pytest.mark.parametrize("mode", MODES)
def test_explorl_ppo_equals_verl_vanilla(mode):
    config = _actor()
    logp, old, adv, mask = _tensors(spread=0.6)  # some ratios clip, some dual-clip
    a = _run(ev.POLICY_LOSSES["explorl_ppo"], logp, old, adv, mask, mode, config)
    b = _run(va.get_policy_loss_fn("vanilla"), logp, old, adv, mask, mode, config)
    assert torch.allclose(a[0], b[0], atol=1e-6) and torch.allclose(a[1], b[1], atol=1e-6)
    assert a[2]["actor/pg_clipfrac"] == pytest.approx(b[2]["actor/pg_clipfrac"])


def test_explorl_kl_cov_equals_verl_kl_cov_with_zero_tolerance():
    config = _actor(policy_loss={"kl_cov_ratio": 0.2, "ppo_kl_coef": 0.5})
    logp, old, adv, mask = _tensors()
    cfg = dataclasses.replace(ev.explorl_loss_config(config, "kl_cov"), kl_cov_tol=0.0)
    assert cfg.kl_cov_coef == 0.5 and cfg.kl_cov_ratio == 0.2  # verl's names read
    for mode in MODES:
        torch.manual_seed(0)
        logp.grad = None
        per_token, _ = LOSSES["kl_cov"](logp, old, adv, mask, cfg)
        a = aggregate(per_token, mask, mode, max_len=mask.shape[-1])
        a.backward()
        ga = logp.grad.clone()
        b = _run(va.get_policy_loss_fn("kl_cov"), logp, old, adv, mask, mode, config)
        assert torch.allclose(a.detach(), b[0], atol=1e-6) and torch.allclose(ga, b[1], atol=1e-6)


def test_explorl_clip_cov_has_verls_gradient_and_keeps_the_detached_value():
    """Same tokens (same RNG draw), same gradient; verl zeroes a selected token's loss, explorl
    keeps its value (detached), so the values differ by exactly those tokens' PPO terms."""
    config = _actor(policy_loss={"clip_cov_ratio": 0.2, "clip_cov_lb": -10.0, "clip_cov_ub": 10.0})
    logp, old, adv, mask = _tensors(spread=0.05)
    a = _run(ev.POLICY_LOSSES["explorl_clip_cov"], logp, old, adv, mask, "token-mean", config)
    b = _run(va.get_policy_loss_fn("clip_cov"), logp, old, adv, mask, "token-mean", config)
    assert torch.allclose(a[1], b[1], atol=1e-6)
    cfg = ev.explorl_loss_config(config, "clip_cov")
    torch.manual_seed(0)
    selected, _ = clip_cov_select(logp, old, adv, mask, cfg)
    assert selected.sum() == max(1, int(0.2 * mask.sum()))
    ratio = torch.exp(logp.detach() - old)
    ppo = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.28))
    assert a[0] - b[0] == pytest.approx(float(ppo[selected].sum() / mask.sum()), abs=1e-6)


def test_explorl_gspo_equals_verl_gspo():
    config = _actor(clip_ratio_low=3e-4, clip_ratio_high=4e-4)
    logp, old, adv, mask = _tensors(spread=1e-3)
    a = _run(ev.POLICY_LOSSES["explorl_gspo"], logp, old, adv, mask, "seq-mean-token-mean", config)
    b = _run(va.get_policy_loss_fn("gspo"), logp, old, adv, mask, "seq-mean-token-mean", config)
    assert torch.allclose(a[0], b[0], atol=1e-6) and torch.allclose(a[1], b[1], atol=1e-6)


def test_explorl_cispo_equals_verl_cispo_where_no_ratio_is_below_the_low_clip():
    """verl's CISPO also clamps the weight below at 1 − clip_ratio_low; explorl's (MiniMax-M1's)
    only caps it above at w_max = 1 + clip_ratio_high here."""
    config = _actor()
    logp, old, adv, mask = _tensors(spread=0.1)
    old = torch.minimum(old, logp.detach() + 0.1)  # ratio ≥ e^-0.1 > 0.8
    object.__setattr__(config.policy_loss, "explorl", {"cispo_w_max": 1.28})
    a = _run(ev.POLICY_LOSSES["explorl_cispo"], logp, old, adv, mask, "token-mean", config)
    b = _run(va.get_policy_loss_fn("cispo"), logp, old, adv, mask, "token-mean", config)
    assert torch.allclose(a[0], b[0], atol=1e-6) and torch.allclose(a[1], b[1], atol=1e-6)


def test_explorl_vespo_folds_rollout_is_weights_into_w():
    """verl's token-level IS weights π_old/π_rollout go into VESPO's W (their product over each
    response), not onto its per-token loss; a weight-0 token (verl's mask) leaves the loss."""
    from explorl.algorithms.rollout_correction import sequence_log_weight

    config = _actor()
    logp, old, adv, mask = _tensors()
    g = torch.Generator().manual_seed(1)
    w = torch.rand(mask.shape, generator=g) + 0.5
    w[1, 2] = 0.0
    got, _ = ev.POLICY_LOSSES["explorl_vespo"](old_log_prob=old, log_prob=logp, advantages=adv,
                                               response_mask=mask, loss_agg_mode="token-mean",
                                               config=config, rollout_is_weights=w)
    keep = mask & (w > 0)
    per_token, _ = LOSSES["vespo"](logp, old, adv, mask, ev.explorl_loss_config(config, "vespo"),
                                   behaviour_log_weight=sequence_log_weight(w, keep))
    want = aggregate(per_token * keep, mask, "token-mean")
    assert torch.allclose(got, want, atol=1e-6)


# ---------------------------------------------------------------------------- advantages
def _rewards(seed=0):
    g = torch.Generator().manual_seed(seed)
    index = np.array(["a"] * 4 + ["b"] * 4 + ["c"] * 4 + ["d"] * 3, dtype=object)
    r = (torch.rand(len(index), generator=g) > 0.5).float()
    r[8:12] = 1.0  # one constant group
    mask = torch.ones(len(index), 5)
    mask[2, 3:] = 0
    token_rewards = torch.zeros(len(index), 5)
    token_rewards[:, 1] = r
    return token_rewards, mask, index, r


@pytest.mark.parametrize("name", list(ADVANTAGES))
def test_registered_estimator_equals_explorls_own(name):
    token_rewards, mask, index, r = _rewards()
    config = OmegaConf.create({"explorl": {"passk_k": 2}})
    fn = va.get_adv_estimator_fn(f"explorl_{name}")
    adv, ret = fn(token_level_rewards=token_rewards, response_mask=mask, index=index,
                  epsilon=1e-6, config=config)
    group = torch.as_tensor(np.unique(index, return_inverse=True)[1])
    kw = {"k": 2} if name in ev.TAKES_K else {}
    want = ADVANTAGES[name](r, group, 1e-6, **kw)
    assert torch.allclose(adv, want[:, None] * mask, atol=1e-6) and torch.equal(adv, ret)


@pytest.mark.parametrize("ours, theirs, kw", [
    ("grpo", "grpo", {}),
    ("dr_grpo", "grpo", {"norm_adv_by_std_in_grpo": False}),
    ("rloo", "rloo", {}),
    ("grpo_passk", "grpo_passk", {}),
])
def test_estimator_equals_verls_where_verl_has_it(ours, theirs, kw):
    token_rewards, mask, index, _ = _rewards(seed=1)
    config = OmegaConf.create({"norm_adv_by_std_in_grpo": True})
    a, _ = va.get_adv_estimator_fn(f"explorl_{ours}")(
        token_level_rewards=token_rewards, response_mask=mask, index=index, epsilon=1e-6)
    b, _ = va.get_adv_estimator_fn(theirs)(
        token_level_rewards=token_rewards, response_mask=mask, index=index, epsilon=1e-6,
        config=config, **kw)
    assert torch.allclose(a, b, atol=1e-5)


def test_pass_at_k_estimator_without_k_is_refused():
    token_rewards, mask, index, _ = _rewards()
    with pytest.raises(ValueError, match="passk_k"):
        va.get_adv_estimator_fn("explorl_pkpo")(token_level_rewards=token_rewards,
                                                response_mask=mask, index=index)


# ---------------------------------------------------------------------------- controllers
def _verl_config(use_kl_loss=False):
    return OmegaConf.create({
        "actor_rollout_ref": {
            "actor": {"clip_ratio_high": 0.28, "entropy_coeff": 0.0, "kl_loss_coef": 0.001,
                      "use_kl_loss": use_kl_loss},
            "rollout": {"temperature": 1.0, "n": 4}},
        "data": {"train_batch_size": 8, "max_response_length": 16}})


def test_verl_control_runs_e3_once_per_step_and_writes_the_config():
    config = _verl_config()
    ctl = ev.VerlControl([TemperatureScheduler(TemperatureControlConfig(enabled=True))], config,
                         vocab_size=100, dataset_size=32, max_steps=5)
    temps = []
    for step, h in enumerate([1.0, 0.8, 0.8], start=1):
        temps.append(ctl.begin_step(config).temperature)
        assert config.actor_rollout_ref.rollout.temperature == temps[-1]
        metrics = ctl.end_step({"actor/entropy": h, "critic/score/mean": 0.5})
        assert metrics["control/target_entropy"] == 1.0
    log_v = np.log(100) + np.log(np.log(100))
    assert temps == [1.0, 1.0, pytest.approx(1.0 * (1 + np.log(1.0 / 0.8) / log_v))]
    state = ctl.state_dict()
    again = ev.VerlControl([TemperatureScheduler(TemperatureControlConfig(enabled=True))],
                           _verl_config(), vocab_size=100, dataset_size=32, max_steps=5)
    again.load_state_dict(state)
    assert again.begin_step(_verl_config()).temperature == ctl.begin_step(config).temperature


def test_verl_control_loss_side_controller_uses_the_steps_own_entropy():
    config = _verl_config()
    coef = EntropyCoefController(EntropyCoefControlConfig(enabled=True, target=0.5, delta=0.01,
                                                          init=0.02, max=0.05))
    ctl = ev.VerlControl([coef], config, vocab_size=100, dataset_size=32, max_steps=5)
    ctl.begin_step(config)
    # 0.3 < 0.5: c is raised first (0.02 + 0.01), then applied (update, then apply)
    assert ctl.before_update(config, entropy=0.3).entropy_coef == pytest.approx(0.03)
    assert config.actor_rollout_ref.actor.entropy_coeff == pytest.approx(0.03)


def test_verl_control_refuses_what_verl_does_not_read():
    with pytest.raises(ControlError, match="EntroPIC"):
        ev.VerlControl([EntroPICController(EntroPICControlConfig(enabled=True))], _verl_config(),
                       vocab_size=100, dataset_size=32, max_steps=5)
    from explorl.config import AdaptiveControlConfig
    from explorl.control import AdaptiveController

    with pytest.raises(ControlError, match="use_kl_loss"):
        kl = AdaptiveController(AdaptiveControlConfig(enabled=True, actuator="kl_coef"))
        ev.VerlControl([kl], _verl_config(), vocab_size=100, dataset_size=32, max_steps=5)
