"""Loading prompt files (explorl.data.files): both schemas, three formats, exact error messages."""

import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from explorl.data import DataError, PromptRecord, load_many, load_prompts

VERL_ROWS = [
    {
        "prompt": [{"role": "user", "content": "1+1?"}],
        "reward_model": {"style": "rule", "ground_truth": "2"},
        "data_source": "gsm8k",
        "extra_info": {"split": "train"},
    },
    {
        "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "6*7?"}],
        "reward_model": {"ground_truth": 42},
        "data_source": "gsm8k",
    },
]


def write_jsonl(path, rows, blank_lines=False):
    lines = [json.dumps(r) for r in rows]
    path.write_text(("\n\n" if blank_lines else "\n").join(lines) + "\n")
    return str(path)


def raises(match_exact):
    return pytest.raises(DataError, match="^" + re.escape(match_exact) + "$")


# ----------------------------------------------------------------------------- schemas and formats


def test_verl_schema_jsonl(tmp_path):
    recs = load_prompts(write_jsonl(tmp_path / "train.jsonl", VERL_ROWS))
    assert recs[0] == PromptRecord(
        [{"role": "user", "content": "1+1?"}], "2", "gsm8k", 0, {"extra_info": {"split": "train"}}
    )
    assert recs[1].ground_truth == "42" and recs[1].index == 1 and len(recs[1].prompt) == 2


def test_plain_schema_and_data_source_default(tmp_path):
    rows = [
        {"prompt": "What is 2+3?", "answer": 5},
        {"problem": "Halve 1.", "solution": r"Half of 1 is $\boxed{\frac{1}{2}}$.", "level": 3},
        {"prompt": "Name?", "answer": "x", "data_source": "mine"},
    ]
    path = write_jsonl(tmp_path / "plain.jsonl", rows)
    recs = load_prompts(path, data_source_default="lab")
    assert [r.prompt for r in recs] == ["What is 2+3?", "Halve 1.", "Name?"]
    assert [r.ground_truth for r in recs] == ["5", r"Half of 1 is $\boxed{\frac{1}{2}}$.", "x"]
    assert [r.data_source for r in recs] == ["lab", "lab", "mine"]
    assert recs[1].extra == {"level": 3}
    assert load_prompts(path)[0].data_source == "unknown"


def test_json_list_file(tmp_path):
    path = tmp_path / "val.json"
    path.write_text(json.dumps(VERL_ROWS, indent=2))
    assert load_prompts(str(path)) == load_prompts(write_jsonl(tmp_path / "val.jsonl", VERL_ROWS))


