"""Passes before a mini-batch's update: Clip-Cov/KL-Cov token selection over the whole
mini-batch (§2d), the forking-token mask's weights (§6c) and EntroPIC's confident-token counts
(§6f), each global over the ranks; and the trainer's own old log-probs (``algorithm.old_logp:
recompute``)."""

from __future__ import annotations

import dataclasses

import torch

from explorl.algorithms import forking_token_mask
from explorl.algorithms.contract import LossParams
from explorl.algorithms.losses import SELECTORS
from explorl.rollout.types import Rollouts
from explorl.training.batch import StepBatch
from explorl.training.loss_pass import LossPass


class BeforeUpdate:
    """What the update computes from the policy's forward or every rank's rows before it
    steps; ``passes`` gives the forward, its idle pass and the loss's generator."""

    def __init__(self, passes: LossPass) -> None:
        self.passes = passes
        self.cfg, self.scorer, self.dist = passes.cfg, passes.scorer, passes.dist
        self.loss_gen, self.old_from_forward = passes.loss_gen, passes.old_from_forward

    def idle(self) -> torch.Tensor:
        return self.passes.idle()

    def confident_counts(self, ro: Rollouts, sb: StepBatch, N: int) -> torch.Tensor:
        """(N,) per global row: valid tokens with π_old > p_min (EntroPIC's confident tokens); one
        gather, so every rank can form each mini-batch's global count."""
        p_min = self.cfg.control.entropic.p_min
        n = (ro.response_mask & (ro.old_logp.exp() > p_min)).sum(-1).float().cpu()  # (n,)
        out = torch.zeros(N)  # host: gathered counts
        for part in self.dist.gather({"local": sb.local.cpu(), "n": n}):
            out[part["local"]] = part["n"]
        return out

    @torch.no_grad()
    def forking_weights(self, ro: Rollouts, micros: list[torch.Tensor], mask_sums: dict) -> list:
        """The forking-token mask over this mini-batch's valid tokens on every rank (§6c): one
        per-token weight (n_micro_rows, T) per micro-batch. Every rank calls the gather, also one
        holding no rows of the mini-batch. Adds the mask's (global) metrics to ``mask_sums``."""
        a = self.cfg.algorithm
        rows = torch.cat(micros) if micros else torch.zeros(0, dtype=torch.long)  # host
        rows = rows.to(ro.entropy.device)
        tm = forking_token_mask(ro.entropy[rows], ro.response_mask[rows], a.entropy_mask_ratio,
                                renorm_kept=a.entropy_mask_renorm, gather=self.dist.gather,
                                rank=self.dist.rank)
        for k, v in tm.metrics.items():
            mask_sums[k] = mask_sums.get(k, 0.0) + float(v)
        return list(tm.weight.split([len(m) for m in micros])) if micros else []

    @torch.no_grad()
    def select_tokens(
        self,
        ro: Rollouts,
        adv: torch.Tensor,
        micros: list[torch.Tensor],
        n_micro: int,
        lcfg: LossParams,
    ) -> list:
        """Clip-Cov/KL-Cov token selection over this rank's whole mini-batch
        (docs/methods/entropy-mechanism.md §2d: per mini-batch, not per micro-batch). A mini-batch
        in one micro-batch selects inside its loss; split into several, each costs one extra no-grad
        forward, whose detached logp is what the loss would select on. Every rank runs ``n_micro``
        forwards (idle ones where it has no rows) so DDP/FSDP collectives stay matched. Returns one
        (selected, cov) per micro-batch, or None each (the loss selects itself)."""
        select = SELECTORS.get(self.cfg.algorithm.loss)
        if select is None or n_micro <= 1:
            return [None] * len(micros)
        a = self.cfg.algorithm
        parts = [ro.select(idx) for idx in micros]
        logps = [
            self.scorer(
                p.prompt_ids,
                p.prompt_mask,
                p.response_ids,
                p.token_mask,
                lcfg.temperature,
                chunk_size=a.logprob_chunk,
                with_entropy=False,
            )[0]
            for p in parts
        ]
        for _ in range(n_micro - len(parts)):
            self.idle()
        if not parts:
            return []
        mask = torch.cat([p.response_mask for p in parts])
        old = torch.cat(logps if self.old_from_forward else [p.old_logp for p in parts])
        selected, cov = select(
            torch.cat(logps), old, adv[torch.cat(micros)], mask, lcfg, generator=self.loss_gen
        )
        sizes = [len(idx) for idx in micros]
        return list(zip(selected.split(sizes), cov.split(sizes)))

    @torch.no_grad()
    def recompute(self, ro: Rollouts, sb: StepBatch, temperature: float, sizes: list[int],
                  n_micro: int, rows: torch.Tensor | None = None,
                  first: tuple | None = None) -> tuple[Rollouts, dict[str, float]]:
        """Old log-probs and entropy from the trainer's own forward (``algorithm.old_logp``).

        One no-grad pass of the policy over this rank's rows, in micro-batches (every rank runs as
        many passes as the busiest, for FSDP), replaces the sampler's values, so the first PPO
        ratio is exactly 1 and KL-Cov's |logp − old_logp| is exactly 0 on the on-policy pass.
        Rows sampled by EEPO's unlearned copy keep the copy's values. ``sb.rows``' entropy and
        log-prob sums are updated with one gather. Returns the sampler-vs-trainer gap
        (``rollout/logp_diff_max``, ``rollout/logp_diff_mean`` over valid tokens).
        """
        a = self.cfg.algorithm
        # host: this rank's rows in pass order (``rows``: all but the first mini-batch's when
        # ``first`` = (its rows, a call returning its log-probs and entropy from the update's own
        # forward, run last), see ``PolicyUpdate.recompute``)
        order = torch.arange(len(ro)) if rows is None else rows  # host
        chunks = order.split(sizes) if len(order) else ()
        logps, ents = [], []
        for k in range(n_micro):
            if k < len(chunks):
                sub = ro.select(chunks[k])
                lp, ent = self.scorer(
                    sub.prompt_ids,
                    sub.prompt_mask,
                    sub.response_ids,
                    sub.token_mask,
                    temperature,
                    chunk_size=a.logprob_chunk,
                    with_entropy=True,
                )
                logps.append(lp.float())
                ents.append(ent.float())
            else:
                self.idle()
        if first is not None:  # after the no-grad passes: its graph is held from here on
            rows1, (lp, ent) = first[0], first[1]()
            chunks = (*chunks, rows1)
            logps.append(lp.detach().float())
            ents.append(ent.detach().float())
        mask = ro.response_mask
        own = sb.rows.own[sb.local].to(mask.device)  # (n,) sampled by the policy itself
        new_logp = torch.cat(logps) if logps else ro.old_logp
        new_ent = torch.cat(ents) if ents else ro.entropy
        if logps and (rows is not None or first is not None):  # back to this rank's row order
            back = torch.empty(len(ro), dtype=torch.long)  # host
            back[torch.cat(chunks[: len(logps)])] = torch.arange(len(ro))  # host
            back = back.to(new_logp.device)
            new_logp, new_ent = new_logp[back], new_ent[back]
        new_logp = torch.where(own[:, None], new_logp.to(ro.old_logp.dtype), ro.old_logp)
        new_ent = torch.where(own[:, None], new_ent.to(ro.entropy.dtype), ro.entropy)
        # The forward scores tool results too (it reads the whole sequence); they are not the
        # policy's tokens, so they keep the sampler's zeros.
        new_logp, new_ent = new_logp.masked_fill(~mask, 0.0), new_ent.masked_fill(~mask, 0.0)
        diff = ((new_logp - ro.old_logp).abs() * mask)[own]
        out = dataclasses.replace(ro, old_logp=new_logp, entropy=new_ent)
        m = mask.float()
        parts = self.dist.gather(
            {
                "local": sb.local.cpu(),
                "ent": (new_ent.cpu() * m.cpu()).sum(-1).double(),
                "logp": (new_logp.cpu() * m.cpu()).sum(-1).double(),
                "diff_sum": float(diff.sum()),
                "diff_n": float(mask[own].sum()),
                "diff_max": float(diff.max()) if diff.numel() else 0.0,
            }
        )
        for p in parts:
            sb.rows.entropy_sum[p["local"]] = p["ent"]
            sb.rows.logp_sum[p["local"]] = p["logp"]
        n = sum(p["diff_n"] for p in parts)
        return out, {"rollout/logp_diff_max": max(p["diff_max"] for p in parts),
                     "rollout/logp_diff_mean": sum(p["diff_sum"] for p in parts) / n if n else 0.0}
