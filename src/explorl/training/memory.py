"""Out of memory in the update: one retry at half the micro-batch, then a clear stop.

The micro-batch token budget planned on CUDA (``training.plan``, docs/gpu.md) leaves headroom for
fragmentation, other processes and longer responses, but a batch can still outgrow it. When a
mini-batch's forward or backward raises ``torch.OutOfMemoryError``, the update drops that
mini-batch's partial gradients and metric sums, halves the micro-batch limits (tokens and rows,
whichever are set) for the rest of the run, prints one line, and runs the mini-batch again: its
gradient is the same sum over smaller micro-batches. A second out-of-memory error in the run
stops it with ``OutOfMemory`` (exit 2), naming the key to lower; no checkpoint is written
mid-step, so the last one stays the run's last good state. With several processes an OOM on
one rank cannot be retried alone (the others wait in a collective), so it stops the run at once.

Metric: ``train/oom_retries``, the micro-batch halvings so far in the run (0 or 1). The halved
limits are part of the checkpoint: a resumed run keeps them.
"""

from __future__ import annotations

import logging

import torch

from explorl.errors import OutOfMemory

log = logging.getLogger(__name__)

OOM_ERRORS: tuple[type[BaseException], ...] = tuple(
    {getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError),
     torch.cuda.OutOfMemoryError})
"""The exceptions an allocator raises when a device is full (one class on recent torch)."""


class MemoryGuard:
    """The update's micro-batch limits under out-of-memory retries (``optim.micro_batch_*``)."""

    MAX_RETRIES = 1

    def __init__(self, optim, world_size: int = 1) -> None:
        self.optim, self.world_size = optim, world_size
        self.halvings = 0

    def limits(self) -> tuple[int | None, int | None]:
        """(most rows, most tokens) per micro-batch now: the config's, halved per retry."""
        o, f = self.optim, 2 ** self.halvings
        rows = None if o.micro_batch_size is None else max(1, o.micro_batch_size // f)
        tokens = None if o.micro_batch_tokens is None else max(1, o.micro_batch_tokens // f)
        return rows, tokens

    def key(self) -> tuple[str, int | None]:
        """The setting that bounds a micro-batch and its value now."""
        rows, tokens = self.limits()
        return ("optim.micro_batch_tokens", tokens) if tokens is not None else (
            "optim.micro_batch_size", rows)

    def on_oom(self, exc: BaseException, step: int) -> None:
        """Halve the limits and return (the caller runs the mini-batch again), or raise
        ``OutOfMemory`` when the run has retried already or runs on several processes."""
        key, value = self.key()
        free_cached_memory()
        if self.halvings >= self.MAX_RETRIES or self.world_size > 1:
            lower = f"{key} below {value}" if value is not None else f"{key}"
            why = ("again after halving the micro-batch once" if self.halvings else
                   f"on one of {self.world_size} processes (no retry across processes)")
            raise OutOfMemory(
                f"step {step}: out of memory in the update {why}; set {lower} (or "
                f"rollout.max_response_len / data.prompts_per_step lower) and resume "
                f"({_first_line(exc)})") from exc
        self.halvings += 1
        key, value = self.key()
        msg = (f"step {step}: out of memory in the update ({_first_line(exc)}); retrying the "
               f"mini-batch with {key}={value} for the rest of the run")
        print(msg, flush=True)
        log.warning(msg)

    def metrics(self) -> dict[str, float]:
        return {"train/oom_retries": float(self.halvings)}

    def state_dict(self) -> dict:
        return {"halvings": self.halvings}

    def load_state_dict(self, state: dict) -> None:
        self.halvings = int(state.get("halvings", 0))


def free_cached_memory() -> None:
    """Give the caching allocator's free blocks back, so the retry starts from a clean pool."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:160] if text else type(exc).__name__
