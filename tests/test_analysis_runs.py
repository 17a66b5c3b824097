"""Reading run directories: missing keys, resumed runs, truncated lines, missing config."""

import json

from explorl.analysis.runs import load_run, read_metrics


def test_last_record_of_a_step_wins_and_bad_lines_are_skipped(tmp_path):
    lines = [
        json.dumps({"step": 1, "reward/mean": 0.1}),
        json.dumps({"step": 2, "reward/mean": 0.2, "entropy/mean": 1.0}),
        json.dumps({"step": 3, "reward/mean": 0.3}),
        "",
        json.dumps({"step": 2, "reward/mean": 0.25}),  # resumed from step 1: re-logged
        json.dumps({"no_step": 1}),
        '{"step": 4, "reward/me',  # the trainer died mid-line
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines))
    recs = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in recs] == [1, 2, 3]
    assert recs[1] == {"step": 2, "reward/mean": 0.25}


def test_series_skips_missing_and_non_finite_values(tmp_path):
    recs = [{"step": 1, "x": 1.0}, {"step": 2}, {"step": 3, "x": float("nan")},
            {"step": 4, "x": None}, {"step": 5, "x": 2}, {"step": 6, "x": True}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    run = load_run(tmp_path)
    assert run.series("x") == ([1, 5], [1.0, 2.0])
    assert run.series("absent") == ([], [])
    # no config.yaml: the directory name is the recipe name
    assert run.name == tmp_path.name and run.seed is None and run.label == tmp_path.name


def test_passk_keys_sorted_by_k(tmp_path):
    recs = [{"step": 1, "val/pass@16": 0.5, "val/pass@2": 0.2, "val/pass@1": 0.1, "val/pass@x": 1}]
    (tmp_path / "metrics.jsonl").write_text(json.dumps(recs[0]) + "\n")
    assert load_run(tmp_path).passk_keys() == ["val/pass@1", "val/pass@2", "val/pass@16"]
