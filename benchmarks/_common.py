"""Shared helpers for the benchmark scripts: run a recipe for a few steps, time its steps."""

from __future__ import annotations

import platform
import resource
import statistics
import sys
import tempfile
from pathlib import Path

import torch
import transformers

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from explorl import config as C  # noqa: E402
from explorl.trainer import Trainer  # noqa: E402


def machine() -> str:
    return (f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
            f"python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}")


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def step_times(recipe: str | Path, sets: list[str], steps: int, warmup: int = 2) -> tuple[list[float], list[dict]]:
    """Train ``recipe`` (with overrides) for warmup + steps steps; per-step seconds after warm-up."""
    cfg = C.load(ROOT / recipe, ["log.progress=false", "log.plots=false", "eval.every=0",
                                 "log.checkpoint_every=0", "log.save_model=false", *sets],
                 max_steps=warmup + steps)
    with tempfile.TemporaryDirectory() as out:
        t = Trainer(cfg, out)
        rows = []
        for _ in range(warmup + steps):
            rows.append(t.train_step())
        t.pool.close()
    kept = rows[warmup:]
    return [r["time/step_s"] for r in kept], kept


def summary(xs: list[float]) -> str:
    med = statistics.median(xs)
    spread = (max(xs) - min(xs)) / 2
    return f"{med * 1000:7.1f} ms ± {spread * 1000:5.1f}"
