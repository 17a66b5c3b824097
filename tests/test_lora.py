"""LoRA adapters (``model.lora``, PEFT): exact base log-probs at initialisation, adapters-only
updates, the KL reference as the base with adapters disabled, PEFT-format checkpoints that plain
PEFT loads, exact resume, EEPO's adapters-only copy, merged weights for engines and export, on
the lab model and on a tiny Qwen2 built from its config."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_config
from peft import PeftModel
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from explorl import adapters
from explorl import config as C
from explorl.config import ModelConfig
from explorl.outputs.runlog import read_metrics
from explorl.policy.forward import response_logprobs
from explorl.training.loop import Trainer

LORA = {"model": {"lora": {"enabled": True, "rank": 4, "alpha": 8.0}}}


def _batch(vocab: int, seed: int = 0):
    """Two prompts of 3 tokens and two responses of 4 (the second padded after 2)."""
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(4, vocab, (2, 3), generator=g)
    response = torch.randint(4, vocab, (2, 4), generator=g)
    p_mask = torch.ones(2, 3, dtype=torch.bool)
    r_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    return prompt, p_mask, response, r_mask


def _logp(model, vocab: int) -> torch.Tensor:
    with torch.no_grad():
        return response_logprobs(model, *_batch(vocab), 1.0, with_entropy=False)[0]


def _vocab(model) -> int:
    return model.get_output_embeddings().weight.shape[0]


@pytest.fixture(scope="module")
def qwen2_dir(tiny_model, tmp_path_factory):
    """A tiny Qwen2 (GQA, q/k/v biases) built from its config, with the lab tokenizer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64, tie_word_embeddings=True,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("qwen2")
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.mark.parametrize("which", ["lab", "qwen2"])
def test_adapters_at_init_give_the_base_logprobs_exactly(which, tiny_model, qwen2_dir):
    path = tiny_model if which == "lab" else qwen2_dir
    cfg = ModelConfig(path=str(path), lora=C.LoRAConfig(enabled=True, rank=4))
    base = AutoModelForCausalLM.from_pretrained(path)
    policy = adapters.load_policy(path, None, cfg, torch.device("cpu"))
    assert adapters.is_adapted(policy)
    assert torch.equal(_logp(policy, _vocab(base)), _logp(base, _vocab(base)))
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert all(p.dtype == torch.float32 for n, p in policy.named_parameters() if n in trainable)
    # all-linear: every projection of every decoder layer, never the output layer
    adapted = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in trainable}
    assert adapted == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                       "down_proj"}


def _split(model) -> tuple[dict, dict]:
    """(adapter tensors, base tensors) by name, copied."""
    ad, base = {}, {}
    for n, p in model.named_parameters():
        (ad if ".lora_" in n else base)[n] = p.detach().clone()
    return ad, base


def test_only_adapter_weights_change_and_reach_the_optimizer(make_config, tmp_path):
    t = Trainer(make_config({**LORA, "max_steps": 1, "eval": {"every": 0}}), tmp_path / "run")
    ad0, base0 = _split(t.policy)
    opt_params = {id(p) for g in t.optimizer.param_groups for p in g["params"]}
    assert opt_params == {id(p) for n, p in t.policy.named_parameters() if ".lora_" in n}
    assert t.n_trainable == sum(v.numel() for v in ad0.values()) < t.n_params
    summary = t.train()
    assert summary["trainable_params"] == t.n_trainable
    assert summary["n_params"] == t.n_params
    ad1, base1 = _split(t.policy)
    assert all(torch.equal(base0[k], base1[k]) for k in base0)
    assert any(not torch.equal(ad0[k], ad1[k]) for k in ad0 if ".lora_B." in k)


def test_kl_reference_is_the_base_with_adapters_disabled(make_config, tmp_path, tiny_model):
    cfg = make_config({**LORA, "max_steps": 2, "algorithm": {"kl_coef": 0.5},
                       "eval": {"every": 0}})
    t = Trainer(cfg, tmp_path / "run")
    assert t.ref is t.policy  # no second copy of the model
    t.train()
    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    V = _vocab(base)
    with adapters.disabled(t.ref) as ref:
        ref_logp = _logp(ref, V)
    assert torch.equal(ref_logp, _logp(base, V))
    assert not torch.equal(_logp(t.policy, V), ref_logp)  # the adapters are back on after it
    rows = read_metrics(tmp_path / "run")
    assert rows[0]["kl/ref_mean"] == 0.0  # the first step: policy = base (B = 0)
    assert rows[-1]["kl/ref_mean"] > 0.0


def test_checkpoint_loads_with_plain_peft_and_gives_the_same_logprobs(make_config, tmp_path,
                                                                      tiny_model):
    t = Trainer(make_config({**LORA, "eval": {"every": 0}}), tmp_path / "run")
    ckpt = t.train()["checkpoint"]
    files = {p.name for p in (tmp_path / "run" / "checkpoints" / "step-2").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "trainer_state.pt"} <= files
    assert "model.safetensors" not in files  # the frozen base is not copied into checkpoints
    assert json.loads((tmp_path / "run/checkpoints/step-2/adapter_config.json").read_text())[
        "base_model_name_or_path"] == str(tiny_model)
    # what a user who never saw explorl does
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), ckpt)
    V = _vocab(loaded)
    assert torch.equal(_logp(loaded, V), _logp(t.policy, V))


