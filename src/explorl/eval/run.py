"""``explorl eval``: n samples per problem → pass@k, mean@n, greedy accuracy, per data source."""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from explorl import config as C
from explorl import validation
from explorl.adapters import adapter_base, is_adapter_checkpoint, load_for_inference
from explorl.data.sources import load_split
from explorl.errors import ModelPathError
from explorl.eval.evaluate import plot_passk, summarize, tool_summary, write_eval_json
from explorl.eval.validate import EVAL_STREAM, answer
from explorl.files import write_text_atomic
from explorl.models import (
    Prompt,
    load_tokenizer,
    render_prompt,
    resolve_device,
    resolve_dtype,
    resolve_model_path,
)
from explorl.outputs.checkpoint import latest_checkpoint
from explorl.outputs.completions import prompt_text
from explorl.outputs.progress_lines import ProgressLines
from explorl.outputs.tables import print_tables, stacked
from explorl.rewards.functions import check_reward
from explorl.rewards.pool import VerifierPool
from explorl.rewards.rewarder import Rewarder
from explorl.rollout.base import build_engine
from explorl.rollout.progress import DecodeRate, listening, phase
from explorl.rollout.seeding import mix_seed
from explorl.validation.references import DEFAULT_RESPONSE_LEN


def resolve_model(model: str, overrides: list[str] | None
                  ) -> tuple[Path, Path, C.RunConfig, Path | None]:
    """``(weights dir, tokenizer dir, config, base dir)`` for a model dir, ``lab:<task>``, a run
    dir or an adapter checkpoint (LoRA); the base dir is the adapters' base model, else None."""
    run_dir = Path(model)
    if (run_dir / "config.yaml").is_file() and (run_dir / "checkpoints").is_dir():
        what = f"{run_dir / 'config.yaml'}"
        data = C.load_yaml(C.read_utf8((run_dir / "config.yaml").read_bytes(), what), what)
        for text in overrides or []:
            k, v = C.parse_override(text)
            C.set_path(data, k, v)
        cfg = validation.from_dict(data)
        ckpt = latest_checkpoint(run_dir)
        if ckpt is not None and is_adapter_checkpoint(ckpt):  # LoRA: the run's base + adapters
            return ckpt, ckpt, cfg, resolve_model_path(cfg.model.path, cfg.lab)
        if ckpt is None or not (ckpt / "config.json").exists():
            raise ModelPathError(f"{run_dir} has no checkpoint with model weights")
        return ckpt, ckpt, cfg, None
    # `explorl eval` samples up to 256 new tokens unless told otherwise (--max-new-tokens, or
    # --set rollout.max_response_len), whatever the model: the numbers it reported before lab
    # tasks had their own response lengths stay the same.
    data: dict = {"model": {"path": model}, "rollout": {"max_response_len": DEFAULT_RESPONSE_LEN}}
    for text in overrides or []:
        k, v = C.parse_override(text)
        C.set_path(data, k, v)
    if is_adapter_checkpoint(Path(model)):  # a checkpoint of adapters alone: PEFT names the base
        data["model"]["path"] = str(adapter_base(Path(model)))
        cfg = validation.from_dict(data)
        return Path(model), Path(model), cfg, Path(cfg.model.path)
    cfg = validation.from_dict(data)
    path = resolve_model_path(model, cfg.lab)
    return path, path, cfg, None


