"""The training loop: sample → score → advantages → update → controllers → log.

Everything a method changes lives elsewhere: the math in ``explorl.algorithms``, the between-step
mechanisms in ``explorl.control`` (reached through ``before_step``/``after_step`` hooks and the
``Knobs`` they set), sampling in ``explorl.rollout``, verification in ``explorl.rewards``.

Data parallelism (``explorl.dist``, README "Scaling out"): with N processes each rank samples and
scores a contiguous share of the step's prompts (a prompt's group is never split), and one
all-gather per generation round gives every rank the per-response statistics of the whole batch
(``StepBatch``). From them every rank computes the same advantages, loss denominators, controller
statistics and metrics as one process would; each rank back-propagates its responses' share of
the global loss and DDP (or FSDP) sums the gradients. At N = 1 the same code runs with no-op
collectives. Sampling draws depend on (seed, step, prompt position, sample index) only
(``explorl.rollout.seeding``), so the responses do not depend on N either.
"""

from __future__ import annotations

import contextlib
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
    LOSSES, aggregate, compute_advantages, informative_groups, kl_estimate, overlong_penalty,
)
from explorl.algorithms.losses import SELECTORS
from explorl.checkpoint import latest_checkpoint, load_state, rng_state, save_checkpoint, set_rng_state
from explorl.control import ControlContext, Knobs, StepStats, build_controllers, sample_then_forget
from explorl.data.order import DataOrder
from explorl.data.sources import default_verifier, load_split
from explorl.dist import LogProbModule, make_dist
from explorl.eval.passk import pass_at_k
from explorl.models import load_model, load_tokenizer, render_prompt, resolve_model_path
from explorl.rewards import to_reward
from explorl.rewards.pool import VerifierPool
from explorl.rollout.base import build_engine, pop_metrics, sync_weights
from explorl.rollout.scoring import response_logprobs
from explorl.rollout.seeding import mix_seed
from explorl.rollout.types import Rollouts
from explorl.runlog import MetricsLog, ProgressBar
from explorl.step_batch import (
    StepBatch, concat_rows, covariance_metrics, response_stats, stage_entropy,
)

