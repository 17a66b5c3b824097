"""The run directory's metrics file and the live progress bar."""

from __future__ import annotations

import contextlib
import json
import math
import signal
import time
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from explorl.config import LogConfig
from explorl.errors import CheckpointError
from explorl.outputs.progress_lines import ProgressLines, duration
from explorl.rollout.progress import DecodeRate, listening


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None  # JSON has no NaN/inf; None keeps the key visible
    return v


def _rows(path: Path) -> list[tuple[str, dict]]:
    """``(line, row)`` of every line of a metrics file. A last line that is not valid JSON was
    being written when the run died (a kill, a full disk) and is dropped; an invalid line
    before it is a ``CheckpointError``."""
    # errors="replace": a multi-byte character cut in half at the end must not stop the read.
    text = path.read_bytes().decode("utf-8", errors="replace")
    lines = [ln for ln in text.split("\n") if ln.strip()]
    rows = []
    for i, line in enumerate(lines):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise CheckpointError(f"{path}: line {i + 1} is not valid JSON (the file was edited "
                                  "or corrupted); remove that line to use the file") from None
        rows.append((line, row))
    return rows


class MetricsLog:
    """``metrics.jsonl``: one JSON object per step, appended and flushed as the step ends."""

    def __init__(self, path: Path, *, truncate_after: int | None = None):
        self.path = Path(path)
        if truncate_after is not None and self.path.exists():
            # Resuming from step N: lines of steps after N came from the interrupted tail, and
            # a partly written last line is dropped.
            keep = [line for line, row in _rows(self.path) if row.get("step", 0) <= truncate_after]
            self.path.write_text("".join(line + "\n" for line in keep))
        self._fh = open(self.path, "a")

    def write(self, metrics: dict) -> None:
        try:
            self._fh.write(json.dumps({k: _clean(v) for k, v in metrics.items()}) + "\n")
            self._fh.flush()
        except OSError as e:
            raise CheckpointError(f"cannot write {self.path}: {e.strerror or e}; the lines "
                                  "before stay, and a resume drops a partial last one") from e

    def close(self) -> None:
        self._fh.close()


def read_metrics(run: str | Path) -> list[dict]:
    """The one reader of ``metrics.jsonl`` (``run``: a run directory or the file): rows sorted by
    ``step``, the last row of a step winning (a resumed run rewrites its tail), a partly written
    last line dropped. Step 0 is the validation of the initial policy (no training keys)."""
    path = Path(run)
    path = path / "metrics.jsonl" if path.is_dir() else path
    if not path.exists():
        return []
    by_step = {row["step"]: row for _, row in _rows(path) if isinstance(row, dict)
               and isinstance(row.get("step"), int)}
    return [by_step[s] for s in sorted(by_step)]


class ProgressBar:
    """Training progress: on a terminal a rich bar showing step, reward, entropy and ETA; off one
    (output to a file) plain lines (``ProgressLines``: one per step, and one at least every
    ``log.progress_every_s`` seconds of a long phase); nothing with ``log.progress`` off or
    ``enabled`` False (ranks other than 0)."""

    def __init__(self, total: int, start: int, log: LogConfig, *, enabled: bool = True,
                 console: Console | None = None):
        self.enabled = enabled = enabled and log.progress
        self.console = console or Console(stderr=True)
        self.lines: ProgressLines | None = None
        self._listening = None
        if not enabled:
            return
        if not self.console.is_interactive:
            self.lines = ProgressLines("step", total, start, every_s=log.progress_every_s,
                                       item="step", write=self._print)
            return
        self.progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(
                "reward {task.fields[reward]}  entropy {task.fields[entropy]}  {task.fields[extra]}"
                "  [dim]{task.fields[decode]}"
            ),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self.task = self.progress.add_task("train", total=total, completed=start,
                                           reward="-", entropy="-", extra="", decode="")
        # The sampler's decode steps move the line between steps (a real model's step on a
        # CPU takes minutes); the rate restarts with each step.
        self._rate = DecodeRate(time.perf_counter)
        self._listening = listening(self._on_decode)
        self._listening.__enter__()
        self.progress.start()

    def _print(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def _on_decode(self, t: int, total: int, rows: int) -> None:
        self._rate(t, total, rows)
        self.progress.update(self.task, decode=self._rate.text())

    def update(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        if self.lines is not None:
            self.lines.done(step, step_fields(metrics))
            if step == 0:  # the validation before training: the ETA counts the steps alone
                self.lines.restart()
            return
        extra = ""
        if "val/accuracy" in metrics:
            extra = f"val {metrics['val/accuracy']:.3f}"
        def fmt(key: str) -> str:  # the step-0 validation row has no training metrics
            return f"{metrics[key]:.3f}" if isinstance(metrics.get(key), (int, float)) else "–"

        self.progress.update(
            self.task,
            completed=step,
            reward=fmt("reward/mean"),
            entropy=fmt("entropy/mean"),
            extra=extra,
            decode="",
        )
        self._rate = DecodeRate(time.perf_counter)

    def log(self, text: str) -> None:
        (self.progress.console if self.enabled and self.lines is None
         else self.console).print(text)

    def close(self) -> None:
        if self.lines is not None:
            self.lines.close()
        elif self.enabled and self._listening is not None:
            self._listening.__exit__(None, None, None)
            self._listening = None
            self.progress.stop()


def step_fields(metrics: dict) -> list[str]:
    """A step's plain progress line after ``step n/N``: reward, entropy, validation accuracy,
    the sampling rate (sampled tokens per second of sampling) and the step's seconds; what the
    row lacks (the validation before training has no training keys) is left out."""
    def num(key: str) -> float | None:
        v = metrics.get(key)
        return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None

    out = [f"{name} {num(key):.3f}" for name, key in
           (("reward", "reward/mean"), ("entropy", "entropy/mean"), ("val", "val/accuracy"))
           if num(key) is not None]
    n, length, gen = num("rollout/n_trained"), num("response/length_mean"), num("time/generate_s")
    if n and length is not None and gen:
        out.append(f"{n * length / gen:,.0f} tok/s")
    if num("time/step_s") is not None:
        out.append(f"step {duration(num('time/step_s'))}")
    return out


def json_default(o):
    """``json.dumps`` fallback: non-finite floats as null, anything else as its string."""
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return str(o)


@contextlib.contextmanager
def graceful_interrupt(stop, bar: ProgressBar):
    """Route Ctrl-C to ``stop()`` while training: the first one asks the loop to finish its step
    and checkpoint (``stop`` returns False), a second one (``stop`` returns True) aborts."""

    def on_sigint(signum, frame):
        if stop():
            raise KeyboardInterrupt
        bar.log(
            "[yellow]interrupt: finishing this step, then writing a checkpoint "
            "(Ctrl-C again to abort)"
        )

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
