"""Loading the policy, its tokenizer and the frozen reference model."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from explorl import model_store
from explorl.config import ModelConfig
from explorl.data.files import tokenize_prompts
from explorl.data.sources import params_for
from explorl.errors import ConfigError, DataError, EnvironmentFailed, ModelPathError
from explorl.hf_compat import quiet_transformers
from explorl.lab.build import lab_model_path
from explorl.lab.registry import get_task, parse_lab_spec
from explorl.lab.tokenizer import outside, tokenizer_alphabet

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(spec)


def resolve_dtype(spec: str, device: torch.device) -> torch.dtype:
    """``auto``: bf16 where the GPU supports it; float32 on CPU (bf16 matmuls are slow there)."""
    if spec != "auto":
        return _DTYPES[spec]
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def param_dtype(cfg: ModelConfig, device: torch.device) -> torch.dtype:
    """The weights' dtype: float32 master weights, unless ``pure_low_precision`` asks for
    ``dtype``."""
    return resolve_dtype(cfg.dtype, device) if cfg.pure_low_precision else torch.float32


def autocast(cfg: ModelConfig, device: torch.device):
    """A context for forward passes: autocast to the compute dtype when it is below the weights'."""
    compute = resolve_dtype(cfg.dtype, device)
    if compute == param_dtype(cfg, device):
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=compute)


def resolve_model_path(path: str, lab=None, *, build: bool = True) -> Path:
    """The model folder ``model.path`` stands for: ``lab:<task>`` → the built (and cached) lab
    model; a registered name (``smollm2-135m``) → its fetched folder; a ``.gguf`` file (or a
    folder holding exactly one) → its conversion in the model cache (made on first use);
    else a local Hugging Face model folder.

    ``lab`` (a ``LabConfig``) makes the lab model's SFT split the same as the one RL uses, so
    validation problems are never in the model's supervised training data. ``build=False``: a
    lab model's cache folder, built or not.
    """
    ref = parse_lab_spec(path) if path.startswith("lab:") else None
    if ref is not None:
        if lab is None:
            return lab_model_path(ref, build=build)
        return lab_model_path(ref, size=lab.model_size, split_seed=lab.split_seed,
                              n_train=lab.n_train, n_val=lab.n_val, n_test=lab.n_test,
                              build=build, **params_for(get_task(ref), lab.params))
    converted = model_store.resolve(path)
    if converted is not None:
        return converted
    p = Path(path).expanduser()
    if not p.is_dir():
        raise ModelPathError(
            f"model.path {path!r} is not a local directory; explorl loads models with "
            "from_pretrained(local_path) (download them beforehand), a .gguf file, a name "
            f"({', '.join(model_store.KNOWN)}) or lab:<task>")
    return p


def load_tokenizer(path: Path, cfg: ModelConfig):
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=cfg.trust_remote_code)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token  # batched sampling needs a pad id; masked everywhere
    # explorl checks prompt lengths itself (data.max_prompt_len, a clear error naming the row):
    # the tokenizer's own "longer than the maximum sequence length" warning is noise.
    warned = getattr(tok, "deprecation_warnings", None)
    if isinstance(warned, dict):
        warned["sequence-length-is-longer-than-the-specified-maximum"] = True
    return tok


def load_model(
    path: Path, cfg: ModelConfig, device: torch.device, *, frozen: bool = False
) -> torch.nn.Module:
    """``from_pretrained`` on ``device``: trained weights in ``param_dtype`` (float32 masters unless
    pure low precision), a frozen reference directly in the compute dtype."""
    if device.type == "cpu" and cfg.cpu_threads is not None:
        torch.set_num_threads(cfg.cpu_threads)  # model.cpu_threads: the whole process's setting
    dtype = resolve_dtype(cfg.dtype, device) if frozen else param_dtype(cfg, device)
    with quiet_transformers():
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype,
                                                     trust_remote_code=cfg.trust_remote_code)
    model.to(device)
    if frozen:
        model.eval()
        model.requires_grad_(False)
    else:
        model.train()
    # Dropout would make the loss's log-probs differ from the sampler's; RL fine-tuning turns it
    # off.
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    if cfg.gradient_checkpointing and not frozen:
        enable_checkpointing(model, path)
    return model


