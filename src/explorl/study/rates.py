"""Measured CPU rates of a model (``explorl study SPEC --plan``): CPU seconds per generated token
while training (sampling and scoring), per trained token (the update), per evaluated token and
per process start, read from runs' ``metrics.jsonl`` and ``eval*/eval.json`` or measured by a
calibration (``explorl.study.calibrate``), and cached per model and shape.

What a run records, and how it is split (``from_runs``):

- each training step's ``time/cpu_s`` (CPU seconds of the training process, all its threads,
  validation included) less its validation's ``time/val_cpu_s`` is shared between sampling
  (``time/generate_s`` + ``time/score_s``) and the update (``time/train_s`` +
  ``time/old_logp_s``) in the ratio of their wall-clock seconds;
- the evaluation rate comes from the measured CPU seconds of validations (``time/val_cpu_s``)
  and evaluations (``eval.json``); only without either, from the validations' wall-clock share
  of their step's CPU time (``time/val_s`` ÷ ``time/step_s``: rough where the cores are shared,
  as the CPU a process gets then varies within a step);
- tokens: a step generated ``rollout/n_samples`` × ``response/length_mean`` and trained
  ``rollout/n_trained`` × ``response/length_mean`` × ``optim.ppo_epochs``; a validation
  generated its replies (``eval.n_samples`` per problem, plus a greedy one with
  ``eval.greedy``) × the run's mean reply length (validation records no lengths of its own);
- an ``explorl eval`` of the run (``eval.json``'s ``cpu_seconds``, start-up excluded) generated
  ``n`` + 1 (greedy) replies per problem × the same mean length;
- ``parallel``: the run's CPU seconds per wall-clock second (Σ ``time/cpu_s`` ÷ Σ
  ``time/step_s``): 1.0 is one core kept busy; a core shared with other work reads below 1.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from explorl import config as C
from explorl import validation
from explorl.errors import ConfigError
from explorl.files import write_text_atomic


@dataclass
class TokenRates:
    """CPU seconds per token of one model at one shape (``shape_of``)."""

    model: str
    """The model (``model_id``)."""
    sample_s: float
    """CPU-s per generated token while training (sampling and scoring)."""
    update_s: float
    """CPU-s per trained token per PPO epoch (the update and any old log-prob pass)."""
    eval_s: float | None
    """CPU-s per evaluated token (validation, ``explorl eval``); None: no evaluation measured."""
    length: float
    """Mean reply length in tokens (``response/length_mean`` over the measured steps)."""
    parallel: float
    """CPU-s per wall-clock second of one job."""
    threads: int
    """torch threads of the measured runs."""
    steps: int
    """Training steps measured."""
    source: str
    """Where the rates come from (runs, a calibration)."""
    start_s: float = 0.0
    """CPU-s of one process's start and end (imports, model load, the last save); 0: not
    measured (runs record no start-up)."""
    shape: dict | None = None
    """The shape measured (``shape_of``): the calibration cache's key."""

    def per_reply(self) -> float | None:
        return None if self.eval_s is None else self.eval_s * self.length

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> TokenRates:
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})


def model_id(cfg: C.RunConfig) -> str:
    """What a rate is measured for: ``model.path`` (a lab model: with its size)."""
    path = cfg.model.path
    return f"{path} ({cfg.lab.model_size})" if path.startswith("lab:") else path


def run_model(run: Path, cfg: C.RunConfig) -> str:
    """The model a run directory measured: its ``model_id``, or for a study's final or tuning
    run that started from the study's ``start`` run (``model.path`` ending in
    ``start/checkpoints/step-N``), the start run's model: the same network, which the study's
    plan prices by the start's rates (``pricing.rated``)."""
    path = Path(cfg.model.path)
    if path.parent.name != "checkpoints" or path.parent.parent.name != "start":
        return model_id(cfg)
    for study in (run.parent.parent, run.parent.parent.parent):  # runs/X, tune/runs/X
        start = study / "start"
        if (start / "config.yaml").exists() and start.resolve() != run.resolve():
            try:
                return run_model(start, run_config(start))
            except ConfigError:
                break
    return model_id(cfg)