def run_eval(
    *,
    model: str,
    data: list[str],
    out_dir: Path,
    n: int = 16,
    k_list: list[int] = (1, 16),
    temperature: float = 1.0,
    max_problems: int | None = None,
    max_new_tokens: int | None = None,
    verifier: str = "auto",
    split: str = "test",
    seed: int = 0,
    overrides: list[str] | None = None,
    batch_problems: int = 64,
    progress: bool = True,
) -> dict:
    """Evaluate ``model`` on ``data``; write ``eval.json`` (the totals; with tools, ``tools``:
    the calls per response), ``problems.jsonl`` (each problem's responses, scores and, with
    tools, tool calls: docs/completions.md) and ``passk.png`` into ``out_dir``."""
    k_list = _check_flags(n=n, k_list=k_list, temperature=temperature, max_problems=max_problems,
                          max_new_tokens=max_new_tokens)
    weights, tok_dir, cfg, base = resolve_model(model, overrides)
    # Data and verifier before the model: a bad file or name fails in seconds.
    records = load_split(data, cfg, split)[: max_problems or None]
    if verifier != "auto":
        try:
            check_reward(verifier)
        except (ValueError, ImportError) as e:
            raise C.ConfigError(f"--verifier: {e}") from None
    rewarder = Rewarder(cfg.reward, list(data), verifier=verifier)
    name = verifier if verifier != "auto" else cfg.reward.verifier
    torch.manual_seed(seed)
    device = resolve_device(cfg.model.device)
    tokenizer = load_tokenizer(tok_dir, cfg.model)
    # LoRA: the adapters merged into their base (the engine starts from the base's directory)
    policy, engine_path = load_for_inference(weights, cfg.model, device, base)
    max_new = max_new_tokens or cfg.rollout.max_response_len
    engine = build_engine(
        cfg, tokenizer, engine_path, resolve_dtype(cfg.model.dtype, device)
    )  # rollout.engine
    t0, cpu0 = time.perf_counter(), time.process_time()
    got = _sample_problems(
        _Sampling(cfg=cfg, tokenizer=tokenizer, engine=engine, policy=policy, rewarder=rewarder,
                  n=n, temperature=temperature, max_new=max_new, seed=seed),
        records, batch_problems=batch_problems, progress=progress, t0=t0)
    summary = _summarize(got, records, k_list)
    summary["settings"] = {"model": model, "data": list(data), "split": split, "n": n, "k": k_list,
                           "temperature": temperature, "max_new_tokens": max_new, "verifier": name,
                           "seed": seed, "seconds": time.perf_counter() - t0,
                           "cpu_seconds": time.process_time() - cpu0}
    out_dir = Path(out_dir)
    # eval.json last: a study takes it as the mark of a finished evaluation
    write_text_atomic(out_dir / "problems.jsonl", (json.dumps(row) + "\n" for row in got.problems))
    plot_passk(summary, out_dir / "passk.png")
    write_eval_json(summary, out_dir / "eval.json")
    _print_table(summary)
    return summary


def _check_flags(*, n: int, k_list: list[int], temperature: float, max_problems: int | None,
                 max_new_tokens: int | None) -> list[int]:
    """The counts ≥ 1 and the temperature in range, else a ConfigError naming the flag; the
    k's up to ``n``, sorted and without repeats."""
    counts = [("--n", n), ("--max-problems", max_problems), ("--max-new-tokens", max_new_tokens),
              *(("--k", k) for k in k_list)]
    for flag, value in counts:
        if value is not None and value < 1:
            raise C.ConfigError(f"{flag}: must be ≥ 1, got {value}")
    if not 0 <= temperature <= 100:  # also NaN
        raise C.ConfigError(f"--temperature: must be in [0, 100], got {temperature}")
    k_list = sorted({k for k in k_list if k <= n})
    if not k_list:
        raise C.ConfigError(f"--k: every k exceeds --n {n}")
    return k_list


@dataclass(frozen=True)
class _Sampling:
    """How each problem is answered: the model, its engine and verifier, and the sampling."""

    cfg: C.RunConfig
    tokenizer: Any
    engine: Any
    policy: Any
    rewarder: Rewarder
    n: int
    temperature: float
    max_new: int
    seed: int


@dataclass
class _Answers:
    """What the evaluation collected, one entry per problem in record order."""

    correct: list[list[bool]] = field(default_factory=list)
    calls: list[list[int]] = field(default_factory=list)
    """Per problem, per response: tool calls answered (with tools; else empty)."""
    greedy: list[bool] = field(default_factory=list)
    problems: list[dict] = field(default_factory=list)
    """One row of problems.jsonl per problem."""


