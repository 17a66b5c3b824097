"""Build (once) and cache the lab's tiny warm-started Llama model for a task.

``lab_model_path("addition")`` returns a directory that ``from_pretrained`` loads: a ~0.9M
parameter ``LlamaForCausalLM``, the character tokenizer, and ``lab.json`` (build settings and
measured accuracies). The model is initialised from a fixed seed and trained with supervised
fine-tuning on the task's train split until its *sampled* accuracy (temperature 1) on the
validation split reaches ``target_accuracy``: a policy that is right some of the time, so RL has
room to improve it. Everything is seeded and the build runs on one thread, so it is
reproducible on one machine (float sums, hence the stopping step, may differ across CPUs).

Cache: ``$EXPLORL_LAB_CACHE``, else ``$XDG_CACHE_HOME/explorl/lab``, else
``~/.cache/explorl/lab``; one directory ``<task>-<hash of the build settings>`` per model.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from explorl.config import SPLIT_SIZES
from explorl.hf_compat import quiet_transformers
from explorl.lab.registry import get_task, make_splits, task_params
from explorl.lab.sampling import LabModel, sample  # noqa: F401 (sample: also read from here)
from explorl.lab.tasks import LabTask
from explorl.lab.tokenizer import (
    CHARS,
    EOS,
    PAD,
    SPECIALS,
    check_alphabet,
    lab_tokenizer,
    outside,
    save_lab_tokenizer,
)
from explorl.records import PromptRecord
from explorl.rewards.functions import as_scorer

log = logging.getLogger(__name__)

BUILD_VERSION = 1
"""Bump when the build procedure changes, so cached models are rebuilt."""


@dataclass(frozen=True)
class BuildConfig:
    """How a lab model is built. Every field is part of the cache key."""

    seed: int = 0
    """Seed of the initial weights, the SFT batch order and the accuracy sampling."""
    split_seed: int = 0
    """Seed of the task's train/val/test split (``make_splits(seed=...)``)."""
    n_train: int = SPLIT_SIZES["n_train"]
    """Training problems; the SFT data."""
    n_val: int = SPLIT_SIZES["n_val"]
    """Validation problems; the accuracy measured while building and recorded in lab.json."""
    n_test: int = SPLIT_SIZES["n_test"]
    """Test problems (not used by the build; part of the split)."""
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 384
    max_positions: int = 64
    """Longest prompt + response the model can see."""
    batch_size: int = 64
    lr: float = 1e-3
    warmup_steps: int = 20
    weight_decay: float = 0.01
    max_steps: int = 1500
    """SFT step cap, reached only when the target accuracy is not."""
    check_every: int = 50
    """SFT steps between two accuracy checks."""
    target_accuracy: float = 0.35
    """Stop SFT at the first check whose sampled val accuracy (T=1) reaches this."""
    check_samples: int = 2
    """Samples per val prompt at each check."""
    eval_samples: int = 8
    """Samples per val prompt for the final sampled accuracy in lab.json."""


SIZES: dict[str, dict[str, Any]] = {
    "default": {},
    # ~9.6M parameters (10× the default): the size-effect runs. A lower SFT learning rate and
    # a longer warm-up, as usual for a wider model.
    "large": {
        "hidden_size": 384,
        "num_layers": 5,
        "num_heads": 6,
        "intermediate_size": 1152,
        "lr": 5e-4,
        "warmup_steps": 50,
    },
    # Seconds to build: for tests that need a loadable model, not a useful one.
    "tiny": {
        "n_train": 64,
        "n_val": 16,
        "n_test": 16,
        "hidden_size": 32,
        "num_layers": 1,
        "num_heads": 2,
        "intermediate_size": 64,
        "batch_size": 16,
        "max_steps": 10,
        "check_every": 5,
        "eval_samples": 2,
    },
}

_FIELDS = {f.name for f in dataclasses.fields(BuildConfig)}


