"""The rollout-engine interface (HF today; a vLLM engine can implement the same call)."""

from __future__ import annotations

from typing import Protocol

import torch

from explorl.rollout.types import Rollouts


class RolloutEngine(Protocol):
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
        """Sample ``n_samples[i]`` responses for prompt i (token ids, no padding).

        ``model`` is passed per call so that EEPO can sample from its rollout copy.
        ``temperature == 0`` means greedy. Returned rows are grouped by prompt, in order.
        ``seeds`` (one per prompt) asks for draws that depend only on (seeds[i], sample index),
        not on the batch (``explorl.rollout.seeding``); the trainer always passes them, so
        data-parallel ranks sample the same responses as one process would.
        """
        ...
