"""Atomic writes: a file is whole or absent, and an evaluation writes eval.json (the study's
mark of a finished evaluation) only after problems.jsonl."""

from __future__ import annotations

import os

import pytest

from explorl.files import write_text_atomic


def test_atomic_write_replaces_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "sub" / "summary.json"
    write_text_atomic(path, "old\n")
    write_text_atomic(path, (f"{i}\n" for i in range(3)))
    assert path.read_text() == "0\n1\n2\n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["summary.json"]


def test_a_write_that_fails_midway_leaves_the_previous_file(tmp_path):
    path = tmp_path / "eval.json"
    write_text_atomic(path, "previous\n")

    def lines():
        yield "half"
        raise OSError("disk full")

    with pytest.raises(OSError):
        write_text_atomic(path, lines())
    assert path.read_text() == "previous\n"
    assert [p.name for p in tmp_path.iterdir()] == ["eval.json"]  # no temporary left


def test_evaluation_writes_eval_json_after_problems(tiny_model, tmp_path, monkeypatch):
    """A kill between the two files must leave no eval.json beside a missing problems.jsonl."""
    import explorl.eval.run as R

    order = []
    real = R.write_text_atomic

    def spy(path, text):
        order.append(os.path.basename(path))
        return real(path, text)

    monkeypatch.setattr(R, "write_text_atomic", spy)
    monkeypatch.setattr(R, "write_eval_json", lambda s, p: order.append("eval.json"))
    R.run_eval(model=str(tiny_model), data=["lab:addition"], out_dir=tmp_path, n=2, k_list=[1, 2],
               max_problems=2, progress=False)
    assert order == ["problems.jsonl", "eval.json"]
