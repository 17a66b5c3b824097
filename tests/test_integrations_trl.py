"""explorl.integrations.trl: explorl controllers and Clip-Cov/KL-Cov in TRL's GRPOTrainer, on the
lab model on CPU (make test-integrations; skipped where TRL is not installed)."""

from __future__ import annotations

import json
import math

import pytest
import torch

trl = pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from explorl.config import (  # noqa: E402
    AdaptiveControlConfig,
    BudgetControlConfig,
    EntroPICControlConfig,
    EntropyCoefControlConfig,
    TemperatureControlConfig,
)
from explorl.control import (  # noqa: E402
    AdaptiveController,
    BudgetAllocator,
    EntroPICController,
    EntropyCoefController,
    TemperatureScheduler,
)
from explorl.errors import ControlError  # noqa: E402
from explorl.integrations.trl import (  # noqa: E402
    STATE_FILE,
    ExplorlCallback,
    ExplorlGRPOTrainer,
    trl_knob_table,
)
from explorl.lab import lab_model_path, make_splits  # noqa: E402
from explorl.rewards import VERIFIERS  # noqa: E402

pytestmark = [pytest.mark.integrations, pytest.mark.slow]


def _reward(completions, ground_truth, **kwargs):
    return [VERIFIERS["addition"](c, g) for c, g in zip(completions, ground_truth)]


def _args(out, **kw) -> GRPOConfig:
    base = dict(output_dir=str(out), max_steps=4, learning_rate=1e-3, lr_scheduler_type="constant",
                per_device_train_batch_size=8, gradient_accumulation_steps=1, num_generations=4,
                max_completion_length=6, temperature=1.0, top_k=0, beta=0.0, loss_type="dapo",
                use_cpu=True, logging_steps=1, save_strategy="no", report_to="none",
                disable_tqdm=True, seed=0, dataloader_num_workers=0)
    return GRPOConfig(**{**base, **kw})


def _trainer(out, controllers, cls=ExplorlGRPOTrainer, **kw):
    path = lab_model_path("addition")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    data = Dataset.from_list([{"prompt": r.prompt, "ground_truth": r.ground_truth}
                              for r in make_splits("addition")["train"][:64]])
    loss = {k: kw.pop(k) for k in ("explorl_loss", "loss_options") if k in kw}
    callbacks = [ExplorlCallback(controllers)] if controllers is not None else []
    return cls(model=model, reward_funcs=_reward, args=_args(out, **kw), train_dataset=data,
               processing_class=tok, callbacks=callbacks, **loss)


class Record(TrainerCallback):
    """Every step's logged entropy and control metrics, and the temperature of each generate."""

    def __init__(self):
        self.logs: list[dict] = []
        self.generate_t: list[float] = []

    def watch(self, trainer):
        gen = trainer.model.generate

        def generate(*a, **k):
            self.generate_t.append(k["generation_config"].temperature)
            return gen(*a, **k)

        trainer.model.generate = generate
        trainer.add_callback(self)
        return trainer

    def on_log(self, args, state, control, logs=None, **kw):
        if "entropy" in logs:
            self.logs.append(dict(logs))


def _e3():
    return TemperatureScheduler(TemperatureControlConfig(enabled=True, t_min=0.5, t_max=2.0))


# ---------------------------------------------------------------------------- refusals
def test_knob_table_refuses_what_trl_does_not_read():
    args = _args("unused")
    table = trl_knob_table(args)
    assert set(table.reads) == {"temperature", "eps_high", "entropy_coef"}
    assert "num_generations" in table.refused["budgets"]
    assert "EntroPIC" in table.refused["pos_neg_weight"]
    assert "beta=0" in table.refused["kl_coef"]
    assert "kl_coef" in trl_knob_table(_args("unused", beta=0.04)).reads
    assert "clip" in trl_knob_table(args, "kl_cov").refused["eps_high"]
    assert "cap" in trl_knob_table(_args("unused", loss_type="cispo")).refused["eps_high"]
    assert "use_adaptive_entropy" in trl_knob_table(
        _args("unused", use_adaptive_entropy=True)).refused["entropy_coef"]