def resolve(
    task: str | LabTask, *, size: str = "default", **overrides: Any
) -> tuple[dict[str, Any], BuildConfig]:
    """Split ``overrides`` into (task parameters, BuildConfig), layering the task's build
    settings < size < overrides."""
    t = get_task(task)
    if size not in SIZES:
        raise ValueError(f"unknown lab model size {size!r}; valid sizes: {sorted(SIZES)}")
    unknown = set(overrides) - _FIELDS - set(t.params)
    if unknown:
        raise ValueError(
            f"unknown lab build setting(s) {sorted(unknown)}; valid: task parameters "
            f"{sorted(t.params)} and build settings {sorted(_FIELDS)}"
        )
    bad = set(t.build) - _FIELDS
    if bad:
        raise ValueError(f"lab task {t.name!r}: build settings {sorted(bad)} are not "
                         f"BuildConfig fields (valid: {sorted(_FIELDS)})")
    params = task_params(t, **{k: v for k, v in overrides.items() if k in t.params})
    build = {
        **t.build,
        **SIZES[size],
        **{k: v for k, v in overrides.items() if k in _FIELDS},
    }
    return params, BuildConfig(**build)


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir)
    if os.environ.get("EXPLORL_LAB_CACHE"):
        return Path(os.environ["EXPLORL_LAB_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg) / "explorl" / "lab"


def build_key(task: str | LabTask, params: dict[str, Any], cfg: BuildConfig) -> str:
    """``<task>-<10 hex digits>``: the cache directory name of these build settings."""
    t = get_task(task)
    key = {"version": BUILD_VERSION, "task": t.name, "params": params,
           "build": dataclasses.asdict(cfg)}
    # Only where they differ from the built-in tasks', so addition's and countdown's keys (and
    # every cached build of them) stay what they were before tasks became plugins.
    if t.alphabet != CHARS:
        key["alphabet"] = t.alphabet
    if t.version is not None:
        key["task_version"] = t.version
    blob = json.dumps(key, sort_keys=True, default=str)
    name = "".join(c if c.isalnum() or c in "_.-" else "-" for c in t.name)
    return f"{name}-{hashlib.sha256(blob.encode()).hexdigest()[:10]}"


def lab_model_path(
    task: str | LabTask,
    *,
    cache_dir: str | os.PathLike | None = None,
    size: str = "default",
    num_threads: int | None = 1,
    build: bool = True,
    **overrides: Any,
) -> Path:
    """Directory of the lab model for ``task``, building it first when it is not cached.

    ``overrides`` are task parameters (e.g. ``max_digits=3``) or ``BuildConfig`` fields (e.g.
    ``max_steps=200``); ``size="tiny"`` builds a throwaway model in seconds. Concurrent callers
    (pytest-xdist workers, several runs) wait on a file lock; the first one builds into a
    temporary directory and renames it into place, so no one ever sees a half-written model.

    ``num_threads``: torch threads while building (the caller's setting is restored after);
    None keeps the caller's. ``build=False``: the folder, built or not (nothing is built). One
    thread is the default: the model is too small to gain from
    more, on a busy machine two threads ran 10x slower than one (OpenMP threads wait on each
    other when cores are oversubscribed), and a fixed count makes the weights independent of
    the caller's setting (float sums may round differently with more threads).
    """
    task = get_task(task)
    params, cfg = resolve(task, size=size, **overrides)
    root = cache_root(cache_dir)
    name = build_key(task, params, cfg)
    final = root / name
    if not build or (final / "lab.json").exists():  # lab.json is written last: complete
        return final
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if (final / "lab.json").exists():  # built by someone else while we waited
                return final
            for stale in root.glob(f".{name}.*"):  # left by a builder that was killed
                shutil.rmtree(stale, ignore_errors=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=root))
            tmp.chmod(0o755)  # mkdtemp makes it owner-only; a shared cache should be readable
            try:
                log.info("building the lab model for %r (once; about a minute on a CPU), "
                         "cached in %s", getattr(task, "name", task), final)
                threads = torch.get_num_threads()
                try:
                    if num_threads:
                        torch.set_num_threads(num_threads)
                    _build(task, params, cfg, tmp)
                finally:
                    torch.set_num_threads(threads)
                if final.exists():  # an incomplete directory not made by us (no lab.json)
                    shutil.rmtree(final)
                os.replace(tmp, final)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return final


# ----------------------------------------------------------------------------- the build


def task_alphabet(task: LabTask, splits: dict[str, list[PromptRecord]]) -> str:
    """The task's alphabet (or, when it has none, the characters its problems use), checked to
    hold every character of every prompt and solution."""
    texts = [t for recs in splits.values() for r in recs for t in (r.prompt, r.extra["solution"])]
    if task.alphabet is None:
        return "".join(sorted(set("".join(texts))))
    check_alphabet(task.alphabet)
    for text in texts:
        if outside(text, task.alphabet):
            raise ValueError(
                f"lab task {task.name!r}: {text!r} has {outside(text, task.alphabet)!r}, outside "
                f"its alphabet {task.alphabet!r} (the lab tokenizer knows only those characters)")
    return task.alphabet


@dataclass(frozen=True)
class _WarmStart:
    """Where SFT stopped: its step count, last loss, and the accuracy checks on the way."""

    steps: int
    loss: float
    history: list[dict[str, float]]


@dataclass(frozen=True)
class _Measured:
    """The built model's accuracies, sampled with fresh seeds (not the stopping rule's)."""

    greedy: float
    greedy_by: dict[str, float]
    sampled: float
    sampled_by: dict[str, float]
    sampled_samples: int
    train_sampled: float


def _build(task: LabTask, params: dict[str, Any], cfg: BuildConfig, out: Path) -> None:
    """Initialise, warm-start by SFT, measure, and save the model into ``out``."""
    t0 = time.perf_counter()
    scorer = as_scorer(task.check)

    def check(text: str, r: PromptRecord) -> bool:
        return scorer(text, r.ground_truth, (r.prompt, r.data_source, r.extra)) >= 1.0

    splits = make_splits(
        task, seed=cfg.split_seed, n_train=cfg.n_train, n_val=cfg.n_val, n_test=cfg.n_test, **params
    )
    lab = _initialise(task, task_alphabet(task, splits), check, cfg)
    train = _sft_examples(lab, splits["train"], cfg)
    sft = _warm_start(lab, train, splits["val"], cfg)
    measured = _measure(lab, splits, cfg)
    _save_model(lab, out)
    meta = _lab_json(lab, params, cfg, sft, measured, seconds=time.perf_counter() - t0)
    (out / "lab.json").write_text(json.dumps(meta, indent=2) + "\n")
    log.info(
        "  lab model %s ready in %.0f s: %d parameters, sampled val accuracy %.3f, greedy %.3f",
        getattr(task, "name", task),
        meta["build_seconds"],
        meta["n_params"],
        measured.sampled,
        measured.greedy,
    )


def _initialise(
    task: LabTask, alphabet: str, check: Callable[[str, PromptRecord], bool], cfg: BuildConfig
) -> LabModel:
    """The tokenizer of ``alphabet`` and a Llama model with weights drawn from ``cfg.seed``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = lab_tokenizer(model_max_length=cfg.max_positions, alphabet=alphabet)
    pad_id, eos_id = tok.convert_tokens_to_ids(PAD), tok.convert_tokens_to_ids(EOS)
    config = LlamaConfig(
        vocab_size=len(SPECIALS) + len(alphabet),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        max_position_embeddings=cfg.max_positions,
        tie_word_embeddings=True,
        pad_token_id=pad_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=eos_id,
    )
    # fork_rng: the build must not move the caller's global RNG (weight init draws from it).
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = LlamaForCausalLM(config)
    return LabModel(task, model, tok, alphabet, pad_id, eos_id, check)


def _sft_examples(
    lab: LabModel, records: list[PromptRecord], cfg: BuildConfig
) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, solution ids + EOS) of each training record, checked to fit the model;
    sets ``lab.max_new`` from the longest solution."""
    train = [(lab.encode(r.prompt), lab.encode(r.extra["solution"]) + [lab.eos_id])
             for r in records]
    too_long = max(len(p) + len(s) for p, s in train)
    if too_long > cfg.max_positions:
        raise ValueError(
            f"a {lab.task.name} example has {too_long} tokens > max_positions={cfg.max_positions}"
        )
    lab.max_new = max(len(s) for _, s in train) + 4  # room for a longer (wrong) answer
    return train


def _sft_tensors(
    train: list[tuple[list[int], list[int]]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded input ids (N, L); labels (N, L), the response tokens and EOS with prompt
    and padding masked out (-100); and each example's length (N,)."""
    L = max(len(p) + len(s) for p, s in train)
    ids = torch.full((len(train), L), pad_id)  # (N, L), right-padded
    labels = torch.full((len(train), L), -100)  # (N, L)
    for i, (p, s) in enumerate(train):
        ids[i, : len(p) + len(s)] = torch.tensor(p + s)
        labels[i, len(p) : len(p) + len(s)] = torch.tensor(s)
    return ids, labels, (ids != pad_id).sum(-1)


def _warm_start(
    lab: LabModel, train: list[tuple[list[int], list[int]]], val: list[PromptRecord],
    cfg: BuildConfig,
) -> _WarmStart:
    """SFT (cross-entropy on the response tokens and EOS) until a check's sampled val accuracy
    reaches ``cfg.target_accuracy``, or for ``cfg.max_steps``. Leaves the model in eval mode."""
    model, pad_id = lab.model, lab.pad_id
    ids, labels, lengths = _sft_tensors(train, pad_id)
    g = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98)
    )
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, cfg.warmup_steps))
    )
    order, pos = torch.randperm(len(train), generator=g), 0
    history, step, loss = [], 0, float("nan")
    model.train()
    while step < cfg.max_steps:
        if pos + cfg.batch_size > len(train):
            order, pos = torch.randperm(len(train), generator=g), 0
        idx = order[pos : pos + cfg.batch_size]
        pos += cfg.batch_size
        T = int(lengths[idx].max())
        x = ids[idx, :T]  # (B, T)
        res = model(input_ids=x, attention_mask=(x != pad_id).long(), labels=labels[idx, :T])
        opt.zero_grad(set_to_none=True)
        res.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        loss = res.loss.item()
        if step % cfg.check_every == 0 or step == cfg.max_steps:
            model.eval()
            acc, _ = lab.accuracy(val, cfg.check_samples, 1.0, cfg.seed + step)
            model.train()
            history.append(
                {"step": step, "loss": round(loss, 4), "val_sampled_accuracy": round(acc, 4)}
            )
            log.info(
                "  lab model %s: SFT step %d/%d  loss %.3f  sampled val accuracy %.3f "
                "(stops at %.2f)",
                lab.task.name,
                step,
                cfg.max_steps,
                loss,
                acc,
                cfg.target_accuracy,
            )
            if acc >= cfg.target_accuracy:
                break
    model.eval()
    return _WarmStart(step, loss, history)


