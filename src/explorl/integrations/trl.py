"""explorl's controllers and the Clip-Cov / KL-Cov losses inside TRL's ``GRPOTrainer``.

Two lines change in a TRL script (docs/integrations-trl.md)::

    trainer = ExplorlGRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...),
                                 train_dataset=ds, callbacks=[ExplorlCallback([controller])])

One *controller step* is one TRL generation round (one call of
``_generate_and_score_completions``; one optimizer step with TRL's defaults). Before the round
samples, the controllers' knobs are written where TRL reads them (``trl_knob_table``): the sampling
temperature into the transformers ``generation_config``/``generation_kwargs``, into vLLM's sampling
parameters and into the fused LM head that computes the loss's log-probs and entropy (so the
ratio, the entropy and the samples all use one temperature, as in explorl's own trainer);
``epsilon_high``, ``entropy_coef`` and ``beta`` into the trainer attributes the loss reads. After
the round's first pass through its rollouts, the mean of TRL's logged ``entropy`` over those
micro-batches (the sampling policy's entropy at the sampling temperature) and TRL's logged
``reward`` feed the controllers. Loss-side controllers (``entropy_coef``) see the previous round's
entropy: TRL measures entropy only inside the loss (the same lag as TRL's ``use_adaptive_entropy``).

Controller state is saved in each checkpoint as ``explorl_control.json`` and restored by
``resume_from_checkpoint``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

import torch
from accelerate.utils import is_peft_model
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer

from explorl.algorithms.aggregation import aggregate
from explorl.algorithms.covariance import masked_mean
from explorl.algorithms.losses import LOSSES
from explorl.config import AlgorithmConfig
from explorl.control import Controller, Knobs
from explorl.errors import ControlError
from explorl.integrations.driver import ControlDriver, KnobTable

STATE_FILE = "explorl_control.json"

TRL_LOSSES = ("clip_cov", "kl_cov")
"""explorl losses this integration adds to TRL (TRL has PPO-clip, CISPO and GSPO itself)."""

_CLIPPING_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
_EXPLORL_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")  # the aggregations we reproduce


def trl_knob_table(args, explorl_loss: str | None = None) -> KnobTable:
    """Which knobs a ``GRPOTrainer`` with ``args`` (a ``GRPOConfig``) reads; why not the rest."""
    loss = f"explorl loss {explorl_loss!r}" if explorl_loss else f"loss_type={args.loss_type!r}"
    reads = {"temperature": "generation_config / vLLM sampling params and the fused LM head "
                            "(log-probs and entropy) at the next generation round"}
    refused = {
        "budgets": "TRL samples a fixed num_generations per prompt (no per-prompt budgets)",
        "unlearn": "TRL has no two-stage sampler (EEPO's unlearning step)",
        "curriculum": "TRL's dataset, num_generations and max_completion_length are fixed",
        "pos_neg_weight": "TRL's losses have no EntroPIC confident-token term",
    }
    clips = explorl_loss in ("clip_cov", "ppo") or (
        explorl_loss is None and args.loss_type in _CLIPPING_LOSS_TYPES)
    if clips:
        reads["eps_high"] = f"GRPOTrainer.epsilon_high (upper PPO clip of {loss})"
    elif explorl_loss == "kl_cov":
        refused["eps_high"] = "KL-Cov does not clip the ratio"
    elif args.loss_type == "cispo":
        refused["eps_high"] = ("TRL's CISPO reads epsilon_high as the absolute cap of its "
                               "importance weight, not a clip width")
    else:
        refused["eps_high"] = f"{loss} has no upper clip"
    if args.use_adaptive_entropy:
        refused["entropy_coef"] = ("TRL's own adaptive entropy controller owns entropy_coef "
                                   "(use_adaptive_entropy=True); turn it off")
    else:
        reads["entropy_coef"] = "GRPOTrainer.entropy_coef (loss -= coef * mean entropy)"
    if args.beta == 0.0:
        refused["kl_coef"] = ("beta=0: TRL loads no reference model and skips the KL term; "
                              "start from beta > 0")
    else:
        reads["kl_coef"] = "GRPOTrainer.beta (loss += beta * k3 KL to the reference)"
    return KnobTable("TRL", reads, refused)


def _temperature_cell(model):
    """The closure cell holding the temperature of the fused LM head TRL added to ``model``.

    TRL's ``add_fused_lm_head`` binds the temperature into ``model.forward`` once; the cell is
    shared by every wrapper accelerate later puts around that function, so writing it changes the
    temperature of every log-prob and entropy the trainer computes from then on.
    """
    fn = getattr(model.forward, "__func__", model.forward)
    code = getattr(fn, "__code__", None)
    if code is None or "temperature" not in code.co_freevars:
        raise ControlError("the model has no TRL fused LM head with a temperature (TRL's "
                           "add_fused_lm_head changed?); explorl.integrations.trl needs TRL 1.16")
    return fn.__closure__[code.co_freevars.index("temperature")]


class ExplorlCallback(TrainerCallback):
    """Carries explorl controllers into an ``ExplorlGRPOTrainer``; sets them up at train begin.

    ``controllers``: explorl controllers (``explorl.control``), each owning its knobs.
    """

    def __init__(self, controllers: list[Controller]) -> None:
        self.controllers = list(controllers)
        self.driver: ControlDriver | None = None  # bound by the trainer
        self.trainer: ExplorlGRPOTrainer | None = None

    def bind(self, trainer: ExplorlGRPOTrainer, driver: ControlDriver) -> None:
        self.trainer, self.driver = trainer, driver

    def on_train_begin(self, args, state, control, **kwargs):
        if self.driver is None:
            raise ControlError("ExplorlCallback needs explorl.integrations.trl.ExplorlGRPOTrainer "
                               "(a plain GRPOTrainer cannot hand its knobs to a callback)")
        self.trainer._explorl_setup()


class ExplorlGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` whose knobs explorl controllers set, plus the Clip-Cov and KL-Cov losses.

    ``explorl_loss``: ``None`` (TRL's own ``loss_type``), ``clip_cov`` or ``kl_cov``. Their settings
    come from ``loss_options`` (fields of explorl's ``AlgorithmConfig``: ``clip_cov_ratio``,
    ``clip_cov_lb``, ``clip_cov_ub``, ``kl_cov_ratio``, ``kl_cov_coef``, ``kl_cov_tol``), the clip
    from TRL's ``epsilon``/``epsilon_high``, the aggregation from TRL's ``loss_type``. Token
    selection runs per micro-batch (as verl; explorl's trainer selects per mini-batch).
    """

    def __init__(self, *args, explorl_loss: str | None = None, loss_options: dict | None = None,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._explorl_loss = explorl_loss
        self._explorl_cfg = self._check_explorl_loss(explorl_loss, loss_options or {})
        callbacks = [c for c in self.callback_handler.callbacks if isinstance(c, ExplorlCallback)]
        if len(callbacks) > 1:
            raise ControlError("pass one ExplorlCallback holding all controllers")
        controllers = callbacks[0].controllers if callbacks else []
        base = self.model.get_base_model() if is_peft_model(self.model) else self.model
        self._temperature_cells = [_temperature_cell(base)]
        if self.ref_model is not None:
            self._temperature_cells.append(_temperature_cell(self.ref_model))
        knobs = Knobs(temperature=self.temperature, eps_high=self.epsilon_high,
                      entropy_coef=self.entropy_coef, kl_coef=self.beta,
                      n_samples=self.num_generations, max_response_len=self.max_completion_length)
        ds = self.train_dataset
        self._explorl = ControlDriver(
            controllers, knobs, trl_knob_table(self.args, explorl_loss),
            vocab_size=base.config.get_text_config().vocab_size,
            dataset_size=len(ds) if hasattr(ds, "__len__") else 0,
            prompts_per_step=self.args.generation_batch_size // self.num_generations,
            lag_update=True)
        if any("entropy_coef" in c.actuators for c in controllers):
            self._entropy_bonus_enabled = True  # TRL skips the bonus when it starts at 0
        if callbacks:
            callbacks[0].bind(self, self._explorl)
        self._explorl_entropies: list[float] = []

    # ------------------------------------------------------------------ checks and setup
    def _check_explorl_loss(self, name, options) -> AlgorithmConfig | None:
        if name is None:
            if options:
                raise ValueError("loss_options needs explorl_loss")
            return None
        if name not in TRL_LOSSES:
            raise ValueError(f"explorl_loss {name!r}: choose one of {list(TRL_LOSSES)} (TRL has "
                             "PPO-clip, CISPO and GSPO itself)")
        a = self.args
        unsupported = {
            "loss_type": (a.loss_type, a.loss_type not in _EXPLORL_LOSS_TYPES),
            "importance_sampling_level": (a.importance_sampling_level,
                                          a.importance_sampling_level != "token"),
            "off_policy_mask_threshold": (a.off_policy_mask_threshold,
                                          a.off_policy_mask_threshold is not None),
            "top_entropy_quantile": (a.top_entropy_quantile, a.top_entropy_quantile < 1.0),
            "delta": (a.delta, a.delta is not None),
        }
        for key, (value, bad) in unsupported.items():
            if bad:
                raise ValueError(f"explorl_loss {name!r} does not support GRPOConfig."
                                 f"{key}={value!r} (aggregations: loss_type in "
                                 f"{list(_EXPLORL_LOSS_TYPES)})")
        fields = {f.name for f in dataclasses.fields(AlgorithmConfig)}
        wrong = sorted(set(options) - fields)
        if wrong:
            raise ValueError(f"loss_options: unknown {wrong}; see explorl's AlgorithmConfig")
        return dataclasses.replace(AlgorithmConfig(), loss=name, **options)

    def _rounds(self, max_steps: int) -> int:
        """Controller steps (generation rounds) in ``max_steps`` optimizer steps."""
        micro_per_round = self.args.steps_per_generation * self.num_iterations
        micro = max_steps * self.args.gradient_accumulation_steps
        return max(1, math.ceil(micro / micro_per_round))

    def _explorl_setup(self) -> None:
        if not self._explorl.ready:
            self._explorl.setup(self._rounds(self.state.max_steps))

    # ------------------------------------------------------------------ knobs in
    def _apply_knobs(self, k: Knobs) -> None:
        """Write the knobs where TRL reads them (every one, owned or not: unowned ones keep TRL's
        configured value)."""
        t = float(k.temperature)
        self.temperature = t
        if self.use_vllm:
            self.vllm_generation.temperature = t
        else:
            self.generation_config.temperature = t
            self.generation_kwargs["temperature"] = t
        for cell in self._temperature_cells:
            cell.cell_contents = t
        self.epsilon_high, self.entropy_coef, self.beta = k.eps_high, k.entropy_coef, k.kl_coef

    def _generate_and_score_completions(self, inputs):
        if self.model.training:
            self._explorl_setup()
            knobs = self._explorl.begin_step()
            self._apply_knobs(knobs)
            self._explorl_entropies = []
            m = self._metrics["train"]
            for key, v in {**self._explorl.metrics, "control/temperature": knobs.temperature,
                           "control/eps_high": knobs.eps_high,
                           "control/entropy_coef": knobs.entropy_coef}.items():
                m[key].append(float(v))
        return super()._generate_and_score_completions(inputs)

    # ------------------------------------------------------------------ statistics out
    def _compute_loss(self, model, inputs):
        if self._explorl_loss is None:
            loss = super()._compute_loss(model, inputs)
        else:
            loss = self._explorl_compute_loss(model, inputs)
        if self.model.training:
            pos = self._step % (self.args.steps_per_generation * self.num_iterations)
            if pos < self.args.steps_per_generation:  # the round's first pass: the sampler's policy
                self._explorl_entropies.append(self._metrics["train"]["entropy"][-1])
                if pos == self.args.steps_per_generation - 1:
                    self._end_round()
        return loss

    def _end_round(self) -> None:
        entropy = sum(self._explorl_entropies) / len(self._explorl_entropies)
        rewards = self._metrics["train"]["reward"]
        reward = rewards[-1] if rewards else math.nan
        for key, v in self._explorl.end_step(entropy, reward).items():
            self._metrics["train"][key].append(float(v))

    # ------------------------------------------------------------------ checkpoints
    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self.args.should_save and self._explorl.ready:
            folder = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            path = os.path.join(self._get_output_dir(trial=trial), folder, STATE_FILE)
            with open(path, "w") as f:
                json.dump(self._explorl.state_dict(), f)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        path = os.path.join(checkpoint, STATE_FILE)
        if not os.path.exists(path):
            if self._explorl.controllers:
                raise ControlError(f"{checkpoint} has no {STATE_FILE}: it was not written by a run "
                                   "with these explorl controllers")
            return
        self._explorl_setup()
        with open(path) as f:
            self._explorl.load_state_dict(json.load(f))
        self._apply_knobs(self._explorl.knobs)

    # ------------------------------------------------------------------ Clip-Cov / KL-Cov
    def _explorl_compute_loss(self, model, inputs):
        """TRL's ``_compute_loss`` with explorl's per-token loss (``algorithms.losses``) in place of
        PPO-clip; importance-sampling correction, KL, aggregation and entropy bonus as TRL's."""
        completion_ids, mask = inputs["completion_ids"], inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        logp, entropies, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True)
        old = inputs.get("old_per_token_logps")
        old = logp.detach() if old is None else old
        cfg = dataclasses.replace(self._explorl_cfg, eps_low=self.epsilon_low,
                                  eps_high=self.epsilon_high)
        valid = mask.bool()  # (B, T)
        per_token, metrics = LOSSES[self._explorl_loss](logp, old, inputs["advantages"], valid, cfg)
        if self.use_vllm and self.vllm_importance_sampling_correction:
            per_token = per_token * inputs["importance_sampling_ratio"]
        mode = "train" if self.model.training else "eval"
        if self.beta != 0.0:
            delta = inputs["ref_per_token_logps"] - logp
            per_token_kl = torch.exp(delta) - delta - 1  # k3, as TRL
            per_token = per_token + self.beta * per_token_kl
            self._metrics[mode]["kl"].append(self._global_mean(per_token_kl, valid))
        accum = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        rows = per_token.size(0)
        if self.loss_type == "grpo":
            loss = aggregate(per_token, valid, "seq-mean-token-mean", seq_denom=rows) / accum
        elif self.loss_type == "bnpo":
            loss = aggregate(per_token, valid, "token-mean") / accum
        elif self.loss_type == "dr_grpo":
            loss = aggregate(per_token, valid, "seq-mean-token-sum-norm", seq_denom=rows,
                             max_len=self.max_completion_length) / accum
        else:  # dapo: tokens of the whole generation batch, as TRL
            denom = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
            if mode == "train":
                accum = self.current_gradient_accumulation_steps
                denom = denom * accum / self.args.steps_per_generation
            loss = aggregate(per_token, valid, "token-mean", token_denom=denom)
        if self._entropy_bonus_enabled:
            loss = loss - self.entropy_coef * masked_mean(entropies, valid) / accum
        self._metrics[mode]["entropy"].append(self._global_mean(entropies, valid))
        for key, v in metrics.items():
            self._metrics[mode][key].append(float(v))
        return loss

    def _global_mean(self, x, valid) -> float:
        totals = torch.stack([torch.where(valid, x, 0).sum(), valid.sum().float()])
        totals = self.accelerator.reduce(totals.detach().float(), reduction="sum")
        return (totals[0] / totals[1].clamp(min=1.0)).item()
