"""vLLM's process-level side effects, tamed: the global state its in-process engine changes
(``preserved_process_state``), CUDA sleep mode's bookkeeping (``SleepCycle``) and vLLM's console
lines once per kind (``quiet_vllm_logs``). No vLLM import."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import time

import numpy as np
import torch


@contextlib.contextmanager
def preserved_process_state():
    """Restore the global RNGs, torch's thread count and ``torch.set_num_threads`` on exit.

    vLLM's in-process engine seeds ``random``, numpy and torch when it is built, and its CPU
    worker limits torch to one thread and replaces ``torch.set_num_threads`` with a no-op.
    """
    py, npy, cpu = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    threads, set_threads = torch.get_num_threads(), torch.set_num_threads
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(npy)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        torch.set_num_threads = set_threads
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


class SleepCycle:
    """CUDA sleep mode (``rollout.vllm.sleep_level``): ``sleep()`` after sampling, ``wake(tag)``
    before the engine's weights (``"weights"``) or KV cache (``"kv_cache"``) are used again.
    ``seconds`` adds up the time both took. Level 2 discards the weights: ``wake("weights")``
    then returns True and the caller must push them again."""

    def __init__(self, level: int) -> None:
        self.level, self.asleep, self.seconds = level, set(), 0.0

    def sleep(self, llm) -> None:
        if self.level and not self.asleep:
            t0 = time.perf_counter()
            llm.sleep(level=self.level)
            self.asleep = {"weights", "kv_cache"}
            self.seconds += time.perf_counter() - t0

    def wake(self, llm, tag: str) -> bool:
        """Wake ``tag``; True when the weights woke empty (level 2: push them again)."""
        if tag not in self.asleep:
            return False
        t0 = time.perf_counter()
        llm.wake_up(tags=[tag])
        self.asleep.discard(tag)
        self.seconds += time.perf_counter() - t0
        return tag == "weights" and self.level == 2


class _OncePerKind(logging.Filter):
    """Lets each kind of vLLM log line (logger and message template) through once per process,
    and none at all on ranks other than 0 (every rank builds its own engine). Errors always
    pass. What was seen is shared by every instance: vLLM re-applies its logging config (a new
    handler, a new filter) each time it builds an engine."""

    seen: set[tuple[str, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        if os.environ.get("RANK", "0") != "0":
            return False
        kind = (record.name, str(record.msg))
        if kind in self.seen:
            return False
        self.seen.add(kind)
        return True


def quiet_vllm_logs(default_config: dict) -> None:
    """vLLM's console lines once per kind (``_OncePerKind``), never RoPE's reload warning.
    ``default_config``: ``vllm.logger.DEFAULT_LOGGING_CONFIG``, the ``dictConfig`` vLLM applies
    again whenever it builds an engine: the filter is added to it and to the handlers now."""
    logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(_quiet_rotary)
    default_config.setdefault("filters", {})["explorl_once"] = {"()": _OncePerKind}
    for handler in default_config.get("handlers", {}).values():
        if "explorl_once" not in handler.setdefault("filters", []):
            handler["filters"].append("explorl_once")
    for handler in logging.getLogger("vllm").handlers:
        if not any(isinstance(f, _OncePerKind) for f in handler.filters):
            handler.addFilter(_OncePerKind())


def _quiet_rotary(record: logging.LogRecord) -> bool:
    """Drop vLLM's warning that a reload gave RoPE no weights: its cache is computed, not loaded."""
    return not (
        record.getMessage().startswith("RotaryEmbedding:")
        and "Failed to load" in record.getMessage()
    )
