"""Trackers (log.report_to): every metric with its step, the config as hyperparameters, the
completions tables, resume into the same tracker run; read back with each tracker's own reader.

TensorBoard and W&B are test dependencies; trackio and MLflow tests run where those are
installed (``pip install 'explorl[trackio,mlflow]'``) and are skipped elsewhere.
"""

from __future__ import annotations

import json
import sys
import time
import typing

import pytest

from explorl import config as C
from explorl import validation
from explorl.outputs.runlog import read_metrics
from explorl.outputs.trackers import STATE_FILE, TrackerError, Trackers, flat_config, scalars

ROW = {"step": 3, "split": "train", "data_source": "lab/addition", "prompt": "3+4=",
       "ground_truth": "7", "response": "7", "score": 1.0, "reward": 1.0}


def cfg_with(*trackers: str) -> C.RunConfig:
    return validation.load(None, [f"log.report_to=[{', '.join(trackers)}]", "name=tracked"])


def rows(steps, scale=0.1):
    """Metrics rows as the trainer logs them: step 0 is the pre-training validation."""
    out = [{"step": 0, "val/accuracy": 0.25, "val/pass@4": 0.5}]
    out += [{"step": s, "reward/mean": scale * s, "entropy/mean": 1.0 / s, "epoch": 0,
             "loss/clip_frac": float("nan"), "flag": True} for s in steps]
    return out


def tb_scalars(run_dir, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)], acc.Tags()


def test_scalars_and_flat_config():
    assert scalars({"step": 4, "a/b": 1, "c": 0.5, "nan": float("nan"), "none": None,
                    "flag": True, "text": "x"}) == {"a/b": 1.0, "c": 0.5}
    flat = flat_config(cfg_with("tensorboard"))
    assert flat["algorithm.eps_high"] == 0.2 and flat["log.report_to"] == "['tensorboard']"
    assert flat["data.train"] == "['lab:addition']" and flat["data.max_train_prompts"] == "None"
    assert all(isinstance(v, (bool, int, float, str)) for v in flat.values())


def test_tensorboard_holds_each_metric_at_its_step(tmp_path):
    """Trackers fed with the trainer's metrics rows: every finite metric, at its step."""
    run = tmp_path / "run"
    t = Trackers(cfg_with("tensorboard"), run)
    for r in rows([1, 2, 3]):
        t.log(r, r["step"])
    t.log_completions([ROW], 3)
    t.close()
    reward, tags = tb_scalars(run, "reward/mean")
    assert [s for s, _ in reward] == [1, 2, 3]
    assert [v for _, v in reward] == pytest.approx([0.1, 0.2, 0.3])
    assert tb_scalars(run, "val/accuracy")[0] == [(0, 0.25)]
    assert "loss/clip_frac" not in tags["scalars"] and "flag" not in tags["scalars"]
    assert "step" not in tags["scalars"]
    assert "config/text_summary" in tags["tensors"]
    assert "completions/train/text_summary" in tags["tensors"]


def test_tensorboard_resume_replaces_the_interrupted_tail(tmp_path):
    """Interrupted after logging step 3 with its checkpoint at step 2: the resumed run logs 3
    again (here with another value) and 4; TensorBoard keeps one value per step, the new one."""
    run = tmp_path / "run"
    t = Trackers(cfg_with("tensorboard"), run)
    for r in rows([1, 2, 3]):
        t.log(r, r["step"])
    t.close()
    t = Trackers(cfg_with("tensorboard"), run, resume=True, start_step=2)
    for r in rows([3, 4], scale=1.0)[1:]:
        t.log(r, r["step"])
    t.close()
    reward, _ = tb_scalars(run, "reward/mean")
    assert reward == [(1, pytest.approx(0.1)), (2, pytest.approx(0.2)), (3, 3.0), (4, 4.0)]


def test_three_step_run_writes_reward_mean_to_tensorboard(make_config, tmp_path):
    from explorl.training.loop import Trainer

    cfg = make_config({"max_steps": 3, "log": {"report_to": ["tensorboard"]}})
    Trainer(cfg, tmp_path / "run").train()
    logged = [(r["step"], r["reward/mean"]) for r in read_metrics(tmp_path / "run")
              if "reward/mean" in r]
    reward, _ = tb_scalars(tmp_path / "run", "reward/mean")
    assert [s for s, _ in reward] == [1, 2, 3]
    assert [v for _, v in reward] == pytest.approx([v for _, v in logged], rel=1e-6)


