"""The lab: task splits, the character tokenizer, and building/caching the tiny model."""

from __future__ import annotations

import ast
import json
import threading
from fractions import Fraction

import pytest
import torch

from explorl import lab
from explorl.lab import TASKS, get_task, make_splits, parse_lab_spec
from explorl.lab import build as lab_build
from explorl.rewards import VERIFIERS

SIZES = {"n_train": 300, "n_val": 50, "n_test": 50}


def canonical(task: str, prompt: str) -> tuple:
    """A problem's identity up to operand order, read back from the prompt text."""
    if task == "addition":
        return tuple(sorted(int(x) for x in prompt.rstrip("=").split("+")))
    if task == "chat_addition":  # "What is 37 + 65? Put your final answer in \boxed{}."
        return tuple(sorted(int(x) for x in prompt[len("What is "):prompt.index("?")].split("+")))
    if task == "multiply":  # a_digits × b_digits: operand order is part of the problem
        return tuple(int(x) for x in prompt.rstrip("=").split("*"))
    if task == "chat_multiply":  # the example's messages, then "What is 347 * 29? ..."
        q = prompt[-1]["content"]
        return tuple(int(x) for x in q[len("What is "):q.index("?")].split("*"))
    nums, target = prompt.rstrip(":").split(">")
    return tuple(sorted(int(x) for x in nums.split())), int(target)


def safe_eval(expr: str) -> tuple[Fraction, list[int]]:
    """Value of an arithmetic expression (+ - * / and parentheses) and the integers it uses."""
    used: list[int] = []

    def ev(node):
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used.append(node.value)
            return Fraction(node.value)
        assert isinstance(node, ast.BinOp), ast.dump(node)
        a, b = ev(node.left), ev(node.right)
        ops = {ast.Add: a.__add__, ast.Sub: a.__sub__, ast.Mult: a.__mul__, ast.Div: a.__truediv__}
        return ops[type(node.op)](b)

    return ev(ast.parse(expr, mode="eval").body), used


# ----------------------------------------------------------------------------- tasks


@pytest.mark.parametrize("task", sorted(TASKS))
def test_splits_are_deterministic_disjoint_and_mixed(task):
    a = make_splits(task, seed=3, **SIZES)
    assert a == make_splits(task, seed=3, **SIZES)
    assert a["train"] != make_splits(task, seed=4, **SIZES)["train"]
    keys = {}
    for split, n in (("train", 300), ("val", 50), ("test", 50)):
        recs = a[split]
        assert len(recs) == n
        assert [r.index for r in recs] == list(range(n))
        assert {r.data_source for r in recs} == {get_task(task).source}
        # text, or chat messages (chat_multiply: a worked example, then the question)
        assert all(isinstance(r.prompt, list if task == "chat_multiply" else str) for r in recs)
        keys[split] = {canonical(task, r.prompt) for r in recs}
        assert len(keys[split]) == n  # no duplicates inside a split either
        assert len({r.extra["difficulty"] for r in recs}) >= 2, f"{split}: one difficulty only"
    assert (
        not keys["train"] & keys["val"]
        and not keys["train"] & keys["test"]
        and not keys["val"] & keys["test"]
    )


def test_addition_records():
    recs = make_splits("addition", min_digits=1, max_digits=3, **SIZES)["train"]
    for r in recs:
        a, b = (int(x) for x in r.prompt.rstrip("=").split("+"))
        assert r.prompt == f"{a}+{b}=" and r.ground_truth == r.extra["solution"] == str(a + b)
        assert 1 <= len(str(a)) <= 3
        assert TASKS["addition"].check(f" {a + b}\n", r.ground_truth) and not TASKS[
            "addition"
        ].check(str(a + b + 1), r.ground_truth)
    assert max(len(str(int(x))) for r in recs for x in r.prompt.rstrip("=").split("+")) == 3
    assert TASKS["addition"].check is VERIFIERS["addition"]  # one checker: the reward's


