"""The training loop: setup, one step in numbered sections (CleanRL's shape), the loop, saving.

Each phase lives in a module beside this one: 0. knobs (``control``), 1–2. sample and score
(``collect``, ``rollout.two_stage``), 3. ``advantages``, 4. ``update``, 5. controllers,
6. log (``metrics``, ``eval.validate``). Data parallelism is a few explicit ``distributed``
calls. docs/architecture.md has the data flow and where each concept lives.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import numpy as np
import torch

from explorl import adapters, files, models, validation
from explorl import config as C
from explorl.analysis.plots import plot_run_safely
from explorl.control import Knobs, bank_from_config
from explorl.control.registry import controller_writes
from explorl.data.order import DataOrder
from explorl.data.sources import in_memory, load_split
from explorl.eval.validate import validate
from explorl.outputs.completions import training_completions
from explorl.outputs.record import RunOutputs
from explorl.outputs.runlog import ProgressBar, json_default
from explorl.rewards.pool import VerifierPool
from explorl.rewards.rewarder import Rewarder
from explorl.rollout.base import build_engine, pop_metrics
from explorl.rollout.two_stage import make_sampler
from explorl.tools.formats import prompt_schemas
from explorl.training import async_rollouts, sampling
from explorl.training import plan as device_plan
from explorl.training import state as run_state
from explorl.training.advantages import step_advantages
from explorl.training.batch import step_stats
from explorl.training.distributed import LogProbModule, make_dist
from explorl.training.history import ResumeRecord, save_config
from explorl.training.metrics import TIME_KEYS, batch_metrics, loss_metrics, ordered, timed
from explorl.training.optim import make_optimizer
from explorl.training.preemption import StopRequests, checkpoint_on_stop, stop_on_signals
from explorl.training.update import PolicyUpdate
from explorl.training.watch import RunWatch

__all__ = ["TIME_KEYS", "Trainer"]


class Trainer:
    """GRPO-family trainer for a local HF causal LM, with pluggable exploration controllers."""

    def __init__(self, cfg: C.RunConfig, out_dir: str | Path, *, resume: bool = False,
                 engine=None, train_data=None, val_data=None, allow_changes: bool = False):
        self.cfg = cfg = validation.validate(cfg)
        # First: under a launcher this joins the process group, so no rank writes into the run
        # directory while another one is still checking or clearing it (``--force``).
        self.dist = make_dist(cfg.dist.strategy, cfg.model.device)
        if cfg.data.prompts_per_step < self.dist.world_size:
            raise C.ConfigError(f"data.prompts_per_step={cfg.data.prompts_per_step} < "
                                f"{self.dist.world_size} processes: every rank needs a prompt")
        self.out = Path(out_dir)
        # A resume: its checkpoint, and what it changes (another experiment needs allow_changes).
        resumed = ResumeRecord(self.out, cfg, allow_changes=allow_changes) if resume else None
        ckpt = resumed.ckpt if resumed else None
        self.out.mkdir(parents=True, exist_ok=True)
        for seed in (random.seed, np.random.seed, torch.manual_seed):
            seed(cfg.seed)
        self.device = self.dist.device
        self._setup_data(train_data, val_data)
        self._setup_model(ckpt)
        self._setup_optimizer()
        self._setup_rollout(engine)
        self.control = bank_from_config(cfg, vocab_size=self.vocab_size,
                                        dataset_size=len(self.train_data))
        self.step, self.watch = 0, RunWatch(cfg)  # non-finite steps, collapse, failing rewards
        self.rollouts = async_rollouts.for_trainer(self)  # rollout.async: None when off
        if ckpt is not None:
            run_state.restore(self, ckpt)
        if self.dist.is_main:
            (self.out / "plots").mkdir(exist_ok=True)
            save_config(self.out, self.cfg, self.plan.lines(), resumed, self.step)  # + changes
            print("\n".join(self.plan.lines()), flush=True)
        self.pool = VerifierPool.from_config(cfg.reward)
        # metrics.jsonl, completions.jsonl and the trackers hold global values: rank 0 writes.
        main = self.dist.is_main
        self.outputs = RunOutputs(cfg, self.out, resume=resume, step=self.step) if main else None
        self._stop = False  # the ranks stop after this step (a signal; tests set it too)
        self.stops = StopRequests(cfg.log.checkpoint_every_minutes, cfg.log.checkpoint_every)

    def _setup_data(self, train_data=None, val_data=None) -> None:
        """Rows in memory (a ``datasets.Dataset``, dicts, records) replace data.train / data.val."""
        cfg, d = self.cfg, self.cfg.data
        train = (load_split(d.train, cfg, "train") if train_data is None
                 else in_memory(train_data, cfg))
        self.train_data = train[: d.max_train_prompts]
        self.val_data = (load_split(d.val or d.train, cfg, "train" if d.val else "val")
                         if val_data is None else in_memory(val_data, cfg))
        self.anneal_data = load_split(d.anneal, cfg, "train") if d.anneal else None
        mem = ["<in-memory rows>"]  # not a lab spec: ``auto`` verifies them with ``math``
        specs = (d.train if train_data is None else mem) + (d.val if val_data is None else mem)
        self.rewarder = Rewarder(cfg.reward, specs + d.anneal)
        self.order = DataOrder(len(self.train_data), d.prompts_per_step, cfg.seed, d.shuffle)
        self.anneal_order = (DataOrder(len(self.anneal_data), d.prompts_per_step, cfg.seed + 7,
                                       d.shuffle) if self.anneal_data else None)

    def _setup_model(self, ckpt: Path | None) -> None:
        cfg = self.cfg
        self.base_path = base_path = models.resolve_model_path(cfg.model.path, cfg.lab)
        self.tokenizer = tok = models.load_tokenizer(base_path, cfg.model)
        self.prompts = models.PromptTokens(self.tokenizer, cfg.model.use_chat_template,  # + tools
                                    cfg.data.max_prompt_len, prompt_schemas(cfg.rollout, tok))
        self.prompts.check(train=self.train_data, val=self.val_data[: cfg.eval.max_problems],
                           anneal=self.anneal_data or [])  # every prompt fits, before the model
        self.policy = adapters.load_policy(base_path, ckpt, cfg.model, self.device)  # model.lora
        self.vocab_size = self.policy.get_output_embeddings().weight.shape[0]
        self.n_params, self.n_trainable = adapters.parameter_counts(self.policy)
        # The loss's forward as a module, wrapped by DDP/FSDP under a launcher (itself at N = 1).
        self.amp = lambda: models.autocast(cfg.model, self.device)  # forwards in the compute dtype
        self.compiled = models.regional_compile(self.policy, cfg.model, self.dist.strategy)
        self.scorer = self.dist.wrap(LogProbModule(self.policy, self.amp, self.compiled,
                                                 cfg.algorithm.fused_logprobs))
        models.warm_up(self.compiled, self.scorer, self.vocab_size, self.device)
        # The reference (a full copy of the weights; LoRA: the policy with adapters off) if needed.
        needs_ref = cfg.algorithm.kl_coef > 0 or any(
            "kl_coef" in knobs for knobs in controller_writes(cfg.control).values())
        self.ref = None if not needs_ref else (
            self.dist.full_model(self.scorer, -1) if cfg.model.lora.enabled
            else models.load_model(base_path, cfg.model, self.device, frozen=True))

    def _setup_optimizer(self) -> None:
        cfg = self.cfg
        self.optimizer, self.scheduler = make_optimizer(cfg.optim, self.scorer, self.device,
                                                        self.dist.strategy)
        gen_device = self.device if self.device.type == "cuda" else torch.device("cpu")
        # Sampling needs no generator: its draws are seeded per prompt (rollout/seeding.py).
        self.generators = {"loss": torch.Generator(gen_device).manual_seed(cfg.seed + 1),
                           "shuffle": torch.Generator().manual_seed(cfg.seed + 2)}

    def _setup_rollout(self, engine) -> None:
        cfg = self.cfg
        dtype = models.resolve_dtype(cfg.model.dtype, self.device)
        engine = engine or build_engine(cfg, self.tokenizer, self.base_path, dtype, self.device)
        # Micro-batch sizes (CUDA: a token budget) and the old-log-prob source (training/plan.py).
        self.plan = device_plan.plan_for(cfg, self.device, self.policy, self.dist, engine,
                                         prompt_len=self.prompts.longest)
        self.cfg = cfg = device_plan.apply(cfg, self.plan)
        pad = getattr(engine, "pad_id", 0)  # sampling strategy: EEPO, ARPO or one stage
        self.sampler = make_sampler(engine, cfg, pad_id=pad, vocab_size=self.vocab_size)
        self.update = PolicyUpdate(cfg, self.scorer, self.optimizer, self.scheduler, self.ref,
                                   self.dist, self.generators["loss"], self.generators["shuffle"],
                                   pad, amp=self.amp,
                                   old_logp_from_forward=self.plan.old_logp == "update")
        self.recompute = self.plan.old_logp == "recompute"

    def state_dict(self) -> dict:
        return run_state.state_of(self)

    def save(self) -> Path:
        """Write ``checkpoints/step-N`` (rank 0; never from non-finite weights)."""
        return self.stops.saved(run_state.save(self))  # the checkpoint timer starts again

    @property
    def knobs(self) -> Knobs:
        return self.control.knobs

    @property
    def engine(self):
        """The rollout engine (training samples go through ``self.sampler``, which wraps it)."""
        return self.sampler.engine

    @engine.setter
    def engine(self, engine) -> None:
        self.sampler.engine = engine

    def _policy_now(self) -> torch.nn.Module:
        """The policy with its current full weights: sampling, validation and checkpoints use it."""
        return self.dist.full_model(self.scorer, version=self.scheduler.last_epoch)

    def validate(self) -> dict:
        e = self.cfg.eval
        data = self.val_data[: e.max_problems]
        if self.rollouts is not None:  # a thread worker's engine is the trainer's
            self.rollouts.release_engine()
        T = e.temperature if e.temperature is not None else self.knobs.temperature
        samples: list = []  # this rank's responses, for completions.jsonl
        with self.amp():
            out = validate(engine=self.engine, policy=self._policy_now(), pool=self.pool,
                           rewarder=self.rewarder, data=data, n_samples=e.n_samples, ks=e.k,
                           prompt_ids=self.prompts.ids_of(self.val_data, "val"), temperature=T,
                           max_new_tokens=self.knobs.max_response_len, seed=self.cfg.seed,
                           step=self.step, greedy=e.greedy, dist=self.dist, samples=samples)
        if self.outputs is not None:
            self.outputs.log_completions(samples, self.step, "val")
        return out

    def train_step(self) -> dict:
        cfg, step, metrics = self.cfg, self.step + 1, {}
        t_start, cpu_start = time.perf_counter(), time.process_time()
        # 0. knobs and prompts  1. sample  2. score (``sb``: the whole batch's statistics); under
        # rollout.async the worker did them while the previous steps trained
        if self.rollouts is None:
            draw = sampling.draw(self, step, metrics)
            got = sampling.sample(self, step, draw, self._policy_now(), self.scheduler.last_epoch)
        else:
            draw, got = self.rollouts.next(step, metrics)
        knobs, data, sb, rows = draw.knobs, draw.data, got.batch, got.batch.rows
        metrics.update(got.metrics)
        if self.outputs is not None and self.outputs.completions_due(step):
            self.outputs.log_completions(training_completions(step, got, data), step, "train")
        if self.recompute:  # old log-probs and entropy from the trainer's own forward (π_prox)
            keep = async_rollouts.sampling_entropy(self.rollouts, sb)  # rollout.async: §8
            with timed(metrics, "time/old_logp_s"), keep:
                got.rollouts, rm = self.update.recompute(got.rollouts, sb, knobs.temperature)
            metrics.update(rm)

        # 3. advantages over the global batch (groups = prompts, never split across ranks), shaping
        self.update.reward_kl(got.rollouts, sb, knobs.temperature)  # kl_in_reward only (§7c)
        adv, am = step_advantages(cfg.algorithm, sb, got.rollouts, self.dist, knobs.kl_coef)
        metrics.update(am)

        # 4. update (skipped, weights untouched, when the loss or a gradient is not finite), with
        # loss-side knobs set from the step's global statistics (the policy's own entropy)
        stats = step_stats(step, cfg.max_steps, sb)
        with timed(metrics, "time/control_s"):
            metrics.update(self.control.before_update(stats, draw.knobs))
        knobs = self.control.for_batch(draw.knobs)
        with timed(metrics, "time/train_s"):
            self.update.step = step  # named by an out-of-memory message
            upd, sums = self.update.run(got.rollouts, adv, knobs, sb)
        # The step's one reduction: loss/token sums, stop signals, checkpoint timer (ranks agree).
        total = self.dist.sum_dict({**sums, **self.stops.flags()})
        self._stop = self.stops.merge(total) or self._stop
        metrics.update({**upd, **loss_metrics(total, len(rows.reward), cfg.optim.ppo_epochs,
                                              upd)})
        self.step = step  # a stop of the watch's below checkpoints this step's (finite) weights
        self.watch.check(step, metrics, rows.reward, stats, self.rewarder.problem)
        if self.rollouts is not None:  # the worker samples the batches queued from now on with them
            self.rollouts.push(self._policy_now(), step)

        # 5. controllers read the step's global statistics
        with timed(metrics, "time/control_s"):
            metrics.update(self.control.after_step(stats, draw.knobs))

        # 6. log (global values, the same on every rank)
        metrics.update(batch_metrics(step, sb, knobs))
        self.watch.signal.check(step, metrics, got.rollouts.texts, self.dist)  # the first steps
        if cfg.eval.every and (step % cfg.eval.every == 0 or step == cfg.max_steps):
            with timed(metrics, "time/val_s", "time/val_cpu_s"):
                metrics.update(self.validate())
        metrics.update(pop_metrics(self.engine))  # vllm: weight pushes, vLLM-vs-forward logp gap
        metrics["time/step_s"] = time.perf_counter() - t_start
        metrics["time/cpu_s"] = time.process_time() - cpu_start
        return ordered(metrics)

    def train(self) -> dict:
        """Run to ``max_steps``; a signal or a stop of the run's own ends it after a checkpoint."""
        cfg, main = self.cfg, self.dist.is_main
        bar = ProgressBar(cfg.max_steps, self.step, cfg.log, enabled=main)  # off a tty: lines
        t_run, last, ckpt = time.perf_counter(), {}, None
        try:
            with stop_on_signals(self.stops, bar.log), checkpoint_on_stop(self):
                if self.step == 0 and cfg.eval.every and cfg.eval.before_training:  # pre-RL point
                    self._log({"step": 0, **self.validate()}, bar)
                while self.step < cfg.max_steps and not self._stop:
                    last = self._log(self.train_step(), bar)
                    if "val/accuracy" in last:
                        self.plot()
                    if self.stops.checkpoint_due(self.step):
                        ckpt = self.save()
                ckpt = ckpt if ckpt and ckpt.name == f"step-{self.step}" else self.save()
        finally:
            if self.rollouts is not None:
                self.rollouts.close()
            getattr(self.engine, "close_tools", lambda: None)()  # tool workers (restart on use)
            bar.close()
            if self.outputs is not None:
                self.outputs.close()
            self.pool.close()
        self.plot()
        summary = {"steps": self.step, "max_steps": cfg.max_steps, "n_params": self.n_params,
                   "interrupted": self._stop and self.step < cfg.max_steps,
                   "stopped_by": self.stops.agreed, "seconds": time.perf_counter() - t_run,
                   "checkpoint": str(ckpt), "final": last, "trainable_params": self.n_trainable,
                   "processes": self.dist.world_size}
        if main:  # atomic: a study reads it as the run's "finished" mark
            files.write_text_atomic(self.out / "summary.json",
                                    json.dumps(summary, indent=2, default=json_default))
        return summary

    def _log(self, metrics: dict, bar: ProgressBar) -> dict:
        if self.outputs is not None:
            self.outputs.log(metrics)
        bar.update(self.step, metrics)
        return metrics

    def plot(self) -> None:
        if self.dist.is_main and self.cfg.log.plots:
            plot_run_safely(self.out)
