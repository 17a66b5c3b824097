"""Data-parallel plumbing over accelerate / torch.distributed: one small interface, two classes.

``make_dist`` returns ``Single`` when the process runs alone and ``Parallel`` when a launcher
(``accelerate launch``, ``torchrun``) started several (``WORLD_SIZE`` > 1). The trainer calls the
same methods either way; in ``Single`` they are no-ops, so N = 1 is never a special case.

What crosses ranks in a training step (ALGORITHMS.md §0 and §1a: global denominators, global
controller statistics):

- ``gather``: the per-response statistics of a generation round (rewards, lengths, entropy
  and log-prob sums, owner rank), one all-gather per round. Every rank then computes
  advantages, loss denominators, controller statistics and rollout metrics from the same
  global table, exactly as one process would.
- gradients: DDP's bucketed all-reduce once per optimizer step (FSDP: its reduce-scatter).
- ``sum_dict``: the update's loss and token sums and the stop flag, one collective per step.

Validation adds one ``gather``; an EEPO unlearning step adds two small all-reduces.
"""

from __future__ import annotations

import atexit
import contextlib
import os

import torch

from explorl.models import resolve_device
from explorl.rollout.scoring import response_logprobs


class LogProbModule(torch.nn.Module):
    """The loss's forward pass (log-probs and entropy of given responses) as a module.

    DDP and FSDP act in their wrapper's ``forward`` (DDP arms its gradient all-reduce there,
    FSDP gathers parameters), so the trainer wraps this module rather than calling
    ``response_logprobs`` on the bare policy, which keeps the chunked-vocabulary path.
    """

    def __init__(self, policy: torch.nn.Module):
        super().__init__()
        self.policy = policy
        # FSDP's transformer auto-wrap policy reads the layer classes from here.
        self._no_split_modules = getattr(policy, "_no_split_modules", None)

    def forward(self, prompt_ids, prompt_mask, response_ids, response_mask, temperature, *, chunk_size=2048,
                with_entropy=True):
        return response_logprobs(self.policy, prompt_ids, prompt_mask, response_ids, response_mask, temperature,
                                 chunk_size=chunk_size, with_entropy=with_entropy)


class Single:
    """One process: every collective is the identity."""

    rank = 0
    world_size = 1
    is_main = True
    strategy = "none"

    def __init__(self, device_spec: str = "auto"):
        self.device = resolve_device(device_spec)

    def shard(self, n: int) -> slice:
        """This rank's contiguous share of ``n`` items (the first n % N ranks get one more)."""
        base, extra = divmod(n, self.world_size)
        start = self.rank * base + min(self.rank, extra)
        return slice(start, start + base + (self.rank < extra))

    def wrap(self, module: torch.nn.Module) -> torch.nn.Module:
        return module

    def no_sync(self, module: torch.nn.Module):
        return contextlib.nullcontext()

    def gather(self, obj) -> list:
        """Every rank's ``obj`` (picklable), in rank order."""
        return [obj]

    def all_reduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over ranks in place; returns it."""
        return tensor

    def sum_dict(self, values: dict[str, float]) -> dict[str, float]:
        """Sum float values over ranks, key by key (a key missing on a rank counts as 0)."""
        return dict(values)

    def clip_grad_norm_(self, module: torch.nn.Module, max_norm: float) -> torch.Tensor:
        """Clip the global gradient norm (no clipping when ``max_norm`` is 0); returns the norm."""
        return torch.nn.utils.clip_grad_norm_(module.parameters(), max_norm if max_norm > 0 else float("inf"))

    def barrier(self) -> None:
        pass


class Parallel(Single):
    """Several processes, through ``accelerate.Accelerator`` (DDP by default, FSDP selectable)."""

    def __init__(self, strategy: str = "ddp", device_spec: str = "auto"):
        from accelerate import Accelerator
        from accelerate.utils import DistributedDataParallelKwargs, DistributedType, FullyShardedDataParallelPlugin

        # Buffers (rotary tables) are constants: DDP must not broadcast them at every forward,
        # which would also require every rank to run the same number of forwards.
        handlers = [DistributedDataParallelKwargs(broadcast_buffers=False)]
        fsdp = None
        if strategy == "fsdp" and os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true":
            fsdp = FullyShardedDataParallelPlugin(use_orig_params=True)  # an accelerate config file may give its own
        cpu = device_spec == "cpu" or (device_spec == "auto" and not torch.cuda.is_available())
        self.accelerator = Accelerator(cpu=cpu, kwargs_handlers=handlers, fsdp_plugin=fsdp)
        self.rank = self.accelerator.process_index
        self.world_size = self.accelerator.num_processes
        self.is_main = self.accelerator.is_main_process
        self.device = self.accelerator.device
        self.strategy = "fsdp" if self.accelerator.distributed_type == DistributedType.FSDP else "ddp"
        atexit.register(_destroy)

    def wrap(self, module: torch.nn.Module) -> torch.nn.Module:
        return self.accelerator.prepare_model(module)

    def no_sync(self, module: torch.nn.Module):
        return module.no_sync()

    def gather(self, obj) -> list:
        out = [None] * self.world_size
        torch.distributed.all_gather_object(out, obj)
        return out

    def all_reduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        torch.distributed.all_reduce(tensor)
        return tensor

    def sum_dict(self, values: dict[str, float]) -> dict[str, float]:
        total: dict[str, float] = {}
        for part in self.gather({k: float(v) for k, v in values.items()}):
            for k, v in part.items():
                total[k] = total.get(k, 0.0) + v
        return total

    def clip_grad_norm_(self, module: torch.nn.Module, max_norm: float) -> torch.Tensor:
        if self.strategy == "fsdp":  # the norm of sharded gradients needs FSDP's own collective
            return module.clip_grad_norm_(max_norm if max_norm > 0 else float("inf"))
        return super().clip_grad_norm_(module, max_norm)

    def barrier(self) -> None:
        torch.distributed.barrier()


def _destroy() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def world_size_from_env() -> int:
    """Number of processes the launcher started (``accelerate launch`` and ``torchrun`` set WORLD_SIZE)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def make_dist(strategy: str = "ddp", device_spec: str = "auto") -> Single:
    """``Parallel`` under a multi-process launcher, else ``Single``."""
    if world_size_from_env() > 1:
        return Parallel(strategy, device_spec)
    return Single(device_spec)