@pytest.mark.parametrize("n_numbers", [3, 4])
def test_countdown_reference_solutions_are_correct(n_numbers):
    splits = make_splits("countdown", n_numbers=n_numbers, **SIZES)
    for r in (r for recs in splits.values() for r in recs):
        truth = json.loads(r.ground_truth)
        assert r.prompt == " ".join(map(str, truth["numbers"])) + f">{truth['target']}:"
        assert len(truth["numbers"]) == n_numbers and truth["numbers"] == sorted(truth["numbers"])
        value, used = safe_eval(r.extra["solution"])
        assert value == truth["target"] and sorted(used) == truth["numbers"], (
            r.prompt,
            r.extra["solution"],
        )
        assert TASKS["countdown"].check(r.extra["solution"], r.ground_truth)
    assert TASKS["countdown"].check is VERIFIERS["countdown"]


def test_countdown_check():
    gt = json.dumps({"numbers": [2, 3, 7], "target": 17})
    assert TASKS["countdown"].check("2*7+3", gt) and TASKS["countdown"].check(" (7*2)+3 ", gt)
    for wrong in [
        "3*7-2",
        "2*7+3+0",
        "7*2+3*1",
        "17",
        "2*7+",
        "__import__('os')",
        "2**7+3",
        "",
        "7/(3-3)+2",
    ]:
        assert not TASKS["countdown"].check(wrong, gt), wrong


def test_subset_sum_check_accepts_every_subset_and_nothing_else():
    gt = json.dumps({"numbers": [1, 3, 4, 6, 8, 9], "target": 15})
    check = TASKS["subset_sum"].check
    # 15 = 6+9 = 1+6+8 = 3+4+8 (worked out by hand): each counts, in any order, padded or not
    for right in ["6+9", "9+6", "1+6+8", "8+1+6", "3+4+8", " 8+4+3 "]:
        assert check(right, gt) == 1.0, right
    for wrong in ["15", "6+6+3", "1+1+13", "9+6+0", "6+9+", "+6+9", "6 + 9", "6-(-9)", "7+8",
                  "__import__('os')", "", "9" * 70, "6+9\n1", "1+3+4+6",
                  # untrusted digits: Arabic-Indic and full-width 6 and 9, a leading zero
                  "\u0666+\u0669", "\uff16+\uff19", "06+9", "6+09"]:
        assert check(wrong, gt) == 0.0, wrong
    # a number given twice may be used twice, not three times
    assert check("2+2", json.dumps({"numbers": [2, 2, 5], "target": 4})) == 1.0
    assert check("2+2+2", json.dumps({"numbers": [2, 2, 5], "target": 6})) == 0.0
    assert TASKS["subset_sum"].check is VERIFIERS["subset_sum"]


def test_subset_sums_by_hand():
    assert lab.tasks.subset_sums([1, 3, 4, 6, 8, 9], 15) == [(1, 6, 8), (3, 4, 8), (6, 9)]
    assert lab.tasks.subset_sums([2, 2, 5], 4) == [(2, 2)]
    assert lab.tasks.subset_sums([2, 2, 5], 1) == []


def test_subset_sum_records_solutions_and_difficulty():
    splits = make_splits("subset_sum", **SIZES)
    for r in splits["train"] + splits["test"]:
        gt = json.loads(r.ground_truth)
        n = len(lab.tasks.subset_sums(gt["numbers"], gt["target"]))
        assert r.extra["n_answers"] == n >= 1
        assert r.extra["difficulty"] == (0 if n >= 6 else 1 if n >= 3 else 2 if n == 2 else 3)
        assert TASKS["subset_sum"].check(r.extra["solution"], r.ground_truth) == 1.0
        assert 3 <= len(r.extra["solution"].split("+")) <= 4  # min_terms..max_terms
        assert r.prompt == " ".join(map(str, gt["numbers"])) + f">{gt['target']}:"
    # several answers on most problems: what makes exploration matter on this task
    assert sum(r.extra["n_answers"] >= 2 for r in splits["test"]) >= 0.6 * len(splits["test"])


