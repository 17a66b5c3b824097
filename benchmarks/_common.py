"""Shared helpers for the benchmark scripts: run a recipe for a few steps, time its steps."""

from __future__ import annotations

import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

# One torch thread: with several, OpenMP workers spin while they wait for a core, and on a
# loaded machine that spinning shows up as CPU time. One thread makes CPU time a stable measure.
torch.set_num_threads(1)

from explorl import validation  # noqa: E402
from explorl.training.loop import Trainer  # noqa: E402


def machine() -> str:
    return (
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
        f"python {platform.python_version()}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}"
    )


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and every live child (verifier workers).

    The wall-clock ratio of two setups is meaningless on a loaded 2-core machine (one setup's
    swung 1.07x to 3.57x under load); CPU time barely moves with load.
    """
    import psutil

    total = time.process_time()  # this process, at ns resolution (psutil's ticks are 10 ms)
    for child in psutil.Process().children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:  # exited meanwhile
            pass
    return total


def step_times(recipe: str | Path, sets: list[str], steps: int, warmup: int = 2,
               cpu: list[float] | None = None) -> tuple[list[float], list[dict]]:
    """Train ``recipe`` (with overrides) for warmup + steps steps; per-step seconds after warm-up.

    ``cpu``: when given, each kept step's CPU seconds (``cpu_seconds``) are appended to it.
    """
    cfg = validation.load(ROOT / recipe, ["log.progress=false", "log.plots=false", "eval.every=0",
                                 "log.checkpoint_every=0", "log.save_model=false", *sets],
                 max_steps=warmup + steps)
    with tempfile.TemporaryDirectory() as out:
        t = Trainer(cfg, out)
        rows = []
        for i in range(warmup + steps):
            c0 = cpu_seconds()
            rows.append(t.train_step())
            if cpu is not None and i >= warmup:
                cpu.append(cpu_seconds() - c0)
        t.pool.close()
        if t.rollouts is not None:  # rollout.async: the worker
            t.rollouts.close()
    kept = rows[warmup:]
    return [r["time/step_s"] for r in kept], kept


def summary(xs: list[float]) -> str:
    med = statistics.median(xs)
    spread = (max(xs) - min(xs)) / 2
    return f"{med * 1000:7.1f} ms ± {spread * 1000:5.1f}"
