"""End-to-end training on the tiny lab model: smoke, metric meanings, resume, interrupt."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from explorl import validation
from explorl.outputs.runlog import read_metrics
from explorl.rollout.fake import FakeEngine
from explorl.training.loop import TIME_KEYS, Trainer
from explorl.training.update import PolicyUpdate

REQUIRED = [
    "step",
    "reward/mean",
    "reward/std",
    "entropy/mean",
    "response/length_mean",
    "rollout/n_samples",
    "rollout/all_correct_frac",
    "rollout/all_wrong_frac",
    "loss/policy",
    "loss/clip_frac",
    "grad/norm",
    "control/temperature",
    "control/eps_high",
    "time/step_s",
    "time/cpu_s",
    "time/generate_s",
    "time/train_s",
    "cov/mean",
    "adv/zero_frac",
]
VAL = ["val/accuracy", "val/greedy_accuracy", "val/pass@1", "val/pass@2"]


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_two_steps_change_parameters_and_log_every_key(make_config, tmp_path):
    cfg = make_config()
    t = Trainer(cfg, tmp_path / "run")
    before = _weights(t.policy)
    summary = t.train()
    after = _weights(t.policy)
    assert any(not torch.equal(before[k], after[k]) for k in before), "no parameter changed"
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [0, 1, 2]
    # step 0: the initial policy's validation (eval.before_training), nothing else
    assert set(rows[0]) == {"step", "val/entropy", *VAL} and 0 <= rows[0]["val/accuracy"] <= 1
    rows = rows[1:]
    for r in rows:
        missing = [k for k in REQUIRED if k not in r]
        assert not missing, missing
        assert all(v is None or isinstance(v, (int, float)) for v in r.values())
        assert 0 <= r["reward/mean"] <= 1 and r["reward/std"] >= 0
        assert 0 <= r["rollout/all_wrong_frac"] <= 1 and 0 <= r["rollout/all_correct_frac"] <= 1
        assert r["rollout/n_samples"] == 16
        assert r["entropy/mean"] > 0 and math.isfinite(r["loss/policy"]) and r["grad/norm"] >= 0
        assert 1 <= r["response/length_mean"] <= 6
        assert r["control/temperature"] == 1.0 and r["control/eps_high"] == 0.2
    assert all(k in rows[-1] for k in VAL) and 0 <= rows[-1]["val/accuracy"] <= 1
    assert rows[-1]["val/pass@2"] >= rows[-1]["val/pass@1"]
    out = tmp_path / "run"
    assert (out / "config.yaml").is_file() and (out / "summary.json").is_file()
    ckpt = out / "checkpoints" / "step-2"
    assert (ckpt / "model.safetensors").is_file() and (ckpt / "trainer_state.pt").is_file()
    assert summary["steps"] == 2 and not summary["interrupted"]
    saved = load_file(ckpt / "model.safetensors")
    name = next(k for k in saved if k in after)
    assert torch.equal(saved[name], after[name])


def _answer_engine(t: Trainer, pattern):
    """Scripted responses: sample j of a prompt answers right iff pattern(prompt_pos, j)."""
    truths = {}
    for i, rec in enumerate(t.train_data):
        truths[tuple(t.prompts.ids_of(t.train_data, "train")(i))] = (i, rec.ground_truth)

    def respond(prompt_ids, j):
        i, gt = truths[tuple(prompt_ids)]
        return gt if pattern(i, j) else str(int(gt) + 1)

    return FakeEngine(t.tokenizer, respond)


def test_reward_and_rollout_metrics_mean_what_docs_say(make_config, tmp_path):
    cfg = make_config({"max_steps": 1, "eval": {"every": 0}})
    t = Trainer(cfg, tmp_path / "run")
    # Prompts with an even dataset index: all 4 samples right; odd: only sample 0 right.
    t.engine = _answer_engine(t, lambda i, j: i % 2 == 0 or j == 0)
    batch_idx = t.order._perm(0)[:4]
    m = t.train_step()
    n_even = sum(1 for i in batch_idx if i % 2 == 0)
    n_right = 4 * n_even + 1 * (4 - n_even)
    assert m["reward/mean"] == pytest.approx(n_right / 16)
    assert m["reward/accuracy"] == pytest.approx(n_right / 16)
    assert m["rollout/all_correct_frac"] == pytest.approx(n_even / 4)
    assert m["rollout/all_wrong_frac"] == 0.0
    rewards = torch.tensor(
        [1.0 if (i % 2 == 0 or j == 0) else 0.0 for i in batch_idx for j in range(4)]
    )
    assert m["reward/std"] == pytest.approx(float(rewards.std(unbiased=False)), abs=1e-6)
    # Responses are the answers' characters + EOS.
    lengths = [
        len(
            t.train_data[i].ground_truth
            if (i % 2 == 0 or j == 0)
            else str(int(t.train_data[i].ground_truth) + 1)
        )
        + 1
        for i in batch_idx
        for j in range(4)
    ]
    assert m["response/length_mean"] == pytest.approx(sum(lengths) / 16)
    # all-correct groups have zero advantage: the zero fraction counts exactly their responses
    assert m["adv/zero_frac"] == pytest.approx(4 * n_even / 16)
    t.pool.close()


def test_signed_reward_convention(make_config, tmp_path):
    cfg = make_config({"max_steps": 1, "eval": {"every": 0}, "reward": {"convention": "signed"}})
    t = Trainer(cfg, tmp_path / "run")
    t.engine = _answer_engine(t, lambda i, j: j < 2)
    m = t.train_step()
    assert m["reward/mean"] == pytest.approx(0.0) and m["reward/accuracy"] == pytest.approx(0.5)
    t.pool.close()


def _strip(rows):
    return [{k: v for k, v in r.items() if not k.startswith(TIME_KEYS)} for r in rows]


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {
            "control": {
                "temperature": {"enabled": True},
                "budget": {"enabled": True},
                "curriculum": {"enabled": True, "start_ratio": 0.4, "n_samples": 6},
            },
            "algorithm": {"loss": "clip_cov", "clip_cov_lb": -10.0, "clip_cov_ratio": 0.05},
            "data": {"max_train_prompts": 8},
            "optim": {"fused": False},
        },
        {
            "control": {
                "eepo": {"enabled": True, "alpha": 10.0},
                # KL-Cov has no eps_high clip: the controller drives a knob it reads
                "adaptive": {"enabled": True, "warmup": 1, "actuator": "kl_coef"},
            },
            "algorithm": {"loss": "kl_cov", "entropy_coef": 0.01, "kl_coef": 0.01},
            "optim": {"mini_batches": 2},
        },
        {
            "model": {"dtype": "bfloat16"},
            "control": {
                "eepo": {"enabled": True, "alpha": 10.0},
                "adaptive": {"enabled": True, "warmup": 1, "actuator": "entropy_coef"},
                "budget": {"enabled": True},
            },
            "algorithm": {"loss": "kl_cov", "dynamic_sampling": True},
            "data": {"max_train_prompts": 8},
        },
        # issue 18: EntroPIC's integral and knapsack's last success rates in the checkpoint, the
        # forking mask, shaping and pass@k advantages; then the entropy coefficient with GSPO and PI
        {
            "control": {
                "entropic": {"enabled": True, "target": 0.5},
                "budget": {"enabled": True, "allocator": "knapsack", "n_min_limit": 2, "widen": 4},
            },
            "algorithm": {
                "loss": "cispo",
                "entropy_mask_ratio": 0.3,
                "entropy_shaping_alpha": 0.4,
                "advantage": "pkpo_loo_minus_one",
                "passk_k": 2,
            },
            "data": {"max_train_prompts": 8},
            "optim": {"mini_batches": 2},
        },
        {
            "control": {
                "entropy_coef": {"enabled": True, "target": 5.0, "delta": 0.01, "max": 0.05}
            },
            "algorithm": {"loss": "gspo", "agg": "seq-mean-token-mean"},
        },
        {"control": {"adaptive": {"enabled": True, "warmup": 1, "law": "pi"}}},
    ],
    ids=[
        "grpo",
        "e3+curriculum+clip_cov+foreach_adamw",
        "eepo+adaptive+kl_cov",
        "bf16:eepo+adaptive+budget+dapo",
        "entropic+knapsack+forking+shaping+cispo+pkpo",
        "entropy_coef+gspo",
        "adaptive_pi",
    ],
)
def test_resume_reproduces_uninterrupted_run(make_config, tmp_path, extra):
    full = make_config({**extra, "max_steps": 5, "eval": {"every": 2}})
    a = Trainer(full, tmp_path / "a")
    a.train()
    ref_rows = read_metrics(tmp_path / "a")

    interrupted = Trainer(full, tmp_path / "b")
    _interrupt_after(interrupted, 3)
    assert interrupted.train()["interrupted"]
    b = Trainer(full, tmp_path / "b", resume=True)
    assert b.step == 3
    b.train()
    assert _strip(read_metrics(tmp_path / "b")) == _strip(ref_rows)
    wa, wb = _weights(a.policy), _weights(b.policy)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("fused, cpu", [(None, True), (True, True), (False, None)])
def test_fused_adamw_unless_turned_off(fused, cpu):
    from explorl.config import OptimConfig
    from explorl.training.optim import make_optimizer

    model = torch.nn.Linear(3, 2)
    o = OptimConfig(fused=fused)
    assert make_optimizer(o, model, torch.device("cpu"), "ddp")[0].param_groups[0]["fused"] is cpu
    assert make_optimizer(o, model, torch.device("cpu"), "fsdp")[0].param_groups[0]["fused"] is None


def _interrupt_after(t: Trainer, n_steps: int) -> None:
    """Make ``t`` behave as if Ctrl-C arrived during step ``n_steps``."""
    original = t.train_step

    def step_then_interrupt():
        out = original()
        if t.step >= n_steps:
            t._stop = True  # what the SIGINT handler does
        return out

    t.train_step = step_then_interrupt


def test_interrupt_checkpoints_and_resumes(make_config, tmp_path):
    cfg = make_config({"max_steps": 4, "eval": {"every": 0}})
    t = Trainer(cfg, tmp_path / "run")
    _interrupt_after(t, 1)
    summary = t.train()
    assert summary["interrupted"] and summary["steps"] == 1
    assert (tmp_path / "run" / "checkpoints" / "step-1" / "trainer_state.pt").is_file()
    t2 = Trainer(cfg, tmp_path / "run", resume=True)
    t2.train()
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1, 2, 3, 4]


def test_resume_without_checkpoint_is_a_clear_error(make_config, tmp_path):
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        Trainer(make_config(), tmp_path / "empty", resume=True)


def test_bad_data_row_stops_before_training(make_config, tmp_path):
    bad = tmp_path / "train.jsonl"
    bad.write_text(
        json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n" + json.dumps({"prompt": "2+2="}) + "\n"
    )
    cfg = make_config({"data": {"train": [str(bad)], "val": [str(bad)], "prompts_per_step": 1},
                       "reward": {"verifier": "addition"}})
    with pytest.raises(ValueError, match=r"train.jsonl row 1.*answer"):
        Trainer(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_temperature_is_used_for_sampling_and_logged(make_config, tmp_path):
    cfg = make_config({"max_steps": 1, "eval": {"every": 0}, "rollout": {"temperature": 0.7}})
    t = Trainer(cfg, tmp_path / "run")
    t.engine = _answer_engine(t, lambda i, j: True)
    m = t.train_step()
    assert t.engine.calls[0]["temperature"] == 0.7 and m["control/temperature"] == 0.7
    t.pool.close()


def test_hung_verifier_is_cut_off_and_counted(make_config, tmp_path):
    cfg = make_config(
        {
            "max_steps": 1,
            "eval": {"every": 0},
            "reward": {"verifier": "explorl.rewards.testing:_sleep_forever", "timeout_s": 0.3},
        }
    )
    t = Trainer(cfg, tmp_path / "run")
    m = t.train()["final"]
    assert m["reward/verify_timeouts"] == 16 and m["reward/mean"] == 0.0


def test_entropy_and_covariance_metrics_are_batch_token_means(make_config, tmp_path):
    from explorl.algorithms import compute_advantages, token_covariance

    cfg = make_config({"max_steps": 1, "eval": {"every": 0}})
    t = Trainer(cfg, tmp_path / "run")
    captured = {}
    engine = t.engine

    class Recording:  # the public seam: an engine that keeps what it returned
        pad_id = engine.pad_id

        def generate(self, *args, **kw):
            captured["ro"] = engine.generate(*args, **kw)
            return captured["ro"]

    t.engine = Recording()
    score = t.pool.score

    def recording_score(*args, **kw):  # binary rewards: the reward is the verifier score
        res = score(*args, **kw)
        captured["rewards"] = torch.tensor(res.scores, dtype=torch.float32)
        return res

    t.pool.score = recording_score
    m = t.train_step()
    ro = captured["ro"]
    mask = ro.response_mask
    assert m["entropy/mean"] == pytest.approx(
        float((ro.entropy * mask).sum() / mask.sum()), rel=1e-6
    )
    adv, _ = compute_advantages("grpo", captured["rewards"], ro.prompt_index)
    cov = token_covariance(ro.old_logp, adv, mask)
    assert m["cov/mean"] == pytest.approx(float(cov.sum() / mask.sum()), rel=1e-5, abs=1e-7)
    t.pool.close()


def test_validation_metrics(make_config, tmp_path):
    cfg = make_config({"max_steps": 1, "eval": {"every": 1, "n_samples": 2, "k": [1, 2]},
                       "data": {"val": [], "train": ["lab:addition"]}})
    t = Trainer(cfg, tmp_path / "run")
    val_ids = t.prompts.ids_of(t.val_data, "val")
    train_ids = t.prompts.ids_of(t.train_data, "train")
    truths = {tuple(val_ids(i)): r.ground_truth for i, r in enumerate(t.val_data)}
    truths.update({tuple(train_ids(i)): r.ground_truth for i, r in enumerate(t.train_data)})
    # sample 0 right, sample 1 wrong: accuracy 1/2, pass@2 = 1; greedy (one sample, j = 0) right
    t.engine = FakeEngine(t.tokenizer, lambda p, j: truths[tuple(p)] if j == 0 else "x")
    m = t.train_step()
    assert m["val/accuracy"] == pytest.approx(0.5) and m["val/pass@1"] == pytest.approx(0.5)
    assert m["val/pass@2"] == pytest.approx(1.0) and m["val/greedy_accuracy"] == pytest.approx(1.0)
    t.pool.close()


def test_length_truncation_epoch_and_lr_metrics(make_config, tmp_path):
    cfg = make_config(
        {"max_steps": 1, "eval": {"every": 0}, "optim": {"lr": 1e-3, "warmup_steps": 4}}
    )
    t = Trainer(cfg, tmp_path / "run")
    t.engine = _answer_engine(t, lambda i, j: True)  # every answer + EOS, never truncated
    batch_idx = t.order._perm(0)[:4]
    m = t.train_step()
    assert m["response/length_max"] == max(len(t.train_data[i].ground_truth) + 1 for i in batch_idx)
    assert m["response/truncated_frac"] == 0.0
    assert m["rollout/n_trained"] == 16 and m["epoch"] == 0
    assert m["train/optimizer_steps"] == 1
    assert m["train/lr"] == pytest.approx(1e-3 * 2 / 4)  # linear warm-up after one optimizer step
    assert m["reward/verify_errors"] == 0 and m["time/control_s"] >= 0
    t.pool.close()


@pytest.mark.parametrize("loss", [
    {"loss": "kl_cov", "kl_cov_ratio": 0.2, "kl_cov_coef": 1.0},
    {"loss": "clip_cov", "clip_cov_ratio": 0.2, "clip_cov_lb": -10.0, "clip_cov_ub": 10.0},
], ids=["kl_cov", "clip_cov"])
def test_cov_token_selection_is_per_mini_batch(make_config, tmp_path, loss):
    """docs/methods/entropy-mechanism.md §2d (ours): Clip-Cov/KL-Cov pick their tokens over the
    whole mini-batch, so how the mini-batch is cut into micro-batches for gradient accumulation
    changes nothing (a per-micro-batch pick changes loss/policy by ~30% here). Two PPO epochs, so
    KL-Cov's |logp − old_logp| is non-zero on the second; one step, as Adam amplifies float noise
    after."""
    rows = []
    for i, micro in enumerate([16, 5]):
        cfg = make_config(
            {
                "algorithm": loss,
                "max_steps": 1,
                "eval": {"every": 0},
                "optim": {"ppo_epochs": 2, "mini_batches": 1, "micro_batch_size": micro},
            }
        )
        Trainer(cfg, tmp_path / f"m{i}").train()
        rows.append(read_metrics(tmp_path / f"m{i}")[0])
    whole, split = rows
    assert whole["loss/cov_selected_frac"] > 0
    # max(1, floor(0.2 · n_valid)) of the mini-batch's tokens, not of each micro-batch's
    assert split["loss/cov_selected_frac"] == pytest.approx(
        whole["loss/cov_selected_frac"], abs=1e-9
    )
    for k in ["loss/policy", "cov/selected_mean", "grad/norm", "loss/ratio_mean"]:
        assert split[k] == pytest.approx(whole[k], rel=1e-4, abs=1e-6), k


def _documented_metric_patterns() -> list[str]:
    """Regexes of the keys docs/metrics.md defines (first column of its tables)."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
    patterns = []
    for line in doc.splitlines():
        if not line.startswith("| `"):
            continue
        for key in re.findall(r"`([^`]+)`", line.split("|")[1]):
            rx = re.escape(key)
            rx = re.sub(r"\\\{([^}]*)\\\}", lambda m: "(" + m.group(1).replace(",", "|") + ")", rx)
            rx = rx.replace("<actuator>", "[a-z_]+").replace("pass@k", r"pass@\d+")
            patterns.append(rx)
    return patterns


