"""Reward functions as users write them: explorl, verl and TRL signatures, weights, per-source
dispatch, accuracy vs reward, loading by module or file without PYTHONPATH, and names checked
when the config is validated."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from conftest import TINY_LAB_CONFIG

import explorl
from explorl import config as C
from explorl import validation
from explorl.records import PromptRecord
from explorl.refs import RefError, anchor, load_ref
from explorl.rewards import VerifierPool
from explorl.rewards.functions import RewardSpec, Term, as_scorer, resolve_scorer, signature_of
from explorl.rewards.rewarder import Rewarder, verifier_spec

VERL = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    # -100 flags a wrong call: the test's sums would show it.
    if data_source != "lab/addition" or "solution" not in extra_info:
        return -100.0
    return {"score": float(solution_str.strip() == ground_truth), "note": "dicts are allowed"}
'''
TRL = '''
def short(prompts, completions, ground_truth, **kwargs):
    ok = (isinstance(completions[0], str) and prompts[0].endswith("=") and
          kwargs["data_source"] == ["lab/addition"] and len(ground_truth) == 1)
    return [0.5 if ok else -100.0]
'''


# ----------------------------------------------------------------------------- signatures


def test_signatures_are_told_apart_by_parameters():
    def plain(response, ground_truth):
        return 1.0

    def verl(data_source, solution_str, ground_truth, extra_info=None):
        return 1.0

    def trl(prompts, completions, **kwargs):
        return [1.0]

    class Callable:
        def __call__(self, response, ground_truth, extra=None):
            return 1.0

    assert [signature_of(f) for f in (plain, verl, trl, Callable())] == [
        "explorl", "verl", "trl", "explorl"]
    with pytest.raises(ValueError, match="cannot tell how to call it .parameters: a, b, c"):
        signature_of(lambda a, b, c: 0.0)


def test_verl_gets_the_record_and_may_return_a_dict():
    seen = {}

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        seen.update(source=data_source, info=extra_info)
        return {"score": 0.25, "acc": True}

    score = as_scorer(compute_score)
    assert score("x", "y", ("p", "gsm8k", {"extra_info": {"split": "train"}, "level": 3})) == 0.25
    assert seen == {"source": "gsm8k", "info": {"split": "train"}}  # verl's extra_info column
    assert score("x", "y", ("p", "lab/addition", {"level": 3})) == 0.25
    assert seen["info"] == {"level": 3}  # no extra_info column: the row's other columns
    with pytest.raises(ValueError, match="'score' key"):
        as_scorer(lambda data_source, solution_str, ground_truth: {"acc": 1})("x", "y", None)


def test_trl_gets_a_batch_of_one_with_the_columns():
    calls = []

    def fmt(prompts, completions, **columns):
        calls.append((prompts, completions, columns))
        return [None]  # TRL: not applicable

    score = as_scorer(fmt)
    assert score("42", "42", ("40+2=", "lab/addition", {"level": 3})) == 0.0
    prompts, completions, cols = calls[-1]
    assert (prompts, completions) == (["40+2="], ["42"])
    assert cols == {"ground_truth": ["42"], "answer": ["42"], "solution": ["42"], "level": [3],
                    "data_source": ["lab/addition"]}
    chat = [{"role": "user", "content": "40+2?"}]
    score("42", "42", (chat, "gsm8k", {}))
    assert calls[-1][:2] == ([chat], [[{"role": "assistant", "content": "42"}]])


def test_a_non_finite_reward_is_an_error():
    with pytest.raises(ValueError, match="not finite"):
        as_scorer(lambda response, ground_truth: math.nan)("a", "b")


# ----------------------------------------------------------------------------- combining

R = "explorl.rewards.testing:"


def test_weighted_sum_with_source_filters():
    spec = RewardSpec((Term("exact", 1.0), Term("addition", 0.5, ("lab/*",)),
                       Term("explorl.rewards.testing:_echo", -2.0, ("gsm8k",))))
    score = resolve_scorer(spec)
    # lab record: exact 1 + 0.5·addition 1 = 1.5; gsm8k: exact 0 + (−2)·echo 0 = 0
    assert score("46", "46", (None, "lab/addition", {})) == 1.5
    assert score("046", "46", (None, "lab/addition", {})) == 0.5  # exact 0, addition 1
    assert score("a", "b", (None, "gsm8k", {})) == 0.0
    assert score("a", "a", (None, "gsm8k", {})) == -1.0  # 1 − 2·1


def test_a_failing_term_of_several_is_named():
    spec = RewardSpec((Term("exact"), Term(R + "_raise")))
    with pytest.raises(Exception, match=rf"^{R}_raise: "):
        resolve_scorer(spec)("a", "a", None)
    with pytest.raises(Exception) as alone:  # one function: the report names it already
        resolve_scorer(RewardSpec((Term(R + "_raise"),)))("a", "a", None)
    assert not str(alone.value).startswith(R)


def test_first_match_dispatch_and_a_source_nobody_scores():
    spec = RewardSpec((Term("addition", 1.0, ("lab/addition",)), Term("exact")), "first")
    score = resolve_scorer(spec)
    assert score("046", "46", (None, "lab/addition", {})) == 1.0
    assert score("046", "46", (None, "other", {})) == 0.0
    with pytest.raises(ValueError, match="no verifier for data source 'gsm8k'"):
        resolve_scorer(RewardSpec((Term("exact", 1.0, ("lab/*",)),), "first"))("a", "a",
                                                                             (None, "gsm8k", {}))


def test_auto_verifier_dispatches_per_source():
    spec = verifier_spec("auto", ["lab:addition", "lab:countdown", "train.jsonl"])
    assert [(t.ref, t.sources) for t in spec.terms] == [
        ("lab:addition", ("lab/addition",)), ("lab:countdown", ("lab/countdown",)), ("math", ())]
    assert [t.ref for t in verifier_spec("auto", ["lab:addition"]).terms] == ["lab:addition"]
    assert [t.ref for t in verifier_spec("exact", ["lab:addition"]).terms] == ["exact"]


def _records(truths, source="lab/addition"):
    return [PromptRecord(f"{t}=", t, source, i, {"solution": t}) for i, t in enumerate(truths)]


def _reward_cfg(**kw):
    return validation.from_dict({"reward": kw, "rollout": {"max_response_len": 8}}).reward


def test_rewarder_reward_and_accuracy():
    pool = VerifierPool(num_workers=0, timeout_s=1.0)
    texts, recs = ["1", "2", "3"], _records(["1", "2", "4"])
    # No functions: reward = verifier score (signed: 2s − 1), correct = score ≥ 1.
    out = Rewarder(_reward_cfg(convention="signed"), ["lab:addition"]).score(pool, texts, recs)
    assert (out.correct, out.rewards) == ([1.0, 1.0, 0.0], [1.0, 1.0, -1.0])
    # Functions: reward = 1·exact + 0.25·(TRL-style constant 1), correct from the verifier.
    fns = [{"name": "exact"}, {"name": R + "_trl_one", "weight": 0.25}]
    out = Rewarder(_reward_cfg(functions=fns), ["lab:addition"]).score(pool, texts, recs)
    assert (out.correct, out.rewards) == ([1.0, 1.0, 0.0], [1.25, 1.25, 0.25])
    # Correct from the reward with a threshold: 1.25 ≥ 1.2, 0.25 < 1.2.
    cfg = _reward_cfg(functions=fns, accuracy="reward", accuracy_threshold=1.2)
    rw = Rewarder(cfg, ["lab:addition"])
    assert rw.verifier is None and rw.score(pool, texts, recs).correct == [1.0, 1.0, 0.0]


def test_rewarder_in_worker_processes_counts_failures():
    fns = [{"name": "exact"}, {"name": R + "_echo", "data_source": ["gsm8k"]}]
    texts = ["1", "raise", "x"]
    recs = _records(["1", "2", "3"]) + []
    recs[1] = PromptRecord("q", "raise", "gsm8k", 1, {})
    with VerifierPool(num_workers=1, timeout_s=5.0) as pool:
        rewarder = Rewarder(_reward_cfg(functions=fns, verifier="exact"), ["lab:addition"])
        out = rewarder.score(pool, texts, recs)
    # record 1: exact("raise", "raise") = 1, then _echo raises, so its whole reward is an error
    # (0); the verifier alone still finds it correct.
    assert out.rewards == [1.0, 0.0, 0.0] and out.errors == 1 and out.correct == [1.0, 1.0, 0.0]


# ----------------------------------------------------------------------------- references


def test_load_by_file_and_by_module_from_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text("def fn(response, ground_truth):\n    return 7.0\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "more.py").write_text("from my_rewards import fn as g\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    assert load_ref("my_rewards:fn")("a", "b") == 7.0  # not on sys.path: found in the cwd
    assert load_ref("sub/more.py:g")("a", "b") == 7.0
    with pytest.raises(RefError, match="did you mean 'my_rewards:fn'"):
        load_ref("my_rewards:fnn")
    with pytest.raises(RefError, match="no module named 'my_reward'.*did you mean 'my_rewards'"):
        load_ref("my_reward:fn")
    with pytest.raises(RefError, match="no file 'sub/mor.py'.*did you mean .*more.py"):
        load_ref("sub/mor.py:g")


def test_ref_of_a_python_function():
    from explorl.refs import ref_of
    from explorl.rewards.verifiers import exact_verifier

    assert ref_of(exact_verifier) == "explorl.rewards.verifiers:exact_verifier"
    assert load_ref(ref_of(exact_verifier)) is exact_verifier
    with pytest.raises(RefError, match="define it at module level"):
        ref_of(lambda response, ground_truth: 1.0)


def test_recipe_references_are_anchored_to_the_recipe(tmp_path, tiny_model, monkeypatch):
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "rw.py").write_text("def f(response, ground_truth):\n    return 1.0\n")
    (conf / "recipe.yaml").write_text(yaml.safe_dump({
        "model": {"path": str(tiny_model)}, "lab": TINY_LAB_CONFIG,
        "rollout": {"max_response_len": 6},
        "reward": {"verifier": "rw:f", "functions": [{"name": "rw.py:f"}, {"name": "exact"}]}}))
    monkeypatch.chdir(tmp_path)  # neither rw nor rw.py is here
    cfg = validation.load(conf / "recipe.yaml")
    assert cfg.reward.verifier == f"{conf.resolve() / 'rw.py'}:f"
    assert [f.name for f in cfg.reward.functions] == [f"{conf.resolve() / 'rw.py'}:f", "exact"]
    assert anchor("math", conf) == "math" and anchor("lab:addition", conf) == "lab:addition"


@pytest.mark.parametrize("sets,message", [
    (["reward.verifier=mathh"], ("reward.verifier: unknown verifier 'mathh'; did you mean "
                                 "'math'?")),
    (["reward.verifier=nosuchmod:fn"], "reward.verifier: no module named 'nosuchmod'"),
    (["reward.functions=[{name: explorl.rewards.verifiers:exact_verifer}]"],
     "reward.functions\\[0\\].name: .*did you mean 'explorl.rewards.verifiers:exact_verifier'"),
    (["reward.functions=[{name: exact, weight: .nan}]"], "reward.functions\\[0\\].weight"),
    (["reward.functions=[{name: exact}]", "reward.convention=signed"], "reward.convention"),
    (["reward.verifier=explorl.rewards.testing:_bad_signature"], "cannot tell how to call it"),
    (["lab.params={max_digit: 3}"], "lab.params.max_digit: .*did you mean 'lab.params.max_digits'"),
    (["lab.params={max_digits: 4}"], "lab.params: addition needs 1 <= min_digits <= max_digits"),
    (["data.train=[lab:additon]"], ("data.train\\[0\\]: unknown lab task 'additon'; did you "
                                    "mean 'addition'")),
    (["model.path=lab:countdwn"], "model.path: unknown lab task 'countdwn'"),
])
def test_config_names_are_checked_before_anything_loads(sets, message):
    with pytest.raises(C.ConfigError, match=message):
        validation.load(None, sets)


# ----------------------------------------------------------------------------- end to end


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``explorl ARGS`` in ``cwd`` with no PYTHONPATH but explorl's own, and with the working
    directory not on sys.path (as with the installed ``explorl`` script)."""
    src = str(Path(explorl.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": src}
    code = ("import sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; "
            "from explorl.cli import main; sys.exit(main(sys.argv[1:]))")
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=env, check=False,
                          capture_output=True, text=True, timeout=600)


def _recipe(tmp_path: Path, tiny_model, reward: dict) -> Path:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "max_steps": 3, "model": {"path": str(tiny_model)}, "lab": TINY_LAB_CONFIG,
        "data": {"train": ["lab:addition"], "prompts_per_step": 4},
        "rollout": {"n_samples": 4, "max_response_len": 6}, "optim": {"lr": 1e-3},
        "reward": {"num_workers": 1, **reward},
        "eval": {"every": 3, "n_samples": 2, "k": [1, 2], "max_problems": 4},
        "log": {"progress": False, "plots": False}}))
    return recipe


