"""Sampling from a lab model while it is built: its accuracy checks, with explicit generators
(the build never touches the global RNG)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from explorl.hf_compat import cache_kwarg
from explorl.lab.tasks import LabTask
from explorl.lab.tokenizer import SPECIALS
from explorl.records import PromptRecord


@dataclass
class LabModel:
    """A lab model being built, its tokenizer, and how its answers are sampled and checked."""

    task: LabTask
    model: Any
    tok: Any
    alphabet: str
    pad_id: int
    eos_id: int
    check: Callable[[str, PromptRecord], bool]
    """Does a response pass the task check for this record?"""
    max_new: int = 0
    """Tokens sampled per answer: the longest SFT response, and room for a longer (wrong) one."""

    def encode(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def accuracy(
        self, records: list[PromptRecord], n: int, temperature: float, seed: int
    ) -> tuple[float, dict[str, float]]:
        """Fraction of ``n`` samples per record that pass the task check; and per difficulty."""
        recs = [r for r in records for _ in range(n)]
        texts = sample(
            self.model,
            [self.encode(r.prompt) for r in recs],
            temperature=temperature,
            max_new_tokens=self.max_new,
            eos_id=self.eos_id,
            pad_id=self.pad_id,
            vocab=self.tok.convert_ids_to_tokens,
            generator=torch.Generator().manual_seed(seed),
        )
        by_diff = defaultdict(list)
        for text, r in zip(texts, recs):
            by_diff[r.extra["difficulty"]].append(self.check(text, r))
        hits = [h for v in by_diff.values() for h in v]
        return sum(hits) / len(hits), {
            str(k): round(sum(v) / len(v), 4) for k, v in sorted(by_diff.items())
        }


@torch.no_grad()
def sample(
    model: torch.nn.Module,
    prompts: list[list[int]],
    *,
    temperature: float,
    max_new_tokens: int,
    eos_id: int,
    pad_id: int,
    vocab,
    generator: torch.Generator,
    batch_size: int = 512,
) -> list[str]:
    """Sample one response per prompt (``temperature == 0``: greedy); text up to EOS.

    A plain KV-cached loop rather than ``generate``: it draws from an explicit generator, so
    the build never touches the global RNG. ``vocab`` maps a list of ids to their characters.
    """
    texts: list[str] = []
    cache_name = cache_kwarg(model)
    for c in range(0, len(prompts), batch_size):
        chunk = prompts[c : c + batch_size]
        B, P = len(chunk), max(len(p) for p in chunk)
        ids = torch.full((B, P), pad_id)  # (B, P), left-padded
        mask = torch.zeros(B, P, dtype=torch.long)
        for i, p in enumerate(chunk):
            ids[i, P - len(p) :] = torch.tensor(p)
            mask[i, P - len(p) :] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, P)
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
        cache = getattr(out, cache_name)
        next_pos = pos[:, -1:] + 1  # (B, 1)
        done = torch.zeros(B, dtype=torch.bool)
        new = []
        for t in range(max_new_tokens):
            logits = out.logits[:, -1].float()  # (B, V)
            if temperature == 0:
                tok = logits.argmax(-1)
            else:
                tok = torch.multinomial(
                    torch.softmax(logits / temperature, -1), 1, generator=generator
                )[:, 0]
            tok = torch.where(done, torch.full_like(tok, pad_id), tok)
            new.append(tok)
            done |= tok == eos_id
            if done.all() or t == max_new_tokens - 1:
                break
            mask = torch.cat([mask, torch.ones(B, 1, dtype=torch.long)], 1)
            out = model(
                input_ids=tok[:, None],
                attention_mask=mask,
                position_ids=next_pos,
                use_cache=True,
                **{cache_name: cache},
            )
            cache = getattr(out, cache_name)
            next_pos = next_pos + 1
        gen = torch.stack(new, 1).tolist()  # (B, R)
        for row in gen:
            row = row[: row.index(eos_id)] if eos_id in row else row
            texts.append("".join(t for t in vocab(row) if t not in SPECIALS))
    return texts