def test_every_logged_metric_is_documented(make_config, tmp_path):
    """Each key any run logs (plain GRPO; every controller; each loss) has a definition in
    docs/metrics.md, so no internal bookkeeping leaks into metrics.jsonl."""
    import re

    patterns = [re.compile(p + "$") for p in _documented_metric_patterns()]
    configs = [
        {},
        {
            "control": {
                "temperature": {"enabled": True},
                "budget": {"enabled": True},
                "curriculum": {"enabled": True},
            },
            "algorithm": {"loss": "clip_cov", "clip_cov_lb": -10.0},
        },
        {
            "control": {
                "eepo": {"enabled": True, "alpha": 10.0},
                "adaptive": {"enabled": True, "warmup": 1, "actuator": "kl_coef"},
            },
            "algorithm": {
                "loss": "kl_cov",
                "entropy_coef": 0.01,
                "kl_coef": 0.01,
                "dynamic_sampling": True,
            },
        },
        {"algorithm": {"kl_in_reward": True, "kl_coef": 0.01, "kl_estimator": "k1",
                       "mask_truncated": True, "advantage": "reinforce_plus_plus"}},
        {
            "control": {
                "entropic": {"enabled": True},
                "budget": {"enabled": True, "allocator": "knapsack"},
            },
            "algorithm": {"loss": "cispo", "entropy_mask_ratio": 0.2, "entropy_shaping_alpha": 0.4},
        },
        {
            "control": {"entropy_coef": {"enabled": True}},
            "algorithm": {"loss": "gspo", "agg": "seq-mean-token-mean"},
        },
        {"rollout": {"async": {"enabled": True, "max_staleness": 1}}},
    ]
    logged = set()
    for i, extra in enumerate(configs):
        Trainer(make_config(extra), tmp_path / f"r{i}").train()
        for row in read_metrics(tmp_path / f"r{i}"):
            logged |= set(row)
    undocumented = sorted(k for k in logged if not any(p.match(k) for p in patterns))
    assert not undocumented, f"logged but not defined in docs/metrics.md: {undocumented}"
    assert {"cov/selected_mean", "eepo/active", "control/temperature_next", "val/pass@2",
            "kl/reward_penalty_mean", "async/staleness_max", "time/sampler_idle_s"} <= logged


