"""The sampler's live progress: every decode step is reported, on the eager and static paths."""

from __future__ import annotations

import pytest
import torch

from explorl.config import ModelConfig
from explorl.lab import lab_model_path, make_splits
from explorl.models import load_model, load_tokenizer, render_prompt
from explorl.rollout import progress
from explorl.rollout.hf import HFEngine


@pytest.mark.parametrize("static", [False, True])
def test_every_decode_step_is_reported_in_order(static):
    path = lab_model_path("addition")
    tok = load_tokenizer(path, ModelConfig())
    model = load_model(path, ModelConfig(dtype="float32"), torch.device("cpu")).eval()
    prompts = [render_prompt(tok, r.prompt, True) for r in make_splits("addition")["train"][:3]]
    seen = []
    engine = HFEngine(tok, static=static)
    with progress.listening(lambda t, total, rows: seen.append((t, total, rows))):
        ro = engine.generate(model, prompts, [2, 2, 2], 1.0, 8, seeds=[1, 2, 3])
    steps = [t for t, _, _ in seen]
    assert steps == list(range(1, len(steps) + 1)) and steps  # one call per step, in order
    assert len(steps) == ro.response_mask.shape[1]  # as many as the longest response's tokens
    assert all(total == 8 and 1 <= rows <= 6 for _, total, rows in seen)
    assert seen[0][2] == 6  # the first step decodes every row
    engine.generate(model, prompts, [1, 1, 1], 1.0, 8, seeds=[1, 2, 3])
    assert len(seen) == len(steps)  # the listener left with its block


def test_decode_rate_counts_rows_over_steps():
    clock = iter([0.0, 2.0])
    rate = progress.DecodeRate(lambda: next(clock))
    assert rate.text() == ""
    rate(1, 64, 16)
    rate(2, 64, 4)
    assert rate.tokens == 20
    assert rate.text() == "decode 2/64 · 10 tok/s"  # 20 tokens in 2 s