def test_bad_task_arguments():
    assert parse_lab_spec("lab:countdown") == "countdown"
    assert parse_lab_spec("data/train.jsonl") is None
    with pytest.raises(ValueError, match="addition"):
        parse_lab_spec("lab:multiplication")
    with pytest.raises(ValueError, match="max_digits"):
        make_splits("addition", max_digit=2)
    with pytest.raises(ValueError, match="max_digits"):
        make_splits("addition", max_digits=4)
    with pytest.raises(ValueError, match="too few distinct"):
        make_splits("addition", max_digits=1, n_train=100, n_val=0, n_test=0)  # only 55 pairs


# ----------------------------------------------------------------------------- tokenizer


def test_tokenizer_round_trips_through_auto_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    from explorl.lab.tokenizer import CHARS, lab_tokenizer, save_lab_tokenizer

    save_lab_tokenizer(lab_tokenizer(), tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    for s in ["37+5=", "3 7 12>17:", "  (3*7)-2/1 ", CHARS]:
        ids = tok(s)["input_ids"]
        assert len(ids) == len(s)  # one token per character, no BOS/EOS added
        assert tok.decode(ids) == s
        assert tok.decode(ids + [tok.eos_token_id, tok.pad_token_id], skip_special_tokens=True) == s
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)


# ----------------------------------------------------------------------------- build


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return lab.lab_model_path("addition", cache_dir=tmp_path_factory.mktemp("lab"), size="tiny")


def test_tiny_build_loads(tiny):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    meta = json.loads((tiny / "lab.json").read_text())
    for key in [
        "task",
        "params",
        "seed",
        "n_params",
        "sft_steps",
        "val_greedy_accuracy",
        "val_sampled_accuracy",
        "build_seconds",
        "torch_version",
    ]:
        assert key in meta
    assert meta["task"] == "addition" and meta["params"] == {"min_digits": 1, "max_digits": 2}
    assert tiny.name.startswith("addition-")
    model = AutoModelForCausalLM.from_pretrained(tiny)
    tok = AutoTokenizer.from_pretrained(tiny)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == meta["n_params"]
    assert (
        model.config.eos_token_id == tok.eos_token_id
        and model.config.pad_token_id == tok.pad_token_id
    )
    assert tok.decode(tok("3 7 2>17:")["input_ids"]) == "3 7 2>17:"
    out = model.generate(**tok(["12+7="], return_tensors="pt"), max_new_tokens=3, do_sample=False)
    assert out.shape == (1, 8)


def test_cached_build_is_reused(tiny, monkeypatch):
    mtime = (tiny / "lab.json").stat().st_mtime_ns
    monkeypatch.setattr(lab_build, "_build", lambda *a, **k: pytest.fail("rebuilt a cached model"))
    assert lab.lab_model_path("addition", cache_dir=tiny.parent, size="tiny") == tiny
    assert (tiny / "lab.json").stat().st_mtime_ns == mtime
    # Changed settings are a different model: a different directory.
    p, c = lab_build.resolve("addition", size="tiny", max_steps=11)
    assert lab_build.build_key("addition", p, c) != tiny.name
    p, c = lab_build.resolve("addition", size="tiny", max_digits=3)
    assert lab_build.build_key("addition", p, c) != tiny.name


def test_env_var_sets_cache_root(tmp_path, monkeypatch):
    monkeypatch.setenv("EXPLORL_LAB_CACHE", str(tmp_path))
    built = []
    monkeypatch.setattr(
        lab_build,
        "_build",
        lambda task, params, cfg, out: built.append(out) or (out / "lab.json").write_text("{}"),
    )
    path = lab.lab_model_path("countdown", size="tiny")
    assert path.parent == tmp_path and path.name.startswith("countdown-") and len(built) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [path.name, path.name + ".lock"]
    )  # no temp dir left
    with pytest.raises(ValueError, match="unknown lab build setting"):
        lab.lab_model_path("countdown", max_digits=2)