def _measure(lab: LabModel, splits: dict[str, list[PromptRecord]], cfg: BuildConfig) -> _Measured:
    """Final measurement with fresh sampling seeds (not the ones the stopping rule saw)."""
    greedy, greedy_by = lab.accuracy(splits["val"], 1, 0.0, cfg.seed)
    sampled, sampled_by = lab.accuracy(splits["val"], cfg.eval_samples, 1.0, cfg.seed + 10**6)
    n_tr = min(len(splits["train"]), cfg.n_val)
    train_sampled, _ = lab.accuracy(
        splits["train"][:n_tr], cfg.check_samples, 1.0, cfg.seed + 2 * 10**6
    )
    return _Measured(greedy, greedy_by, sampled, sampled_by,
                     cfg.eval_samples * len(splits["val"]), train_sampled)


def _save_model(lab: LabModel, out: Path) -> None:
    """The model (config.json, generation_config.json, model.safetensors) and tokenizer."""
    lab.model.generation_config.pad_token_id = lab.pad_id
    lab.model.generation_config.eos_token_id = lab.eos_id
    with quiet_transformers():  # no "Writing model shards" bar between the build's own lines
        lab.model.save_pretrained(out)
    save_lab_tokenizer(lab.tok, out)


def _lab_json(
    lab: LabModel, params: dict[str, Any], cfg: BuildConfig, sft: _WarmStart, measured: _Measured,
    *, seconds: float,
) -> dict[str, Any]:
    """``lab.json``: the build settings, where SFT stopped and the measured accuracies."""
    import transformers

    return {
        "task": lab.task.name,
        "params": params,
        "alphabet": lab.alphabet,
        "max_response_len": lab.task.max_response_len,
        "build": dataclasses.asdict(cfg),
        "build_version": BUILD_VERSION,
        "seed": cfg.seed,
        "split_seed": cfg.split_seed,
        "n_params": sum(p.numel() for p in lab.model.parameters()),
        "sft_steps": sft.steps,
        "final_loss": round(sft.loss, 4),
        "val_greedy_accuracy": round(measured.greedy, 4),
        "val_sampled_accuracy": round(measured.sampled, 4),
        "val_sampled_samples": measured.sampled_samples,
        "val_greedy_accuracy_by_difficulty": measured.greedy_by,
        "val_sampled_accuracy_by_difficulty": measured.sampled_by,
        "train_sampled_accuracy": round(measured.train_sampled, 4),
        "max_new_tokens": lab.max_new,
        "history": sft.history,
        "build_seconds": round(seconds, 1),
        "torch_num_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
    }