def _sample_problems(how: _Sampling, records: list, *, batch_problems: int, progress: bool,
                     t0: float) -> _Answers:
    """n sampled responses and a greedy one per problem, scored, ``batch_problems`` problems at
    a time under a progress bar (off a terminal: plain lines, log.progress_every_s)."""
    cfg, got = how.cfg, _Answers()
    columns = (TextColumn("[bold]eval"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("eta"), TimeRemainingColumn(), TextColumn("[dim]{task.fields[decode]}"))
    rate = DecodeRate(time.perf_counter)

    def on_decode(t: int, total: int, rows: int) -> None:  # moves the line between batches
        rate(t, total, rows)
        bar.update(task, decode=rate.text())

    def render(prompt) -> list[int]:
        return render_prompt(how.tokenizer, prompt, cfg.model.use_chat_template)

    # Off a terminal the bar draws nothing: plain lines instead (log.progress_every_s)
    lines = (ProgressLines("eval problems", len(records), every_s=cfg.log.progress_every_s)
             if progress and not Console().is_interactive else None)
    with VerifierPool.from_config(cfg.reward) as pool, \
            Progress(*columns, disable=not progress or lines is not None) as bar, \
            listening(on_decode), lines or contextlib.nullcontext():
        task = bar.add_task("eval", total=len(records), decode="")
        for start in range(0, len(records), batch_problems):
            chunk = records[start: start + batch_problems]
            ids = [Prompt(render(r.prompt), r, render) for r in chunk]  # records: for envs
            seeds = [mix_seed(how.seed, EVAL_STREAM, start + i) for i in range(len(chunk))]
            with phase(f"sampling {len(chunk)} problems", len(chunk) * (how.n + 1)):  # + greedy
                batch = answer(engine=how.engine, policy=how.policy, pool=pool,
                               rewarder=how.rewarder, records=chunk, ids=ids, n=how.n,
                               temperature=how.temperature, max_new_tokens=how.max_new,
                               seeds=seeds, greedy=True)
            _collect(got, start, chunk, batch)
            bar.update(task, advance=len(chunk))
            if lines is not None:
                secs = max(1e-9, time.perf_counter() - t0)
                lines.done(start + len(chunk), [f"{lines.tokens / secs:,.0f} tok/s"])
    return got


def _collect(got: _Answers, start: int, chunk: list, batch) -> None:
    """Add one batch's answers (``answer``'s result for ``chunk``, the problems from index
    ``start``) to ``got``."""
    pidx, scores = batch.ro.prompt_index.tolist(), batch.correct
    g_texts, g_scores = batch.greedy_texts, batch.greedy_correct
    used = batch.ro.tool_calls.tolist() if batch.ro.tool_calls is not None else None
    lens = batch.ro.lengths.tolist()
    for i, rec in enumerate(chunk):
        mine = [(t, sc) for t, sc, p in zip(batch.ro.texts, scores, pidx) if p == i]
        got.correct.append([sc > 0 for _, sc in mine])
        row = problem_row(start + i, rec, mine, g_texts[i], g_scores[i])
        row["lengths"] = [n_tok for n_tok, p in zip(lens, pidx) if p == i]
        if used is not None:
            got.calls.append([c for c, p in zip(used, pidx) if p == i])
            row["tool_calls"] = got.calls[-1]
        got.problems.append(row)
    got.greedy += [s > 0 for s in g_scores]


def _summarize(got: _Answers, records: list, k_list: list[int]) -> dict:
    """pass@k and mean@n overall and per data source, with greedy accuracy beside them; with
    tools, the ``tools`` section."""
    summary = summarize(got.correct, [r.data_source for r in records], k_list)
    if got.calls:  # a run without tools writes no `tools` section
        summary["tools"] = tool_summary(got.calls, got.correct)
    summary["overall"]["greedy_accuracy"] = sum(got.greedy) / max(1, len(got.greedy))
    for src in summary["by_source"]:
        flags = [g for g, r in zip(got.greedy, records) if r.data_source == src]
        summary["by_source"][src]["greedy_accuracy"] = sum(flags) / max(1, len(flags))
    return summary


def problem_row(index: int, rec, samples: list[tuple[str, float]], greedy_text: str,
                greedy_score: float) -> dict:
    """One row of ``problems.jsonl``: the problem, its n sampled responses with their verifier
    scores, and the greedy response (fields in docs/completions.md)."""
    return {"index": index, "data_source": str(rec.data_source), "prompt": prompt_text(rec.prompt),
            "ground_truth": str(rec.ground_truth), "n_correct": sum(sc > 0 for _, sc in samples),
            "responses": [t for t, _ in samples], "scores": [float(sc) for _, sc in samples],
            "greedy_response": greedy_text, "greedy_score": float(greedy_score)}


def _print_table(summary: dict, console=None) -> None:
    """The summary as a table stacked to the terminal's width (``outputs.tables``), then the
    overall numbers as one JSON line (for scripts)."""
    console = console or Console()
    ks = summary["settings"]["k"]
    title = f"pass@k (n={summary['settings']['n']}, T={summary['settings']['temperature']})"
    header = ["source", "problems", *[f"pass@{k}" for k in ks], "mean@n", "greedy"]
    rows = [("overall", summary["overall"])] + list(summary["by_source"].items())
    cells = [[name, str(s.get("n_problems", "")), *[f"{s[f'pass@{k}']:.3f}" for k in ks],
              f"{s['mean@n']:.3f}", f"{s.get('greedy_accuracy', float('nan')):.3f}"]
             for name, s in rows]
    print_tables(stacked(header, cells, console.width, title=title), console)
    print(json.dumps({"overall": summary["overall"]}))