def test_eepo_metrics_with_dynamic_sampling_are_means_over_rounds(make_config, tmp_path):
    """eepo/active is 1 on every step whose gate is open, however many generation rounds DAPO's
    dynamic sampling ran (each round unlearns on its own stage 1)."""
    cfg = make_config(
        {
            "max_steps": 4,
            "control": {"eepo": {"enabled": True, "alpha": 10.0}},
            "algorithm": {"dynamic_sampling": True, "max_gen_rounds": 3},
            "eval": {"every": 0},
        }
    )
    Trainer(cfg, tmp_path / "r").train()
    rows = read_metrics(tmp_path / "r")
    assert [r["eepo/active"] for r in rows] == [0.0, 1.0, 1.0, 1.0]  # no entropy history at step 1
    assert all(r["eepo/unlearn_loss"] < 0 for r in rows[1:]) and rows[0]["eepo/unlearn_loss"] == 0.0
    assert any(
        r["rollout/gen_rounds"] > 1 for r in rows[1:]
    )  # the case a per-max_rounds mean got wrong


def test_cpu_seconds_are_the_process_time_spent_in_the_step(make_config, tmp_path, monkeypatch):
    """``time/cpu_s`` = process CPU time at the step's end − at its start (a fake clock that
    advances 0.25 s per reading: the step reads it twice, at its start and its end)."""
    import explorl.training.loop as trainer_mod

    t = Trainer(make_config(), tmp_path / "run")
    clock = iter(10.0 + 0.25 * i for i in range(1000))
    monkeypatch.setattr(trainer_mod.time, "process_time", lambda: next(clock))
    m = t.train_step()
    assert m["time/cpu_s"] == 0.25