def threads_of(cfg: C.RunConfig) -> int:
    """torch threads of a study job: ``model.cpu_threads``, else 1 (a job runs with
    ``OMP_NUM_THREADS=1``)."""
    return cfg.model.cpu_threads or 1


def shape_of(cfg: C.RunConfig) -> dict:
    """What a rate depends on besides the model: the task, the batch (prompts × samples), the
    reply limit, the model section (dtype, threads, adapters) and the micro-batch."""
    return {"model": model_id(cfg), "data": list(cfg.data.train),
            "prompts_per_step": cfg.data.prompts_per_step, "n_samples": cfg.rollout.n_samples,
            "max_response_len": cfg.rollout.max_response_len, "threads": threads_of(cfg),
            "model_section": C.to_dict(cfg)["model"],
            "micro_batch_size": cfg.optim.micro_batch_size, "engine": cfg.rollout.engine}


def split_size(cfg: C.RunConfig, split: str, max_problems: int | None) -> int:
    """Problems evaluated on ``split`` (a lab split's size, at most ``max_problems``)."""
    n = {"train": cfg.lab.n_train, "val": cfg.lab.n_val, "test": cfg.lab.n_test}[split]
    return min(n, max_problems) if max_problems else n


def val_replies(cfg: C.RunConfig) -> int:
    """Replies one in-training validation generates: ``eval.n_samples`` per problem, plus a
    greedy one with ``eval.greedy``."""
    e = cfg.eval
    problems = split_size(cfg, "val", e.max_problems)
    return problems * (e.n_samples + (1 if e.greedy else 0))


def validations(cfg: C.RunConfig, start: int = 0) -> int:
    """In-training validations of a run's steps after ``start``: every ``eval.every`` steps and
    at the last, plus one before training (``eval.before_training``) when ``start`` is 0."""
    e, end = cfg.eval, cfg.max_steps
    if not e.every:
        return 0
    return (end // e.every - start // e.every + (1 if end % e.every else 0)
            + (1 if e.before_training and start == 0 else 0))


@dataclass
class _Sums:
    sample_cpu: float = 0.0
    sample_tok: float = 0.0
    update_cpu: float = 0.0
    update_tok: float = 0.0
    eval_cpu: float = 0.0  # measured: time/val_cpu_s, eval.json's cpu_seconds
    eval_tok: float = 0.0
    rough_cpu: float = 0.0  # validations' wall-clock share of their step's CPU time
    rough_tok: float = 0.0
    cpu: float = 0.0
    wall: float = 0.0
    len_sum: float = 0.0
    steps: int = 0


def run_config(run: Path) -> C.RunConfig:
    """A run directory's ``config.yaml``."""
    try:
        return validation.from_dict(yaml.safe_load((run / "config.yaml").read_text()), env=False)
    except (OSError, yaml.YAMLError, ConfigError) as e:
        raise ConfigError(f"{run}: no readable config.yaml ({e})") from None


