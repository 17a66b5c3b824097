"""explorl's policy losses and advantage estimators in verl's registries, and the controllers as a
per-step object for a verl trainer subclass (docs/integrations-verl.md).

``import explorl.integrations.verl`` registers, with verl's own signatures:

- policy losses ``explorl_<name>`` for every loss in ``algorithms.LOSSES`` (``explorl_ppo``,
  ``explorl_clip_cov``, ``explorl_kl_cov``, ``explorl_gspo``, ``explorl_cispo``, ``explorl_sapo``,
  ``explorl_luspo``, ``explorl_vespo``; ``actor_rollout_ref.actor.policy_loss.loss_mode``):
  explorl's per-token losses (``algorithms.losses``) aggregated by verl's ``agg_loss`` with its
  global-batch information;
- advantage estimators ``explorl_<name>`` for every estimator in ``algorithms.ADVANTAGES``
  (``algorithm.adv_estimator``): verl lacks ``passk_training``, ``pkpo``, ``pkpo_loo`` and
  ``pkpo_loo_minus_one``; the others are explorl's versions of methods verl has.

Settings come from verl's config: the clip from ``actor.clip_ratio_low``/``clip_ratio_high``,
the dual clip ``actor.clip_ratio_c`` (explorl_ppo only), Clip-Cov/KL-Cov from
``actor.policy_loss.{clip_cov_ratio, clip_cov_lb, clip_cov_ub, kl_cov_ratio, ppo_kl_coef}``
(verl's names); settings verl has no field for (``kl_cov_tol``, ``cispo_w_max``…) from
``actor.policy_loss.explorl`` (a dict of explorl ``AlgorithmConfig`` fields) or explorl's defaults.
Estimators take verl's ``epsilon`` argument; the pass@k ``k`` comes from
``algorithm.explorl.passk_k``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo.core_algos import agg_loss, register_adv_est, register_policy_loss

from explorl.algorithms.advantages import ADVANTAGES, TAKES_K
from explorl.algorithms.losses import LOSSES, REQUIRED_AGG, take_correction
from explorl.config import AlgorithmConfig
from explorl.control import Controller, Knobs
from explorl.integrations.driver import ControlDriver, KnobTable

PREFIX = "explorl_"

VERL_KNOB_TABLE = KnobTable(
    "verl",
    reads={
        "temperature": "actor_rollout_ref.rollout.temperature (the sampler's and the actor's "
                       "meta_info['temperature'])",
        "eps_high": "actor_rollout_ref.actor.clip_ratio_high (ppo-family losses)",
        "entropy_coef": "actor_rollout_ref.actor.entropy_coeff",
        "kl_coef": "actor_rollout_ref.actor.kl_loss_coef (use_kl_loss: true)",
    },
    refused={
        "budgets": "verl samples rollout.n responses for every prompt",
        "unlearn": "verl has no two-stage sampler (EEPO's unlearning step)",
        "curriculum": "verl's dataset and rollout.n are fixed for the run",
        "pos_neg_weight": "verl's losses have no EntroPIC confident-token term",
    },
)
"""What verl's PPO trainer reads, per knob; the config path is where ``VerlControl.apply``
writes it."""

KNOB_PATHS = {
    "temperature": ("actor_rollout_ref", "rollout", "temperature"),
    "eps_high": ("actor_rollout_ref", "actor", "clip_ratio_high"),
    "entropy_coef": ("actor_rollout_ref", "actor", "entropy_coeff"),
    "kl_coef": ("actor_rollout_ref", "actor", "kl_loss_coef"),
}


def _get(cfg, key, default=None):
    if cfg is None:
        return default
    value = cfg.get(key, default) if hasattr(cfg, "get") else getattr(cfg, key, default)
    return default if value is None else value


def explorl_loss_config(config, loss: str) -> AlgorithmConfig:
    """explorl's loss settings from a verl actor config (verl's field names where it has them)."""
    pl = _get(config, "policy_loss")
    low = _get(config, "clip_ratio_low", _get(config, "clip_ratio", 0.2))
    high = _get(config, "clip_ratio_high", _get(config, "clip_ratio", 0.2))
    extra = dict(_get(pl, "explorl", {}) or {})
    base = AlgorithmConfig()
    fields = dict(
        loss=loss, eps_low=low, eps_high=high,
        clip_c=_get(config, "clip_ratio_c", None) if loss in ("ppo", "aepo") else None,
        clip_cov_ratio=_get(pl, "clip_cov_ratio", base.clip_cov_ratio),
        clip_cov_lb=_get(pl, "clip_cov_lb", base.clip_cov_lb),
        clip_cov_ub=_get(pl, "clip_cov_ub", base.clip_cov_ub),
        kl_cov_ratio=_get(pl, "kl_cov_ratio", base.kl_cov_ratio),
        kl_cov_coef=_get(pl, "ppo_kl_coef", base.kl_cov_coef),
        agg=REQUIRED_AGG.get(loss, base.agg),
    )
    return dataclasses.replace(base, **{**fields, **extra})


def _policy_loss(name: str):
    fn = LOSSES[name]

    def loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
             config=None, rollout_is_weights=None) -> tuple[torch.Tensor, dict[str, Any]]:
        cfg = explorl_loss_config(config, name)
        if name in REQUIRED_AGG and loss_agg_mode != REQUIRED_AGG[name]:
            raise ValueError(f"{PREFIX}{name} needs actor.loss_agg_mode: {REQUIRED_AGG[name]}")
        mask = response_mask.bool()
        # each loss takes verl's token-level IS weights in its own form (``take_correction``):
        # VESPO into its sequence weight W (a token with weight 0, verl's mask modes, leaves the
        # loss and counts 1 in W), LUSPO as its response's mean weight, the others per token
        weight, extra = None, {}
        if rollout_is_weights is not None:
            weight, keep, extra = take_correction(name, rollout_is_weights,
                                                  mask & (rollout_is_weights > 0), mask)
            weight = keep.to(rollout_is_weights.dtype) if weight is None else weight
        per_token, metrics = fn(log_prob, old_log_prob, advantages, mask, cfg, **extra)  # (B, T)
        if weight is not None:
            per_token = per_token * weight
        batch_info = getattr(config, "global_batch_info", None) or {}
        pg_loss = agg_loss(loss_mat=per_token, loss_mask=mask, loss_agg_mode=loss_agg_mode,
                           **batch_info)
        out = {f"actor/{k}": float(v) for k, v in metrics.items()}
        out["actor/pg_clipfrac"] = float(metrics["loss/clip_frac"])
        return pg_loss, out

    loss.__name__ = loss.__qualname__ = f"compute_policy_loss_{PREFIX}{name}"
    loss.__doc__ = f"explorl's ``{name}`` loss (``explorl.algorithms.losses``) in verl's signature."
    return loss


def _adv_estimator(name: str):
    fn = ADVANTAGES[name]

    def estimator(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                  index: np.ndarray, epsilon: float = 1e-6, config=None, **kwargs):
        # verl's outcome estimators: one score per response = the sum of its token rewards
        scores = token_level_rewards.sum(dim=-1)  # (B,)
        _, group = np.unique(np.asarray(index), return_inverse=True)
        group = torch.as_tensor(group, device=scores.device)
        if name in TAKES_K:
            k = _get(_get(config, "explorl", {}), "passk_k", None)
            if k is None:
                raise ValueError(f"{PREFIX}{name} needs algorithm.explorl.passk_k")
            adv = fn(scores, group, epsilon, k=int(k))
        else:
            adv = fn(scores, group, epsilon)
        adv = adv.to(scores.dtype)[:, None] * response_mask  # (B, T)
        return adv, adv

    estimator.__name__ = f"compute_{PREFIX}{name}_outcome_advantage"
    estimator.__doc__ = f"explorl's ``{name}`` estimator (``explorl.algorithms.advantages``)."
    return estimator


POLICY_LOSSES = {PREFIX + n: register_policy_loss(PREFIX + n)(_policy_loss(n)) for n in LOSSES}
ADV_ESTIMATORS = {PREFIX + n: register_adv_est(PREFIX + n)(_adv_estimator(n)) for n in ADVANTAGES}


class VerlControl:
    """explorl controllers for a verl ``RayPPOTrainer`` subclass, called once per step.

    ``begin_step(config)`` before generation writes the step's knobs into the trainer's config
    (``KNOB_PATHS``); ``before_update(entropy)`` after the old-log-prob pass lets loss-side
    controllers use the step's own entropy (verl logs it as ``actor/entropy`` before the update);
    ``end_step(metrics)`` feeds the step's ``actor/entropy`` and ``critic/score/mean`` to the
    controllers and returns the ``control/*`` metrics to log. ``state_dict``/``load_state_dict``
    go into the trainer's checkpoint. Worker-side values (the sampler's temperature, the actor's
    clip and coefficients) must reach the workers: see docs/integrations-verl.md.
    """

    def __init__(self, controllers: list[Controller], config, *, vocab_size: int,
                 dataset_size: int, max_steps: int) -> None:
        a, r = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
        knobs = Knobs(temperature=float(r.temperature), eps_high=float(
            _get(a, "clip_ratio_high", _get(a, "clip_ratio", 0.2))),
            entropy_coef=float(_get(a, "entropy_coeff", 0.0)),
            kl_coef=float(_get(a, "kl_loss_coef", 0.0)), n_samples=int(r.n),
            max_response_len=int(_get(config.data, "max_response_length", 0)))
        table = VERL_KNOB_TABLE
        if not _get(a, "use_kl_loss", False):
            table = KnobTable("verl", {k: v for k, v in table.reads.items() if k != "kl_coef"},
                              {**table.refused, "kl_coef": "actor.use_kl_loss is false: verl "
                               "adds no KL loss to weight"})
        self.driver = ControlDriver(controllers, knobs, table, vocab_size=vocab_size,
                                    dataset_size=dataset_size,
                                    prompts_per_step=int(config.data.train_batch_size),
                                    lag_update=False)
        self.driver.setup(max_steps)

    def apply(self, config, knobs: Knobs) -> None:
        """Write the owned knobs into ``config`` (an OmegaConf tree or objects)."""
        owned = {a for c in self.driver.controllers for a in c.actuators}
        for knob, path in KNOB_PATHS.items():
            if knob in owned:
                node = config
                for key in path[:-1]:
                    node = node[key] if hasattr(node, "__getitem__") else getattr(node, key)
                node[path[-1]] = float(getattr(knobs, knob))

    def begin_step(self, config) -> Knobs:
        knobs = self.driver.begin_step()
        self.apply(config, knobs)
        return knobs

    def before_update(self, config, entropy: float) -> Knobs:
        knobs = self.driver.before_update(entropy)
        self.apply(config, knobs)
        return knobs

    def end_step(self, metrics: dict[str, Any]) -> dict[str, float]:
        self.driver.end_step(float(metrics["actor/entropy"]),
                             float(metrics.get("critic/score/mean", float("nan"))))
        k = self.driver.knobs
        return {**self.driver.metrics, "control/temperature": k.temperature,
                "control/eps_high": k.eps_high, "control/entropy_coef": k.entropy_coef}

    def state_dict(self) -> dict[str, Any]:
        return self.driver.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.driver.load_state_dict(state)
