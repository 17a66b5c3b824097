"""Data-parallel plumbing over accelerate / torch.distributed: one small interface, two classes.

``make_dist`` returns ``Single`` when the process runs alone and ``Parallel`` when a launcher
(``accelerate launch``, ``torchrun``) started several (``WORLD_SIZE`` > 1). The trainer calls the
same methods either way; in ``Single`` they are no-ops, so N = 1 is never a special case.

What crosses ranks in a training step (docs/methods/baseline.md §0, docs/methods/e3.md §1a: global
denominators, global controller statistics):

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
import copy
import os
import warnings

import torch

from explorl.models import resolve_device
from explorl.policy.forward import response_logprobs


class LogProbModule(torch.nn.Module):
    """The loss's forward pass (log-probs and entropy of given responses) as a module.

    DDP and FSDP act in their wrapper's ``forward`` (DDP arms its gradient all-reduce there,
    FSDP gathers parameters), so the trainer wraps this module rather than calling
    ``response_logprobs`` on the bare policy, which keeps the chunked-vocabulary path.
    """

    def __init__(self, policy: torch.nn.Module, amp=None, compiled=None, fused: bool = True):
        super().__init__()
        self.policy = policy
        self.fused = fused  # algorithm.fused_logprobs
        self._amp = amp or contextlib.nullcontext  # autocast to the compute dtype (models.autocast)
        # model.compile: the decoder layers' compiled calls, on for this module's passes only.
        self._compiled = compiled or contextlib.nullcontext
        # FSDP's transformer auto-wrap policy reads the layer classes from here.
        self._no_split_modules = getattr(policy, "_no_split_modules", None)

    def forward(
        self,
        prompt_ids,
        prompt_mask,
        response_ids,
        response_mask,
        temperature,
        *,
        chunk_size=2048,
        with_entropy=True,
    ):
        with self._amp(), self._compiled():
            return response_logprobs(
                self.policy,
                prompt_ids,
                prompt_mask,
                response_ids,
                response_mask,
                temperature,
                chunk_size=chunk_size,
                with_entropy=with_entropy,
                fused=self.fused,
            )


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

    def wrap(self, module: LogProbModule) -> torch.nn.Module:
        """The module the loss runs through: DDP/FSDP-wrapped under a launcher, else itself."""
        return module

    def full_model(self, scorer: torch.nn.Module, version: int) -> torch.nn.Module:
        """The policy with its current full weights, for sampling, validation and saving.

        ``version`` counts optimizer steps; FSDP refreshes its replica when it changed.
        """
        return _unwrap(scorer).policy

    def optimizer_state(self, scorer: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
        """The optimizer state to checkpoint (complete on rank 0)."""
        return optimizer.state_dict()

    def load_optimizer_state(
        self, scorer: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict
    ) -> None:
        """Load a checkpointed optimizer state, whatever the strategy that wrote it."""
        if _keyed_by_name(state):  # written under FSDP
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                set_optimizer_state_dict,
            )

            # FSDP shares one ``step`` tensor among the parameters of a unit; loaded as is, Adam
            # would advance that shared count once per parameter. Every parameter gets its own.
            state = {
                **state,
                "state": {
                    k: {n: v.clone() if isinstance(v, torch.Tensor) else v for n, v in s.items()}
                    for k, s in state["state"].items()
                },
            }
            set_optimizer_state_dict(
                scorer, optimizer, state, options=StateDictOptions(full_state_dict=True)
            )
        else:
            optimizer.load_state_dict(state)

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
        return torch.nn.utils.clip_grad_norm_(
            module.parameters(), max_norm if max_norm > 0 else float("inf")
        )

    def barrier(self) -> None:
        pass


class Parallel(Single):
    """Several processes, through ``accelerate.Accelerator`` (DDP by default, FSDP selectable)."""

    def __init__(self, strategy: str = "ddp", device_spec: str = "auto"):
        from accelerate import Accelerator
        from accelerate.utils import (
            DistributedDataParallelKwargs,
            DistributedType,
            FullyShardedDataParallelPlugin,
        )

        # Buffers (rotary tables) are constants: no broadcast from rank 0 at every forward.
        handlers = [DistributedDataParallelKwargs(broadcast_buffers=False)]
        fsdp = None
        env_fsdp = (
            os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
        )  # accelerate config file
        if strategy == "fsdp" and not env_fsdp:
            fsdp = FullyShardedDataParallelPlugin(
                use_orig_params=False
            )  # an accelerate config file may give its own
        cpu = device_spec == "cpu" or (device_spec == "auto" and not torch.cuda.is_available())
        self.accelerator = Accelerator(cpu=cpu, kwargs_handlers=handlers, fsdp_plugin=fsdp)
        self.rank = self.accelerator.process_index
        self.world_size = self.accelerator.num_processes
        self.is_main = self.accelerator.is_main_process
        self.device = self.accelerator.device
        self._accelerate_fsdp = self.accelerator.distributed_type == DistributedType.FSDP
        self.strategy = "fsdp" if strategy == "fsdp" or env_fsdp or self._accelerate_fsdp else "ddp"
        atexit.register(_destroy)

    def wrap(self, module: LogProbModule) -> torch.nn.Module:
        if self.strategy == "fsdp":
            if self._accelerate_fsdp and self.accelerator.state.fsdp_plugin.fsdp_version != 1:
                raise ValueError(
                    "explorl supports FSDP version 1 (accelerate's default); set fsdp_version: 1"
                )
            # Sampling runs token by token on each rank's own prompts, which sharded weights cannot
            # do without a collective per token: a full replica (no gradients, no optimizer
            # state) samples instead and is refreshed after each update (``full_model``).
            self._replica = copy.deepcopy(module.policy).requires_grad_(False)
            self._replica_version = None
            # the optimizer's order at N = 1 (its parameters: every one, or LoRA's adapters)
            self._param_names = [n for n, p in module.named_parameters() if p.requires_grad]
            frozen = any(not p.requires_grad for p in module.parameters())
            # accelerate turns FSDP on for GPUs only: same wrapping by hand; LoRA's frozen base
            # needs units of their own for the adapters, which accelerate's policy does not make
            if not self._accelerate_fsdp or frozen:
                return _fsdp(module, self.device)
        with (
            warnings.catch_warnings()
        ):  # torch ≥ 2.12 prefers forward_sync_buffers, which accelerate lacks
            warnings.filterwarnings(
                "ignore", message=".*broadcast_buffers.*", category=FutureWarning
            )
            return self.accelerator.prepare_model(module)

    def full_model(self, scorer: torch.nn.Module, version: int) -> torch.nn.Module:
        if self.strategy != "fsdp":
            return super().full_model(scorer, version)
        if version != self._replica_version:
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                get_model_state_dict,
            )

            full = get_model_state_dict(scorer, options=StateDictOptions(full_state_dict=True))
            self._replica.load_state_dict({k.removeprefix("policy."): v for k, v in full.items()})
            self._replica_version = version
        return self._replica

    def optimizer_state(self, scorer: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
        if self.strategy != "fsdp":  # DDP: every rank holds the whole (identical) state
            return super().optimizer_state(scorer, optimizer)
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        return get_optimizer_state_dict(
            scorer, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )

    def load_optimizer_state(
        self, scorer: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict
    ) -> None:
        if self.strategy == "fsdp" and not _keyed_by_name(state):  # written by one process or DDP
            state = {"state": {self._param_names[i]: v for i, v in state["state"].items()},
                     "param_groups": [{**g, "params": [self._param_names[i] for i in g["params"]]}
                                      for g in state["param_groups"]]}
        super().load_optimizer_state(scorer, optimizer, state)

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


def _fsdp(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """FSDP (version 1) with one unit per transformer layer, as accelerate's default auto-wrap.

    ``use_orig_params=False``: with True, torch 2.13 gathers wrong values for the full optimizer
    state (checked on CPU/gloo), which checkpoints need. A flat parameter is trainable or frozen
    as a whole, so with LoRA each trainable leaf (an adapter's linear) gets a unit of its own
    (PEFT's ``fsdp_auto_wrap_policy`` does the same) and the layers' units hold the frozen base.
    """
    import functools

    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import (
        _or_policy,
        lambda_auto_wrap_policy,
        transformer_auto_wrap_policy,
    )

    names = set(getattr(module, "_no_split_modules", None) or [])
    layers = {type(m) for m in module.modules() if type(m).__name__ in names}
    policies = (
        [functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=layers)]
        if layers
        else []
    )
    if any(not p.requires_grad for p in module.parameters()):
        policies.insert(0, functools.partial(lambda_auto_wrap_policy, lambda_fn=_trainable_leaf))
    policy = functools.partial(_or_policy, policies=policies) if policies else None
    cuda = (
        device.type == "cuda"
    )  # on CPU (tests) FSDP refuses to sync states; every rank loaded the same weights
    return FullyShardedDataParallel(
        module,
        auto_wrap_policy=policy,
        use_orig_params=False,
        device_id=device if cuda else torch.device("cpu"),
        sync_module_states=cuda,
    )


def _trainable_leaf(module: torch.nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return not list(module.children()) and weight is not None and weight.requires_grad


def _unwrap(module: torch.nn.Module) -> torch.nn.Module:
    return getattr(module, "module", module)  # DDP and FSDP keep the wrapped module in .module


def _keyed_by_name(optimizer_state: dict) -> bool:
    return any(isinstance(k, str) for k in optimizer_state.get("state", {}))


def _destroy() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def world_size_from_env() -> int:
    """Number of processes the launcher started (``accelerate launch``, ``torchrun`` set
    WORLD_SIZE)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def make_dist(strategy: str = "ddp", device_spec: str = "auto") -> Single:
    """``Parallel`` under a multi-process launcher, else ``Single``."""
    if world_size_from_env() > 1:
        return Parallel(strategy, device_spec)
    return Single(device_spec)
