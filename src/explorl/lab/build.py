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
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from explorl.config import SPLIT_SIZES
from explorl.hf_compat import cache_kwarg, quiet_transformers
from explorl.lab.registry import get_task, make_splits, task_params
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


def _build(task: LabTask, params: dict[str, Any], cfg: BuildConfig, out: Path) -> None:
    """Initialise, warm-start by SFT, measure, and save the model into ``out``."""
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    t0 = time.perf_counter()
    scorer = as_scorer(task.check)

    def check(text: str, r: PromptRecord) -> bool:
        return scorer(text, r.ground_truth, (r.prompt, r.data_source, r.extra)) >= 1.0

    splits = make_splits(
        task, seed=cfg.split_seed, n_train=cfg.n_train, n_val=cfg.n_val, n_test=cfg.n_test, **params
    )
    alphabet = task_alphabet(task, splits)
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
    n_params = sum(p.numel() for p in model.parameters())

    def encode(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    train = [(encode(r.prompt), encode(r.extra["solution"]) + [eos_id]) for r in splits["train"]]
    too_long = max(len(p) + len(s) for p, s in train)
    if too_long > cfg.max_positions:
        raise ValueError(
            f"a {task.name} example has {too_long} tokens > max_positions={cfg.max_positions}"
        )
    max_new = max(len(s) for _, s in train) + 4  # room for a longer (wrong) answer

    def accuracy(
        records: list[PromptRecord], n: int, temperature: float, seed: int
    ) -> tuple[float, dict[str, float]]:
        """Fraction of ``n`` samples per record that pass the task check; and per difficulty."""
        recs = [r for r in records for _ in range(n)]
        texts = sample(
            model,
            [encode(r.prompt) for r in recs],
            temperature=temperature,
            max_new_tokens=max_new,
            eos_id=eos_id,
            pad_id=pad_id,
            vocab=tok.convert_ids_to_tokens,
            generator=torch.Generator().manual_seed(seed),
        )
        by_diff = defaultdict(list)
        for text, r in zip(texts, recs):
            by_diff[r.extra["difficulty"]].append(check(text, r))
        hits = [h for v in by_diff.values() for h in v]
        return sum(hits) / len(hits), {
            str(k): round(sum(v) / len(v), 4) for k, v in sorted(by_diff.items())
        }

    # SFT: cross-entropy on the response tokens and EOS; prompt and padding are masked out.
    L = max(len(p) + len(s) for p, s in train)
    ids = torch.full((len(train), L), pad_id)  # (N, L), right-padded
    labels = torch.full((len(train), L), -100)  # (N, L)
    for i, (p, s) in enumerate(train):
        ids[i, : len(p) + len(s)] = torch.tensor(p + s)
        labels[i, len(p) : len(p) + len(s)] = torch.tensor(s)
    lengths = (ids != pad_id).sum(-1)
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
            acc, _ = accuracy(splits["val"], cfg.check_samples, 1.0, cfg.seed + step)
            model.train()
            history.append(
                {"step": step, "loss": round(loss, 4), "val_sampled_accuracy": round(acc, 4)}
            )
            log.info(
                "  lab model %s: SFT step %d/%d  loss %.3f  sampled val accuracy %.3f "
                "(stops at %.2f)",
                task.name,
                step,
                cfg.max_steps,
                loss,
                acc,
                cfg.target_accuracy,
            )
            if acc >= cfg.target_accuracy:
                break
    model.eval()

    # Final measurement with fresh sampling seeds (not the ones the stopping rule saw).
    greedy, greedy_by = accuracy(splits["val"], 1, 0.0, cfg.seed)
    sampled, sampled_by = accuracy(splits["val"], cfg.eval_samples, 1.0, cfg.seed + 10**6)
    n_tr = min(len(splits["train"]), cfg.n_val)
    train_sampled, _ = accuracy(
        splits["train"][:n_tr], cfg.check_samples, 1.0, cfg.seed + 2 * 10**6
    )

    model.generation_config.pad_token_id = pad_id
    model.generation_config.eos_token_id = eos_id
    with quiet_transformers():  # no "Writing model shards" bar between the build's own lines
        model.save_pretrained(out)  # config.json, generation_config.json, model.safetensors
    save_lab_tokenizer(tok, out)
    meta = {
        "task": task.name,
        "params": params,
        "alphabet": alphabet,
        "max_response_len": task.max_response_len,
        "build": dataclasses.asdict(cfg),
        "build_version": BUILD_VERSION,
        "seed": cfg.seed,
        "split_seed": cfg.split_seed,
        "n_params": n_params,
        "sft_steps": step,
        "final_loss": round(loss, 4),
        "val_greedy_accuracy": round(greedy, 4),
        "val_sampled_accuracy": round(sampled, 4),
        "val_sampled_samples": cfg.eval_samples * len(splits["val"]),
        "val_greedy_accuracy_by_difficulty": greedy_by,
        "val_sampled_accuracy_by_difficulty": sampled_by,
        "train_sampled_accuracy": round(train_sampled, 4),
        "max_new_tokens": max_new,
        "history": history,
        "build_seconds": round(time.perf_counter() - t0, 1),
        "torch_num_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
    }
    (out / "lab.json").write_text(json.dumps(meta, indent=2) + "\n")
    log.info(
        "  lab model %s ready in %.0f s: %d parameters, sampled val accuracy %.3f, greedy %.3f",
        getattr(task, "name", task),
        meta["build_seconds"],
        n_params,
        sampled,
        greedy,
    )


@torch.no_grad()
def sample(
    model: torch.nn.Module,
    prompts: list[list[int]],
    *,
    temperature: float,
    max_new_tokens: int,
    eos_id: int,
    pad_id: int,
    vocab,
    generator: torch.Generator,
    batch_size: int = 512,
) -> list[str]:
    """Sample one response per prompt (``temperature == 0``: greedy); text up to EOS.

    A plain KV-cached loop rather than ``generate``: it draws from an explicit generator, so
    the build never touches the global RNG. ``vocab`` maps a list of ids to their characters.
    """
    texts: list[str] = []
    cache_name = cache_kwarg(model)
    for c in range(0, len(prompts), batch_size):
        chunk = prompts[c : c + batch_size]
        B, P = len(chunk), max(len(p) for p in chunk)
        ids = torch.full((B, P), pad_id)  # (B, P), left-padded
        mask = torch.zeros(B, P, dtype=torch.long)
        for i, p in enumerate(chunk):
            ids[i, P - len(p) :] = torch.tensor(p)
            mask[i, P - len(p) :] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, P)
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
        cache = getattr(out, cache_name)
        next_pos = pos[:, -1:] + 1  # (B, 1)
        done = torch.zeros(B, dtype=torch.bool)
        new = []
        for t in range(max_new_tokens):
            logits = out.logits[:, -1].float()  # (B, V)
            if temperature == 0:
                tok = logits.argmax(-1)
            else:
                tok = torch.multinomial(
                    torch.softmax(logits / temperature, -1), 1, generator=generator
                )[:, 0]
            tok = torch.where(done, torch.full_like(tok, pad_id), tok)
            new.append(tok)
            done |= tok == eos_id
            if done.all() or t == max_new_tokens - 1:
                break
            mask = torch.cat([mask, torch.ones(B, 1, dtype=torch.long)], 1)
            out = model(
                input_ids=tok[:, None],
                attention_mask=mask,
                position_ids=next_pos,
                use_cache=True,
                **{cache_name: cache},
            )
            cache = getattr(out, cache_name)
            next_pos = next_pos + 1
        gen = torch.stack(new, 1).tolist()  # (B, R)
        for row in gen:
            row = row[: row.index(eos_id)] if eos_id in row else row
            texts.append("".join(t for t in vocab(row) if t not in SPECIALS))
    return texts