def _interrupt_after(t: Trainer, n_steps: int) -> None:
    original = t.train_step

    def step_then_interrupt():
        out = original()
        if t.step >= n_steps:
            t._stop = True
        return out

    t.train_step = step_then_interrupt


def _strip(rows):
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


@pytest.mark.parametrize("extra", [{}, {"control": {"eepo": {"enabled": True, "alpha": 10.0}},
                                       "algorithm": {"kl_coef": 0.1}}], ids=["grpo", "eepo+kl"])
def test_resume_reproduces_the_uninterrupted_run(make_config, tmp_path, extra):
    cfg = make_config({**LORA, **extra, "max_steps": 4, "eval": {"every": 2}})
    a = Trainer(cfg, tmp_path / "a")
    a.train()
    b = Trainer(cfg, tmp_path / "b")
    _interrupt_after(b, 2)
    assert b.train()["interrupted"]
    b = Trainer(cfg, tmp_path / "b", resume=True)
    assert b.step == 2
    b.train()
    assert _strip(read_metrics(tmp_path / "b")) == _strip(read_metrics(tmp_path / "a"))
    wa, wb = dict(a.policy.named_parameters()), dict(b.policy.named_parameters())
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_eepo_copy_shares_the_base_and_copies_the_adapters(make_config, tmp_path):
    cfg = make_config({**LORA, "max_steps": 2, "eval": {"every": 0},
                       "control": {"eepo": {"enabled": True, "alpha": 10.0}}})
    t = Trainer(cfg, tmp_path / "run")
    t.train()
    rows = read_metrics(tmp_path / "run")
    assert any(r["eepo/active"] == 1.0 for r in rows)
    copy = t.sampler._copy
    assert adapters.is_adapted(copy)
    mine, theirs = dict(t.policy.named_parameters()), dict(copy.named_parameters())
    for n, p in theirs.items():
        if ".lora_" in n:
            assert p.data_ptr() != mine[n].data_ptr()  # its own adapters ...
        else:
            assert p is mine[n]  # ... over the policy's own frozen base (no second copy)
    # the unlearning step moved the copy's adapters away from the policy's
    assert any(not torch.equal(p, mine[n]) for n, p in theirs.items() if ".lora_B." in n)
    adapters.refresh_copy_(copy, t.policy)
    assert all(torch.equal(p, mine[n]) for n, p in theirs.items())


def test_merged_weights_are_peft_merge_and_leave_the_model_as_it_was(make_config, tmp_path):
    t = Trainer(make_config({**LORA, "max_steps": 1, "eval": {"every": 0}}), tmp_path / "run")
    t.train()
    before = {n: p.detach().clone() for n, p in t.policy.named_parameters()}
    merged = dict(adapters.merged_weights(t.policy))
    assert all(torch.equal(p, before[n]) for n, p in t.policy.named_parameters())
    reference = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(adapters.adapter_base(tmp_path / "run/checkpoints"
                                                                   "/step-1")),
        tmp_path / "run" / "checkpoints" / "step-1").merge_and_unload()
    want = dict(reference.named_parameters())
    assert merged.keys() == want.keys()
    for n in want:
        torch.testing.assert_close(merged[n], want[n].detach(), rtol=0, atol=1e-6)
    changed = [n for n in want if "proj" in n and not torch.equal(
        merged[n], before[n.replace("_proj.", "_proj.base_layer.").replace(
            "model.", "base_model.model.model.", 1)])]
    assert changed  # the adapters are in the merged weights


def test_export_eval_and_report_take_an_adapter_run(make_config, tmp_path, tiny_model):
    from explorl.cli import main

    t = Trainer(make_config({**LORA, "eval": {"every": 0}}), tmp_path / "run")
    t.train()
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "merged")]) == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert not adapters.is_adapted(merged)
    V = _vocab(merged)
    torch.testing.assert_close(_logp(merged, V), _logp(t.policy, V), rtol=0, atol=1e-5)
    for model in (tmp_path / "run", tmp_path / "run" / "checkpoints" / "step-2"):
        out = tmp_path / f"eval-{model.name}"
        assert main(["eval", str(model), "--data", "lab:addition", "--out", str(out), "--n", "2",
                     "--k", "1", "--max-problems", "3", "--set", "lab.params.max_digits=1",
                     "--set", "lab.n_train=30", "--set", "lab.n_val=10",
                     "--set", "lab.n_test=10"]) == 0
        assert json.loads((out / "eval.json").read_text())["overall"]["n_problems"] == 3
    assert main(["report", str(tmp_path / "run"), "--out", str(tmp_path / "report")]) == 0
    assert (tmp_path / "report" / "report.md").is_file()