def test_cpu_adamw_off_fused_is_multi_tensor_and_bit_for_bit_torchs_default():
    # optim.fused: false takes the foreach path (faster than torch's CPU default); it must
    # compute exactly what torch's one-tensor-at-a-time default does, or the lab studies that
    # pin it would drift. The fused default rounds differently in the last bit.
    from explorl.training.optim import make_optimizer

    def run(opt_for):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 8))
        opt = opt_for(net)
        g = torch.Generator().manual_seed(1)
        for _ in range(5):
            for p in net.parameters():
                p.grad = torch.randn(p.shape, generator=g) * 0.1
            opt.step()
        return opt, torch.cat([p.detach().flatten() for p in net.parameters()])

    o = validation.from_dict({"optim": {"lr": 1e-2, "weight_decay": 0.1, "fused": False}}).optim
    opt, ours = run(lambda net: make_optimizer(o, net, torch.device("cpu"), "single")[0])
    assert opt.param_groups[0]["foreach"] is True and not opt.param_groups[0]["fused"]
    _, single = run(lambda net: torch.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.1,
                                                  foreach=False))
    assert torch.equal(ours, single)
    fo = validation.from_dict({"optim": {"lr": 1e-2, "weight_decay": 0.1}}).optim  # the default
    opt, fused = run(lambda net: make_optimizer(fo, net, torch.device("cpu"), "single")[0])
    assert opt.param_groups[0]["fused"] and torch.allclose(fused, single, atol=1e-6)