def test_parquet_round_trip(tmp_path):
    path = str(tmp_path / "train.parquet")
    rows = [
        dict(r, reward_model={"ground_truth": str(r["reward_model"]["ground_truth"])})
        for r in VERL_ROWS
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    recs = load_prompts(path)
    assert recs[0].extra == {"extra_info": {"split": "train"}}
    assert recs[1].extra == {"extra_info": None}  # parquet columns exist in every row
    assert [r.prompt for r in recs] == [r["prompt"] for r in VERL_ROWS]
    assert [r.ground_truth for r in recs] == ["2", "42"]


def test_parquet_tinyzero_countdown_and_float_integers(tmp_path):
    # TinyZero stores countdown ground truth as a struct;
    # pandas turns int columns with nulls into floats.
    path = str(tmp_path / "cd.parquet")
    pq.write_table(
        pa.Table.from_pylist(
            [
                {
                    "prompt": "a",
                    "reward_model": {"ground_truth": {"target": 24, "numbers": [1, 3, 4, 6]}},
                },
            ]
        ),
        path,
    )
    assert json.loads(load_prompts(path)[0].ground_truth) == {"target": 24, "numbers": [1, 3, 4, 6]}
    path = str(tmp_path / "f.parquet")
    pq.write_table(pa.table({"prompt": ["a", "b"], "answer": [46.0, 0.5]}), path)
    assert [r.ground_truth for r in load_prompts(path)] == ["46", "0.5"]


def test_unicode_line_separator_inside_a_string_and_crlf(tmp_path):
    path = tmp_path / "u.jsonl"
    rows = [{"prompt": "a\u2028b\x85c", "answer": "1"}, {"prompt": "d", "answer": "2"}]
    path.write_text("\r\n".join(json.dumps(r, ensure_ascii=False) for r in rows), newline="")
    assert [r.prompt for r in load_prompts(str(path))] == ["a\u2028b\x85c", "d"]


def test_blank_lines_are_skipped(tmp_path):
    recs = load_prompts(write_jsonl(tmp_path / "b.jsonl", VERL_ROWS, blank_lines=True))
    assert [r.index for r in recs] == [0, 1]


def test_load_many_reindexes(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", VERL_ROWS)
    b = write_jsonl(tmp_path / "b.jsonl", [{"prompt": "p", "answer": "1"}])
    recs = load_many([a, b, a])
    assert [r.index for r in recs] == [0, 1, 2, 3, 4]
    assert [r.ground_truth for r in recs] == ["2", "42", "1", "2", "42"]


# ----------------------------------------------------------------------------- errors


def test_missing_ground_truth_names_file_row_field(tmp_path):
    rows = VERL_ROWS + [{"prompt": [{"role": "user", "content": "?"}], "data_source": "gsm8k"}]
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    with raises(
        f"{path} row 2 (line 3): field 'reward_model.ground_truth' is missing "
        "(row has keys: prompt, data_source)"
    ):
        load_prompts(path)


@pytest.mark.parametrize(
    "row,message",
    [
        ({"answer": "1"}, "field 'prompt' is missing (row has keys: answer)"),
        ({"prompt": "q"}, "field 'answer' (or 'solution') is missing (row has keys: prompt)"),
        (
            {"prompt": "q", "reward_model": {"style": "rule"}},
            "field 'reward_model.ground_truth' is missing (row has keys: prompt, reward_model)",
        ),
        (
            {"prompt": 3, "answer": "1"},
            "field 'prompt' must be a string or a list of {role, content} messages, got int",
        ),
        (
            {"prompt": [{"role": "user"}], "answer": "1"},
            'field \'prompt[0]\' must be a message {"role": str, "content": str}, '
            'got {"role": "user"}',
        ),
        (
            {"prompt": ["hi"], "answer": "1"},
            'field \'prompt[0]\' must be a message {"role": str, "content": str}, got "hi"',
        ),
        ({"prompt": [], "answer": "1"}, "field 'prompt' is an empty list of messages"),
        (
            {"prompt": "q", "answer": ["1", "2"]},
            "field 'answer' must be a string, number or object, got list",
        ),
        (
            {"prompt": "q", "answer": True},
            "field 'answer' must be a string, number or object, got bool",
        ),
        ({"prompt": "q", "reward_model": "2"}, "field 'reward_model' must be an object, got str"),
        (
            {"prompt": "q", "answer": "1", "data_source": 7},
            "field 'data_source' must be a string, got int",
        ),
        (["q", "1"], "expected an object, got list"),
    ],
)
def test_bad_row_messages(tmp_path, row, message):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "ok", "answer": "1"}, row])
    with raises(f"{path} row 1 (line 2): {message}"):
        load_prompts(path)


def test_bad_row_in_json_and_parquet_names_row(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps([{"prompt": "ok", "answer": "1"}, {"prompt": "q"}]))
    with raises(f"{path} row 1: field 'answer' (or 'solution') is missing (row has keys: prompt)"):
        load_prompts(str(path))
    ppath = str(tmp_path / "d.parquet")
    pq.write_table(pa.table({"prompt": ["a", "b"], "answer": ["1", None]}), ppath)
    with raises(
        f"{ppath} row 1: field 'answer' (or 'solution') is missing (row has keys: prompt, answer)"
    ):
        load_prompts(ppath)


def test_invalid_json_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a", "answer": "1"}\n\n{"prompt": "b", "answer": \n')
    with raises(f"{path} line 3: invalid JSON (Expecting value at column 27)"):
        load_prompts(str(path))


def test_invalid_json_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('[\n{"prompt": "a"\n]')
    with raises(f"{path} line 3: invalid JSON (Expecting ',' delimiter)"):
        load_prompts(str(path))
    path.write_text('{"prompt": "a", "answer": "1"}')
    with raises(f"{path}: expected a JSON list of row objects, got dict"):
        load_prompts(str(path))


@pytest.mark.parametrize("name,content", [("e.jsonl", "\n\n"), ("e.json", ""), ("e.json", "[]")])
def test_empty_file(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content)
    with raises(f"{path}: file is empty (no rows)"):
        load_prompts(str(path))