def test_concurrent_builders_build_once(tmp_path, monkeypatch):
    built, started = [], threading.Event()

    def slow_build(task, params, cfg, out):
        started.set()
        built.append(out)
        threading.Event().wait(0.3)
        (out / "lab.json").write_text("{}")

    monkeypatch.setattr(lab_build, "_build", slow_build)
    paths = []
    threads = [
        threading.Thread(
            target=lambda: paths.append(
                lab.lab_model_path("addition", cache_dir=tmp_path, size="tiny")
            )
        )
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(built) == 1 and len(set(paths)) == 1 and (paths[0] / "lab.json").exists()


def test_failed_build_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(lab_build, "_build", lambda *a: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError):
        lab.lab_model_path("addition", cache_dir=tmp_path, size="tiny")
    assert [p.suffix for p in tmp_path.iterdir()] == [".lock"]


def test_build_is_deterministic_and_leaves_global_state(tiny, tmp_path, capfd):
    from transformers.utils import logging as hf_logging

    rng, threads = torch.get_rng_state(), torch.get_num_threads()
    bars = hf_logging.is_progress_bar_enabled()
    again = lab.lab_model_path("addition", cache_dir=tmp_path, size="tiny")
    assert torch.equal(torch.get_rng_state(), rng) and torch.get_num_threads() == threads
    assert hf_logging.is_progress_bar_enabled() == bars
    printed = capfd.readouterr()
    assert "Writing model shards" not in printed.err + printed.out  # only the build's own lines
    assert (again / "model.safetensors").read_bytes() == (tiny / "model.safetensors").read_bytes()
    a, b = (json.loads((p / "lab.json").read_text()) for p in (tiny, again))
    assert {k: v for k, v in a.items() if k != "build_seconds"} == {
        k: v for k, v in b.items() if k != "build_seconds"
    }


def test_cached_sampling_matches_full_recompute():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=24,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            max_position_embeddings=64,
            pad_token_id=0,
        )
    ).eval()
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [14]]
    got = lab_build.sample(
        model,
        prompts,
        temperature=0.0,
        max_new_tokens=6,
        eos_id=2,
        pad_id=0,
        vocab=lambda ids: [f"<{i}>" for i in ids],
        generator=torch.Generator(),
    )
    want = []
    with torch.no_grad():
        for p in prompts:
            x = torch.tensor([p])
            for _ in range(6):
                nxt = int(model(x).logits[0, -1].argmax())
                if nxt == 2:
                    break
                x = torch.cat([x, torch.tensor([[nxt]])], 1)
            want.append("".join(f"<{i}>" for i in x[0, len(p) :].tolist()))
    assert got == want and len(set(got)) > 1


def test_public_api():
    assert sorted(lab.__all__) == ["LabTask", "Problem", "TASKS", "get_task", "lab_model_path",
                                   "make_splits", "parse_lab_spec"]
    assert all(getattr(lab, name) is not None for name in lab.__all__)


def test_lab_model_size_reaches_the_build(monkeypatch):
    """``lab.model_size`` picks the build size of ``model.path: lab:<task>``; a bad size names
    the valid ones."""
    import explorl.models
    from explorl import config as C
    from explorl import validation
    from explorl.models import resolve_model_path

    seen = {}
    monkeypatch.setattr(explorl.models, "lab_model_path",
                        lambda ref, **kw: seen.update(kw, ref=ref))
    cfg = validation.load(None, ["model.path=lab:addition", "lab.model_size=large"])
    resolve_model_path(cfg.model.path, cfg.lab)
    assert seen["ref"] == "addition" and seen["size"] == "large"
    import typing

    hints = typing.get_type_hints(C.LabConfig)
    assert set(typing.get_args(hints["model_size"])) <= set(lab_build.SIZES)
    with pytest.raises(C.ConfigError, match="lab.model_size"):
        validation.load(None, ["lab.model_size=huge"])
    params, build = lab_build.resolve("addition", size="large")
    n = build.num_layers * (4 * build.hidden_size**2 + 3 * build.hidden_size
                            * build.intermediate_size)
    assert 8e6 < n < 12e6  # ~10× the default model's blocks
