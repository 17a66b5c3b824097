"""Batched sampling on a Hugging Face causal LM with a KV cache.

Unlike ``model.generate`` this loop returns what RL needs from the sampling pass itself: the
log-prob and entropy of every sampled token at the sampling temperature (so the trainer can
reuse them as old log-probs while the policy is unchanged), and it accepts a different number
of samples per prompt (E3 budgets) in one batch.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from explorl.rollout.seeding import gumbel_sample, row_keys
from explorl.rollout.types import Rollouts


def left_pad(seqs: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists to one width: ``(ids (N, P), mask (N, P) bool)``."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s):] = torch.as_tensor(s, dtype=torch.long)
            mask[i, width - len(s):] = True
    return ids.to(device), mask.to(device)


def position_ids(mask: torch.Tensor) -> torch.Tensor:
    """Positions that ignore left padding: 0 at each row's first real token."""
    return (mask.long().cumsum(-1) - 1).clamp_min(0)


class HFEngine:
    """The ``hf`` rollout engine: sampling with the training model's weights and a KV cache."""

    def __init__(self, tokenizer, *, batch_size: int = 256, eos_ids: list[int] | None = None):
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        eos = eos_ids if eos_ids is not None else [tokenizer.eos_token_id]
        self.eos_ids = torch.as_tensor([e for e in eos if e is not None], dtype=torch.long)

    @torch.no_grad()
    def generate(
        self,
        model: torch.nn.Module,
        prompt_ids: list[list[int]],
        n_samples: list[int],
        temperature: float,
        max_new_tokens: int,
        generator: torch.Generator | None = None,
        seeds: list[int] | None = None,
    ) -> Rollouts:
        """``seeds`` (one per prompt) switches to counter-based sampling: response j of prompt i
        depends only on (seeds[i], j), not on the batch it is generated in (``rollout.seeding``)."""
        if len(prompt_ids) != len(n_samples):
            raise ValueError(f"{len(prompt_ids)} prompts but {len(n_samples)} sample counts")
        rows = [i for i, n in enumerate(n_samples) for _ in range(n)]  # response -> prompt
        keys = row_keys(seeds, n_samples) if seeds is not None else None  # (N,) per-response keys
        parts = []
        for start in range(0, len(rows), self.batch_size):
            chunk = rows[start: start + self.batch_size]
            parts.append(self._generate_rows(model, [prompt_ids[i] for i in chunk], chunk, temperature,
                                             max_new_tokens, generator,
                                             None if keys is None else keys[start: start + self.batch_size]))
        return Rollouts.concat(parts, self.pad_id)

    def _generate_rows(self, model, seqs, prompt_index, temperature, max_new_tokens, generator,
                       keys=None) -> Rollouts:
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        ids, mask = left_pad(seqs, self.pad_id, device)  # (N, P)
        N = ids.shape[0]
        eos = self.eos_ids.to(device)
        greedy = temperature == 0
        scale = 1.0 if greedy else 1.0 / temperature

        out_tokens = torch.full((N, max_new_tokens), self.pad_id, dtype=torch.long, device=device)
        out_logp = torch.zeros((N, max_new_tokens), device=device)
        out_ent = torch.zeros((N, max_new_tokens), device=device)
        out_mask = torch.zeros((N, max_new_tokens), dtype=torch.bool, device=device)
        alive = torch.ones(N, dtype=torch.bool, device=device)

        cache = DynamicCache()
        attn = mask.long()
        pos = position_ids(mask)
        step_ids = ids
        n_steps = 0
        for t in range(max_new_tokens):
            out = model(input_ids=step_ids, attention_mask=attn, position_ids=pos,
                        past_key_values=cache, use_cache=True, logits_to_keep=1)
            z = out.logits[:, -1, :].float() * scale  # (N, V) at the sampling temperature
            logp_all = torch.log_softmax(z, dim=-1)
            # Entropy at the sampling temperature: the quantity E3's scheduler and the metrics use.
            ent = -(logp_all.exp() * logp_all).sum(-1)  # (N,)
            if greedy:
                tok = z.argmax(-1)
            elif keys is not None:
                tok = gumbel_sample(logp_all, keys, t)
            else:
                tok = torch.multinomial(logp_all.exp(), 1, generator=generator).squeeze(-1)
            tok = torch.where(alive, tok, torch.full_like(tok, self.pad_id))
            out_tokens[:, t] = tok
            out_logp[:, t] = logp_all.gather(-1, tok[:, None]).squeeze(-1) * alive
            out_ent[:, t] = ent * alive
            out_mask[:, t] = alive
            n_steps = t + 1
            alive = alive & ~torch.isin(tok, eos)
            if not bool(alive.any()):
                break
            step_ids = tok[:, None]
            attn = torch.cat([attn, torch.ones((N, 1), dtype=attn.dtype, device=device)], dim=1)
            pos = pos[:, -1:] + 1
        if was_training:
            model.train()

        out_tokens, out_logp = out_tokens[:, :n_steps], out_logp[:, :n_steps]
        out_ent, out_mask = out_ent[:, :n_steps], out_mask[:, :n_steps]
        texts = self.tokenizer.batch_decode(
            [row[m].tolist() for row, m in zip(out_tokens.cpu(), out_mask.cpu())], skip_special_tokens=True)
        return Rollouts(
            prompt_ids=ids, prompt_mask=mask, response_ids=out_tokens, response_mask=out_mask,
            old_logp=out_logp, entropy=out_ent,
            prompt_index=torch.as_tensor(prompt_index, dtype=torch.long, device=device),
            texts=texts, temperature=temperature, truncated=alive.clone(),
        )
