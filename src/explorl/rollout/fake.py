"""A scripted rollout engine for tests (httpx's ``MockTransport`` idea).

Responses come from a function instead of the model, so a test controls exactly what is
"sampled"; log-probs and entropy are still those of the model for the scripted tokens, so the
PPO ratio on the first pass is 1 as it would be after real sampling.
"""

from __future__ import annotations

from typing import Callable

import torch

from explorl.policy.forward import response_logprobs
from explorl.rollout.hf import left_pad
from explorl.rollout.types import Rollouts


class FakeEngine:
    # Its float32 log-probs equal the trainer's forward up to ~1e-6 (same model, same weights), so
    # ``algorithm.old_logp: auto`` keeps them instead of recomputing (tests/test_rollout_hf.py).
    logprobs_match_trainer = True

    def __init__(self, tokenizer, respond: Callable[[list[int], int], str]):
        """``respond(prompt_ids, j)`` returns the text of the j-th sample for a prompt."""
        self.tokenizer = tokenizer
        self.respond = respond
        self.pad_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )
        self.calls: list[dict] = []

    @torch.no_grad()
    def generate(self, model, prompt_ids, n_samples, temperature, max_new_tokens, generator=None,
                 seeds=None) -> Rollouts:
        self.calls.append(
            {"n_samples": list(n_samples), "temperature": temperature, "model": model}
        )
        device = next(model.parameters()).device
        rows, texts, resp = [], [], []
        for i, (p, n) in enumerate(zip(prompt_ids, n_samples)):
            for j in range(n):
                text = self.respond(p, j)
                ids = self.tokenizer(text, add_special_tokens=False)["input_ids"][
                    : max_new_tokens - 1
                ]
                ids = ids + [self.tokenizer.eos_token_id]
                rows.append(i)
                texts.append(self.tokenizer.decode(ids, skip_special_tokens=True))
                resp.append(ids)
        pids, pmask = left_pad([prompt_ids[i] for i in rows], self.pad_id, device)
        R = max(len(r) for r in resp)
        rids = torch.full((len(resp), R), self.pad_id, dtype=torch.long, device=device)
        rmask = torch.zeros((len(resp), R), dtype=torch.bool, device=device)
        for k, r in enumerate(resp):
            rids[k, : len(r)] = torch.as_tensor(r, device=device)
            rmask[k, : len(r)] = True
        logp, ent = response_logprobs(model, pids, pmask, rids, rmask, temperature or 1.0)
        return Rollouts(
            prompt_ids=pids,
            prompt_mask=pmask,
            response_ids=rids,
            response_mask=rmask,
            old_logp=logp,
            entropy=ent,
            prompt_index=torch.as_tensor(rows, device=device),
            texts=texts,
            temperature=temperature,
            truncated=torch.zeros(len(resp), dtype=torch.bool, device=device),
        )
