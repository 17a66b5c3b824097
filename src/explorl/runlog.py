"""The run directory's metrics file and the live progress bar."""

from __future__ import annotations

import contextlib
import json
import math
import signal
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None  # JSON has no NaN/inf; None keeps the key visible
    return v


class MetricsLog:
    """``metrics.jsonl``: one JSON object per step, appended and flushed as the step ends."""

    def __init__(self, path: Path, *, truncate_after: int | None = None):
        self.path = Path(path)
        if truncate_after is not None and self.path.exists():
            # Resuming from step N: lines of steps after N came from the interrupted tail.
            keep = [line for line in self.path.read_text().splitlines()
                    if line.strip() and json.loads(line).get("step", 0) <= truncate_after]
            self.path.write_text("".join(line + "\n" for line in keep))
        self._fh = open(self.path, "a")

    def write(self, metrics: dict) -> None:
        self._fh.write(json.dumps({k: _clean(v) for k, v in metrics.items()}) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class ProgressBar:
    """A rich progress bar showing step, reward, entropy and ETA (no-op when disabled)."""

    def __init__(self, total: int, start: int = 0, enabled: bool = True):
        self.enabled = enabled
        self.console = Console(stderr=True)
        if not enabled:
            return
        self.progress = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
            TextColumn("reward {task.fields[reward]}  entropy {task.fields[entropy]}  {task.fields[extra]}"),
            TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
            console=self.console, transient=False,
        )
        self.task = self.progress.add_task("train", total=total, completed=start,
                                           reward="-", entropy="-", extra="")
        self.progress.start()

    def update(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        extra = ""
        if "val/accuracy" in metrics:
            extra = f"val {metrics['val/accuracy']:.3f}"
        self.progress.update(self.task, completed=step, reward=f"{metrics.get('reward/mean', float('nan')):.3f}",
                             entropy=f"{metrics.get('entropy/mean', float('nan')):.3f}", extra=extra)

    def log(self, text: str) -> None:
        (self.progress.console if self.enabled else self.console).print(text)

    def close(self) -> None:
        if self.enabled:
            self.progress.stop()


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
        bar.log("[yellow]interrupt: finishing this step, then writing a checkpoint (Ctrl-C again to abort)")

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
