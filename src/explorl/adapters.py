"""LoRA adapters through PEFT (``model.lora``): the policy as a frozen base plus trained adapters.

The policy is a ``peft.PeftModel``; its forward passes run on the transformers model inside it
(``plain``), whose adapted layers are PEFT's LoRA modules in place of the linear ones, so the
packed loss layout and the lean sampler work on it unchanged. The KL reference is the same
model with its adapters disabled (``disabled``: PEFT's ``disable_adapter()``), never a second
copy; EEPO's unlearning copy shares the frozen base and copies the adapters only
(``rollout_copy``). Checkpoints hold the adapters in PEFT's own format (``adapter_config.json``
+ ``adapter_model.safetensors``, ``PeftModel.from_pretrained`` loads them); engines that keep
their own weights (vLLM) get the merged weights (``merged_weights``), computed out of place so
the frozen base is never rounded by a merge and unmerge. docs/lora.md is the user's page.

``peft`` is imported when adapters are made or loaded (it costs ~2 s at import); a model can
only be a ``PeftModel`` once it was, which is how ``is_adapted`` checks without importing it.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import json
import sys
import warnings
from pathlib import Path

import torch

from explorl.config import LoRAConfig, ModelConfig
from explorl.errors import ConfigError, ModelPathError
from explorl.models import enable_checkpointing, load_model

ADAPTER_CONFIG = "adapter_config.json"
ALL_LINEAR = "all-linear"


def is_adapted(model) -> bool:
    """Whether ``model`` is a ``peft.PeftModel`` (a base with adapters)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def plain(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model a forward pass runs: inside a ``PeftModel`` its base model, whose
    adapted layers are PEFT's LoRA modules; any other model as it is."""
    return model.get_base_model() if is_adapted(model) else model


def is_adapter_checkpoint(path: Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def adapter_base(path: Path) -> Path:
    """The base model directory an adapter checkpoint names (PEFT's
    ``base_model_name_or_path``)."""
    base = json.loads((Path(path) / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    if not base or not Path(base).is_dir():
        raise ModelPathError(f"{path}: the adapters' base model {base!r} is not a local "
                             "directory; load it with the run directory (its config.yaml "
                             "names the base) or fix base_model_name_or_path in "
                             f"{Path(path) / ADAPTER_CONFIG}")
    return Path(base)


def linear_layer_names(model: torch.nn.Module) -> list[str]:
    """Distinct last names of the model's linear layers (``q_proj``, ``lm_head``, ...)."""
    return sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                   if isinstance(m, torch.nn.Linear) and n})


def _check_targets(model: torch.nn.Module, targets: list[str]) -> None:
    """Every name in ``model.lora.target_modules`` matches a module (as PEFT matches names:
    the module's dotted path equals it or ends with ``.name``)."""
    if targets == [ALL_LINEAR]:
        return
    names = [n for n, _ in model.named_modules() if n]
    linear = linear_layer_names(model)
    for i, t in enumerate(targets):
        if not any(n == t or n.endswith("." + t) for n in names):
            close = difflib.get_close_matches(t, linear, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"model.lora.target_modules[{i}]: {t!r} matches no module of "
                              f"{type(model).__name__}{hint}; its linear layers are "
                              f"{linear} (or use {ALL_LINEAR})")


def add_adapters(model: torch.nn.Module, cfg: LoRAConfig) -> torch.nn.Module:
    """``model`` (frozen) with fresh LoRA adapters (``B = 0``: the base's outputs exactly)."""
    from peft import LoraConfig, get_peft_model

    _check_targets(model, cfg.target_modules)
    targets = ALL_LINEAR if cfg.target_modules == [ALL_LINEAR] else list(cfg.target_modules)
    lora = LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                      target_modules=targets, bias="none", task_type="CAUSAL_LM")
    with _quiet():
        return get_peft_model(model, lora)


@contextlib.contextmanager
def _quiet():
    """PEFT asks transformers a deprecated question when it wraps a model: noise to a user."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
        yield


def load_policy(base_path: Path, ckpt: Path | None, cfg: ModelConfig,
                device: torch.device) -> torch.nn.Module:
    """The policy to train: the whole model (from ``ckpt`` when it holds weights), or with
    ``model.lora`` the base frozen in the compute dtype plus adapters (``ckpt``'s, or fresh)
    as float32 master weights."""
    if not cfg.lora.enabled:
        full = ckpt is not None and (ckpt / "config.json").exists()
        return load_model(ckpt if full else base_path, cfg, device)
    base = load_model(base_path, cfg, device, frozen=True)
    if ckpt is not None and is_adapter_checkpoint(ckpt):
        from peft import PeftModel

        with _quiet():
            model = PeftModel.from_pretrained(base, ckpt, is_trainable=True)
    else:
        model = add_adapters(base, cfg.lora)
    for p in model.parameters():
        if p.requires_grad:
            p.data = p.data.float()  # master weights (model.pure_low_precision is refused)
    model.train()
    if cfg.gradient_checkpointing:
        enable_checkpointing(model.get_base_model(), base_path)
    return model


def load_for_inference(path: Path, cfg: ModelConfig, device: torch.device,
                       base_path: Path | None = None) -> tuple[torch.nn.Module, Path]:
    """``(model, base directory)`` for sampling only: a model directory as it is, or an adapter
    checkpoint merged into its base (``base_path``, else the base the checkpoint names)."""
    if not is_adapter_checkpoint(path):
        return load_model(path, cfg, device, frozen=True), path
    from peft import PeftModel

    base_path = base_path or adapter_base(path)
    base = load_model(base_path, cfg, device, frozen=True)
    with _quiet():
        merged = PeftModel.from_pretrained(base, path).merge_and_unload()
    return merged.eval().requires_grad_(False), base_path


@contextlib.contextmanager
def disabled(model: torch.nn.Module):
    """``model`` with its adapters switched off (PEFT's ``disable_adapter()``): the base model,
    the KL reference of an adapted policy. A model without adapters is itself."""
    if not is_adapted(model):
        yield model
        return
    with model.disable_adapter():
        yield model


def _adapter_params(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for n, p in model.named_parameters() if "lora_" in n]


def rollout_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A trainable copy of ``model`` (EEPO's θ′): a deep copy, or for an adapted model one
    that shares the frozen base's tensors and copies the adapters only."""
    if not is_adapted(model):
        return copy.deepcopy(model)
    adapters = {id(p) for p in _adapter_params(model)}
    shared = {id(t): t for t in (*model.parameters(), *model.buffers()) if id(t) not in adapters}
    out = copy.deepcopy(model, memo=shared)
    for p in _adapter_params(out):
        p.requires_grad_(True)  # an FSDP sampling replica holds them frozen
    return out


@torch.no_grad()
def refresh_copy_(dst: torch.nn.Module, src: torch.nn.Module) -> None:
    """``dst`` ← ``src`` in place (``dst`` from ``rollout_copy(src)``): the adapters only when
    the base is shared."""
    if is_adapted(src):
        for d, s in zip(_adapter_params(dst), _adapter_params(src), strict=True):
            d.copy_(s)
        return
    for d, s in zip(dst.parameters(), src.parameters(), strict=True):
        d.copy_(s)
    for d, s in zip(dst.buffers(), src.buffers(), strict=True):
        d.copy_(s)


def copied_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """What ``refresh_copy_`` copies: the adapters of an adapted model, else every parameter
    and buffer."""
    if is_adapted(model):
        return list(_adapter_params(model))
    return [*model.parameters(), *model.buffers()]


@torch.no_grad()
def snapshot(model: torch.nn.Module) -> list[torch.Tensor]:
    """A detached copy of what ``refresh_copy_`` would copy from ``model`` (a weight push taken
    now and loaded later with ``load_snapshot_``, while ``model`` trains on)."""
    return [t.detach().clone() for t in copied_tensors(model)]


@torch.no_grad()
def load_snapshot_(dst: torch.nn.Module, tensors: list[torch.Tensor]) -> None:
    """``dst`` (from ``rollout_copy``) ← a ``snapshot`` of its source, in place."""
    for d, s in zip(copied_tensors(dst), tensors, strict=True):
        d.copy_(s)


@torch.no_grad()
def merged_weights(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of the base model's parameters under its own names, each adapted
    layer's weight merged with its active adapters (W + scale·B·A, PEFT's
    ``get_delta_weight``), computed out of place: the model is left as it was."""
    from peft.tuners.lora import LoraLayer

    inner = plain(model)
    deltas: dict[str, torch.Tensor] = {}
    if not getattr(model, "_adapters_disabled", False):
        for name, m in inner.named_modules():
            if isinstance(m, LoraLayer) and not m.disable_adapters:
                active = [a for a in m.active_adapters if a in m.lora_A]
                if active:
                    deltas[f"{name}.base_layer.weight"] = sum(m.get_delta_weight(a) for a in active)
    out = []
    for name, p in inner.named_parameters():
        if ".lora_" in name:
            continue
        t = p.detach()
        if name in deltas:
            t = (t.float() + deltas[name].float()).to(t.dtype)
        out.append((name.replace(".base_layer.", "."), t))
    return out


def parameter_counts(model: torch.nn.Module) -> tuple[int, int]:
    """``(all parameters, trainable ones)``: the adapters' under LoRA, every one otherwise."""
    params = list(model.parameters())
    return sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad)


@contextlib.contextmanager
def for_sampling(model: torch.nn.Module):
    """The model a sampler calls (``plain(model)``); an adapted one with ``model.lora.dropout``
    in eval mode meanwhile (the lean sampler reads no training flag, LoRA's dropout does)."""
    inner = plain(model)
    dropout = is_adapted(model) and model.training and any(
        getattr(c, "lora_dropout", 0) for c in model.peft_config.values())
    if dropout:
        model.eval()
    try:
        yield inner
    finally:
        if dropout:
            model.train()
