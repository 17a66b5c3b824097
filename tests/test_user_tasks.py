"""Lab tasks as plugins: a user's task (tests/user_tasks.py) builds a lab model and trains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from explorl import validation
from explorl.lab import TASKS, get_task, make_splits, parse_lab_spec
from explorl.lab import build as lab_build

HERE = Path(__file__).resolve().parent
LETTERS = f"{HERE / 'user_tasks.py'}:letters"  # a file reference: found without PYTHONPATH
SIZES = {"n_train": 64, "n_val": 16, "n_test": 16}


def test_task_reference_forms_resolve_to_one_task():
    task = get_task(LETTERS)
    assert task.name == "letters" and task.alphabet == "abcd,=" and task.source == "lab/letters"
    assert parse_lab_spec(f"lab:{LETTERS}") == LETTERS
    assert parse_lab_spec("lab:addition") == "addition" and parse_lab_spec("x.jsonl") is None
    with pytest.raises(ValueError, match="did you mean 'addition'"):
        get_task("additon")
    with pytest.raises(ValueError, match="did you mean .*user_tasks.py:letters"):
        get_task(f"{HERE / 'user_tasks.py'}:leters")
    with pytest.raises(ValueError, match="not an explorl.lab.LabTask"):
        get_task(f"{HERE / 'user_tasks.py'}:check")


def test_user_task_splits_and_params():
    splits = make_splits(LETTERS, seed=1, groups=3, **SIZES)
    r = splits["train"][0]
    assert r.prompt.count(",") == 2 and r.prompt.endswith("=")
    assert r.ground_truth == r.prompt[:-1].replace(",", "") == r.extra["solution"]
    with pytest.raises(ValueError, match="did you mean 'groups'"):
        make_splits(LETTERS, group=3, **SIZES)
    with pytest.raises(ValueError, match="groups ≥ 1"):
        make_splits(LETTERS, groups=0, **SIZES)


def test_builtin_tasks_carry_their_settings():
    assert TASKS["countdown"].build == {"max_steps": 600}
    assert (TASKS["addition"].max_response_len, TASKS["countdown"].max_response_len) == (8, 20)
    # The built-in tasks' cache keys do not depend on the plugin fields (same as before them).
    params, cfg = lab_build.resolve("addition")
    assert lab_build.build_key("addition", params, cfg) == "addition-b182eaffed"


def test_tokenizer_from_the_alphabet_rejects_other_characters(tmp_path):
    from transformers import AutoTokenizer

    from explorl.lab.tokenizer import lab_tokenizer, save_lab_tokenizer
    from explorl.models import render_prompt

    save_lab_tokenizer(lab_tokenizer(alphabet="abcd,="), tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    ids = render_prompt(tok, "ab,c=", use_chat_template=True)
    # ids: the 4 specials, then a b c d , =
    assert ids == [4, 5, 8, 6, 9] and tok.decode(ids) == "ab,c="
    with pytest.raises(ValueError, match="'e' outside the lab model's alphabet 'abcd,='"):
        render_prompt(tok, "ae=", use_chat_template=True)
    with pytest.raises(ValueError, match="repeats 'a'"):
        lab_tokenizer(alphabet="aab")


def test_build_rejects_a_problem_outside_the_alphabet(tmp_path):
    with pytest.raises(ValueError, match="'ae=' has 'e', outside its alphabet 'abcd,='"):
        lab_build.lab_model_path(f"{HERE / 'user_tasks.py'}:bad_alphabet", cache_dir=tmp_path,
                                 n_train=8, n_val=2, n_test=2)
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]  # nothing half-built left


@pytest.mark.slow
def test_user_task_builds_a_lab_model_and_trains(tmp_path, monkeypatch):
    from explorl.outputs.runlog import read_metrics
    from explorl.training.loop import Trainer

    monkeypatch.setenv("EXPLORL_LAB_CACHE", str(tmp_path / "cache"))
    cfg = validation.from_dict({
        "max_steps": 2,
        "model": {"path": f"lab:{LETTERS}"},
        "lab": {**SIZES, "params": {"groups": 2}},
        "data": {"train": [f"lab:{LETTERS}"], "prompts_per_step": 4},
        "rollout": {"n_samples": 4},
        "reward": {"num_workers": 1},
        "optim": {"lr": 1e-3},
        "eval": {"every": 2, "n_samples": 2, "k": [1, 2], "max_problems": 4},
        "log": {"progress": False, "plots": False},
    })
    assert cfg.rollout.max_response_len == 6  # the task's
    Trainer(cfg, tmp_path / "run").train()
    model = next((tmp_path / "cache").glob("letters-*"))
    meta = json.loads((model / "lab.json").read_text())
    assert meta["alphabet"] == "abcd,=" and meta["params"] == {"n_letters": 2, "groups": 2}
    vocab = json.loads((model / "tokenizer.json").read_text())["model"]["vocab"]
    assert [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])][4:] == list("abcd,=")
    rows = [r for r in read_metrics(tmp_path / "run") if r["step"] > 0]  # step 0: validation only
    assert [r["step"] for r in rows] == [1, 2] and rows[-1]["reward/verify_errors"] == 0
    assert "val/accuracy" in rows[-1]