def test_wandb_offline_writes_a_local_run_and_resumes_it(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    t = Trackers(cfg_with("wandb"), run)
    for r in rows([1, 2]):
        t.log(r, r["step"])
    t.log_completions([ROW], 2)
    t.close()
    run_id = json.loads((run / STATE_FILE).read_text())["wandb"]["id"]
    offline = sorted((run / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(offline) == 1 and (offline[0] / f"run-{run_id}.wandb").stat().st_size > 0
    assert list((offline[0] / "files" / "media" / "table").rglob("*.table.json"))
    # wandb names an offline run's directory by the second it starts: resume in the next one.
    time.sleep(1.05 - time.time() % 1)
    t = Trackers(cfg_with("wandb"), run, resume=True, start_step=2)
    t.log(rows([3])[1], 3)
    t.close()
    assert json.loads((run / STATE_FILE).read_text())["wandb"]["id"] == run_id  # the same run
    assert len(list((run / "wandb").glob(f"offline-run-*-{run_id}"))) == 2


def test_mlflow_local_store_and_resume(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run = tmp_path / "run"
    t = Trackers(cfg_with("mlflow"), run)
    for r in rows([1, 2, 3]):
        t.log(r, r["step"])
    t.log_completions([ROW], 3)
    t.close()
    t = Trackers(cfg_with("mlflow"), run, resume=True, start_step=2)
    for r in rows([3, 4], scale=1.0)[1:]:
        t.log(r, r["step"])
    t.close()
    from mlflow import MlflowClient

    run_id = json.loads((run / STATE_FILE).read_text())["mlflow"]["run_id"]
    client = MlflowClient(tracking_uri=f"sqlite:///{run.resolve() / 'mlflow' / 'mlflow.db'}")
    history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "reward/mean"))
    # step 3 was logged by the interrupted run; the resumed run skips it and goes on at 4
    assert history == [(1, pytest.approx(0.1)), (2, pytest.approx(0.2)), (3, pytest.approx(0.3)),
                       (4, 4.0)]
    assert [m.value for m in client.get_metric_history(run_id, "val/pass_at_4")] == [0.5]
    assert client.get_run(run_id).data.params["algorithm.eps_high"] == "0.2"
    assert list((run / "mlflow" / "artifacts").rglob("train_step0000003.json"))


def test_trackio_logs_locally_and_resumes_by_name(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))  # read when trackio is imported
    if "trackio" in sys.modules:
        pytest.skip("trackio was imported before TRACKIO_DIR could be set")
    pytest.importorskip("trackio")
    run = tmp_path / "run"
    t = Trackers(cfg_with("trackio"), run)
    for r in rows([1, 2]):
        t.log(r, r["step"])
    t.close()
    name = json.loads((run / STATE_FILE).read_text())["trackio"]["name"]
    t = Trackers(cfg_with("trackio"), run, resume=True, start_step=2)
    t.log(rows([3])[1], 3)
    t.close()
    from trackio import SQLiteStorage

    assert SQLiteStorage.get_runs("explorl") == [name]  # one run, continued
    logs = SQLiteStorage.get_logs("explorl", name)
    assert [(r["step"], r["reward/mean"]) for r in logs if r.get("reward/mean") is not None] == [
        (1, pytest.approx(0.1)), (2, pytest.approx(0.2)), (3, pytest.approx(0.3))]


def test_unknown_or_missing_tracker_is_a_clear_error(tmp_path, monkeypatch):
    with pytest.raises(C.ConfigError, match=r"log.report_to\[0\]: 'tensorbord' is not a known "
                                            r"tracker; did you mean 'tensorboard'"):
        cfg_with("tensorbord")
    with pytest.raises(C.ConfigError, match="names a tracker twice"):
        cfg_with("wandb", "wandb")
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if not installed
    with pytest.raises(TrackerError, match=r"pip install 'explorl\[mlflow\]'"):
        Trackers(cfg_with("mlflow"), tmp_path / "run")


def test_no_trackers_by_default(tmp_path):
    t = Trackers(validation.load(None), tmp_path / "run")
    t.log({"step": 1, "reward/mean": 0.5}, 1)
    t.close()
    assert not (tmp_path / "run" / STATE_FILE).exists()
    assert C.RunConfig().log.report_to == []


class Recorder:
    """A tracker that keeps what it was given (registered in TRACKERS for one test)."""

    logged: typing.ClassVar[list] = []

    def __init__(self, cfg, run_dir, resume, start_step, state):
        state["runs"] = state.get("runs", 0) + 1

    def log(self, metrics, step):
        Recorder.logged.append((step, metrics.get("reward/mean")))

    def log_completions(self, rows, step):
        Recorder.logged.append((step, "completions"))

    def close(self):
        pass


def test_resume_skips_the_steps_the_interrupted_run_logged(tmp_path, monkeypatch):
    """Checkpoint at step 2, interrupted after logging step 3: the resumed run's step 3 goes
    only to trackers that purge (TensorBoard); the others already hold it."""
    from explorl.outputs import trackers
    monkeypatch.setitem(trackers.TRACKERS, "recorder", Recorder)
    monkeypatch.setattr(Recorder, "logged", [])
    run = tmp_path / "run"
    t = Trackers(cfg_with("recorder"), run)
    for r in rows([1, 2, 3]):
        t.log(r, r["step"])
    t.close()
    assert json.loads((run / STATE_FILE).read_text()) == {"last_step": 3, "recorder": {"runs": 1}}
    Recorder.logged.clear()
    t = Trackers(cfg_with("recorder"), run, resume=True, start_step=2)
    for r in rows([3, 4])[1:]:
        t.log(r, r["step"])
        t.log_completions([ROW], r["step"])
    t.close()
    assert Recorder.logged == [(4, pytest.approx(0.4)), (4, "completions")]
    assert json.loads((run / STATE_FILE).read_text()) == {"last_step": 4, "recorder": {"runs": 2}}
