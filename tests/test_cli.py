"""The command line end to end on the tiny lab model: train, resume, eval, fit, report, config."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import yaml
from conftest import tiny_config
from transformers import AutoTokenizer

from explorl import config as C
from explorl.cli import main
from explorl.outputs.runlog import read_metrics


@pytest.fixture
def recipe(tiny_model, tmp_path):
    cfg = tiny_config(tiny_model, {"max_steps": 3, "eval": {"every": 1}})
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(C.to_dict(cfg)))
    return path


def test_train_then_extend_with_resume(recipe, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", str(recipe), "--out", str(out), "--seed", "1"]) == 0
    cap = capsys.readouterr()
    printed = cap.out
    assert "plots:" in printed and str(out) in printed
    # transformers' own bars stay out of the trainer's console (model load, checkpoint)
    assert "Loading weights" not in cap.err and "Writing model shards" not in cap.err
    assert yaml.safe_load((out / "config.yaml").read_text())["seed"] == 1
    assert main(["train", str(recipe), "--out", str(out)]) == 2  # refuses to overwrite a run
    assert "already holds a run" in capsys.readouterr().err
    assert main(["train", "--resume", str(out), "--max-steps", "5"]) == 0
    assert [r["step"] for r in read_metrics(out)] == [0, 1, 2, 3, 4, 5]  # 0: the pre-RL validation
    # resuming a finished run says so, and touches nothing
    capsys.readouterr()
    ckpt = out / "checkpoints" / "step-5" / "trainer_state.pt"
    stamp, metrics = ckpt.stat().st_mtime_ns, (out / "metrics.jsonl").read_text()
    assert main(["train", "--resume", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"{out} is finished: its checkpoint is at step 5 and max_steps is 5" in printed
    assert "nan" not in printed and "--max-steps N (N > 5)" in printed
    assert ckpt.stat().st_mtime_ns == stamp and (out / "metrics.jsonl").read_text() == metrics


def test_config_error_exits_2_with_key_path(recipe, capsys):
    assert main(["train", str(recipe), "--set", "algorithm.eps_hihg=0.3"]) == 2
    err = capsys.readouterr().err
    assert "algorithm.eps_hihg: unknown key; did you mean 'algorithm.eps_high'?" in err


def test_eval_fit_report(recipe, tiny_model, tmp_path, capsys):
    runs = []
    for seed in (0, 1):
        out = tmp_path / f"run{seed}"
        assert (
            main(["train", str(recipe), "--out", str(out), "--seed", str(seed), "--max-steps", "4"])
            == 0
        )
        runs.append(out)

    ev = tmp_path / "eval"
    assert (
        main(
            [
                "eval",
                str(runs[0]),
                "--data",
                "lab:addition",
                "--split",
                "train",
                "--out",
                str(ev),
                "--n",
                "4",
                "--k",
                "1",
                "2",
                "4",
                "--max-problems",
                "6",
            ]
        )
        == 0
    )
    summary = json.loads((ev / "eval.json").read_text())
    o = summary["overall"]
    assert o["n_problems"] == 6 and 0 <= o["pass@1"] <= o["pass@2"] <= o["pass@4"] <= 1
    assert o["pass@1"] == pytest.approx(o["mean@n"])
    assert "lab/addition" in summary["by_source"] and (ev / "passk.png").is_file()

    assert main(["fit", str(runs[0])]) == 0
    fit = json.loads((runs[0] / "fit.json").read_text())
    assert {"a", "b", "r2", "ceiling"} <= set(fit) and fit["ceiling"] == pytest.approx(
        fit["b"] - fit["a"]
    )
    assert (runs[0] / "plots" / "entropy_law.png").is_file()

    problems = [json.loads(line) for line in (ev / "problems.jsonl").read_text().splitlines()]
    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    assert [p["index"] for p in problems] == list(range(6))
    for p in problems:  # every response with its score; n_correct is pass@k's c
        assert len(p["responses"]) == len(p["scores"]) == 4
        assert p["n_correct"] == sum(s > 0 for s in p["scores"])
        a, b = p["prompt"].removesuffix("=").split("+")
        assert p["ground_truth"] == str(int(a) + int(b))
        assert p["greedy_score"] == float(p["greedy_response"].strip() == p["ground_truth"])
        # the policy's tokens of each response: its text's tokens, and the end token if it
        # stopped before the limit
        tok_lens = [len(tok(r, add_special_tokens=False)["input_ids"]) for r in p["responses"]]
        assert all(n in (t, t + 1) for n, t in zip(p["lengths"], tok_lens, strict=True)), \
            (p["lengths"], tok_lens)
    assert sum(p["n_correct"] for p in problems) / 24 == pytest.approx(o["pass@1"])
    assert sum(p["greedy_score"] for p in problems) / 6 == pytest.approx(o["greedy_accuracy"])
    capsys.readouterr()
    assert (
        main(["passk", f"before={ev}", str(ev / "eval.json"), "--out", str(tmp_path / "pk.png")])
        == 0
    )
    printed = capsys.readouterr().out
    assert (tmp_path / "pk.png").read_bytes()[:4] == b"\x89PNG"
    rows = {line.split("│")[1].strip(): line for line in printed.splitlines()
            if line.startswith("│")}
    assert set(rows) == {"before", "eval"} and f"{o['pass@1']:.3f}" in rows["before"]

    assert main(["report", *map(str, runs), "--out", str(tmp_path / "report")]) == 0
    rep = tmp_path / "report"
    printed = capsys.readouterr().out
    for name in ("report.html", "report.md", "report.json"):  # it says where everything is
        assert str(rep / name) in printed
    html = (rep / "report.html").read_text()
    linked = sorted(re.findall(r"<a href='([^']+\.png)'><img ", html))
    assert linked and linked == sorted(p.name for p in rep.glob("*.png"))
    assert all(name in printed for name in linked)


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


def test_version_and_help_for_every_option(capsys):
    from explorl import __version__
    from explorl.cli import build_parser

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"explorl {__version__}"
    parser = build_parser()
    sub = next(
        a for a in parser._actions if isinstance(a, __import__("argparse")._SubParsersAction)
    )
    missing = []
    for name, p in [("explorl", parser), *sub.choices.items()]:
        for action in p._actions:
            if not action.help and not isinstance(action, type(sub)):
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
    assert not missing, f"options without help: {missing}"


def test_closed_pipe_ends_quietly():
    """`explorl config | head -1`: no BrokenPipeError traceback when the reader stops early."""
    cmd = f"{sys.executable} -m explorl config | head -1"
    res = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True,
                         check=False,
                         timeout=120)
    assert res.stdout.startswith("name ") and res.stdout.count("\n") == 1
    assert res.stderr == ""
    # 141 (the shell's code for a writer stopped by a closed pipe) when head exited before the
    # last write; 0 when the whole reference fitted into the pipe's buffer first
    assert res.returncode in (0, 141)


def test_closed_pipe_in_process(monkeypatch, capsys):
    """The same, deterministic: stdout is a pipe whose reader is already gone."""
    import os

    r, w = os.pipe()
    os.close(r)
    with open(w, "w") as closed:
        monkeypatch.setattr(sys, "stdout", closed)
        assert main(["config"]) == 141
        closed.write("x" * 100000)  # stdout now points at /dev/null: later flushes are silent
        closed.flush()
    assert capsys.readouterr().err == ""


def test_lab_build_reports_progress(tmp_path):
    """The CLI shows the lab-model build's progress lines (logging is configured)."""
    code = ("from explorl.cli import setup_logging; setup_logging(); from explorl.lab import "
            f"lab_model_path; lab_model_path('addition', size='tiny', cache_dir={str(tmp_path)!r})")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         check=False)
    assert res.returncode == 0, res.stderr
    assert "building the lab model for 'addition'" in res.stderr
    assert "SFT step 5/10" in res.stderr and "ready in" in res.stderr