def test_resume_at_another_thread_count_warns(make_config, tmp_path, caplog):
    # The checkpoint records torch's thread count; resuming with another one says that the
    # run may not reproduce bit for bit (on some CPUs the count changes float rounding).
    cfg = make_config({"max_steps": 2, "eval": {"every": 0}})
    t = Trainer(cfg, tmp_path / "run")
    _interrupt_after(t, 1)
    t.train()
    threads = torch.get_num_threads()
    try:
        with caplog.at_level("WARNING", logger="explorl.training.state"):
            Trainer(cfg, tmp_path / "run", resume=True)
            assert not [r for r in caplog.records if "torch threads" in r.getMessage()]
            torch.set_num_threads(threads + 1)
            Trainer(cfg, tmp_path / "run", resume=True)
        msgs = [r.getMessage() for r in caplog.records if "torch threads" in r.getMessage()]
        assert len(msgs) == 1 and f"OMP_NUM_THREADS={threads}" in msgs[0]
        assert f"model.cpu_threads={threads}" in msgs[0]
    finally:
        torch.set_num_threads(threads)


def test_micro_batch_sizes_by_rows_and_tokens():
    from explorl.training.optim import micro_batch_sizes

    assert micro_batch_sizes([5] * 7, 3, None) == [3, 3, 1]
    assert micro_batch_sizes([4, 4, 4, 9, 1, 1], 64, 10) == [2, 1, 2, 1]  # 4+4 | 4 | 9+1 | 1
    assert micro_batch_sizes([12, 3, 3], 64, 10) == [1, 2]  # longer than the budget: its own
    assert micro_batch_sizes([3, 3, 3, 3], 2, 100) == [2, 2]  # the row limit still holds
    assert micro_batch_sizes([], 4, 10) == []


