"""The training loop: sample → score → advantages → update → controllers → log.

Everything a method changes lives elsewhere: the math in ``explorl.algorithms``, the between-step
mechanisms in ``explorl.control`` (reached through ``before_step``/``after_step`` hooks and the
``Knobs`` they set), sampling in ``explorl.rollout``, verification in ``explorl.rewards``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from explorl import config as C
from explorl.algorithms import (
    LOSSES, aggregate, compute_advantages, covariance_by_difficulty, informative_groups,
    kl_estimate, overlong_penalty, token_covariance,
)
from explorl.checkpoint import latest_checkpoint, load_state, rng_state, save_checkpoint, set_rng_state
from explorl.control import ControlContext, Knobs, StepStats, build_controllers, sample_then_forget
from explorl.data.order import DataOrder
from explorl.data.sources import default_verifier, load_split
from explorl.eval.passk import pass_at_k
from explorl.models import load_model, load_tokenizer, render_prompt, resolve_device, resolve_model_path
from explorl.rewards import to_reward
from explorl.rewards.pool import VerifierPool
from explorl.rollout.hf import HFEngine
from explorl.rollout.scoring import response_logprobs
from explorl.rollout.types import Rollouts
from explorl.runlog import MetricsLog, ProgressBar

TIME_KEYS = ("time/", "perf/")  # wall-clock metrics: excluded from resume-equality checks


def controller_specs(cfg: C.RunConfig) -> dict[str, dict]:
    """Map the enabled controller sections of the config to constructor arguments."""
    ctl, specs = cfg.control, {}
    if ctl.temperature.enabled:
        t = ctl.temperature
        specs["temperature"] = dict(t_init=cfg.rollout.temperature, t_min=t.t_min, t_max=t.t_max,
                                    anneal=t.anneal, annealing_ratio=t.annealing_ratio, beta=t.beta)
    if ctl.budget.enabled:
        b = ctl.budget
        specs["budget"] = dict(n_min_limit=b.n_min_limit, n_max_limit=b.n_max_limit, widen=b.widen)
    if ctl.adaptive.enabled:
        a = ctl.adaptive
        specs["adaptive"] = dict(actuator=a.actuator, schedule=dataclasses.asdict(a.schedule), warmup=a.warmup,
                                 window=a.window, delta=a.delta, c0=a.init, c_min=a.min, c_max=a.max,
                                 deadband=a.deadband)
    if ctl.eepo.enabled:
        e = ctl.eepo
        specs["eepo"] = dict(window=e.window, alpha=e.alpha, lr=e.lr, eps_l=e.eps_l, eps_r=e.eps_r)
    if ctl.curriculum.enabled:
        c = ctl.curriculum
        specs["curriculum"] = dict(start_ratio=c.start_ratio, n_samples=c.n_samples,
                                   max_response_len=c.max_response_len, anneal_dataset=bool(cfg.data.anneal))
    return specs


class Trainer:
    """GRPO-family trainer for a local HF causal LM, with pluggable exploration controllers."""

    def __init__(self, cfg: C.RunConfig, out_dir: str | Path, *, resume: bool = False, engine=None):
        self.cfg = cfg = C.validate(cfg)
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "plots").mkdir(exist_ok=True)
        self._seed_everything(cfg.seed)

        ckpt = latest_checkpoint(self.out) if resume else None
        if resume and ckpt is None:
            raise FileNotFoundError(f"--resume {self.out}: no complete checkpoint under {self.out / 'checkpoints'}")
        self.device = resolve_device(cfg.model.device)
        base_path = resolve_model_path(cfg.model.path)
        policy_path = ckpt if (ckpt is not None and (ckpt / "config.json").exists()) else base_path
        self.tokenizer = load_tokenizer(base_path, cfg.model)
        self.policy = load_model(policy_path, cfg.model, self.device)
        self.vocab_size = self.policy.get_output_embeddings().weight.shape[0]
        controlled = {cfg.control.adaptive.actuator} if cfg.control.adaptive.enabled else set()
        # The reference model costs a full copy of the weights: load it only when a loss needs it.
        self.ref = (load_model(base_path, cfg.model, self.device, frozen=True)
                    if cfg.algorithm.kl_coef > 0 or "kl_coef" in controlled else None)
        self.engine = engine or HFEngine(self.tokenizer, batch_size=cfg.rollout.batch_size)

        self.train_data = load_split(cfg.data.train, cfg.lab, "train")[: cfg.data.max_train_prompts]
        self.val_data = load_split(cfg.data.val or cfg.data.train, cfg.lab, "val" if not cfg.data.val else "train")
        self.anneal_data = load_split(cfg.data.anneal, cfg.lab, "train") if cfg.data.anneal else None
        self.verifier = cfg.reward.verifier if cfg.reward.verifier != "auto" else default_verifier(cfg.data.train)
        self._prompt_cache: dict[tuple[str, int], list[int]] = {}
        self.order = DataOrder(len(self.train_data), cfg.data.prompts_per_step, cfg.seed, cfg.data.shuffle)
        self.anneal_order = (DataOrder(len(self.anneal_data), cfg.data.prompts_per_step, cfg.seed + 7,
                                       cfg.data.shuffle) if self.anneal_data else None)

        o = cfg.optim
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=o.lr, betas=(o.beta1, o.beta2),
                                           weight_decay=o.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / o.warmup_steps) if o.warmup_steps > 0 else 1.0)

        gen_device = self.device if self.device.type == "cuda" else torch.device("cpu")
        self.generators = {
            "sample": torch.Generator(gen_device).manual_seed(cfg.seed),
            "loss": torch.Generator(gen_device).manual_seed(cfg.seed + 1),
            "shuffle": torch.Generator().manual_seed(cfg.seed + 2),
        }
        a = cfg.algorithm
        self.knobs = Knobs(temperature=cfg.rollout.temperature, eps_high=a.eps_high, entropy_coef=a.entropy_coef,
                           kl_coef=a.kl_coef, n_samples=cfg.rollout.n_samples,
                           max_response_len=cfg.rollout.max_response_len)
        ctx = ControlContext(vocab_size=self.vocab_size, dataset_size=len(self.train_data), max_steps=cfg.max_steps,
                             prompts_per_step=cfg.data.prompts_per_step, n_samples=cfg.rollout.n_samples)
        self.controllers = build_controllers(controller_specs(cfg), ctx, self.knobs)
        self.eepo = cfg.control.eepo
        self.step = 0
        if ckpt is not None:
            self._load(ckpt)
        C.save(cfg, self.out / "config.yaml")
        self.pool = VerifierPool(cfg.reward.num_workers, cfg.reward.timeout_s)
        self.metrics_log = MetricsLog(self.out / "metrics.jsonl", truncate_after=self.step if resume else 0)
        self._stop = False

    # ------------------------------------------------------------------ state

    @staticmethod
    def _seed_everything(seed: int) -> None:
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)

    def state_dict(self) -> dict:
        return {
            "step": self.step,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": rng_state(self.generators),
            "data": self.order.state_dict(),
            "anneal_data": self.anneal_order.state_dict() if self.anneal_order else None,
            "knobs": dataclasses.asdict(self.knobs),
            "controllers": {c.name: c.state_dict() for c in self.controllers},
        }

    def _load(self, ckpt: Path) -> None:
        state = load_state(ckpt)
        self.step = state["step"]
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.order.load_state_dict(state["data"])
        if self.anneal_order and state.get("anneal_data"):
            self.anneal_order.load_state_dict(state["anneal_data"])
        for k, v in state["knobs"].items():
            setattr(self.knobs, k, v)
        for c in self.controllers:
            if c.name not in state["controllers"]:
                raise ValueError(f"checkpoint {ckpt} has no state for controller {c.name!r}; "
                                 "resume with the configuration the run started with")
            c.load_state_dict(state["controllers"][c.name])
        set_rng_state(state["rng"], self.generators)

    def save(self) -> Path:
        return save_checkpoint(self.out, self.step, self.policy, self.tokenizer, self.state_dict(),
                               save_model=self.cfg.log.save_model, keep=self.cfg.log.keep_checkpoints)

    # ------------------------------------------------------------------ pieces

    def _prompt_ids(self, data: list, idx: int, tag: str) -> list[int]:
        key = (tag, idx)
        if key not in self._prompt_cache:
            ids = render_prompt(self.tokenizer, data[idx].prompt, self.cfg.model.use_chat_template)
            if len(ids) > self.cfg.data.max_prompt_len:
                raise ValueError(f"{tag} prompt {idx} has {len(ids)} tokens > data.max_prompt_len="
                                 f"{self.cfg.data.max_prompt_len}")
            self._prompt_cache[key] = ids
        return self._prompt_cache[key]

    def _sample(self, prompt_ids: list[list[int]], budgets: list[int], knobs: Knobs) -> tuple[Rollouts, dict]:
        if self.eepo.enabled:
            return sample_then_forget(
                self.engine, self.policy, prompt_ids, budgets, knobs.temperature, knobs.max_response_len,
                self.generators["sample"], unlearn=knobs.unlearn, lr=self.eepo.lr, eps_l=self.eepo.eps_l,
                eps_r=self.eepo.eps_r, pad_id=self.engine.pad_id, micro_batch_size=self.cfg.optim.micro_batch_size)
        ro = self.engine.generate(self.policy, prompt_ids, budgets, knobs.temperature, knobs.max_response_len,
                                  self.generators["sample"])
        return ro, {}

    def _score(self, ro: Rollouts, truths: list[str]) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """Verifier scores in {0, 1} and shaped rewards, both (N,)."""
        res = self.pool.score(self.verifier, ro.texts, truths)
        scores = torch.tensor(res.scores, dtype=torch.float32)
        rewards = torch.tensor([to_reward(s, self.cfg.reward.convention) for s in res.scores])
        rc = self.cfg.reward
        if rc.overlong_buffer > 0:
            rewards = rewards + overlong_penalty(ro.lengths.cpu(), self.knobs.max_response_len,
                                                 rc.overlong_buffer, rc.overlong_penalty)
        return scores, rewards, {"reward/verify_timeouts": float(res.timeouts), "reward/verify_errors": float(res.errors)}

    def _rollout(self, knobs: Knobs, batch: tuple[list[int], int, bool]) -> tuple[Rollouts, torch.Tensor, torch.Tensor, dict]:
        """# 1. sample and # 2. score, with DAPO dynamic sampling rounds when enabled.

        Returns the kept rollouts (prompt_index = position in ``prompts``), scores, rewards, the
        dataset indices of all prompts sampled this step, the epochs flags and metrics.
        """
        a = self.cfg.algorithm
        use_anneal = knobs.dataset == "anneal" and self.anneal_order is not None
        data, order, tag = ((self.anneal_data, self.anneal_order, "anneal") if use_anneal
                            else (self.train_data, self.order, "train"))
        B = self.cfg.data.prompts_per_step
        kept: list[tuple[Rollouts, torch.Tensor, torch.Tensor]] = []
        all_idx, all_scores, all_counts = [], [], []
        metrics: dict = {}
        n_kept_groups, n_groups_total, rounds, epoch_end, epoch = 0, 0, 0, False, 0
        t_gen = t_score = 0.0
        while rounds < (a.max_gen_rounds if a.dynamic_sampling else 1) and n_kept_groups < B:
            if rounds == 0:
                idx, epoch, end = batch
            else:
                idx, _, end = order.next_batch()
            epoch_end |= end
            rounds += 1
            budgets = knobs.budgets_for(len(idx)) if rounds == 1 else [knobs.n_samples] * len(idx)
            t0 = time.perf_counter()
            ro, m = self._sample([self._prompt_ids(data, i, tag) for i in idx], budgets, knobs)
            t_gen += time.perf_counter() - t0
            for k, v in m.items():
                metrics[k] = metrics.get(k, 0.0) + v / max(1, a.max_gen_rounds if a.dynamic_sampling else 1)
            t0 = time.perf_counter()
            pi = ro.prompt_index.cpu()
            scores, rewards, sm = self._score(ro, [data[idx[i]].ground_truth for i in pi.tolist()])
            t_score += time.perf_counter() - t0
            for k, v in sm.items():
                metrics[k] = metrics.get(k, 0.0) + v
            counts = torch.bincount(pi, minlength=len(idx))
            correct = torch.zeros(len(idx)).index_add_(0, pi, scores)
            all_scores.append(scores)
            ro.prompt_index = ro.prompt_index + len(all_idx)  # positions among all sampled prompts
            all_idx += idx
            all_counts.append((counts, correct))
            n_groups_total += len(idx)
            if a.dynamic_sampling:
                keep = informative_groups(rewards, pi)
                keep_groups = sorted(set(pi[keep].tolist()))[: B - n_kept_groups]
                rows = torch.isin(pi, torch.as_tensor(keep_groups, dtype=torch.long)).nonzero().squeeze(-1)
                n_kept_groups += len(keep_groups)
                if len(rows):
                    kept.append((ro.select(rows), scores[rows], rewards[rows]))
            else:
                kept.append((ro, scores, rewards))
                n_kept_groups = len(idx)
        if not kept:  # every group was uninformative in every round: train on nothing this step
            kept.append((ro.select([]), scores[:0], rewards[:0]))
        ro = Rollouts.concat([k[0] for k in kept], self.engine.pad_id) if len(kept) > 1 else kept[0][0]
        scores = torch.cat([k[1] for k in kept])
        rewards = torch.cat([k[2] for k in kept])
        counts = torch.cat([c for c, _ in all_counts])
        correct = torch.cat([c for _, c in all_counts])
        metrics.update({
            "rollout/gen_rounds": float(rounds),
            "rollout/filtered_frac": 1.0 - n_kept_groups / max(1, n_groups_total) if a.dynamic_sampling else 0.0,
            "rollout/all_wrong_frac": float((correct == 0).float().mean()),
            "rollout/all_correct_frac": float((correct == counts).float().mean()),
            "time/generate_s": t_gen, "time/score_s": t_score,
        })
        self._step_prompts = (all_idx, correct.tolist(), counts.tolist(), epoch, epoch_end)
        return ro, scores, rewards, metrics

    def _update(self, ro: Rollouts, adv: torch.Tensor, knobs: Knobs) -> dict:
        """# 4. update: PPO epochs × mini-batches, gradient accumulation over micro-batches."""
        cfg, a, o = self.cfg, self.cfg.algorithm, self.cfg.optim
        N = len(ro)
        if N == 0:
            return {"loss/policy": 0.0, "loss/clip_frac": 0.0, "grad/norm": 0.0, "train/optimizer_steps": 0.0}
        loss_fn = LOSSES[a.loss]
        lcfg = SimpleNamespace(**{**dataclasses.asdict(a), "eps_high": knobs.eps_high})
        need_entropy = knobs.entropy_coef > 0
        max_len = a.agg_max_len or cfg.rollout.max_response_len
        n_mb = min(o.mini_batches, N)
        sums: dict[str, torch.Tensor] = {}
        tok_total = torch.zeros(())
        n_opt, policy_loss_sum, grad_norm_sum = 0, torch.zeros(()), torch.zeros(())
        adv = adv.to(self.device)
        self.policy.train()
        for _ in range(o.ppo_epochs):
            order = (torch.randperm(N, generator=self.generators["shuffle"]) if n_mb > 1 or o.ppo_epochs > 1
                     else torch.arange(N))
            for mb in order.tensor_split(n_mb):
                mb_mask = ro.response_mask[mb]
                tok_denom = mb_mask.sum().clamp_min(1)
                seq_denom = len(mb)
                self.optimizer.zero_grad(set_to_none=True)
                mb_policy = torch.zeros(())
                for micro in mb.split(o.micro_batch_size):
                    sub = ro.select(micro)
                    mask = sub.response_mask
                    logp, ent = response_logprobs(self.policy, sub.prompt_ids, sub.prompt_mask, sub.response_ids,
                                                  mask, knobs.temperature, chunk_size=a.logprob_chunk,
                                                  with_entropy=need_entropy)
                    per_tok, m = loss_fn(logp, sub.old_logp, adv[micro], mask, lcfg,
                                         generator=self.generators["loss"])
                    agg = dict(token_denom=tok_denom, seq_denom=seq_denom, max_len=max_len)
                    pg = aggregate(per_tok, mask, a.agg, **agg)
                    loss = pg
                    if need_entropy:
                        bonus = aggregate(ent, mask, a.agg, **agg)
                        loss = loss - knobs.entropy_coef * bonus
                        sums["loss/entropy_bonus"] = sums.get("loss/entropy_bonus", 0) + bonus.detach() * seq_denom
                    if knobs.kl_coef > 0 and self.ref is not None:
                        with torch.no_grad():
                            ref_logp, _ = response_logprobs(self.ref, sub.prompt_ids, sub.prompt_mask,
                                                            sub.response_ids, mask, knobs.temperature,
                                                            chunk_size=a.logprob_chunk, with_entropy=False)
                        kl = kl_estimate(logp, ref_logp, a.kl_estimator) * mask
                        loss = loss + knobs.kl_coef * aggregate(kl, mask, a.agg, **agg)
                        sums["kl/ref_mean"] = sums.get("kl/ref_mean", 0) + kl.detach().sum()
                    loss.backward()
                    n_tok = mask.sum()
                    tok_total += n_tok
                    for k, v in m.items():
                        if k != "cov/mean":  # logged once per step from the whole batch instead
                            sums[k] = sums.get(k, 0) + v.detach().float() * n_tok
                    mb_policy += pg.detach()
                gn = (torch.nn.utils.clip_grad_norm_(self.policy.parameters(), o.max_grad_norm)
                      if o.max_grad_norm > 0 else _grad_norm(self.policy))
                self.optimizer.step()
                self.scheduler.step()
                n_opt += 1
                policy_loss_sum += mb_policy
                grad_norm_sum += gn.detach().float()
        self.optimizer.zero_grad(set_to_none=True)
        out = {k: float(v / tok_total.clamp_min(1)) for k, v in sums.items()
               if k not in ("loss/entropy_bonus",)}
        if "loss/entropy_bonus" in sums:  # seq-weighted sum of per-mini-batch aggregates → mean aggregate
            out["loss/entropy_bonus"] = float(sums["loss/entropy_bonus"] / (N * o.ppo_epochs))
        out["loss/policy"] = float(policy_loss_sum / n_opt)
        out["grad/norm"] = float(grad_norm_sum / n_opt)
        out["train/optimizer_steps"] = float(n_opt)
        out["train/lr"] = float(self.scheduler.get_last_lr()[0])
        return out

    @torch.no_grad()
    def validate(self) -> dict:
        """Sampled accuracy and pass@k at the training temperature, plus greedy accuracy."""
        e = self.cfg.eval
        data = self.val_data[: e.max_problems]
        if not data:
            return {}
        ids = [self._prompt_ids(self.val_data, i, "val") for i in range(len(data))]
        T = e.temperature if e.temperature is not None else self.knobs.temperature
        ro = self.engine.generate(self.policy, ids, [e.n_samples] * len(ids), T, self.knobs.max_response_len,
                                  self.generators["sample"])
        pi = ro.prompt_index.cpu()
        scores = torch.tensor(self.pool.score(self.verifier, ro.texts, [data[i].ground_truth for i in pi]).scores)
        correct = torch.zeros(len(ids)).index_add_(0, pi, scores)
        out = {"val/accuracy": float(scores.mean()),
               "val/entropy": float((ro.entropy * ro.response_mask).sum() / ro.response_mask.sum().clamp_min(1))}
        for k in e.k:
            out[f"val/pass@{k}"] = float(np.mean([pass_at_k(e.n_samples, int(c), k) for c in correct.tolist()]))
        if e.greedy:
            g = self.engine.generate(self.policy, ids, [1] * len(ids), 0.0, self.knobs.max_response_len)
            gs = self.pool.score(self.verifier, g.texts, [d.ground_truth for d in data]).scores
            out["val/greedy_accuracy"] = float(np.mean(gs))
        return out

    # ------------------------------------------------------------------ loop

    def train_step(self) -> dict:
        cfg, knobs = self.cfg, self.knobs
        t_start = time.perf_counter()
        step = self.step + 1
        metrics: dict = {}
        t0 = time.perf_counter()
        for c in self.controllers:  # 5a. controllers set this step's knobs (the dataset first)
            metrics.update(c.before_batch(step, knobs))
        batch = (self.anneal_order if knobs.dataset == "anneal" and self.anneal_order else self.order).next_batch()
        for c in self.controllers:
            metrics.update(c.before_step(step, knobs, batch[0]))
        t_control = time.perf_counter() - t0

        # 1. sample  2. score
        ro, scores, rewards, rm = self._rollout(knobs, batch)
        metrics.update(rm)
        mask = ro.response_mask
        n_tok = mask.sum().clamp_min(1)

        # 3. advantages (groups = prompts; sizes may differ under dynamic budgets)
        group = ro.prompt_index.cpu()
        adv, am = compute_advantages(cfg.algorithm.advantage, rewards, group, eps=cfg.algorithm.adv_eps)
        metrics.update({k: float(v) for k, v in am.items()})
        # Covariance diagnostics on the sampling pass's log-probs (= the policy's, before the update).
        acc_by_group = torch.zeros(int(group.max()) + 1 if len(group) else 0).index_add_(0, group, scores)
        size_by_group = torch.bincount(group, minlength=len(acc_by_group)).clamp_min(1)
        group_acc = (acc_by_group / size_by_group)[group] if len(group) else scores
        cov = token_covariance(ro.old_logp.cpu(), adv, mask.cpu())
        metrics["cov/mean"] = float(cov.sum() / n_tok.cpu())
        metrics.update({k: float(v) for k, v in covariance_by_difficulty(cov, mask.cpu(), group_acc).items()})

        # 4. update
        t0 = time.perf_counter()
        metrics.update(self._update(ro, adv, knobs))
        metrics["time/train_s"] = time.perf_counter() - t0
        self.step = step

        # 5b. controllers read the step's global statistics
        entropy = float((ro.entropy * mask).sum() / n_tok)
        idx, correct, counts, epoch, epoch_end = self._step_prompts
        stats = StepStats(step=step, max_steps=cfg.max_steps, entropy=entropy, prompt_indices=idx,
                          prompt_correct=correct, prompt_samples=counts, epoch=epoch, epoch_end=epoch_end)
        used = dataclasses.replace(knobs)
        t0 = time.perf_counter()
        for c in self.controllers:
            metrics.update(c.after_step(stats, knobs))
        metrics["time/control_s"] = t_control + time.perf_counter() - t0

        # 6. log
        lengths = ro.lengths.float()
        metrics.update({
            "step": step,
            "epoch": epoch,
            "reward/mean": float(rewards.mean()) if len(rewards) else 0.0,
            "reward/std": float(rewards.std(unbiased=False)) if len(rewards) else 0.0,
            "reward/accuracy": float(scores.mean()) if len(scores) else 0.0,
            "entropy/mean": entropy,
            "response/length_mean": float(lengths.mean()) if len(lengths) else 0.0,
            "response/length_max": float(lengths.max()) if len(lengths) else 0.0,
            "response/truncated_frac": float(ro.truncated.float().mean()) if ro.truncated is not None and len(ro) else 0.0,
            "rollout/n_samples": float(sum(counts)),
            "rollout/n_trained": float(len(ro)),
            "control/temperature": used.temperature,
            "control/eps_high": used.eps_high,
            "control/entropy_coef": used.entropy_coef,
            "control/kl_coef": used.kl_coef,
        })
        if cfg.eval.every and (step % cfg.eval.every == 0 or step == cfg.max_steps):
            t0 = time.perf_counter()
            metrics.update(self.validate())
            metrics["time/val_s"] = time.perf_counter() - t0
        metrics["time/step_s"] = time.perf_counter() - t_start
        return dict(sorted(metrics.items(), key=lambda kv: (kv[0] != "step", kv[0])))

    def train(self) -> dict:
        """Run to ``max_steps``; Ctrl-C finishes the current step, checkpoints and returns."""
        cfg = self.cfg
        bar = ProgressBar(cfg.max_steps, self.step, enabled=cfg.log.progress)
        previous = signal.getsignal(signal.SIGINT)

        def on_sigint(signum, frame):
            if self._stop:  # second Ctrl-C: stop now
                raise KeyboardInterrupt
            self._stop = True
            bar.log("[yellow]interrupt: finishing this step, then writing a checkpoint (Ctrl-C again to abort)")

        signal.signal(signal.SIGINT, on_sigint)
        t_run = time.perf_counter()
        last: dict = {}
        try:
            while self.step < cfg.max_steps and not self._stop:
                last = self.train_step()
                self.metrics_log.write(last)
                bar.update(self.step, last)
                if "val/accuracy" in last and cfg.log.plots:
                    self.plot()
                if cfg.log.checkpoint_every and self.step % cfg.log.checkpoint_every == 0:
                    self.save()
            ckpt = self.save()
        finally:
            signal.signal(signal.SIGINT, previous)
            bar.close()
            self.metrics_log.close()
            self.pool.close()
        if cfg.log.plots:
            self.plot()
        summary = {"steps": self.step, "max_steps": cfg.max_steps, "interrupted": self._stop and self.step < cfg.max_steps,
                   "seconds": time.perf_counter() - t_run, "checkpoint": str(ckpt), "final": last,
                   "n_params": sum(p.numel() for p in self.policy.parameters())}
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2, default=_json_default))
        return summary

    def plot(self) -> None:
        try:
            from explorl.plots import plot_training_curves
            plot_training_curves(self.out)
        except Exception as e:  # a plotting problem must never cost a training run
            print(f"warning: plotting failed: {e}")


def _grad_norm(model) -> torch.Tensor:
    norms = [p.grad.detach().norm() for p in model.parameters() if p.grad is not None]
    return torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.zeros(())


def _json_default(o):
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return str(o)
