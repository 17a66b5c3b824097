"""A corpus of malformed data files: each is a ``DataError`` naming the file, row and field, and
at the command line one ``error:`` line with exit status 2, no traceback, before the model is
loaded (``explorl.models.load_model`` is replaced by a stub that fails the test)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import TINY_LAB

from explorl.cli import main
from explorl.data import DataError, load_prompts

GOOD = {"prompt": "1+1=", "answer": "2"}


def jsonl(*rows) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


def parquet(rows: list[dict]) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(rows), sink)
    return sink.getvalue().to_pybytes()


# (id, file name, content, expected part of the message, which starts with the file's path)
CORPUS: list[tuple[str, str, str | bytes, str]] = [
    ("empty", "d.jsonl", "", ": file is empty (no rows)"),
    ("blank-lines", "d.jsonl", "\n \n\t\n", ": file is empty (no rows)"),
    ("not-json", "d.jsonl", "{prompt: 1}\n", " line 1: invalid JSON"),
    (
        "truncated-last-line",
        "d.jsonl",
        jsonl(GOOD) + '{"prompt": "1+1=", "ans',
        " line 2: invalid JSON",
    ),
    ("row-is-a-list", "d.jsonl", jsonl([1, 2]), " row 0 (line 1): expected an object, got list"),
    (
        "row-is-null",
        "d.jsonl",
        jsonl(GOOD, "null"),
        " row 1 (line 2): expected an object, got NoneType",
    ),
    (
        "missing-prompt",
        "d.jsonl",
        jsonl({"answer": "2"}),
        " row 0 (line 1): field 'prompt' is missing",
    ),
    (
        "missing-answer",
        "d.jsonl",
        jsonl({"prompt": "1+1="}),
        " row 0 (line 1): field 'answer' (or 'solution') is missing",
    ),
    (
        "empty-prompt",
        "d.jsonl",
        jsonl(GOOD, {"prompt": "", "answer": "2"}),
        " row 1 (line 2): field 'prompt' is empty",
    ),
    (
        "whitespace-prompt",
        "d.jsonl",
        jsonl({"prompt": " \n\t", "answer": "2"}),
        " row 0 (line 1): field 'prompt' is empty",
    ),
    (
        "whitespace-problem",
        "d.jsonl",
        jsonl({"problem": "  ", "solution": "2"}),
        "field 'problem' is empty",
    ),
    (
        "no-messages",
        "d.jsonl",
        jsonl({"prompt": [], "answer": "2"}),
        " row 0 (line 1): field 'prompt' is an empty list of messages",
    ),
    (
        "blank-messages",
        "d.jsonl",
        jsonl({"prompt": [{"role": "user", "content": " "}], "answer": "2"}),
        " row 0 (line 1): field 'prompt' has no message with any text",
    ),
    (
        "message-shape",
        "d.jsonl",
        jsonl({"prompt": [{"role": "user"}], "answer": "2"}),
        " row 0 (line 1): field 'prompt[0]' must be a message",
    ),
    (
        "prompt-number",
        "d.jsonl",
        jsonl({"prompt": 5, "answer": "2"}),
        (
            " row 0 (line 1): field 'prompt' must be a string or a list of {role, content} "
            "messages, got int"
        ),
    ),
    (
        "empty-answer",
        "d.jsonl",
        jsonl({"prompt": "1+1=", "answer": ""}),
        " row 0 (line 1): field 'answer' is empty (every response would score 0)",
    ),
    (
        "whitespace-answer",
        "d.jsonl",
        jsonl({"prompt": "1+1=", "answer": "  "}),
        "field 'answer' is empty",
    ),
    (
        "empty-object-answer",
        "d.jsonl",
        jsonl({"prompt": "1+1=", "answer": {}}),
        "field 'answer' is empty",
    ),
    (
        "null-answer",
        "d.jsonl",
        jsonl({"prompt": "1+1=", "answer": None}),
        "field 'answer' (or 'solution') is missing",
    ),
    (
        "list-answer",
        "d.jsonl",
        jsonl({"prompt": "1+1=", "answer": [2]}),
        "field 'answer' must be a string, number or object, got list",
    ),
    (
        "nan-answer",
        "d.jsonl",
        '{"prompt": "1+1=", "answer": NaN}\n',
        "field 'answer' must be a string, number or object, got float",
    ),
    ("bool-answer", "d.jsonl", jsonl({"prompt": "1+1=", "answer": True}), "got bool"),
    (
        "verl-no-ground-truth",
        "d.jsonl",
        jsonl({"prompt": [{"role": "user", "content": "1+1?"}], "reward_model": {"style": "rule"}}),
        "field 'reward_model.ground_truth' is missing",
    ),
    (
        "verl-empty-ground-truth",
        "d.jsonl",
        jsonl(
            {"prompt": [{"role": "user", "content": "1+1?"}], "reward_model": {"ground_truth": ""}}
        ),
        "field 'reward_model.ground_truth' is empty",
    ),
    (
        "verl-reward-model-text",
        "d.jsonl",
        jsonl({"prompt": "1+1=", "reward_model": "2"}),
        "field 'reward_model' must be an object, got str",
    ),
    (
        "data-source-number",
        "d.jsonl",
        jsonl({**GOOD, "data_source": 5}),
        "field 'data_source' must be a string, got int",
    ),
    (
        "deep-json-line",
        "d.jsonl",
        "[" * 100_000 + "\n",
        " line 1: invalid JSON (nested too deeply)",
    ),
    ("deep-json-file", "d.json", "[" * 100_000, ": invalid JSON (nested too deeply)"),
    (
        "huge-integer",
        "d.jsonl",
        '{"prompt": "1+1=", "answer": ' + "1" * 5000 + "}\n",
        " line 1: invalid JSON (Exceeds the limit",
    ),
    (
        "latin1",
        "d.jsonl",
        '{"prompt": "café", "answer": "2"}\n'.encode("latin-1"),
        ": not UTF-8 text",
    ),
    ("utf16", "d.jsonl", jsonl(GOOD).encode("utf-16"), ": not UTF-8 text"),
    ("json-object", "d.json", json.dumps(GOOD), ": expected a JSON list of row objects, got dict"),
    ("json-syntax", "d.json", '[{"prompt": "1+1=", "answer": "2"},]', " line 1: invalid JSON"),
    ("json-empty", "d.json", "  ", ": file is empty (no rows)"),
    ("parquet-junk", "d.parquet", b"PAR1 not really", ": not a readable parquet file"),
    ("parquet-truncated", "d.parquet", parquet([GOOD] * 4)[:-20], ": not a readable parquet file"),
    (
        "parquet-empty-prompt",
        "d.parquet",
        parquet([GOOD, {"prompt": "", "answer": "3"}]),
        " row 1: field 'prompt' is empty",
    ),
    (
        "parquet-no-answer-column",
        "d.parquet",
        parquet([{"prompt": "1+1=", "x": 1}]),
        " row 0: field 'answer' (or 'solution') is missing",
    ),
]


def _write(tmp_path, name: str, content) -> str:
    path = tmp_path / name
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        path.write_bytes(content)
    return str(path)


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c[0])
def test_malformed_file_is_a_data_error_naming_the_place(tmp_path, case):
    _, name, content, message = case
    path = _write(tmp_path, name, content)
    with pytest.raises(DataError) as e:
        load_prompts(path)
    msg = str(e.value)
    assert msg.startswith(path) and message in msg, msg
    assert len(msg) < 400


def test_byte_order_mark_is_read(tmp_path):
    path = _write(tmp_path, "d.jsonl", "\ufeff" + jsonl(GOOD, {"prompt": "2+2=", "answer": 4}))
    assert [r.ground_truth for r in load_prompts(path)] == ["2", "4"]
    path = _write(tmp_path, "d.json", "\ufeff" + json.dumps([GOOD]))
    assert load_prompts(path)[0].prompt == "1+1="


def test_records_remember_where_they_came_from(tmp_path):
    path = _write(tmp_path, "d.jsonl", jsonl(GOOD, GOOD))
    assert [r.origin for r in load_prompts(path)] == [
        f"{path} row 0 (line 1)",
        f"{path} row 1 (line 2)",
    ]


# ----------------------------------------------------------------------------- the command line


@pytest.fixture
def cli(tiny_model, tmp_path, monkeypatch, capsys):
    """``explorl train`` on a recipe whose training data is ``path``; the model never loads."""
    import explorl.models

    def no_model(*a, **k):
        raise AssertionError("the model was loaded before the data was checked")

    monkeypatch.setattr(explorl.models, "load_model", no_model)

    def run(path: str, lab: dict | None = None, **data) -> str:
        recipe = {
            "model": {"path": str(tiny_model)},
            "lab": {**TINY_LAB, **(lab or {})},
            "data": {"train": [path], "prompts_per_step": 1, **data},
            "reward": {"verifier": "exact", "num_workers": 0},
            "log": {"progress": False},
        }
        (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
        out = tmp_path / "run"
        code = main(["train", str(tmp_path / "r.yaml"), "--out", str(out)])
        captured = capsys.readouterr()
        assert code == 2, captured.err
        assert captured.err.startswith("error: ") and captured.err.count("\n") == 1, captured.err
        assert "Traceback" not in captured.err + captured.out
        assert not (out / "metrics.jsonl").exists()  # a rerun needs no --force
        return captured.err

    return run


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c[0])
def test_malformed_file_at_the_command_line(cli, tmp_path, case):
    _, name, content, message = case
    path = _write(tmp_path, name, content)
    err = cli(path)
    assert err.startswith(f"error: {path}") and message in err, err


def test_prompt_longer_than_max_prompt_len_stops_before_the_model(cli, tmp_path):
    # 1 MB of prompt: counted in tokens once the tokenizer is loaded, never sampled from
    path = _write(
        tmp_path, "d.jsonl", jsonl(GOOD, {"prompt": "1+" * 500_000 + "1=", "answer": "2"})
    )
    err = cli(path)
    assert err.startswith(f"error: data.train: {path} row 1 (line 2): the prompt has ")
    assert "tokens, more than data.max_prompt_len=1024" in err
    assert "data.max_prompt_len=2" in cli(
        _write(tmp_path, "e.jsonl", jsonl(GOOD)), max_prompt_len=2
    )


def test_fewer_rows_than_prompts_per_step(cli, tmp_path):
    path = _write(tmp_path, "d.jsonl", jsonl(GOOD, GOOD))
    assert "the training set has 2 prompts, fewer than data.prompts_per_step=4" in cli(
        path, prompts_per_step=4
    )


def test_data_path_that_is_a_directory(cli, tmp_path):
    (tmp_path / "dir.jsonl").mkdir()
    assert "data.train[0]: data file" in cli(str(tmp_path / "dir.jsonl"))
    assert "(it is a directory)" in cli(str(tmp_path / "dir.jsonl"))


def test_lab_split_larger_than_the_task(cli):
    # 1-digit addition has 55 distinct problems: asking for 200 is a data error
    err = cli("lab:addition", lab={"n_train": 200})
    assert err.startswith("error: lab:addition: lab task 'addition'")
    assert "too few distinct problems" in err and "(lab.n_train/n_val/n_test)" in err


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--data", "missing.jsonl"], "missing.jsonl: file not found"),
        (["--data", "lab:addition", "--verifier", "mathh"], "unknown verifier 'mathh'"),
        (["--data", "lab:addition", "--n", "0"], "--n: must be ≥ 1, got 0"),
        (["--data", "lab:addition", "--n", "2", "--k", "4"], "--k: every k exceeds --n 2"),
        (["--data", "lab:addition", "--temperature", "nan"], "--temperature: must be in [0, 100]"),
    ],
)
def test_eval_errors_before_the_model_loads(
    tiny_model, tmp_path, monkeypatch, capsys, args, fragment
):
    import explorl.eval.run

    def no_model(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(explorl.eval.run, "load_for_inference", no_model)
    monkeypatch.chdir(tmp_path)
    sets = [f"lab.{k}={v}" for k, v in TINY_LAB.items()]
    argv = ["eval", str(tiny_model), "--out", str(tmp_path / "ev"), *args]
    assert main([*argv, *(x for s in sets for x in ("--set", s))]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and fragment in err and "Traceback" not in err, err