@pytest.mark.slow
def test_verl_and_trl_reward_files_train_without_pythonpath(tmp_path, tiny_model):
    (tmp_path / "verl_rewards.py").write_text(textwrap.dedent(VERL))
    (tmp_path / "trl_rewards.py").write_text(textwrap.dedent(TRL))
    recipe = _recipe(tmp_path, tiny_model, {
        "verifier": "verl_rewards:compute_score",  # a module in the working directory
        "functions": [{"name": "verl_rewards:compute_score", "weight": 1.0},
                      {"name": "trl_rewards.py:short", "weight": 0.5}]})  # a file
    res = _cli(["train", str(recipe), "--out", "run"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text()
    rows = [json.loads(line) for line in metrics.splitlines()]
    rows = [r for r in rows if r["step"] > 0]  # step 0: validation only
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        # reward = 1·(verl score = correct) + 0.5·0.5 for every response
        assert r["reward/mean"] == pytest.approx(r["reward/accuracy"] + 0.25, abs=1e-6)
        assert r["reward/verify_errors"] == 0 and r["reward/verify_timeouts"] == 0


@pytest.mark.slow
def test_a_typo_fails_before_the_model_loads_and_leaves_no_run(tmp_path, tiny_model):
    (tmp_path / "verl_rewards.py").write_text(textwrap.dedent(VERL))
    recipe = _recipe(tmp_path, tiny_model, {"functions": [{"name": "verl_rewards:compute_scor"}]})
    res = _cli(["train", str(recipe), "--out", "run"], tmp_path)
    assert res.returncode == 2
    assert ("error: reward.functions[0].name: 'verl_rewards:compute_scor': verl_rewards has "
            "no attribute 'compute_scor'; did you mean 'verl_rewards:compute_score'?") in res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "run").exists()
