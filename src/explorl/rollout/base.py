"""The rollout-engine interface, its optional methods, and the engine named by the config."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch

from explorl.rollout.hf import HFEngine
from explorl.rollout.multiturn import ToolEngine
from explorl.rollout.types import Rollouts
from explorl.rollout.vllm import VLLMEngine
from explorl.tools.environments import runner_of
from explorl.tools.formats import make_format
from explorl.tools.sandbox import describe


class RolloutEngine(Protocol):
    """What the trainer calls. Besides ``generate``, an engine may define:

    - ``sync_weights(model, version) -> float``: make the engine sample from ``model``'s current
      weights; ``version`` identifies them (the trainer passes its optimizer step count before
      every sampling call; EEPO's unlearned copy another value), and an engine that keeps its
      own copy of the weights skips the push when ``version`` equals the last pushed one.
      Returns the seconds spent. Engines that sample with ``model`` itself (``hf``) need none.
    - ``pop_metrics() -> dict[str, float]``: metrics gathered since the last call (docs/metrics.md).
    - ``logprobs_match_trainer``: True when old_logp/entropy are the trainer's forward's values
      (``algorithm.old_logp: auto`` then skips its own recompute in float32).

    Call them through ``sync_weights`` and ``pop_metrics`` below, which accept any engine.
    """

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


def sync_weights(engine: Any, model: torch.nn.Module, version: Any) -> float:
    """``engine.sync_weights(model, version)`` where the engine has it, else 0.0 seconds."""
    sync = getattr(engine, "sync_weights", None)
    return float(sync(model, version)) if sync is not None else 0.0


def pop_metrics(engine: Any) -> dict[str, float]:
    """``engine.pop_metrics()`` where the engine has it, else no metrics."""
    pop = getattr(engine, "pop_metrics", None)
    return pop() if pop is not None else {}


ENGINES = {"hf": HFEngine.from_config, "vllm": VLLMEngine.from_config}  # rollout.engine


def build_engine(cfg, tokenizer, model_path: str | Path, dtype: torch.dtype, device=None):
    """The engine ``cfg.rollout.engine`` names (``cfg``: a ``RunConfig``), from ``ENGINES``.

    ``model_path``: the model the engine starts from (``vllm`` loads it itself; later weights
    come from ``sync_weights``); ``dtype``: the training model's, for ``rollout.vllm.dtype:
    auto``; ``device``: the trainer's (None: CUDA where available).
    """
    make = ENGINES.get(cfg.rollout.engine)
    if make is None:
        raise ValueError(f"unknown rollout.engine {cfg.rollout.engine!r}; valid: {list(ENGINES)}")
    if not (cfg.rollout.tools or cfg.rollout.environment):
        return make(cfg, tokenizer, model_path, dtype, device)
    # Multi-turn sampling (``rollout.multiturn``) with ``rollout.tools`` or
    # ``rollout.environment``: the engine stops at EOS and at a tool call's end (both kept in the
    # response), and ``ToolEngine`` runs the calls between its turns.
    runner = runner_of(cfg)
    tools = describe(cfg.rollout.tools, cfg.rollout.environment).schemas  # read in a worker
    fmt = make_format(cfg.rollout.tool_format, tokenizer, tools)
    eos = [tokenizer.eos_token_id]
    engine = make(cfg, tokenizer, model_path, dtype, device, eos_ids=eos + list(fmt.stop_ids))
    return ToolEngine(engine, fmt, runner, cfg.rollout.max_turns, eos_ids=eos)