@pytest.mark.parametrize("controller, kw, reason", [
    (lambda: EntroPICController(EntroPICControlConfig(enabled=True)), {}, "EntroPIC"),
    (lambda: BudgetAllocator(BudgetControlConfig(enabled=True)), {}, "num_generations"),
    (lambda: AdaptiveController(AdaptiveControlConfig(enabled=True, actuator="kl_coef")), {},
     "beta=0"),
    (lambda: AdaptiveController(AdaptiveControlConfig(enabled=True)),
     {"explorl_loss": "kl_cov"}, "does not clip"),
    (lambda: EntropyCoefController(EntropyCoefControlConfig(enabled=True)),
     {"use_adaptive_entropy": True}, "use_adaptive_entropy"),
])
def test_trainer_refuses_a_controller_whose_knob_trl_does_not_read(tmp_path, controller, kw,
                                                                    reason):
    with pytest.raises(ControlError, match=reason):
        _trainer(tmp_path, [controller()], **kw)


def test_unsupported_explorl_loss_settings_are_refused(tmp_path):
    with pytest.raises(ValueError, match="importance_sampling_level"):
        _trainer(tmp_path, [], explorl_loss="clip_cov", importance_sampling_level="sequence")
    with pytest.raises(ValueError, match="choose one of"):
        _trainer(tmp_path, [], explorl_loss="ppo")
    with pytest.raises(ValueError, match="unknown"):
        _trainer(tmp_path, [], explorl_loss="kl_cov", loss_options={"kl_cov_ration": 0.1})


def test_plain_grpo_trainer_with_the_callback_is_refused(tmp_path):
    trainer = _trainer(tmp_path, [_e3()], cls=GRPOTrainer)
    with pytest.raises(ControlError, match="ExplorlGRPOTrainer"):
        trainer.train()


# ---------------------------------------------------------------------------- knobs reach TRL
def test_temperature_reaches_the_fused_lm_head(tmp_path):
    """After the knob is applied, TRL's log-probs and entropy are those of a trainer built with that
    temperature (TRL's fused LM head, ``add_fused_lm_head(temperature=T)``)."""
    trainer = _trainer(tmp_path, [_e3()])
    twin = _trainer(tmp_path, [_e3()], temperature=1.7)
    k = trainer._explorl.initial_knobs
    trainer._apply_knobs(k.__class__(**{**k.__dict__, "temperature": 1.7}))
    ids = torch.tensor([[3, 5, 7, 9, 4, 6]])
    mask = torch.ones_like(ids)
    got, want = (t._get_per_token_logps_and_entropies(t.model, ids, mask, 3, compute_entropy=True)
                 for t in (trainer, twin))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert trainer.generation_config.temperature == 1.7 == trainer.temperature
    back = trainer._get_per_token_logps_and_entropies(
        _trainer(tmp_path, [_e3()]).model, ids, mask, 3)[0]
    assert not torch.allclose(back, got[0])  # T = 1 differs: the cell did change the head


def test_temperature_reaches_vllm_sampling_params(tmp_path):
    from types import SimpleNamespace

    trainer = _trainer(tmp_path, [_e3()])
    trainer.use_vllm, trainer.vllm_generation = True, SimpleNamespace(temperature=1.0)
    k = trainer._explorl.initial_knobs
    trainer._apply_knobs(k.__class__(**{**k.__dict__, "temperature": 0.8}))
    assert trainer.vllm_generation.temperature == 0.8  # read by VLLMGeneration.generate


def _e3_next(T, H0, H, vocab):
    log_v = math.log(vocab) + math.log(math.log(vocab))
    return min(2.0, max(0.5, T * (1 + T * math.log(H0 / H) / log_v)))


def test_e3_controls_trl_sampling_temperature_and_resumes_exactly(tmp_path):
    rec = Record()
    trainer = rec.watch(_trainer(tmp_path / "full", [_e3()], save_strategy="steps", save_steps=2))
    trainer.train()
    temps = [log["control/temperature"] for log in rec.logs]
    ents = [log["entropy"] for log in rec.logs]
    # the temperature each generate call sampled at is the one the controller chose for the step
    assert rec.generate_t == temps
    # E3 from TRL's logged entropy: T1 = T2 = 1; T3 from H0 = H1 and H2; T4 from H3
    assert temps[:2] == [1.0, 1.0]
    assert temps[2] == pytest.approx(_e3_next(1.0, ents[0], ents[1], 24), rel=1e-9)
    assert temps[3] == pytest.approx(_e3_next(temps[2], ents[0], ents[2], 24), rel=1e-9)
    assert temps[2] != 1.0
    state = json.loads((tmp_path / "full" / "checkpoint-2" / STATE_FILE).read_text())
    assert state["step"] == 2 and state["bank"]["controllers"]["temperature"]["H0"] == ents[0]

    rec2 = Record()
    resumed = rec2.watch(_trainer(tmp_path / "full", [_e3()]))
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-2"))
    assert [log["control/temperature"] for log in rec2.logs] == temps[2:]
    assert [log["entropy"] for log in rec2.logs] == pytest.approx(ents[2:], rel=1e-6)
    assert resumed._explorl.state_dict() == trainer._explorl.state_dict()