def test_empty_parquet(tmp_path):
    path = str(tmp_path / "e.parquet")
    pq.write_table(
        pa.table({"prompt": pa.array([], pa.string()), "answer": pa.array([], pa.string())}), path
    )
    with raises(f"{path}: file is empty (no rows)"):
        load_prompts(path)


def test_unknown_extension_and_unreadable_files(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("prompt,answer\n")
    with raises(f"{path}: unsupported file type '.csv' (expected .jsonl, .json, .parquet)"):
        load_prompts(str(path))
    path = tmp_path / "junk.parquet"
    path.write_bytes(b"not parquet")
    with pytest.raises(DataError, match="not a readable parquet file"):
        load_prompts(str(path))
    path = tmp_path / "bin.jsonl"
    path.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(DataError, match="not UTF-8 text"):
        load_prompts(str(path))
    with raises(f"{tmp_path / 'missing.jsonl'}: file not found"):
        load_prompts(str(tmp_path / "missing.jsonl"))


def test_public_api():
    import explorl.data

    assert sorted(explorl.data.__all__) == [
        "DataError",
        "PromptRecord",
        "load_many",
        "load_prompts",
        "records_from_rows",
    ]


# ------------------------------------------------------------------- column names, rows in memory


def test_prompt_and_answer_keys(tmp_path):
    rows = [{"question": "1+1=", "answer": "ignored", "final": {"value": "2", "unit": "-"}}]
    path = write_jsonl(tmp_path / "q.jsonl", rows)
    (r,) = load_prompts(path, prompt_key="question", answer_key="final.value")
    assert (r.prompt, r.ground_truth) == ("1+1=", "2")
    # The answer's object stays in extra (only its value was used); the prompt column does not.
    assert r.extra == {"answer": "ignored", "final": {"value": "2", "unit": "-"}}
    (r,) = load_prompts(path, prompt_key="question")  # default answer column
    assert r.ground_truth == "ignored" and "question" not in r.extra
    with raises(f"{path} row 0 (line 1): field 'problem' (data.prompt_key) is missing "
                "(row has keys: question, answer, final)"):
        load_prompts(path, prompt_key="problem")
    with raises(f"{path} row 0 (line 1): field 'final.val' (data.answer_key) is missing "
                "(row has keys: question, answer, final)"):
        load_prompts(path, prompt_key="question", answer_key="final.val")


def test_rows_in_memory_and_a_datasets_dataset():
    import datasets

    from explorl.data import records_from_rows

    rows = [{"question": "1+1=", "answer": 2, "level": 1}, {"question": "2+2=", "answer": 4,
                                                            "level": 2}]
    ds = datasets.Dataset.from_list(rows)
    recs = records_from_rows(ds, prompt_key="question")
    assert recs == records_from_rows(rows, prompt_key="question") == [
        PromptRecord("1+1=", "2", "unknown", 0, {"level": 1}),
        PromptRecord("2+2=", "4", "unknown", 1, {"level": 2})]
    with raises("dataset row 0: field 'prompt' is missing (row has keys: question, answer, level)"):
        records_from_rows(ds)
    with raises("dataset: no rows"):
        records_from_rows([])


@pytest.mark.slow
def test_question_column_trains_with_prompt_key(make_config, tmp_path):
    import datasets

    from explorl.outputs.runlog import read_metrics
    from explorl.training.loop import Trainer

    rows = [{"question": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(4)]
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    cfg = make_config({"data": {"train": [path], "prompt_key": "question"},
                       "reward": {"verifier": "addition"}, "max_steps": 3, "eval": {"every": 3}})
    Trainer(cfg, tmp_path / "run").train()
    got = read_metrics(tmp_path / "run")
    assert [r["step"] for r in got] == [0, 1, 2, 3] and "val/accuracy" in got[-1]  # 0: validation
    # The same rows as a datasets.Dataset, given to the Trainer directly.
    cfg = make_config({"data": {"prompt_key": "question"}, "reward": {"verifier": "addition"}})
    t = Trainer(cfg, tmp_path / "run2", train_data=datasets.Dataset.from_list(rows),
                val_data=rows[:4])
    assert t.train_data[5].prompt == "1+1=" and [r.ground_truth for r in t.val_data] == list("0123")
    t.train()
    assert [r["step"] for r in read_metrics(tmp_path / "run2")] == [0, 1, 2]