def records(run: Path) -> list[dict]:
    """The readable lines of a run's ``metrics.jsonl`` (none when it has none)."""
    out = []
    try:
        lines = (run / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:  # a line cut by a kill
            continue
    return out


def _add_run(s: _Sums, run: Path, cfg: C.RunConfig) -> None:
    steps = [r for r in records(run) if r.get("time/cpu_s") is not None
             and r.get("time/step_s", 0) > 0 and "response/length_mean" in r]
    lengths = [float(r["response/length_mean"]) for r in steps]
    mean_len = sum(lengths) / len(lengths) if lengths else 0.0
    epochs = cfg.optim.ppo_epochs
    for r in steps:
        cpu, wall = float(r["time/cpu_s"]), float(r["time/step_s"])
        if r.get("time/val_cpu_s") is not None:  # measured
            val = min(cpu, float(r["time/val_cpu_s"]))
            s.eval_cpu += val
            s.eval_tok += val_replies(cfg) * mean_len
        else:  # the wall-clock share (a core shared with other work makes it rough)
            val = min(cpu, cpu * float(r.get("time/val_s", 0.0)) / wall)
            if r.get("time/val_s"):
                s.rough_cpu += val
                s.rough_tok += val_replies(cfg) * mean_len
        gen = float(r.get("time/generate_s", 0.0)) + float(r.get("time/score_s", 0.0))
        upd = float(r.get("time/train_s", 0.0)) + float(r.get("time/old_logp_s", 0.0))
        rest = cpu - val
        share = gen / (gen + upd) if gen + upd > 0 else 0.5
        length = float(r["response/length_mean"])
        sampled = float(r.get("rollout/n_samples", cfg.data.prompts_per_step
                              * cfg.rollout.n_samples))
        trained = float(r.get("rollout/n_trained", sampled))
        s.sample_cpu += rest * share
        s.sample_tok += sampled * length
        s.update_cpu += rest * (1 - share)
        s.update_tok += trained * length * epochs
        s.cpu += cpu
        s.wall += wall
        s.len_sum += length
        s.steps += 1
    for ev in sorted(run.glob("eval*/eval.json")):
        try:
            data = json.loads(ev.read_text())
            cpu_s, st = data["settings"].get("cpu_seconds"), data["settings"]
            problems = data["overall"]["n_problems"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if cpu_s is None or not mean_len:
            continue
        s.eval_cpu += float(cpu_s)
        s.eval_tok += problems * (st["n"] + 1) * min(mean_len, st.get("max_new_tokens")
                                                     or mean_len)


def run_dirs(path: Path) -> list[Path]:
    """The run directories under ``path``: itself (a run: ``metrics.jsonl``), or a study's
    ``runs/*``, ``tune/runs/*`` and ``start`` (its warm start run)."""
    if (path / "metrics.jsonl").exists():
        return [path]
    return sorted(d for pattern in ("runs/*", "tune/runs/*", "start") for d in path.glob(pattern)
                  if (d / "metrics.jsonl").exists() and (d / "config.yaml").exists())


def from_runs(runs: list[Path], model: str, source: str) -> TokenRates | None:
    """The pooled rates of the runs of ``model`` among ``runs`` (token-weighted: Σ CPU ÷ Σ
    tokens), or None when none of them has a measured step."""
    s, threads, shape = _Sums(), set(), None
    for run in runs:
        try:
            cfg = run_config(run)
        except ConfigError:  # not a run this version reads: it prices nothing
            continue
        if run_model(run, cfg) != model:
            continue
        before = s.steps
        _add_run(s, run, cfg)
        if s.steps > before:
            threads.add(threads_of(cfg))
            shape = shape or shape_of(cfg)
    if not s.steps or not s.sample_tok or not s.update_tok:
        return None
    return TokenRates(model=model, sample_s=s.sample_cpu / s.sample_tok,
                      update_s=s.update_cpu / s.update_tok,
                      eval_s=(s.eval_cpu / s.eval_tok if s.eval_tok
                              else s.rough_cpu / s.rough_tok if s.rough_tok else None),
                      length=s.len_sum / s.steps, parallel=s.cpu / s.wall,
                      threads=max(threads), steps=s.steps, source=source, shape=shape)


def cache_root() -> Path:
    """``$EXPLORL_COST_CACHE``, else ``$XDG_CACHE_HOME/explorl/cost``, else
    ``~/.cache/explorl/cost``: the calibrations' rates."""
    if os.environ.get("EXPLORL_COST_CACHE"):
        return Path(os.environ["EXPLORL_COST_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg) / "explorl" / "cost"


def cache_path(cfg: C.RunConfig) -> Path:
    """``<model>-<10 hex digits of the shape>.json`` under ``cache_root``."""
    shape = shape_of(cfg)
    digest = hashlib.sha256(json.dumps(shape, sort_keys=True, default=str).encode()).hexdigest()
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", shape["model"]).strip("_")[-60:]
    return cache_root() / f"{slug}-{digest[:10]}.json"


def cached(cfg: C.RunConfig) -> TokenRates | None:
    """The cached calibration of ``cfg``'s model and shape, or None."""
    try:
        return TokenRates.from_json(json.loads(cache_path(cfg).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def store(cfg: C.RunConfig, rates: TokenRates) -> Path:
    """Cache ``rates`` as the calibration of ``cfg``'s model and shape."""
    path = cache_path(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(rates.to_json(), indent=1, default=str) + "\n")
    return path