TIME_KEYS = ("time/", "perf/")  # wall-clock metrics: excluded from resume-equality checks
TRAIN_STREAM, VAL_STREAM = 0, 1  # first component of the sampling seeds after the run seed


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
        # First: under a launcher this joins the process group, so no rank writes into the run
        # directory while another one is still checking or clearing it (``--force``).
        self.dist = make_dist(cfg.dist.strategy, cfg.model.device)
        if cfg.data.prompts_per_step < self.dist.world_size:
            raise ValueError(f"data.prompts_per_step={cfg.data.prompts_per_step} < {self.dist.world_size} "
                             "processes: every rank needs at least one prompt per step")
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "plots").mkdir(exist_ok=True)
        self._seed_everything(cfg.seed)

        ckpt = latest_checkpoint(self.out) if resume else None
        if resume and ckpt is None:
            raise FileNotFoundError(f"--resume {self.out}: no complete checkpoint under {self.out / 'checkpoints'}")
        self.device = self.dist.device
        base_path = resolve_model_path(cfg.model.path, cfg.lab)
        policy_path = ckpt if (ckpt is not None and (ckpt / "config.json").exists()) else base_path
        self.tokenizer = load_tokenizer(base_path, cfg.model)
        self.policy = load_model(policy_path, cfg.model, self.device)
        self.vocab_size = self.policy.get_output_embeddings().weight.shape[0]
        self.n_params = sum(p.numel() for p in self.policy.parameters())
        # The loss's forward as a module, wrapped by DDP/FSDP under a launcher (itself at N = 1).
        self.scorer = self.dist.wrap(LogProbModule(self.policy))
        controlled = {cfg.control.adaptive.actuator} if cfg.control.adaptive.enabled else set()
        # The reference model costs a full copy of the weights: load it only when a loss needs it.
        self.ref = (load_model(base_path, cfg.model, self.device, frozen=True)
                    if cfg.algorithm.kl_coef > 0 or "kl_coef" in controlled else None)
        self.engine = engine or build_engine(cfg, self.tokenizer, base_path, self.policy.dtype)

        self.train_data = load_split(cfg.data.train, cfg.lab, "train")[: cfg.data.max_train_prompts]
        self.val_data = load_split(cfg.data.val or cfg.data.train, cfg.lab, "val" if not cfg.data.val else "train")
        self.anneal_data = load_split(cfg.data.anneal, cfg.lab, "train") if cfg.data.anneal else None
        self.verifier = cfg.reward.verifier if cfg.reward.verifier != "auto" else default_verifier(cfg.data.train)
        self._prompt_cache: dict[tuple[str, int], list[int]] = {}
        self.order = DataOrder(len(self.train_data), cfg.data.prompts_per_step, cfg.seed, cfg.data.shuffle)
        self.anneal_order = (DataOrder(len(self.anneal_data), cfg.data.prompts_per_step, cfg.seed + 7,
                                       cfg.data.shuffle) if self.anneal_data else None)

        o = cfg.optim
        # Fused AdamW (one kernel for every parameter) on CUDA with replicated parameters; the
        # default multi-tensor path elsewhere (CPU, FSDP's flattened shards).
        fused = True if self.device.type == "cuda" and self.dist.strategy != "fsdp" else None
        self.optimizer = torch.optim.AdamW(self.scorer.parameters(), lr=o.lr, betas=(o.beta1, o.beta2),
                                           weight_decay=o.weight_decay, fused=fused)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / o.warmup_steps) if o.warmup_steps > 0 else 1.0)

        gen_device = self.device if self.device.type == "cuda" else torch.device("cpu")
        # Sampling needs no generator: its draws are seeded per prompt (TRAIN_STREAM / VAL_STREAM).
        self.generators = {
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
        if self.dist.is_main:
            C.save(cfg, self.out / "config.yaml")
        self.pool = VerifierPool(cfg.reward.num_workers, cfg.reward.timeout_s)
        # metrics.jsonl holds global values: only rank 0 writes it.
        self.metrics_log = (MetricsLog(self.out / "metrics.jsonl", truncate_after=self.step if resume else 0)
                            if self.dist.is_main else None)
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
            "optimizer": self.dist.optimizer_state(self.scorer, self.optimizer),
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
        self.dist.load_optimizer_state(self.scorer, self.optimizer, state["optimizer"])
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
        """Rank 0 writes the checkpoint (weights and state are the same on every rank); the others wait.

        Sampling seeds depend on the step only and the state holds no per-rank stream, so a
        checkpoint resumes at any number of processes.
        """
        state, policy = self.state_dict(), self._policy_now()
        path = self.out / "checkpoints" / f"step-{self.step}"
        if self.dist.is_main:
            path = save_checkpoint(self.out, self.step, policy, self.tokenizer, state,
                                   save_model=self.cfg.log.save_model, keep=self.cfg.log.keep_checkpoints)
        self.dist.barrier()
        return path

    # ------------------------------------------------------------------ pieces

    def _policy_now(self) -> torch.nn.Module:
        """The policy with its current full weights: sampling, validation and checkpoints use it."""
        return self.dist.full_model(self.scorer, version=self.scheduler.last_epoch)

    def _prompt_ids(self, data: list, idx: int, tag: str) -> list[int]:
        key = (tag, idx)
        if key not in self._prompt_cache:
            ids = render_prompt(self.tokenizer, data[idx].prompt, self.cfg.model.use_chat_template)
            if len(ids) > self.cfg.data.max_prompt_len:
                raise ValueError(f"{tag} prompt {idx} has {len(ids)} tokens > data.max_prompt_len="
                                 f"{self.cfg.data.max_prompt_len}")
            self._prompt_cache[key] = ids
        return self._prompt_cache[key]

    def _sample(self, prompt_ids: list[list[int]], budgets: list[int], knobs: Knobs, seeds: list[int],
                unlearn: bool) -> tuple[Rollouts, dict]:
        # Engines with their own copy of the weights (vllm) get them pushed when they changed.
        sync_weights(self.engine, self._policy_now(), self.scheduler.last_epoch)
        if self.eepo.enabled:
            return sample_then_forget(
                self.engine, self._policy_now(), prompt_ids, budgets, knobs.temperature, knobs.max_response_len, None,
                unlearn=unlearn, lr=self.eepo.lr, eps_l=self.eepo.eps_l, eps_r=self.eepo.eps_r,
                pad_id=self.engine.pad_id, micro_batch_size=self.cfg.optim.micro_batch_size, seeds=seeds,
                reduce=self.dist.all_reduce_ if self.dist.world_size > 1 else None)
        ro = self.engine.generate(self._policy_now(), prompt_ids, budgets, knobs.temperature,
                                  knobs.max_response_len, seeds=seeds)
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

    def _rollout(self, knobs: Knobs, batch: tuple[list[int], int, bool]):
        """# 1. sample and # 2. score this rank's share of the prompts (DAPO dynamic sampling rounds
        when enabled); one all-gather per round makes the responses' statistics global.

        Returns this rank's kept rollouts (prompt_index = position among all prompts sampled this
        step), their scores and rewards, metrics, and the global ``StepBatch``.
        """
        a = self.cfg.algorithm
        use_anneal = knobs.dataset == "anneal" and self.anneal_order is not None
        data, order, tag = ((self.anneal_data, self.anneal_order, "anneal") if use_anneal
                            else (self.train_data, self.order, "train"))
        B = self.cfg.data.prompts_per_step
        max_rounds = a.max_gen_rounds if a.dynamic_sampling else 1
        step, rank = self.step + 1, self.dist.rank
        kept: list[tuple[Rollouts, torch.Tensor, torch.Tensor]] = []
        kept_rows: list[dict] = []
        kept_local: list[torch.Tensor] = []
        all_idx: list[int] = []
        all_counts: list[tuple[torch.Tensor, torch.Tensor]] = []
        metrics: dict = {}
        round_sums: dict = {}  # the sampler's metrics (EEPO's), summed over generation rounds
        n_kept_groups, n_kept_rows, n_groups_total, rounds, epoch_end, epoch = 0, 0, 0, 0, False, 0
        t_gen = t_score = 0.0
        while rounds < max_rounds and n_kept_groups < B:
            if rounds == 0:
                idx, epoch, end = batch
            else:
                idx, _, end = order.next_batch()
            epoch_end |= end
            rounds += 1
            budgets = knobs.budgets_for(len(idx)) if rounds == 1 else [knobs.n_samples] * len(idx)
            mine = self.dist.shard(len(idx))  # budgets were allocated over the global batch
            seeds = [mix_seed(self.cfg.seed, TRAIN_STREAM, step, rounds, p) for p in range(len(idx))]
            unlearn = knobs.unlearn and any(n // 2 > 0 for n in budgets)  # decided for the global batch
            t0 = time.perf_counter()
            ro, m = self._sample([self._prompt_ids(data, i, tag) for i in idx[mine]], budgets[mine], knobs,
                                 seeds[mine], unlearn)
            ro.prompt_index = ro.prompt_index + mine.start  # position in this round's global batch
            t_gen += time.perf_counter() - t0
            t0 = time.perf_counter()
            scores, rewards, sm = self._score(ro, [data[idx[i]].ground_truth for i in ro.prompt_index.cpu().tolist()])
            t_score += time.perf_counter() - t0
            # The round's one collective: every rank's per-response statistics and verifier counters.
            parts = self.dist.gather({"rows": response_stats(ro, scores, rewards, rank), **sm})
            rows = concat_rows([p["rows"] for p in parts])
            offset = sum(len(p["rows"]["group"]) for p in parts[:rank])  # this rank's first row
            for k in sm:
                metrics[k] = metrics.get(k, 0.0) + sum(p[k] for p in parts)
            for k, v in {**m, **stage_entropy(rows, m)}.items():  # averaged over the rounds below
                round_sums[k] = round_sums.get(k, 0.0) + v
            pi = rows["group"]
            counts = torch.bincount(pi, minlength=len(idx))
            correct = torch.zeros(len(idx), dtype=torch.float64).index_add_(0, pi, rows["score"])
            if a.dynamic_sampling:
                informative = informative_groups(rows["reward"], pi)
                keep_groups = sorted(set(pi[informative].tolist()))[: B - n_kept_groups]
                keep = torch.isin(pi, torch.as_tensor(keep_groups, dtype=torch.long))  # (rows,) global
                n_kept_groups += len(keep_groups)
            else:
                keep = torch.ones(len(pi), dtype=torch.bool)
                n_kept_groups = len(idx)
            mine_keep = keep[offset: offset + len(ro)]
            sel = mine_keep.nonzero().squeeze(-1)
            ro_k = ro.select(sel)
            ro_k.prompt_index = ro_k.prompt_index + len(all_idx)  # position among all sampled prompts
            kept.append((ro_k, scores[sel], rewards[sel]))
            kept_local.append(n_kept_rows + (keep.long().cumsum(0) - 1)[offset: offset + len(ro)][sel])
            rows = {k: v[keep] for k, v in rows.items()}
            rows["group"] = rows["group"] + len(all_idx)
            kept_rows.append(rows)
            n_kept_rows += int(keep.sum())
            all_idx += idx
            all_counts.append((counts, correct))
            n_groups_total += len(idx)
        parts_ro = [k[0] for k in kept if len(k[0])] or [kept[0][0]]
        ro = Rollouts.concat(parts_ro, self.engine.pad_id) if len(parts_ro) > 1 else parts_ro[0]
        scores = torch.cat([k[1] for k in kept])
        rewards = torch.cat([k[2] for k in kept])
        counts = torch.cat([c for c, _ in all_counts])
        correct = torch.cat([c for _, c in all_counts])
        metrics.update({k: v / rounds for k, v in round_sums.items()})
        metrics.update({
            "rollout/gen_rounds": float(rounds),
            "rollout/filtered_frac": 1.0 - n_kept_groups / max(1, n_groups_total) if a.dynamic_sampling else 0.0,
            "rollout/all_wrong_frac": float((correct == 0).float().mean()),
            "rollout/all_correct_frac": float((correct == counts).float().mean()),
            "time/generate_s": t_gen, "time/score_s": t_score,
        })
        sb = StepBatch(rows=concat_rows(kept_rows), local=torch.cat(kept_local), prompt_indices=all_idx,
                       prompt_correct=correct.tolist(), prompt_samples=counts.tolist(), epoch=epoch,
                       epoch_end=epoch_end)
        return ro, scores, rewards, metrics, sb

    def _update(self, ro: Rollouts, adv: torch.Tensor, knobs: Knobs, sb: StepBatch) -> tuple[dict, dict]:
        """# 4. update: PPO epochs × mini-batches of the global batch, gradient accumulation over micro-batches.

        One shared generator permutes the global batch, so every rank cuts the same mini-batches;
        each rank takes the rows of a mini-batch it holds. Every micro-batch's loss is divided by
        its mini-batch's *global* token and sequence counts, so the ranks' gradients sum to the
        one-process gradient (DDP averages, hence the loss × N). Returns metrics that are the same
        on every rank, and this rank's sums for ``_loss_metrics`` (added over ranks by the caller).
        """
        cfg, a, o = self.cfg, self.cfg.algorithm, self.cfg.optim
        rows, W = sb.rows, self.dist.world_size
        N = len(rows["reward"])  # global
        if N == 0:
            return {"loss/policy": 0.0, "loss/clip_frac": 0.0, "grad/norm": 0.0, "train/optimizer_steps": 0.0}, {}
        loss_fn = LOSSES[a.loss]
        lcfg = SimpleNamespace(**{**dataclasses.asdict(a), "eps_high": knobs.eps_high})
        max_len = a.agg_max_len or cfg.rollout.max_response_len
        n_mb = min(o.mini_batches, N)
        local_row = torch.full((N,), -1, dtype=torch.long)
        local_row[sb.local] = torch.arange(len(sb.local))  # global row -> this rank's row, or -1
        sums: dict[str, torch.Tensor] = {}
        n_opt, grad_norm_sum = 0, torch.zeros((), device=self.device)  # read once: no host sync per step
        adv = adv.to(self.device)
        self.scorer.train()
        for _ in range(o.ppo_epochs):
            order = (torch.randperm(N, generator=self.generators["shuffle"]) if n_mb > 1 or o.ppo_epochs > 1
                     else torch.arange(N))
            for mb in order.tensor_split(n_mb):
                agg = dict(token_denom=rows["length"][mb].sum().clamp_min(1), seq_denom=len(mb), max_len=max_len)
                mine = local_row[mb]
                micros = mine[mine >= 0].split(o.micro_batch_size)
                # Every rank runs as many forward/backward passes as the busiest one: only the last
                # synchronises gradients (DDP), and FSDP gathers weights in every pass.
                per_rank = torch.bincount(rows["rank"][mb], minlength=W)
                n_micro = int(max(math.ceil(int(c) / o.micro_batch_size) for c in per_rank))
                selections = self._select_tokens(ro, adv, micros, n_micro, knobs, lcfg)
                self.optimizer.zero_grad(set_to_none=True)
                for k in range(n_micro):
                    sync = k == n_micro - 1
                    with contextlib.nullcontext() if sync else self.dist.no_sync(self.scorer):
                        if k < len(micros):
                            loss = self._micro_loss(ro.select(micros[k]), adv[micros[k]], knobs, loss_fn, lcfg,
                                                    agg, sums, selection=selections[k])
                        else:
                            loss = self._idle_loss()
                        (loss * W).backward()
                gn = self.dist.clip_grad_norm_(self.scorer, o.max_grad_norm)
                self.optimizer.step()
                self.scheduler.step()
                n_opt += 1
                grad_norm_sum += gn.detach().float()
        self.optimizer.zero_grad(set_to_none=True)
        out = {"grad/norm": float(grad_norm_sum) / n_opt, "train/optimizer_steps": float(n_opt),
               "train/lr": float(self.scheduler.get_last_lr()[0])}
        return out, {k: float(v) for k, v in sums.items()}

    @torch.no_grad()
    def _select_tokens(self, ro: Rollouts, adv: torch.Tensor, micros: list[torch.Tensor], n_micro: int,
                       knobs: Knobs, lcfg) -> list:
        """Clip-Cov/KL-Cov token selection over this rank's whole mini-batch (ALGORITHMS §2d: ours
        per mini-batch, not per micro-batch). A mini-batch in one micro-batch selects inside its
        loss; split into several, each costs one extra no-grad forward, whose detached logp is
        what the loss would select on. Every rank runs ``n_micro`` forwards (idle ones where it
        has no rows) so DDP/FSDP collectives stay matched. Returns one (selected, cov) per
        micro-batch, or None each (the loss selects itself)."""
        select = SELECTORS.get(self.cfg.algorithm.loss)
        if select is None or n_micro <= 1:
            return [None] * len(micros)
        a = self.cfg.algorithm
        parts = [ro.select(idx) for idx in micros]
        logps = [self.scorer(p.prompt_ids, p.prompt_mask, p.response_ids, p.response_mask, knobs.temperature,
                             chunk_size=a.logprob_chunk, with_entropy=False)[0] for p in parts]
        for _ in range(n_micro - len(parts)):
            self._idle_loss()
        if not parts:
            return []
        mask = torch.cat([p.response_mask for p in parts])
        old = torch.cat([p.old_logp for p in parts])
        selected, cov = select(torch.cat(logps), old, adv[torch.cat(micros)], mask, lcfg,
                               generator=self.generators["loss"])
        sizes = [len(idx) for idx in micros]
        return list(zip(selected.split(sizes), cov.split(sizes)))

    def _micro_loss(self, sub: Rollouts, adv: torch.Tensor, knobs: Knobs, loss_fn, lcfg, agg: dict,
                    sums: dict, selection=None) -> torch.Tensor:
        """This micro-batch's share of the mini-batch loss; adds its metric sums to ``sums``."""
        a = self.cfg.algorithm
        mask = sub.response_mask
        need_entropy = knobs.entropy_coef > 0
        logp, ent = self.scorer(sub.prompt_ids, sub.prompt_mask, sub.response_ids, mask, knobs.temperature,
                                chunk_size=a.logprob_chunk, with_entropy=need_entropy)
        per_tok, m = loss_fn(logp, sub.old_logp, adv, mask, lcfg, generator=self.generators["loss"],
                             selection=selection)
        pg = aggregate(per_tok, mask, a.agg, **agg)
        loss = pg
        if need_entropy:
            bonus = aggregate(ent, mask, a.agg, **agg)
            loss = loss - knobs.entropy_coef * bonus
            _add(sums, "loss/entropy_bonus", bonus.detach() * agg["seq_denom"])
        if knobs.kl_coef > 0 and self.ref is not None:
            with torch.no_grad():
                ref_logp, _ = response_logprobs(self.ref, sub.prompt_ids, sub.prompt_mask, sub.response_ids, mask,
                                                knobs.temperature, chunk_size=a.logprob_chunk, with_entropy=False)
            kl = kl_estimate(logp, ref_logp, a.kl_estimator) * mask
            loss = loss + knobs.kl_coef * aggregate(kl, mask, a.agg, **agg)
            _add(sums, "kl/ref_mean", kl.detach().sum())
        n_tok = mask.sum()
        _add(sums, "tokens", n_tok)
        for k, v in m.items():
            if k == "cov/selected_mean":  # a mean over the selected tokens, not over all of them
                n_sel = m["loss/cov_selected_frac"].detach().float() * n_tok
                _add(sums, "cov/selected_sum", v.detach().float() * n_sel)
                _add(sums, "cov/selected_n", n_sel)
            elif k != "cov/mean":  # logged once per step from the whole batch instead
                _add(sums, k, v.detach().float() * n_tok)
        _add(sums, "loss/policy", pg.detach())
        return loss

    def _idle_loss(self) -> torch.Tensor:
        """A zero loss through the wrapped model for a rank with no rows left in this pass: its
        forward/backward still has to join the gradient collectives of DDP/FSDP."""
        tok = torch.full((1, 1), self.engine.pad_id, dtype=torch.long, device=self.device)
        yes = torch.ones((1, 1), dtype=torch.bool, device=self.device)
        logp, _ = self.scorer(tok, yes, tok, yes, 1.0, with_entropy=False)
        return logp.sum() * 0.0

    @torch.no_grad()
    def validate(self) -> dict:
        """Sampled accuracy and pass@k at the training temperature, plus greedy accuracy.

        Each rank samples a contiguous share of the problems; one gather makes the metrics global.
        """
        e = self.cfg.eval
        data = self.val_data[: e.max_problems]
        if not data:
            return {}
        mine = self.dist.shard(len(data))
        ids = [self._prompt_ids(self.val_data, i, "val") for i in range(mine.start, mine.stop)]
        T = e.temperature if e.temperature is not None else self.knobs.temperature
        policy = self._policy_now()
        sync_weights(self.engine, policy, self.scheduler.last_epoch)
        local = {"problem": torch.zeros(0, dtype=torch.long), "score": torch.zeros(0, dtype=torch.float64),
                 "entropy_sum": torch.zeros(0, dtype=torch.float64), "length": torch.zeros(0, dtype=torch.long),
                 "greedy": torch.zeros(0, dtype=torch.float64)}
        if ids:
            seeds = [mix_seed(self.cfg.seed, VAL_STREAM, self.step, p) for p in range(mine.start, mine.stop)]
            ro = self.engine.generate(policy, ids, [e.n_samples] * len(ids), T, self.knobs.max_response_len,
                                      seeds=seeds)
            problem = ro.prompt_index.cpu() + mine.start
            scores = self.pool.score(self.verifier, ro.texts, [data[i].ground_truth for i in problem]).scores
            mask = ro.response_mask.cpu()
            local.update(problem=problem, score=torch.tensor(scores, dtype=torch.float64),
                         entropy_sum=(ro.entropy.cpu() * mask).sum(-1).double(), length=mask.sum(-1).long())
            if e.greedy:
                g = self.engine.generate(policy, ids, [1] * len(ids), 0.0, self.knobs.max_response_len)
                gs = self.pool.score(self.verifier, g.texts, [d.ground_truth for d in data[mine]]).scores
                local["greedy"] = torch.tensor(gs, dtype=torch.float64)
        rows = concat_rows(self.dist.gather(local))
        correct = torch.zeros(len(data), dtype=torch.float64).index_add_(0, rows["problem"], rows["score"])
        out = {"val/accuracy": float(rows["score"].mean()),
               "val/entropy": float(rows["entropy_sum"].sum() / rows["length"].sum().clamp_min(1))}
        for k in e.k:
            out[f"val/pass@{k}"] = float(np.mean([pass_at_k(e.n_samples, int(c), k) for c in correct.tolist()]))
        if e.greedy:
            out["val/greedy_accuracy"] = float(rows["greedy"].mean())
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

        # 1. sample  2. score (this rank's share; ``sb`` holds the whole batch's statistics)
        ro, _scores, _rewards, rm, sb = self._rollout(knobs, batch)
        metrics.update(rm)
        rows = sb.rows
        n_tok = rows["length"].sum().clamp_min(1)

        # 3. advantages over the global batch (groups = prompts, never split across ranks; sizes
        # may differ under dynamic budgets); this rank keeps its responses' share.
        adv_all, am = compute_advantages(cfg.algorithm.advantage, rows["reward"].float(), rows["group"],
                                         eps=cfg.algorithm.adv_eps)
        adv = adv_all[sb.local]
        metrics.update({k: float(v) for k, v in am.items()})
        # Covariance diagnostics on the sampling pass's log-probs (= the policy's, before the update).
        metrics.update(covariance_metrics(rows, adv_all))

        # 4. update
        t0 = time.perf_counter()
        upd, sums = self._update(ro, adv, knobs, sb)
        # The step's one reduction: loss and token sums, and the Ctrl-C flag (all ranks stop together).
        total = self.dist.sum_dict({**sums, "stop": float(self._stop)})
        self._stop = total.pop("stop") > 0
        metrics.update({**upd, **_loss_metrics(total, len(rows["reward"]), cfg.optim.ppo_epochs, upd)})
        metrics["time/train_s"] = time.perf_counter() - t0
        self.step = step

        # 5b. controllers read the step's global statistics
        entropy = float(rows["entropy_sum"].sum() / n_tok)
        stats = StepStats(step=step, max_steps=cfg.max_steps, entropy=entropy, prompt_indices=sb.prompt_indices,
                          prompt_correct=sb.prompt_correct, prompt_samples=sb.prompt_samples, epoch=sb.epoch,
                          epoch_end=sb.epoch_end)
        used = dataclasses.replace(knobs)
        t0 = time.perf_counter()
        for c in self.controllers:
            metrics.update(c.after_step(stats, knobs))
        metrics["time/control_s"] = t_control + time.perf_counter() - t0

        # 6. log (global values, the same on every rank)
        n = len(rows["reward"])
        lengths = rows["length"].double()
        metrics.update({
            "step": step,
            "epoch": sb.epoch,
            "reward/mean": float(rows["reward"].mean()) if n else 0.0,
            "reward/std": float(rows["reward"].std(unbiased=False)) if n else 0.0,
            "reward/accuracy": float(rows["score"].mean()) if n else 0.0,
            "entropy/mean": entropy,
            "response/length_mean": float(lengths.mean()) if n else 0.0,
            "response/length_max": float(lengths.max()) if n else 0.0,
            "response/truncated_frac": float(rows["truncated"].double().mean()) if n else 0.0,
            "rollout/n_samples": float(sum(sb.prompt_samples)),
            "rollout/n_trained": float(n),
            "control/temperature": used.temperature,
            "control/eps_high": used.eps_high,
            "control/entropy_coef": used.entropy_coef,
            "control/kl_coef": used.kl_coef,
        })
        if cfg.eval.every and (step % cfg.eval.every == 0 or step == cfg.max_steps):
            t0 = time.perf_counter()
            metrics.update(self.validate())
            metrics["time/val_s"] = time.perf_counter() - t0
        metrics.update(pop_metrics(self.engine))  # vllm: weight pushes, sampler-vs-trainer logp gap
        metrics["time/step_s"] = time.perf_counter() - t_start
        return dict(sorted(metrics.items(), key=lambda kv: (kv[0] != "step", kv[0])))

    def train(self) -> dict:
        """Run to ``max_steps``; Ctrl-C finishes the current step, checkpoints and returns."""
        cfg, main = self.cfg, self.dist.is_main
        bar = ProgressBar(cfg.max_steps, self.step, enabled=cfg.log.progress and main)
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
                if self.metrics_log is not None:
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
            if self.metrics_log is not None:
                self.metrics_log.close()
            self.pool.close()
        if cfg.log.plots:
            self.plot()
        summary = {"steps": self.step, "max_steps": cfg.max_steps, "interrupted": self._stop and self.step < cfg.max_steps,
                   "seconds": time.perf_counter() - t_run, "checkpoint": str(ckpt), "final": last,
                   "n_params": self.n_params, "processes": self.dist.world_size}
        if main:
            (self.out / "summary.json").write_text(json.dumps(summary, indent=2, default=_json_default))
        return summary

    def plot(self) -> None:
        if not self.dist.is_main:
            return
        try:
            from explorl.plots import plot_training_curves
            plot_training_curves(self.out)
        except Exception as e:  # a plotting problem must never cost a training run
            print(f"warning: plotting failed: {e}")


def _add(sums: dict, key: str, value: torch.Tensor) -> None:
    sums[key] = sums.get(key, 0) + value


def _loss_metrics(total: dict[str, float], n_rows: int, ppo_epochs: int, upd: dict) -> dict[str, float]:
    """Metrics from the update's sums over all ranks: token-weighted means, except the three below."""
    tokens = max(total.pop("tokens", 0.0), 1.0)
    if "cov/selected_n" in total:  # mean covariance over every selected token of the update
        n_sel, sel_sum = total.pop("cov/selected_n"), total.pop("cov/selected_sum")
        total["cov/selected_mean"] = sel_sum / n_sel * tokens if n_sel > 0 else 0.0
    out = {k: v / tokens for k, v in total.items() if k not in ("loss/entropy_bonus", "loss/policy")}
    if "loss/entropy_bonus" in total:  # seq-weighted sum of per-mini-batch aggregates → mean aggregate
        out["loss/entropy_bonus"] = total["loss/entropy_bonus"] / (n_rows * ppo_epochs)
    if "loss/policy" in total:  # sum over optimizer steps of the mini-batch losses → mean
        out["loss/policy"] = total["loss/policy"] / max(1.0, upd["train/optimizer_steps"])
    return out


def _json_default(o):
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return str(o)