def enable_checkpointing(model: torch.nn.Module, path) -> None:
    """transformers' activation checkpointing, non-reentrant (``model.gradient_checkpointing``).

    It applies in train mode only: the sampler and validation (eval mode, KV cache) run the
    layers as they are, and the loss pass (train mode, no cache) recomputes each layer in the
    backward. Non-reentrant checkpointing works with DDP/FSDP and inputs without gradients.
    """
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ConfigError(f"model.gradient_checkpointing: {type(model).__name__} (from {path}) "
                          "does not support gradient checkpointing; set it to false")
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x's name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def render_prompt(tokenizer, prompt, use_chat_template: bool, tools: list | None = None
                  ) -> list[int]:
    """Token ids of a prompt: chat messages through the chat template when the tokenizer has one
    (``tools``: the JSON schemas of the run's tools, which the template shows the model).

    A lab tokenizer rejects a prompt with characters outside its task's alphabet (they would
    become ``<unk>``)."""
    ids = _render(tokenizer, prompt, use_chat_template, tools)
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is not None and unk in ids:
        alphabet = tokenizer_alphabet(tokenizer)
        text = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)
        if alphabet is not None and outside(text, alphabet):
            raise DataError(f"prompt {text[:80]!r} has characters {outside(text, alphabet)!r} "
                             f"outside the lab model's alphabet {alphabet!r}: a lab model reads "
                             "only its task's characters")
    return ids


def _render(tokenizer, prompt, use_chat_template: bool, tools: list | None = None) -> list[int]:
    has_template = use_chat_template and getattr(tokenizer, "chat_template", None)
    kw = {"tools": tools} if tools else {}
    if isinstance(prompt, list):
        if has_template:
            ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True,
                                                **kw)
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
            return list(ids)
        prompt = "\n".join(m["content"] for m in prompt)
    elif has_template:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                            add_generation_prompt=True, tokenize=True, **kw)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)
    return tokenizer(prompt, add_special_tokens=True)["input_ids"]


class Prompt(list):
    """A prompt's token ids (a ``list``) that also carries its record and how it was rendered,
    for an environment's ``reset`` (``rollout.environment``): ``with_observation`` renders it
    again with ``reset``'s text appended (to the last message's content, as TRL does)."""

    def __init__(self, ids: list[int], record, render, max_len: int | None = None) -> None:
        super().__init__(ids)
        self.record, self._render, self.max_len = record, render, max_len

    def with_observation(self, text: str) -> list[int]:
        """The prompt rendered with ``text`` appended; longer than ``max_len`` tokens
        (``data.max_prompt_len``, checked for the prompt alone at setup), or with characters
        the tokenizer refuses (a lab model's alphabet), it is the environment's fault:
        ``EnvironmentFailed``, naming the row."""
        p = self.record.prompt
        p = p + text if isinstance(p, str) else [*p[:-1], {**p[-1],
                                                           "content": p[-1]["content"] + text}]
        r = self.record
        where = getattr(r, "origin", None) or f"{r.data_source} problem {r.index}"
        try:
            ids = self._render(p)
        except DataError as e:  # e.g. characters outside a lab model's alphabet
            raise EnvironmentFailed(f"rollout.environment: {where}: reset's observation cannot "
                                    f"join the prompt: {e}") from None
        if self.max_len is not None and len(ids) > self.max_len:
            raise EnvironmentFailed(
                f"rollout.environment: {where}: the prompt with reset's observation has "
                f"{len(ids)} tokens ({len(self)} without it), more than data.max_prompt_len="
                f"{self.max_len}: raise data.max_prompt_len or have reset return a shorter "
                "observation")
        return ids