def test_resume_without_the_state_file_is_refused(tmp_path):
    plain = _trainer(tmp_path, None, cls=GRPOTrainer, max_steps=1, save_strategy="steps",
                     save_steps=1)
    plain.train()
    trainer = _trainer(tmp_path, [_e3()], max_steps=2)
    with pytest.raises(ControlError, match=STATE_FILE):
        trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))


def test_adaptive_eps_high_and_entropy_coef_reach_the_loss(tmp_path):
    ad = AdaptiveController(AdaptiveControlConfig(enabled=True, warmup=1, window=1))
    rec = Record()
    trainer = rec.watch(_trainer(tmp_path, [ad], max_steps=3))
    trainer.train()
    eps = [log["control/eps_high"] for log in rec.logs]
    assert eps[0] == pytest.approx(0.28)  # c_0 of the eps_high actuator, not TRL's 0.2
    for prev, nxt in zip(eps, eps[1:]):  # ±δ (or 0 in the dead-band) per step
        assert round(nxt - prev, 6) in (-0.01, 0.0, 0.01)
    assert trainer.epsilon_high == eps[-1]  # the loss read the controller's value

    coef = EntropyCoefController(EntropyCoefControlConfig(enabled=True, target=100.0,
                                                          delta=0.01, max=0.05))
    rec = Record()
    trainer = rec.watch(_trainer(tmp_path / "c", [coef], max_steps=3))
    trainer.train()
    # entropy < 100 always: step 1 keeps TRL's 0; from step 2 the law steps c up by δ on step
    # t−1's entropy and applies the new c (update, then apply)
    assert [log["control/entropy_coef"] for log in rec.logs] == pytest.approx([0.0, 0.01, 0.02])
    assert trainer._entropy_bonus_enabled


# ---------------------------------------------------------------------------- Clip-Cov / KL-Cov
def _batch(trainer):
    g = torch.Generator().manual_seed(0)
    B, P, T = 4, 3, 5
    comp = torch.randint(3, 20, (B, T), generator=g)
    cmask = torch.ones(B, T, dtype=torch.long)
    cmask[1, 3:] = 0
    with torch.no_grad():
        logp, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.cat([torch.randint(3, 20, (B, P), generator=g), comp], 1),
            torch.ones(B, P + T, dtype=torch.long), T)
    return {"prompt_ids": torch.randint(3, 20, (B, P), generator=g),
            "prompt_mask": torch.ones(B, P, dtype=torch.long), "completion_ids": comp,
            "completion_mask": cmask, "advantages": torch.tensor([1.0, -0.5, 0.3, -0.8]),
            "old_per_token_logps": logp + 0.3 * torch.randn(B, T, generator=g),
            "num_items_in_batch": cmask.sum().float()}


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_clip_cov_without_selected_tokens_equals_trls_loss(tmp_path, loss_type):
    """No candidate in (lb, ub): Clip-Cov is PPO-clip, so value and gradient equal TRL's own."""
    trainer = _trainer(tmp_path, [], loss_type=loss_type, explorl_loss="clip_cov",
                       loss_options={"clip_cov_lb": 1e8, "clip_cov_ub": 2e8}, epsilon_high=0.28)
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.train()  # the training normalisers (steps_per_generation = accumulation = 1)
    inputs = _batch(trainer)
    grads = []
    trl_loss = lambda m, i: GRPOTrainer._compute_loss(trainer, m, i)  # noqa: E731
    for fn in (trainer._explorl_compute_loss, trl_loss):
        trainer.model.zero_grad()
        loss = fn(trainer.model, inputs)
        loss.backward()
        grads.append((loss.item(), [p.grad.clone() for p in trainer.model.parameters()]))
    assert grads[0][0] == pytest.approx(grads[1][0], rel=1e-5)
    for a, b in zip(grads[0][1], grads[1][1]):
        assert torch.allclose(a, b, atol=1e-6)
    assert trainer._metrics["train"]["loss/cov_selected_frac"] == [0.0]


def test_kl_cov_trains_in_trl_and_logs_its_selection(tmp_path):
    rec = Record()
    trainer = rec.watch(_trainer(tmp_path, [_e3()], max_steps=2, explorl_loss="kl_cov",
                                 loss_options={"kl_cov_ratio": 0.2}))
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
    for log in rec.logs:
        assert log["loss/cov_selected_frac"] > 0.0 and math.isfinite(log["entropy"])
