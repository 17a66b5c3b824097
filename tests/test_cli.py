"""The command line end to end on the tiny lab model: train, resume, eval, fit, report, config."""

from __future__ import annotations

import json

import pytest
import yaml

from explorl import config as C
from explorl.cli import main
from explorl.runlog import read_metrics

from conftest import tiny_config


@pytest.fixture
def recipe(tiny_model, tmp_path):
    cfg = tiny_config(tiny_model, {"max_steps": 3, "eval": {"every": 1}})
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(C.to_dict(cfg)))
    return path


def test_train_then_extend_with_resume(recipe, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", str(recipe), "--out", str(out), "--seed", "1"]) == 0
    printed = capsys.readouterr().out
    assert "plots:" in printed and str(out) in printed
    assert yaml.safe_load((out / "config.yaml").read_text())["seed"] == 1
    assert main(["train", str(recipe), "--out", str(out)]) == 2  # refuses to overwrite a run
    assert "already holds a run" in capsys.readouterr().err
    assert main(["train", "--resume", str(out), "--max-steps", "5"]) == 0
    assert [r["step"] for r in read_metrics(out)] == [0, 1, 2, 3, 4, 5]  # 0: the pre-RL validation


def test_config_error_exits_2_with_key_path(recipe, capsys):
    assert main(["train", str(recipe), "--set", "algorithm.eps_hihg=0.3"]) == 2
    err = capsys.readouterr().err
    assert "algorithm.eps_hihg: unknown key; did you mean 'algorithm.eps_high'?" in err


def test_eval_fit_report(recipe, tiny_model, tmp_path, capsys):
    runs = []
    for seed in (0, 1):
        out = tmp_path / f"run{seed}"
        assert main(["train", str(recipe), "--out", str(out), "--seed", str(seed), "--max-steps", "4"]) == 0
        runs.append(out)

    ev = tmp_path / "eval"
    assert main(["eval", str(runs[0]), "--data", "lab:addition", "--split", "train", "--out", str(ev),
                 "--n", "4", "--k", "1", "2", "4", "--max-problems", "6"]) == 0
    summary = json.loads((ev / "eval.json").read_text())
    o = summary["overall"]
    assert o["n_problems"] == 6 and 0 <= o["pass@1"] <= o["pass@2"] <= o["pass@4"] <= 1
    assert o["pass@1"] == pytest.approx(o["mean@n"])
    assert "lab/addition" in summary["by_source"] and (ev / "passk.png").is_file()

    assert main(["fit", str(runs[0])]) == 0
    fit = json.loads((runs[0] / "fit.json").read_text())
    assert {"a", "b", "r2", "ceiling"} <= set(fit) and fit["ceiling"] == pytest.approx(fit["b"] - fit["a"])
    assert (runs[0] / "plots" / "entropy_law.png").is_file()

    assert main(["report", *map(str, runs), "--out", str(tmp_path / "report")]) == 0
    assert (tmp_path / "report" / "report.md").is_file() and (tmp_path / "report" / "report.html").is_file()
    assert list((tmp_path / "report").glob("*.png"))


def test_fit_on_too_short_run_is_a_clear_error(recipe, tmp_path, capsys):
    out = tmp_path / "short"
    assert main(["train", str(recipe), "--out", str(out), "--max-steps", "2"]) == 0
    capsys.readouterr()
    assert main(["fit", str(out)]) == 2
    assert "need at least 3" in capsys.readouterr().err


def test_config_reference_lists_every_key(capsys):
    assert main(["config"]) == 0
    out = capsys.readouterr().out
    assert "algorithm.eps_high" in out and "control.adaptive.schedule.kind" in out


def test_commands_joined_by_then_run_in_turn_and_stop_at_the_first_failure(tmp_path, capsys):
    assert main(["config", "--then", "config"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("$ explorl config") == 2 and printed.count("algorithm.loss ") == 2
    assert main(["study", str(tmp_path / "missing.yaml"), "--then", "config"]) == 2
    printed = capsys.readouterr().out
    assert "$ explorl study" in printed and "$ explorl config" not in printed