def test_micro_batch_tokens_splits_the_update_not_the_result(make_config, tmp_path):
    # A token budget only changes how the mini-batch is cut for gradient accumulation: the
    # run equals the one-micro-batch run up to float summation order, with more passes.
    def run(name, optim):
        cfg = make_config({"max_steps": 2, "eval": {"every": 0},
                           "algorithm": {"old_logp": "recompute"}, "optim": optim})
        t = Trainer(cfg, tmp_path / name)
        calls = []
        scorer_forward = t.scorer.forward

        def counting(*a, **k):
            calls.append(int(a[3].shape[0]))
            return scorer_forward(*a, **k)

        t.scorer.forward = counting
        t.train()
        return _strip(read_metrics(tmp_path / name)), calls

    whole, calls_whole = run("whole", {"micro_batch_size": 64})
    split, calls_split = run("split", {"micro_batch_size": 64, "micro_batch_tokens": 24})
    assert max(calls_whole) == 16 and len(calls_split) > len(calls_whole)
    # one micro-batch: the recompute's forward is the update's (one pass of 16 rows a step);
    # split, the recompute and the update each pass every row (2 × 16 a step)
    assert sum(calls_whole) == 2 * 16 and sum(calls_split) == 2 * 2 * 16
    assert max(calls_split) < 16
    for a, b in zip(whole, split):
        for k in ("reward/mean", "loss/policy", "grad/norm", "entropy/mean"):
            assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-6), k


