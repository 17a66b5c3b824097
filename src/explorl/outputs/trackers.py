"""Experiment trackers (``log.report_to``): TensorBoard, Weights & Biases, trackio and MLflow.

Rank 0 of the trainer hands every row of ``metrics.jsonl`` to ``Trackers.log`` with its step,
and each sample of completions (``explorl.outputs.completions``) to
``Trackers.log_completions``. Each
backend is the tracker's own library, imported only when a recipe names it (each is an optional
extra: ``pip install 'explorl[wandb]'``). All of them work offline; where each one writes, and
how it continues a resumed run, is in docs/trackers.md:

- ``tensorboard``: event files under ``RUN_DIR/tensorboard/``; a resume purges the events after
  the checkpoint's step, so the re-run steps are not drawn twice.
- ``wandb``: ``RUN_DIR/wandb/``; ``WANDB_MODE=offline`` logs locally (``wandb sync`` uploads
  later). The run id is kept in ``RUN_DIR/trackers.json`` and a resume continues that run.
- ``trackio``: trackio's local database (``TRACKIO_DIR``, default ``~/.cache/huggingface/trackio``);
  a resume continues the run of the name kept in ``trackers.json``.
- ``mlflow``: ``MLFLOW_TRACKING_URI`` when set, else a SQLite store in ``RUN_DIR/mlflow/``; a
  resume continues the run id kept in ``trackers.json``.

The resolved config goes to each tracker as hyperparameters (flattened to dotted keys).
"""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from pathlib import Path
from typing import Any

from explorl import config as C

STATE_FILE = "trackers.json"
"""Per-tracker ids that let a resumed run continue the same tracker run, and the last step
logged (``last_step``)."""

COMPLETION_COLUMNS = ("step", "split", "data_source", "prompt", "ground_truth", "response",
                      "score", "reward")
"""Column order of the completions tables (the fields of ``completions.jsonl``)."""


class TrackerError(RuntimeError):
    """A tracker named in ``log.report_to`` is not installed or could not start."""


def flat_config(cfg: C.RunConfig) -> dict[str, Any]:
    """The config as ``{"algorithm.eps_high": 0.2, ...}``: lists and None as their text, so
    every value is a number, a bool or a string (what every tracker accepts as a parameter)."""
    out: dict[str, Any] = {}

    def walk(node: dict, prefix: str) -> None:
        for k, v in node.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            else:
                out[f"{prefix}{k}"] = v if isinstance(v, (bool, int, float, str)) else str(v)

    walk(C.to_dict(cfg), "")
    return out


def scalars(metrics: dict) -> dict[str, float]:
    """The finite numbers of a metrics row, without ``step`` (the x axis of every tracker).
    Non-finite values are left out, as ``metrics.jsonl`` writes them as null."""
    return {k: float(v) for k, v in metrics.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v)}