class PromptTokens:
    """Token ids of dataset prompts, rendered once (chat template when the tokenizer has one) and
    checked against ``data.max_prompt_len``."""

    def __init__(self, tokenizer, use_chat_template: bool, max_prompt_len: int,
                 tools: list | None = None) -> None:
        self.tokenizer, self.use_chat_template, self.max_len = (
            tokenizer,
            use_chat_template,
            max_prompt_len,
        )
        self.tools = tools  # the tools' schemas, for chat templates that show them
        self._cache: dict[tuple[str, int], list[int]] = {}

    def _render(self, prompt) -> list[int]:
        return render_prompt(self.tokenizer, prompt, self.use_chat_template, self.tools)

    def check(self, **splits: list) -> None:
        """Render every prompt of each split (``train=records, val=…``) now, at setup: a prompt
        over ``data.max_prompt_len`` tokens is a ``DataError`` naming its file and row."""
        for tag, data in splits.items():
            ids = tokenize_prompts(data, self._render, self.max_len, f"data.{tag}")
            self._cache.update({(tag, i): x for i, x in enumerate(ids)})

    @property
    def longest(self) -> int:
        """Tokens in the longest prompt rendered so far (0 before any)."""
        return max(map(len, self._cache.values()), default=0)

    def ids_of(self, data: list, tag: str):
        """A function: row index of ``data`` -> its prompt's token ids, a ``Prompt`` (``tag``
        names the split)."""
        def ids(idx: int) -> Prompt:
            if (tag, idx) not in self._cache:
                (self._cache[(tag, idx)],) = tokenize_prompts(
                    [data[idx]], self._render, self.max_len, f"data.{tag}"
                )
            return Prompt(self._cache[(tag, idx)], data[idx], self._render, self.max_len)
        return ids


def regional_compile(model: torch.nn.Module, cfg: ModelConfig,
                     strategy: str) -> RegionalCompile | None:
    """``model.compile``'s compiler for ``model``, or None when it is off."""
    if not cfg.compile:
        return None
    if strategy == "fsdp":  # an accelerate config file chose FSDP (the recipe's choice is checked)
        raise ConfigError("model.compile: not supported with FSDP (chosen by the accelerate "
                          "config); use ddp or model.compile: false")
    return RegionalCompile(model)


def warm_up(compiled: RegionalCompile | None, scorer: torch.nn.Module, vocab_size: int,
            device: torch.device) -> None:
    """Compile ``model.compile``'s layers now (``RegionalCompile.warm_up``); no-op when off."""
    if compiled is not None:
        compiled.warm_up(scorer, vocab_size, device)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks of a transformers causal LM (``model.model.layers`` and kin)."""
    body = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    layers = getattr(body, "layers", None) or getattr(body, "h", None)
    return list(layers) if layers is not None else []


class RegionalCompile:
    """``model.compile``: each decoder layer compiled with ``torch.compile`` (dynamic shapes),
    switched on only inside ``with compiled():`` (the loss passes), so sampling, validation and
    copies of the model (EEPO's θ′) run the layers eagerly.

    The layers share their code, so dynamo compiles one graph per grad mode and reuses it for
    every layer (regional compilation). ``warm_up`` compiles on a tiny batch at setup, forward
    and backward; when that raises, the layers stay eager and ``error`` says why.
    """

    def __init__(self, model: torch.nn.Module):
        self.layers = decoder_layers(model)
        self.compiled = [torch.compile(layer._call_impl, dynamic=True) for layer in self.layers]
        self.error: str | None = None if self.layers else "no decoder layers found"

    @contextlib.contextmanager
    def __call__(self):
        if self.error is not None:
            yield
            return
        for layer, fn in zip(self.layers, self.compiled):
            layer._compiled_call_impl = fn
        try:
            yield
        finally:
            for layer in self.layers:
                layer._compiled_call_impl = None

    def warm_up(self, scorer: torch.nn.Module, vocab_size: int, device: torch.device) -> None:
        """One forward + backward of ``scorer`` (a ``LogProbModule``) on two 3-token responses to
        a shared 3-token prompt; gradients are dropped. Sets ``error`` when compiling fails."""
        if self.error is None:
            self._try(scorer, vocab_size, device)
        if self.error is not None:
            log.warning("model.compile: compiling the decoder layers failed (%s); the loss "
                        "passes run eagerly", self.error)

    def _try(self, scorer: torch.nn.Module, vocab_size: int, device: torch.device) -> None:
        ids = torch.arange(3, device=device) % vocab_size
        prompt = ids[None].expand(2, 3).contiguous()
        response = ids.flip(0)[None].expand(2, 3).contiguous()
        ones = torch.ones(2, 3, dtype=torch.bool, device=device)
        try:
            logp, ent = scorer(prompt, ones, response, ones, 1.0)
            (logp.sum() + ent.sum()).backward()
        except Exception as e:  # any compiler failure: run eagerly
            self.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        finally:
            for p in scorer.parameters():
                p.grad = None