def test_gradient_checkpointing_recomputes_layers_and_changes_nothing(make_config, tmp_path):
    # Checkpointing trades memory for a second forward of each layer in the backward: the run's
    # metrics and final weights are the same bit for bit, and each layer's MLP runs twice per
    # loss pass in train mode (the sampler, in eval mode, runs it once).
    def run(name, on):
        cfg = make_config({"max_steps": 2, "eval": {"every": 0},
                           "model": {"gradient_checkpointing": on},
                           "algorithm": {"old_logp": "recompute"}})  # a no-grad pass as well
        t = Trainer(cfg, tmp_path / name)
        calls = {"train": 0}

        def count(module, args):
            if torch.is_grad_enabled() and module.training:
                calls["train"] += 1

        t.policy.model.layers[0].mlp.register_forward_pre_hook(count)
        t.train()
        return _strip(read_metrics(tmp_path / name)), _weights(t.policy), calls["train"]

    plain, w_plain, n_plain = run("plain", False)
    ckpt, w_ckpt, n_ckpt = run("ckpt", True)
    assert n_plain > 0 and n_ckpt == 2 * n_plain
    assert ckpt == plain
    for k in w_plain:
        assert torch.equal(w_plain[k], w_ckpt[k]), k


def test_gradient_checkpointing_on_a_model_without_it_is_a_config_error(make_config, tmp_path,
                                                                        monkeypatch):
    from transformers.models.llama.modeling_llama import LlamaPreTrainedModel

    from explorl.errors import ConfigError

    monkeypatch.setattr(LlamaPreTrainedModel, "supports_gradient_checkpointing", False)
    cfg = make_config({"model": {"gradient_checkpointing": True}})
    with pytest.raises(ConfigError, match="model.gradient_checkpointing"):
        Trainer(cfg, tmp_path / "run")


def test_model_compile_runs_the_loss_passes_compiled_and_matches_eager(make_config, tmp_path):
    # model.compile: the decoder layers' compiled calls serve the loss passes (counted), never the
    # sampler (the layers are eager outside those passes), and the run equals the eager run up
    # to float round-off.
    def run(name, on):
        cfg = make_config({"max_steps": 2, "eval": {"every": 0}, "model": {"compile": on},
                           "algorithm": {"old_logp": "recompute"}, "optim": {"mini_batches": 2}})
        t = Trainer(cfg, tmp_path / name)
        calls = {"compiled": 0, "eager_in_generate": 0}
        if on:
            assert t.compiled.error is None
            fns = t.compiled.compiled

            def counting(fn):
                def call(*a, **k):
                    calls["compiled"] += 1
                    return fn(*a, **k)
                return call

            t.compiled.compiled = [counting(fn) for fn in fns]
            generate = t.engine.generate

            def checking(*a, **k):
                assert all(layer._compiled_call_impl is None for layer in t.compiled.layers)
                calls["eager_in_generate"] += 1
                return generate(*a, **k)

            t.engine.generate = checking
        t.train()
        return _strip(read_metrics(tmp_path / name)), calls

    eager, _ = run("eager", False)
    compiled, calls = run("compiled", True)
    # 2 steps × (mini-batch 1's forward, which the recompute reuses, the no-grad recompute of
    # mini-batch 2, its loss pass) × every layer
    assert calls["compiled"] >= 2 * 3 * 2 and calls["eager_in_generate"] >= 2
    for a, b in zip(eager, compiled):
        for k in ("reward/mean", "loss/policy", "grad/norm", "entropy/mean"):
            assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-6), k


def test_model_compile_falls_back_to_eager_when_compiling_fails(make_config, tmp_path,
                                                                 monkeypatch, caplog):
    def broken(fn, **kw):
        def call(*a, **k):
            raise RuntimeError("no compiler here")
        return call

    monkeypatch.setattr(torch, "compile", broken)
    cfg = make_config({"max_steps": 1, "eval": {"every": 0}, "model": {"compile": True}})
    with caplog.at_level("WARNING", logger="explorl"):
        t = Trainer(cfg, tmp_path / "run")
        t.train()
    assert t.compiled.error == "RuntimeError: no compiler here"
    assert "model.compile" in caplog.text and "eagerly" in caplog.text
    with t.compiled():  # the loss passes' context no longer switches the broken calls on
        assert all(layer._compiled_call_impl is None for layer in t.compiled.layers)
    assert len(read_metrics(tmp_path / "run")) == 1