def test_target_modules_that_match_nothing_name_the_linear_layers(make_config, tmp_path):
    cfg = make_config({"model": {"lora": {"enabled": True, "target_modules": ["q_prj"]}}})
    with pytest.raises(C.ConfigError, match=r"model\.lora\.target_modules\[0\].*'q_prj'.*"
                                            r"did you mean 'q_proj'.*'down_proj'.*'v_proj'"):
        Trainer(cfg, tmp_path / "run")


@pytest.mark.parametrize("bad, where", [
    ({"pure_low_precision": True, "lora": {"enabled": True}}, "model.lora.enabled"),
    ({"lora": {"enabled": True, "target_modules": []}}, "model.lora.target_modules"),
    ({"lora": {"enabled": True, "rank": 0}}, "model.lora.rank"),
    ({"lora": {"enabled": True, "dropout": 1.0}}, "model.lora.dropout"),
    ({"lora": {"enabled": True, "rnak": 4}}, "model.lora.rank"),
])
def test_impossible_lora_settings_are_refused_before_the_model_loads(tiny_model, bad, where,
                                                                     monkeypatch):
    monkeypatch.setattr(adapters, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    with pytest.raises(C.ConfigError, match=where.replace(".", r"\.")):
        tiny_config(tiny_model, {"model": bad})


def test_qwen2_from_config_trains_with_lora(qwen2_dir, tmp_path):
    cfg = tiny_config(qwen2_dir, {**LORA, "model": {"path": str(qwen2_dir),
                                                    "lora": {"enabled": True,
                                                             "target_modules": ["q_proj",
                                                                                "v_proj"]}},
                                  # an untrained model scores 0: the entropy bonus and
                                  # the KL term give the gradient
                                  "algorithm": {"kl_coef": 0.1, "entropy_coef": 0.1},
                                  "eval": {"every": 0}})
    t = Trainer(cfg, tmp_path / "run")
    ad0, base0 = _split(t.policy)
    assert {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in ad0} == {"q_proj", "v_proj"}
    t.train()
    ad1, base1 = _split(t.policy)
    assert all(torch.equal(base0[k], base1[k]) for k in base0)
    assert any(not torch.equal(ad0[k], ad1[k]) for k in ad0)
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(qwen2_dir),
                                       tmp_path / "run" / "checkpoints" / "step-2")
    V = _vocab(loaded)
    assert torch.equal(_logp(loaded, V), _logp(t.policy, V))


def test_sampler_with_lora_dropout_samples_in_eval_mode(make_config, tmp_path, monkeypatch):
    """The lean sampler reads no training flag; LoRA's dropout does: sampling runs it in eval
    mode, the loss passes in train mode."""
    import torch.nn.functional as F

    seen, dropout = [], F.dropout

    def spy(x, p=0.5, training=True, inplace=False):
        if p == 0.5:
            seen.append((torch.is_inference_mode_enabled(), training))
        return dropout(x, p, training, inplace)

    monkeypatch.setattr(F, "dropout", spy)
    cfg = make_config({"model": {"lora": {"enabled": True, "dropout": 0.5}}, "max_steps": 1,
                       "eval": {"every": 0}})
    t = Trainer(cfg, tmp_path / "run")
    t.train()
    assert {training for sampling, training in seen if sampling} == {False}
    assert {training for sampling, training in seen if not sampling} == {True}
    assert t.policy.training


@pytest.mark.slow
@pytest.mark.parametrize("launcher, strategy", [("accelerate", "ddp"), ("torchrun", "fsdp")])
def test_lora_two_processes_equal_one_and_resume_at_one(tiny_model, tmp_path, launcher,
                                                        strategy):
    """DDP and FSDP (adapters in FSDP units of their own over the frozen base) with the KL
    reference (FSDP: its sampling replica with the adapters disabled) equal one process."""
    from test_distributed import BASE, _assert_same_run, _launch, _resume_at_one_process

    cfg = tiny_config(tiny_model, {**BASE, **LORA, "algorithm": {"kl_coef": 0.1}})
    _launch(launcher, cfg, tmp_path / "two", f"dist.strategy={strategy}")
    Trainer(cfg, tmp_path / "one").train()
    _assert_same_run(tmp_path / "one", tmp_path / "two")
    assert read_metrics(tmp_path / "two")[-1]["kl/ref_mean"] > 0
    _resume_at_one_process(cfg, tmp_path / "two", tmp_path / "resumed")
    _assert_same_run(tmp_path / "one", tmp_path / "resumed")


def test_gradient_checkpointing_with_lora_gives_the_same_adapters(make_config, tmp_path):
    got = []
    for gc in (False, True):
        cfg = make_config({"model": {"gradient_checkpointing": gc, "lora": {"enabled": True}},
                           "eval": {"every": 0}})
        t = Trainer(cfg, tmp_path / f"gc-{gc}")
        t.train()
        got.append({n: p.detach() for n, p in t.policy.named_parameters() if ".lora_" in n})
    assert got[0].keys() == got[1].keys()
    assert all(torch.equal(got[0][k], got[1][k]) for k in got[0])
