"""Atomic checkpoints: model (save_pretrained), optimizer, scheduler, controllers, RNG, position."""

from __future__ import annotations

import errno
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from explorl.errors import CheckpointError, ExplorlError, NonFiniteError
from explorl.models import quiet_transformers

STATE_FILE = "trainer_state.pt"
_STEP_DIR = re.compile(r"^step-(\d+)$")
_OLD_DIR = re.compile(r"^\.step-(\d+)\.old$")  # replaced, until its successor is in place


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


def nonfinite_parameters(model: torch.nn.Module) -> dict[str, int]:
    """``{parameter name: number of NaN/inf values}`` for every parameter that has any.

    One device-side reduction per parameter and a single host sync, so it is cheap enough to
    run before every checkpoint (and for a trainer's guard after an update)."""
    named = list(model.named_parameters())
    if not named:
        return {}
    device = named[0][1].device
    bad = torch.stack([(~torch.isfinite(p.detach())).sum().to(device) for _, p in named]).tolist()
    return {n: int(k) for (n, _), k in zip(named, bad) if k}


def finite_or_raise(model: torch.nn.Module, what: str) -> None:
    """Raise ``NonFiniteError`` naming ``what`` when any parameter of ``model`` is NaN or inf."""
    bad = nonfinite_parameters(model)
    if bad:
        first = ", ".join(list(bad)[:3]) + (", …" if len(bad) > 3 else "")
        raise NonFiniteError(f"{what}: {sum(bad.values())} weights of {len(bad)} parameters are "
                             f"NaN or infinite ({first})")


def save_checkpoint(run_dir: Path, step: int, model, tokenizer, state: dict[str, Any], *,
                    save_model: bool = True, keep: int = 2) -> Path:
    """Write ``checkpoints/step-N`` atomically: build in a temp dir, fsync, rename.

    A crash mid-write leaves only a ``.tmp`` directory, which loading ignores, so the previous
    checkpoint stays the latest valid one. Weights that are NaN or infinite are never written
    (``NonFiniteError``). A write that fails (disk full, permissions) removes the temp dir and
    raises ``CheckpointError`` naming the path and the cause; earlier checkpoints are untouched.
    A checkpoint of the same step is replaced only once the new one is complete. Rotation
    keeps the ``keep`` newest checkpoints, never the one just written among those deleted.
    """
    root = Path(run_dir) / "checkpoints"
    final = root / f"step-{step}"
    latest = latest_checkpoint(run_dir)
    finite_or_raise(model, f"refusing to write checkpoint {final} (the last one written is "
                           f"{latest.name if latest else 'none'})")
    tmp = root / f".step-{step}.tmp"
    try:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".step-*.tmp"):  # left by a crash mid-write
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()
        if save_model:
            with quiet_transformers():  # no "Writing model shards" bar under the trainer's own
                model.save_pretrained(tmp, safe_serialization=True)
                tokenizer.save_pretrained(tmp)
        torch.save(state, tmp / STATE_FILE)
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    except (OSError, RuntimeError) as e:  # torch reports a full disk as a RuntimeError
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"cannot write checkpoint {final}: {_write_cause(e, root)}; "
                              f"earlier checkpoints are untouched") from e
    old = root / f".step-{step}.old"
    if final.exists():  # the same step again: keep it until the new one is in place
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    others = [p for p in list_checkpoints(run_dir) if p != final]
    for stale in others[: max(0, len(others) - (keep - 1))]:
        shutil.rmtree(stale, ignore_errors=True)
    return final


def _write_cause(e: BaseException, where: Path) -> str:
    """The cause of a failed write in words, with the free space when the disk may be full."""
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        return f"no space left on the device of {where}"
    cause = " ".join(str(e).split()) or type(e).__name__
    if isinstance(e, OSError) and e.strerror:
        cause = f"{e.strerror} ({e.filename or where})"
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        return cause
    return f"{cause} [{free / 2**20:.0f} MiB free on the device of {where}]"


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first.

    ``.step-N.old`` stands in for ``step-N`` if a crash came between the two renames that
    replace a checkpoint of the same step."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = {int(m.group(1)): p for p in root.iterdir()
             if (m := _STEP_DIR.match(p.name)) and (p / STATE_FILE).is_file()}
    for p in root.iterdir():
        m = _OLD_DIR.match(p.name)
        if m and int(m.group(1)) not in found and (p / STATE_FILE).is_file():
            found[int(m.group(1))] = p
    return [found[k] for k in sorted(found)]


def checkpoint_step(ckpt: Path) -> int:
    """The training step a checkpoint directory holds (N of ``step-N`` or ``.step-N.old``)."""
    m = _STEP_DIR.match(Path(ckpt).name) or _OLD_DIR.match(Path(ckpt).name)
    if m is None:
        raise ValueError(f"{ckpt} is not a checkpoints/step-N directory")
    return int(m.group(1))


def latest_checkpoint(run_dir: Path) -> Path | None:
    ckpts = list_checkpoints(run_dir)
    return ckpts[-1] if ckpts else None


def load_state(ckpt: Path) -> dict[str, Any]:
    # Our own file (optimizer tensors, numpy RNG tuples): not loadable with weights_only=True.
    return torch.load(Path(ckpt) / STATE_FILE, map_location="cpu", weights_only=False)