def _need(module: str, name: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise TrackerError(f"log.report_to names {name!r}, but {module!r} is not installed: "
                           f"pip install 'explorl[{name}]' ({e})") from None


class TensorBoardTracker:
    """``torch.utils.tensorboard.SummaryWriter`` into ``RUN_DIR/tensorboard``."""

    purges_on_resume = True  # shows the resumed run's values of the re-run steps

    def __init__(self, cfg: C.RunConfig, run_dir: Path, resume: bool, start_step: int,
                 state: dict):
        _need("tensorboard", "tensorboard")
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        # purge_step: TensorBoard hides the earlier events from this step on, i.e. the steps
        # the interrupted run logged after its last checkpoint, which the resumed run re-logs.
        self.writer = SummaryWriter(str(run_dir / "tensorboard"),
                                    purge_step=start_step + 1 if resume else None)
        if not resume:
            # The HParams dashboard: the config in the run's own event file (add_hparams would
            # start a second run in a subdirectory).
            for summary in hparams(flat_config(cfg), {"reward/mean": 0.0}):
                self.writer.file_writer.add_summary(summary)
            self.writer.add_text("config", "```yaml\n" + _yaml(cfg) + "```", 0)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def log_completions(self, rows: list[dict], step: int) -> None:
        """A markdown table in the Text tab, one per split and step."""
        for split in sorted({r["split"] for r in rows}):
            part = [r for r in rows if r["split"] == split]
            cols = [c for c in COMPLETION_COLUMNS if c not in ("step", "split")]
            lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
            lines += ["| " + " | ".join(_cell(r.get(c)) for c in cols) + " |" for r in part]
            self.writer.add_text(f"completions/{split}", "\n".join(lines), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """``wandb.init(dir=RUN_DIR)``; the run id is kept so a resume continues the same run."""

    def __init__(self, cfg: C.RunConfig, run_dir: Path, resume: bool, start_step: int,
                 state: dict):
        wandb = _need("wandb", "wandb")
        self.wandb = wandb
        if not (resume and state.get("id")):
            state["id"] = uuid.uuid4().hex[:8]  # wandb's own id format: 8 of [0-9a-z]
        try:
            # WANDB_MODE (online / offline / disabled) decides, as everywhere else in wandb.
            self.run = wandb.init(project=cfg.log.project, name=run_dir.name, id=state["id"],
                                  resume="allow", dir=str(run_dir), config=flat_config(cfg),
                                  settings=wandb.Settings(console="off"))
        except Exception as e:  # noqa: BLE001 (no API key, no network, ...)
            raise TrackerError(f"wandb could not start a run ({e}); set WANDB_MODE=offline to "
                               "log locally and `wandb sync` later") from None

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def log_completions(self, rows: list[dict], step: int) -> None:
        for split in sorted({r["split"] for r in rows}):
            data = [[r.get(c) for c in COMPLETION_COLUMNS] for r in rows if r["split"] == split]
            table = self.wandb.Table(columns=list(COMPLETION_COLUMNS), data=data)
            self.run.log({f"completions/{split}": table}, step=step)

    def close(self) -> None:
        self.run.finish()


class TrackioTracker:
    """``trackio.init`` into trackio's local database; the run name is kept for a resume."""

    def __init__(self, cfg: C.RunConfig, run_dir: Path, resume: bool, start_step: int,
                 state: dict):
        trackio = _need("trackio", "trackio")
        self.trackio = trackio
        resuming = resume and bool(state.get("name"))
        if not resuming:  # trackio resumes by name: a fresh run gets a name of its own
            state["name"] = f"{run_dir.name}-{uuid.uuid4().hex[:6]}"
        self.run = trackio.init(project=cfg.log.project, name=state["name"],
                                config=flat_config(cfg), resume="allow" if resuming else "never",
                                embed=False, auto_log_cpu=False, auto_log_gpu=False)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def log_completions(self, rows: list[dict], step: int) -> None:
        for split in sorted({r["split"] for r in rows}):
            data = [[r.get(c) for c in COMPLETION_COLUMNS] for r in rows if r["split"] == split]
            table = self.trackio.Table(columns=list(COMPLETION_COLUMNS), data=data)
            self.run.log({f"completions/{split}": table}, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    """An ``MlflowClient`` run (no global active-run state); the run id is kept for a resume."""

    def __init__(self, cfg: C.RunConfig, run_dir: Path, resume: bool, start_step: int,
                 state: dict):
        _need("mlflow", "mlflow")
        from mlflow import MlflowClient
        from mlflow.entities import Param

        local = run_dir.resolve() / "mlflow"
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:  # offline: a store of the run's own (mlflow's file store is deprecated)
            local.mkdir(parents=True, exist_ok=True)
            uri = f"sqlite:///{local / 'mlflow.db'}"
        self.client = MlflowClient(tracking_uri=uri)
        if resume and state.get("run_id"):
            self.run_id = state["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            exp = self.client.get_experiment_by_name(cfg.log.project)
            exp_id = exp.experiment_id if exp else self.client.create_experiment(
                cfg.log.project,
                artifact_location=None if os.environ.get("MLFLOW_TRACKING_URI")
                else (local / "artifacts").as_uri())
            self.run_id = self.client.create_run(exp_id, run_name=run_dir.name).info.run_id
            state["run_id"] = self.run_id
            # Parameters are write-once in MLflow: logged at the start only (a resume that
            # extends max_steps keeps the original value there; config.yaml has the new one).
            params = [Param(k, str(v)) for k, v in flat_config(cfg).items()]
            for i in range(0, len(params), 100):  # MLflow's limit per batch
                self.client.log_batch(self.run_id, params=params[i: i + 100])

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(_mlflow_key(k), v, now, step) for k, v in metrics.items()]
        for i in range(0, len(batch), 1000):  # MLflow's limit per batch
            self.client.log_batch(self.run_id, metrics=batch[i: i + 1000])

    def log_completions(self, rows: list[dict], step: int) -> None:
        for split in sorted({r["split"] for r in rows}):
            part = [r for r in rows if r["split"] == split]
            data = {c: [r.get(c) for r in part] for c in COMPLETION_COLUMNS}
            self.client.log_table(self.run_id, data=data,
                                  artifact_file=f"completions/{split}_step{step:07d}.json")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


TRACKERS = {
    "tensorboard": TensorBoardTracker,
    "wandb": WandbTracker,
    "trackio": TrackioTracker,
    "mlflow": MlflowTracker,
}
"""``log.report_to`` names → tracker classes."""


class Trackers:
    """The trackers of ``cfg.log.report_to`` behind one ``log`` / ``log_completions`` / ``close``.

    ``start_step``: the step a resumed run continues from (its checkpoint's). Only rank 0 builds
    this; with an empty ``report_to`` every call is a no-op and nothing is written.
    """

    def __init__(self, cfg: C.RunConfig, run_dir: str | Path, resume: bool = False, *,
                 start_step: int = 0):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / STATE_FILE
        saved = json.loads(self.path.read_text()) if resume and self.path.is_file() else {}
        # A resume re-runs the steps after its checkpoint that the interrupted run had already
        # logged. Trackers that keep every value (W&B drops them, MLflow and trackio would show
        # two per step) skip those steps: the interrupted run's numbers are the same ones.
        self.skip_through = saved.get("last_step", start_step) if resume else -1
        self.state: dict[str, Any] = {"last_step": max(self.skip_through, start_step)}
        self.trackers: dict[str, Any] = {}
        try:
            for name in cfg.log.report_to:
                self.state[name] = dict(saved.get(name, {}))
                self.trackers[name] = TRACKERS[name](cfg, self.run_dir, resume, start_step,
                                                     self.state[name])
        except BaseException:
            self.close()
            raise
        self._save()

    def _save(self) -> None:
        if self.trackers:
            self.path.write_text(json.dumps(self.state, indent=2) + "\n")

    def _takes(self, tracker, step: int) -> bool:
        return step > self.skip_through or getattr(tracker, "purges_on_resume", False)

    def log(self, metrics: dict, step: int) -> None:
        """Every finite number of a metrics row (``step`` is the x axis, not a series)."""
        values = scalars(metrics)
        for t in self.trackers.values():
            if self._takes(t, step):
                t.log(values, step)
        if self.trackers and step > self.state["last_step"]:
            self.state["last_step"] = step
            self._save()

    def log_completions(self, rows: list[dict], step: int) -> None:
        """Completions rows (docs/completions.md) as each tracker's table view."""
        if rows:
            for t in self.trackers.values():
                if self._takes(t, step):
                    t.log_completions(rows, step)

    def close(self) -> None:
        for t in self.trackers.values():
            t.close()
        self.trackers = {}


def _yaml(cfg: C.RunConfig) -> str:
    import yaml

    return yaml.safe_dump(C.to_dict(cfg), sort_keys=False)


def _cell(v: Any) -> str:
    text = "" if v is None else str(v)
    return text.replace("|", "\\|").replace("\n", "⏎")


def _mlflow_key(key: str) -> str:
    """MLflow keys allow letters, digits, ``_ - . / space``: ``val/pass@4`` → ``val/pass_at_4``."""
    return key.replace("@", "_at_")
