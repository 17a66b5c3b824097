"""reasoning-gym tasks (rg:<task>): splits, parameters, the checker, the refusal of scorers
that execute the answer, and a run on a lab model. Skipped when reasoning-gym is not installed.

Only short tasks are generated here (chain_sum, string_insertion): some generators take
seconds per item, so no test enumerates the tasks.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("reasoning_gym")

from explorl import config as C
from explorl import validation
from explorl.data.sources import load_split
from explorl.lab import get_task, make_splits, rg
from explorl.rewards import VerifierPool
from explorl.rewards.rewarder import verifier_spec

SIZES = {"n_train": 64, "n_val": 16, "n_test": 16}
CHAIN = {"min_terms": 2, "max_terms": 2, "max_digits": 2}  # "... problem: 81 + 14 =" → "95"


def test_the_audit_covers_every_registered_task():
    from reasoning_gym.factory import DATASETS

    if rg.installed_version() != rg.AUDITED_VERSION:
        pytest.skip(f"the audit is of reasoning-gym {rg.AUDITED_VERSION}")
    assert set(DATASETS) == set(rg.SUPPORTED) | set(rg.EVAL_TASKS)
    assert not set(rg.SUPPORTED) & set(rg.EVAL_TASKS)
    lab_page = (Path(__file__).resolve().parents[1] / "docs" / "lab.md").read_text()
    assert all(f"`{t}`" in lab_page for t in [*rg.SUPPORTED, *rg.EVAL_TASKS])


def test_splits_are_deterministic_and_disjoint():
    a = make_splits("rg:chain_sum", seed=3, **SIZES, **CHAIN)
    assert a == make_splits("rg:chain_sum", seed=3, **SIZES, **CHAIN)
    assert a["train"] != make_splits("rg:chain_sum", seed=4, **SIZES, **CHAIN)["train"]
    questions = {s: {r.prompt for r in recs} for s, recs in a.items()}
    assert [len(questions[s]) for s in ("train", "val", "test")] == [64, 16, 16]
    assert not (questions["train"] & questions["val"] or questions["train"] & questions["test"]
                or questions["val"] & questions["test"])
    r = a["train"][0]
    assert r.data_source == "rg/chain_sum" and r.extra["rg"]["params"]["max_terms"] == 2
    a_, op, b_ = r.prompt.rsplit(":", 1)[1].strip(" =").split()
    assert r.ground_truth == str(int(a_) + int(b_) if op == "+" else int(a_) - int(b_))


def test_parameters_are_the_task_config():
    task = get_task("rg:chain_sum")
    assert task.params == {"min_terms": 2, "max_terms": 6, "min_digits": 1, "max_digits": 4,
                           "allow_negation": False}
    with pytest.raises(ValueError, match="did you mean 'max_terms'"):
        make_splits("rg:chain_sum", max_term=3, **SIZES)
    with pytest.raises(ValueError, match="max_terms must be >= min_terms"):
        make_splits("rg:chain_sum", min_terms=3, max_terms=2, **SIZES)
    with pytest.raises(ValueError, match="did you mean 'rg:chain_sum'"):
        get_task("rg:chain_summ")


def test_checker_scores_the_item():
    r = make_splits("rg:chain_sum", **SIZES, **CHAIN)["test"][0]
    score = get_task("rg:chain_sum").check
    args = (r.data_source, r.ground_truth, r.extra)
    assert rg.score(r.data_source, r.ground_truth, "", r.extra) == 1.0
    assert rg.score(r.data_source, f"think... <answer> {r.ground_truth} </answer>", *args[1:]) \
        == 1.0
    assert score(r.data_source, "no", *args[1:]) == 0.0
    with pytest.raises(ValueError, match="not a reasoning-gym record"):
        rg.score("x", "1", "1", {})


# ----------------------------------------------------------------------------- eval() scorers


def test_eval_scorer_tasks_are_refused_by_default():
    with pytest.raises(C.ConfigError, match=r"data.train\[0\]: rg:string_insertion refused: "
                       r"reasoning_gym's string_insertion scorer calls eval\(\) on the model's "
                       r"answer, so a model could run any code. Set reward.allow_eval_scorers"):
        validation.load(None, ["data.train=[rg:string_insertion]"])
    with pytest.raises(C.ConfigError, match="sympy.parse_expr"):
        validation.load(None, ["data.train=[rg:puzzle24]"])
    with pytest.raises(C.ConfigError, match="model.path: lab:rg:n_queens cannot be a lab model"):
        validation.load(None, ["model.path=lab:rg:n_queens", "reward.allow_eval_scorers=true"])
    with pytest.raises(C.ConfigError, match="reward.num_workers: must be ≥ 1"):
        validation.load(None, ["reward.allow_eval_scorers=true", "reward.num_workers=0"])
    cfg = validation.load(None)
    cfg.data.train = ["rg:string_insertion"]  # past the config check: the loader refuses too
    with pytest.raises(ValueError, match="refused: .*eval"):
        load_split(cfg.data.train, cfg, "train")


def test_canary_a_hostile_answer_runs_only_in_a_worker_and_only_with_the_opt_in(tmp_path):
    """The canary: an answer that, if ``eval``ed, writes the pid of the process that ran it.

    What it shows: on the default path (no opt-in) the answer is never executed, in a worker or
    in the trainer; with ``reward.allow_eval_scorers`` it is executed, but only in a verifier
    worker process, never in the caller's (an in-process pool, num_workers=0, refuses). What a
    worker can reach: anything the user's account can (files, as here; the network), bounded
    by the pool's time limit per response and its address-space cap. What it cannot reach: the
    trainer's memory or its model, or the run's time beyond ``reward.timeout_s``.
    """
    canary = tmp_path / "canary"
    hostile = (f"[__import__('pathlib').Path({str(canary)!r}).write_text("
               f"str(__import__('os').getpid())), 'x'][1]")
    plain = make_splits("rg:string_insertion", n_train=2, n_val=0, n_test=0)["train"]
    allowed = validation.load(None, ["data.train=[rg:string_insertion]", "lab.n_train=2",
                                     "lab.n_val=0", "lab.n_test=0",
                                     "reward.allow_eval_scorers=true"])
    marked = load_split(allowed.data.train, allowed, "train")
    assert marked[0].extra["rg"]["allow_eval"] is True and "allow_eval" not in plain[0].extra["rg"]
    spec = verifier_spec("auto", ["rg:string_insertion"])

    def score(pool, records):
        r = records[0]
        return pool.score(spec, [hostile], [r.ground_truth], [(r.prompt, r.data_source, r.extra)])

    with VerifierPool(num_workers=1, timeout_s=5.0) as pool:
        res = score(pool, plain)  # default path, in a worker: refused
        assert (res.scores, res.errors) == ([0.0], 1) and not canary.exists()
        res = score(VerifierPool(num_workers=0, timeout_s=5.0), marked)  # opt-in, in-process
        assert (res.scores, res.errors) == ([0.0], 1) and not canary.exists()
        res = score(pool, marked)  # opt-in, in a worker: executed there
        assert res.errors == 0 and canary.exists()
        assert int(canary.read_text()) not in (os.getpid(), os.getppid())
        # A hostile answer that never returns costs one time limit, not the run.
        pool.timeout_s = 1.0
        r = marked[0]
        res = pool.score(spec, ["[x for x in iter(int, 1)]"], [r.ground_truth],
                         [(r.prompt, r.data_source, r.extra)])
        assert (res.scores, res.timeouts) == ([0.0], 1)


# ----------------------------------------------------------------------------- training


@pytest.mark.slow
def test_chain_sum_trains_on_its_lab_model_scored_in_the_pool(tmp_path):
    from explorl.lab import lab_model_path
    from explorl.outputs.runlog import read_metrics
    from explorl.training.loop import Trainer

    model = lab_model_path("rg:chain_sum", cache_dir=tmp_path / "cache", size="tiny",
                           **SIZES, **CHAIN)
    cfg = validation.from_dict({
        "max_steps": 3,
        "model": {"path": str(model)},
        "lab": {**SIZES, "params": CHAIN},
        "data": {"train": ["rg:chain_sum"], "prompts_per_step": 4},
        "rollout": {"n_samples": 4},
        "reward": {"num_workers": 1},
        "optim": {"lr": 1e-3},
        "eval": {"every": 3, "n_samples": 2, "k": [1, 2], "max_problems": 4},
        "log": {"progress": False, "plots": False},
    })
    assert cfg.rollout.max_response_len == 24  # the rg lab task's, read from its lab.json
    t = Trainer(cfg, tmp_path / "run")
    t.train()
    rows = [r for r in read_metrics(tmp_path / "run") if r["step"] > 0]  # step 0: validation only
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["reward/verify_errors"] == 0 == r["reward/verify_timeouts"] for r in rows)
    # The pool path scores a right answer 1 and a wrong one 0 on these very records.
    recs = t.train_data[:2]
    with VerifierPool(num_workers=1, timeout_s=5.0) as pool:
        out = t.rewarder.score(pool, [recs[0].ground_truth, "x"], recs)
    assert out.correct == [1.0, 0.0] and out.rewards == [1.0, 0.0]
