"""Atomic checkpoints: model (save_pretrained), optimizer, scheduler, controllers, RNG, position."""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from explorl.errors import ExplorlError

STATE_FILE = "trainer_state.pt"
_STEP_DIR = re.compile(r"^step-(\d+)$")


def rng_state(generators: dict[str, torch.Generator]) -> dict[str, Any]:
    """Every random state the run depends on (global and the trainer's own generators)."""
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "generators": {k: g.get_state() for k, g in generators.items()},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any], generators: dict[str, torch.Generator]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    for k, g in generators.items():
        g.set_state(state["generators"][k])


class NoCheckpoint(ExplorlError, FileNotFoundError):
    """``--resume`` of a run directory that holds no complete checkpoint."""


def save_checkpoint(run_dir: Path, step: int, model, tokenizer, state: dict[str, Any], *,
                    save_model: bool = True, keep: int = 2) -> Path:
    """Write ``checkpoints/step-N`` atomically: build in a temp dir, fsync, rename.

    A crash mid-write leaves only a ``.tmp`` directory, which loading ignores, so the previous
    checkpoint stays the latest valid one.
    """
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step}"
    tmp = root / f".step-{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    if save_model:
        from explorl.models import quiet_transformers

        with quiet_transformers():  # no "Writing model shards" bar under the trainer's own
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
    torch.save(state, tmp / STATE_FILE)
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir()
             if (m := _STEP_DIR.match(p.name)) and (p / STATE_FILE).is_file()]
    return [p for _, p in sorted(found)]


def checkpoint_step(ckpt: Path) -> int:
    """The training step a ``checkpoints/step-N`` directory holds (N)."""
    m = _STEP_DIR.match(Path(ckpt).name)
    if m is None:
        raise ValueError(f"{ckpt} is not a checkpoints/step-N directory")
    return int(m.group(1))


def latest_checkpoint(run_dir: Path) -> Path | None:
    ckpts = list_checkpoints(run_dir)
    return ckpts[-1] if ckpts else None


def load_state(ckpt: Path) -> dict[str, Any]:
    # Our own file (optimizer tensors, numpy RNG tuples): not loadable with weights_only=True.
    return torch.load(Path(ckpt) / STATE_FILE, map_location="cpu", weights_only=False)
