"""A run's settings across its segments: what a resume changes, and the record of it.

A resume may change settings (``--set optim.lr=…``, ``--max-steps``). Every changed key is
printed (old → new) before the first step, and ``config.yaml`` keeps the settings each segment
ran with: its keys are the current segment's, and its ``resumes:`` list holds, for each resume,
the step it continued from, the time and the changes, so the settings of an earlier segment are
the current ones with the later changes undone. A change that makes the run another experiment
(``EXPERIMENT_KEYS``: the loss, the advantage estimator, the model, the data, the reward, the
seed) is refused unless the resume allows changes (``--allow-changes``), before any model loads.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

from explorl import config as C
from explorl import validation
from explorl.errors import ExplorlError
from explorl.outputs.checkpoint import NoCheckpoint, latest_checkpoint

EXPERIMENT_KEYS = (
    "seed", "algorithm.loss", "algorithm.advantage", "model.path", "model.lora",
    "model.use_chat_template", "lab", "data.train", "data.val", "data.anneal",
    "data.max_train_prompts", "data.prompt_key", "data.answer_key", "reward.verifier",
    "reward.functions", "reward.convention", "reward.accuracy",
)
"""Keys (and sections) whose change makes a resumed run a different experiment."""


def flatten(data: dict, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` → ``{"a.b": 1}`` (lists stay whole values)."""
    out: dict[str, Any] = {}
    for k, v in data.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def changes(old: dict, new: dict) -> dict[str, tuple[Any, Any]]:
    """``{key: (old, new)}`` for every leaf that differs between two config dicts."""
    a, b = flatten(old), flatten(new)
    return {k: (a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)}


def _experiment(key: str) -> bool:
    return any(key == p or key.startswith(p + ".") for p in EXPERIMENT_KEYS)


class ResumeRecord:
    """The resumed run's saved settings and history, checked against its new config."""

    def __init__(self, run_dir: Path, cfg: C.RunConfig, *, allow_changes: bool = False) -> None:
        """Read ``run_dir/config.yaml`` and find the checkpoint to continue from (``ckpt``;
        ``NoCheckpoint`` when there is none); ``ConfigError`` when ``cfg`` changes an experiment
        key and ``allow_changes`` is off."""
        self.ckpt = latest_checkpoint(run_dir)
        if self.ckpt is None:
            raise NoCheckpoint(f"--resume {run_dir}: no complete checkpoint in its checkpoints/")
        path = Path(run_dir) / "config.yaml"
        self.old: dict = C.to_dict(cfg)  # without a config.yaml, nothing to compare with
        self.history: list = []
        if path.is_file():
            data = C.load_yaml(C.read_utf8(path.read_bytes(), str(path)), str(path)) or {}
            self.history = list(data.pop(C.HISTORY_KEY, None) or [])
            try:  # the saved settings as this version reads them
                self.old = C.to_dict(validation.from_dict(data))
            except ExplorlError:
                self.old = data
        refused = [k for k in changes(self.old, C.to_dict(cfg)) if _experiment(k)]
        if refused and not allow_changes:
            shown = "; ".join(self.lines(refused, C.to_dict(cfg)))
            raise C.ConfigError(
                f"--resume {run_dir}: this would make the run a different experiment ({shown}); "
                "start a new run, or pass --allow-changes to continue this one with them")

    def lines(self, keys, new: dict) -> list[str]:
        d = changes(self.old, new)
        return [f"{k}: {_show(d[k][0])} → {_show(d[k][1])}" for k in keys]

    def save(self, out: Path, cfg: C.RunConfig, step: int, comments: list[str]) -> list[str]:
        """Write ``config.yaml`` with this resume appended to its history; the change lines."""
        new = C.to_dict(cfg)
        diff = changes(self.old, new)
        entry = {"step": step,
                 "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                 "changes": {k: {"from": a, "to": b} for k, (a, b) in diff.items()}}
        C.save(cfg, Path(out) / "config.yaml", comments=comments, history=[*self.history, entry])
        return self.lines(diff, new)


def save_config(out: Path, cfg: C.RunConfig, comments: list[str], resumed: ResumeRecord | None,
                step: int) -> None:
    """Write ``out/config.yaml``; a resume (``resumed``) also prints every changed key and adds
    itself to the file's ``resumes:``."""
    if resumed is None:
        C.save(cfg, Path(out) / "config.yaml", comments=comments)
        return
    changed = resumed.save(out, cfg, step, comments)
    print(f"resuming {out} at step {step}: "
          + ("; ".join(changed) if changed else "no settings changed"), flush=True)


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)
