"""completions.jsonl: the documented fields, seeded sampling that leaves the run untouched,
resume truncation, and rows built from real training and validation rollouts."""

from __future__ import annotations

import dataclasses
import random
import re
from pathlib import Path

import pytest
import torch

from explorl.outputs.completions import (
    Completion,
    CompletionsLog,
    completions_of,
    prompt_text,
    read_completions,
    training_completions,
)
from explorl.records import PromptRecord

FIELDS = [f.name for f in dataclasses.fields(Completion)]
DOC = Path(__file__).resolve().parents[1] / "docs" / "completions.md"


def doc_fields(heading: str) -> list[str]:
    """First-column keys of the table under ``heading`` in docs/completions.md."""
    text = DOC.read_text().split(heading, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([^`]+)` \|", text, flags=re.MULTILINE)


def rows(n, step=10, split="train"):
    recs = [PromptRecord(prompt=f"{i}+1=", ground_truth=str(i + 1), data_source="lab/addition")
            for i in range(n)]
    return completions_of(
        step,
        split,
        recs,
        [str(i + 1 - i % 2) for i in range(n)],
        [1.0 - i % 2 for i in range(n)],
        [2.0 * (1 - i % 2) - 1 for i in range(n)],
    )


def test_fields_are_documented():
    assert doc_fields("## completions.jsonl") == FIELDS
    assert set(doc_fields("## problems.jsonl")) == {
        "index", "data_source", "prompt", "ground_truth", "n_correct", "responses", "scores",
        "greedy_response", "greedy_score", "lengths",
        "tool_calls"}  # tool_calls: runs with tools only


def test_rows_from_records_and_chat_prompts():
    r = rows(2)
    assert dataclasses.asdict(r[1]) == {"step": 10, "split": "train", "data_source": "lab/addition",
                                        "prompt": "1+1=", "ground_truth": "2", "response": "1",
                                        "score": 0.0, "reward": -1.0}
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    assert prompt_text(chat) == "system: Be brief.\nuser: 2+2?"
    val = completions_of(0, "val", [PromptRecord(chat, "4")], ["4"], [1.0])
    assert val[0].reward is None and val[0].prompt == prompt_text(chat)


def test_log_samples_per_step_seeded_and_leaves_global_rngs_alone(tmp_path):
    log = CompletionsLog(tmp_path / "completions.jsonl", every=5, per_step=3, seed=7)
    assert [s for s in range(1, 16) if log.due(s)] == [5, 10, 15]
    assert not CompletionsLog(tmp_path / "never.jsonl", every=0, per_step=3, seed=7).due(5)
    state, torch_state = random.getstate(), torch.get_rng_state()
    written = log.log(rows(20), step=10, split="train")
    assert random.getstate() == state and torch.equal(torch.get_rng_state(), torch_state)
    assert len(written) == 3 and list(written[0]) == FIELDS
    prompts = [int(w["prompt"].split("+")[0]) for w in written]
    assert prompts == sorted(prompts)  # kept in their original order
    again = CompletionsLog(tmp_path / "b.jsonl", every=5, per_step=3, seed=7)
    assert again.sample(rows(20), 10, "train") == [Completion(**w) for w in written]
    other = [again.sample(rows(20), s, "train") for s in (15, 20, 25)]  # other steps, other draws
    assert any(o != [Completion(**w) for w in written] for o in other)
    assert log.log(rows(2, step=0, split="val"), step=0, split="val") == [
        dataclasses.asdict(c) for c in rows(2, step=0, split="val")]  # fewer rows than per_step
    log.close()
    assert read_completions(tmp_path) == written + [
        dataclasses.asdict(c) for c in rows(2, 0, "val")
    ]


def test_resume_truncates_the_interrupted_tail(tmp_path):
    path = tmp_path / "completions.jsonl"
    log = CompletionsLog(path, every=1, per_step=1, seed=0)
    for step in (0, 1, 2, 3):
        log.log(rows(1, step=step), step, "train")
    log.close()
    CompletionsLog(path, every=1, per_step=1, seed=0, truncate_after=2).close()
    assert [r["step"] for r in read_completions(path)] == [0, 1, 2]


def test_training_and_validation_rows_of_a_real_step(make_config, tmp_path, monkeypatch):
    """Rows built from a trainer step's own rollouts: their rewards and scores average to the
    step's reward/mean and reward/accuracy; validation rows average to val/accuracy."""
    import explorl.training.sampling as trainer_mod  # the step samples through it
    from explorl.eval.validate import validate
    from explorl.training.loop import Trainer

    captured = []
    real_collect = trainer_mod.collect
    monkeypatch.setattr(trainer_mod, "collect",
                        lambda **kw: captured.append(real_collect(**kw)) or captured[-1])
    t = Trainer(make_config({"eval": {"every": 0}}), tmp_path / "run")
    try:
        metrics = t.train_step()
        got = captured[0]
        train = training_completions(1, got, t.train_data)
        assert len(train) == metrics["rollout/n_trained"] == 16
        assert all(c.step == 1 and c.split == "train" for c in train)
        assert sum(c.reward for c in train) / 16 == pytest.approx(metrics["reward/mean"])
        assert sum(c.score for c in train) / 16 == pytest.approx(metrics["reward/accuracy"])
        for c in train:  # each row's ground truth is its prompt's: a + b
            a, b = c.prompt.removesuffix("=").split("+")
            assert int(c.ground_truth) == int(a) + int(b)
            assert c.score == float(c.response.strip() == c.ground_truth)

        samples: list = []
        e = t.cfg.eval
        data = t.val_data[: e.max_problems]
        out = validate(
            engine=t.engine,
            policy=t._policy_now(),
            pool=t.pool,
            rewarder=t.rewarder,
            data=data,
            prompt_ids=t.prompts.ids_of(t.val_data, "val"),
            n_samples=e.n_samples,
            ks=e.k,
            temperature=1.0,
            max_new_tokens=t.knobs.max_response_len,
            seed=t.cfg.seed,
            step=t.step,
            greedy=False,
            dist=t.dist,
            samples=samples,
        )
        assert len(samples) == len(data) * e.n_samples
        assert {c.split for c in samples} == {"val"} and all(c.reward is None for c in samples)
        assert sum(c.score for c in samples) / len(samples) == pytest.approx(out["val/accuracy"])
    finally:
        t.pool.close()


def test_three_step_run_writes_completions(make_config, tmp_path):
    from explorl.training.loop import Trainer

    cfg = make_config({"max_steps": 3, "eval": {"every": 3},
                       "log": {"completions_every": 1, "completions_per_step": 2}})
    Trainer(cfg, tmp_path / "run").train()
    got = read_completions(tmp_path / "run")
    assert [(r["step"], r["split"]) for r in got] == [
        (0, "val"), (0, "val"), (1, "train"), (1, "train"), (2, "train"), (2, "train"),
        (3, "train"), (3, "train"), (3, "val"), (3, "val")]
    assert all(list(r) == FIELDS for r in got)


def test_run_outputs_write_metrics_completions_and_trackers_and_resume(tmp_path):
    """The trainer's one handle on its outputs; a resume at step 2 drops the later rows of
    metrics.jsonl and completions.jsonl and continues the tracker run."""
    from explorl import validation
    from explorl.outputs.record import RunOutputs
    from explorl.outputs.runlog import read_metrics

    cfg = validation.load(None, ["log.report_to=[tensorboard]", "log.completions_every=2",
                        "log.completions_per_step=1"])
    out = RunOutputs(cfg, tmp_path, step=0)
    for step in range(4):
        out.log({"step": step, "reward/mean": step / 10})
        if out.completions_due(step):
            out.log_completions(rows(3, step=step), step, "train")
    out.close()
    assert [r["step"] for r in read_completions(tmp_path)] == [0, 2]
    out = RunOutputs(cfg, tmp_path, resume=True, step=2)
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2]
    assert [r["step"] for r in read_completions(tmp_path)] == [0, 2]
    out.log({"step": 3, "reward/mean": 0.9})
    out.close()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, round(e.value, 6)) for e in acc.Scalars("reward/mean")] == [
        (0, 0.0), (1, 0.1), (2, 0.2), (3, 0.9)]
    # a fresh run into a used directory starts both files over
    RunOutputs(cfg, tmp_path, step=0).close()
    assert read_metrics(tmp_path) == [] and read_completions(tmp_path) == []