def test_model_compile_with_fsdp_is_a_config_error(make_config):
    from explorl.errors import ConfigError

    with pytest.raises(ConfigError, match="model.compile"):
        make_config({"model": {"compile": True}, "dist": {"strategy": "fsdp"}})


def test_model_compile_without_decoder_layers_warns_and_runs_eagerly(caplog):
    from explorl.models import RegionalCompile

    model = torch.nn.Sequential(torch.nn.Linear(2, 2))  # nothing named layers
    compiled = RegionalCompile(model)
    with caplog.at_level("WARNING", logger="explorl"):
        compiled.warm_up(model, 2, torch.device("cpu"))
        with compiled():
            assert model(torch.ones(1, 2)).shape == (1, 2)
    assert compiled.error == "no decoder layers found"
    assert "model.compile" in caplog.text and "eagerly" in caplog.text


@pytest.mark.parametrize("threads", [1, 2])
def test_cpu_threads_sets_torchs_thread_count(make_config, tmp_path, threads):
    before = torch.get_num_threads()
    try:
        Trainer(make_config({"model": {"cpu_threads": threads}}), tmp_path / "run")
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)


def test_cpu_threads_out_of_range_is_a_config_error(make_config):
    from explorl.errors import ConfigError

    with pytest.raises(ConfigError, match="model.cpu_threads"):
        make_config({"model": {"cpu_threads": 0}})


def test_a_controller_that_writes_kl_coef_gets_the_reference(make_config, tmp_path):
    """The reference model loads when a controller writes ``kl_coef``, even with the recipe's own
    ``algorithm.kl_coef`` at 0; otherwise the knob would reach no KL term (a silent no-op)."""
    cfg = make_config({"max_steps": 1, "eval": {"every": 0},
                       "control": {"adaptive": {"enabled": True, "actuator": "kl_coef",
                                                "init": 0.01, "min": 0.0, "max": 0.05}},
                       "algorithm": {"kl_coef": 0.0}})
    t = Trainer(cfg, tmp_path / "kl")
    m = t.train_step()
    t.pool.close()
    assert t.ref is not None and m["control/kl_coef"] == 0.01 and "kl/ref_mean" in m
    plain = Trainer(make_config({"max_steps": 1, "eval": {"every": 0}}), tmp_path / "plain")
    plain.pool.close()
    assert plain.ref is None


@pytest.mark.parametrize("extra", [
    {"optim": {"mini_batches": 2}},  # mini-batch 1 folded, mini-batch 2 recomputed
    # π_prox (docs/rollout-engines.md §8)
    {"rollout": {"async": {"enabled": True, "max_staleness": 1}},
     "optim": {"mini_batches": 2}},
    {"control": {"eepo": {"enabled": True}}},  # stage-2 rows keep the unlearned copy's values
])
def test_the_recompute_reuses_the_first_mini_batchs_forward(make_config, tmp_path, extra,
                                                            monkeypatch):
    """The old-log-prob recompute runs the first mini-batch's forward with gradients and the
    update takes it instead of running it again: one pass fewer over those rows, the first
    ratio exactly 1 there, and the same run as recomputing everything up to rounding."""
    def run(name, fold):
        if not fold:
            monkeypatch.setattr(PolicyUpdate, "_fold", lambda self, ro, sb: None)
        cfg = make_config({"max_steps": 3, "eval": {"every": 0},
                           "algorithm": {"old_logp": "recompute"}, **extra})
        t = Trainer(cfg, tmp_path / name)
        rows, forward = [], t.scorer.forward

        def counting(*a, **k):
            rows.append(int(a[3].shape[0]))
            return forward(*a, **k)

        t.scorer.forward = counting
        t.train()
        monkeypatch.undo()
        return _strip(read_metrics(tmp_path / name)), sum(rows)

    folded, n_folded = run("folded", True)
    plain, n_plain = run("plain", False)
    mb = extra.get("optim", {}).get("mini_batches", 1)
    assert n_plain - n_folded == 3 * 16 // mb  # 16 rows a step: mini-batch 1's pass, saved
    assert len(folded) == len(plain) == 3
    for a, b in zip(plain, folded):
        for k in ("reward/mean", "loss/policy", "grad/norm", "entropy/mean", "loss/clip_frac"):
            assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-6), k
