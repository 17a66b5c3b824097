"""Asynchronous rollouts (``rollout.async``, docs/rollout-engines.md §8): max_staleness 0 is the
synchronous run bit for bit (controllers included), resume is exact, the decoupled-PPO weights,
staleness metrics, config refusals."""

from __future__ import annotations

import math

import pytest
import torch

from explorl import config as C
from explorl import validation
from explorl.algorithms import LOSSES
from explorl.algorithms.losses import ppo_loss, vespo_loss
from explorl.algorithms.rollout_correction import rollout_correction, sequence_log_weight
from explorl.config import ConfigError
from explorl.outputs.runlog import read_metrics
from explorl.training.async_rollouts import clip_note
from explorl.training.loop import TIME_KEYS, Trainer

ASYNC_KEYS = ("async/",)

CONTROLLERS = {
    "grpo": {},
    "e3+curriculum": {"control": {"temperature": {"enabled": True},
                                  "budget": {"enabled": True},
                                  "curriculum": {"enabled": True, "start_ratio": 0.4,
                                                 "n_samples": 6}},
                      "data": {"max_train_prompts": 8}},
    "adaptive+entropy_coef_law": {"control": {"adaptive": {"enabled": True, "warmup": 1,
                                                           "actuator": "kl_coef"}},
                                  "algorithm": {"loss": "kl_cov", "kl_coef": 0.01},
                                  "optim": {"mini_batches": 2}},
    "entropy_coef+dapo": {"control": {"entropy_coef": {"enabled": True, "target": 5.0,
                                                       "delta": 0.01, "max": 0.05}},
                          "algorithm": {"dynamic_sampling": True}},
    "entropic+knapsack": {"control": {"entropic": {"enabled": True, "target": 0.5},
                                      "budget": {"enabled": True, "allocator": "knapsack",
                                                 "n_min_limit": 2, "widen": 4}},
                          "data": {"max_train_prompts": 8}},
}


def _strip(rows):
    return [{k: v for k, v in r.items() if not k.startswith(TIME_KEYS + ASYNC_KEYS)}
            for r in rows]


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _async(cfg_extra: dict, staleness: int, worker: str = "auto") -> dict:
    rollout = {**cfg_extra.get("rollout", {}),
               "async": {"enabled": True, "max_staleness": staleness, "worker": worker}}
    return {**cfg_extra, "rollout": rollout}


@pytest.mark.parametrize("worker", ["thread", "process"])
@pytest.mark.parametrize("extra", list(CONTROLLERS.values()), ids=list(CONTROLLERS))
def test_staleness_zero_is_the_synchronous_run_bit_for_bit(make_config, tmp_path, extra, worker):
    """Metrics, weights and every controller's state (E3's temperature and budgets, the
    curriculum, the adaptive and entropy-coefficient controllers, EntroPIC, knapsack)."""
    base = {**extra, "max_steps": 4, "eval": {"every": 2}, "model": {"cpu_threads": 1}}
    a = Trainer(make_config(base), tmp_path / "sync")
    a.train()
    b = Trainer(make_config(_async(base, 0, worker)), tmp_path / "async")
    assert b.rollouts is not None and b.rollouts.kind == worker
    b.train()
    ra, rb = read_metrics(tmp_path / "sync"), read_metrics(tmp_path / "async")
    assert _strip(rb) == _strip(ra)
    trained = [r for r in rb if "loss/policy" in r]
    assert all(r["async/staleness_max"] == 0 and r["async/dropped"] == 0 for r in trained)
    wa, wb = _weights(a.policy), _weights(b.policy)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert a.control.state_dict() == b.control.state_dict()


def _interrupt_after(t: Trainer, n: int) -> None:
    step = t.train_step

    def wrapped():
        out = step()
        if t.step >= n:
            t._stop = True
        return out

    t.train_step = wrapped


@pytest.mark.parametrize("worker", ["thread", "process"])
def test_resume_mid_run_reproduces_the_uninterrupted_async_run(make_config, tmp_path, worker):
    """The checkpoint holds the batch sampled ahead (with the older weights): the resumed run
    trains on the very batches the uninterrupted one did."""
    extra = {"control": {"temperature": {"enabled": True}, "budget": {"enabled": True}},
             "data": {"max_train_prompts": 8}, "model": {"cpu_threads": 1}}
    cfg = make_config({**_async(extra, 2, worker), "max_steps": 6, "eval": {"every": 3}})
    a = Trainer(cfg, tmp_path / "a")
    a.train()
    b = Trainer(cfg, tmp_path / "b")
    _interrupt_after(b, 3)
    assert b.train()["interrupted"]
    c = Trainer(cfg, tmp_path / "b", resume=True)
    assert c.step == 3 and [q.step for q in c.rollouts.queued] == [4, 5]
    c.train()
    rows_a, rows_b = read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b")
    strip = [{k: v for k, v in r.items() if not k.startswith(TIME_KEYS)} for r in rows_a]
    assert [{k: v for k, v in r.items() if not k.startswith(TIME_KEYS)} for r in rows_b] == strip
    wa, wc = _weights(a.policy), _weights(c.policy)
    assert all(torch.equal(wa[k], wc[k]) for k in wa)


@pytest.mark.parametrize("staleness", [1, 2])
def test_staleness_and_idle_metrics_mean_what_docs_say(make_config, tmp_path, staleness):
    """async/staleness_*: trainer steps done before the update minus the version that sampled;
    batch t is sampled by the weights after step t − 1 − s (≥ 0). time/*_idle_s: waits ≥ 0."""
    cfg = make_config({**_async({}, staleness, "thread"), "max_steps": 4, "eval": {"every": 0}})
    t = Trainer(cfg, tmp_path / "run")
    seen = []
    run = t.update.run

    def spy(ro, *args, **kw):
        seen.append((t.step, ro.version.clone(), ro.old_logp.clone(), ro.engine_logp.clone(),
                     ro.response_mask.clone()))
        return run(ro, *args, **kw)

    t.update.run = spy
    rows = [t.train_step() for _ in range(4)]
    for step, r in enumerate(rows, start=1):
        expect = min(step - 1, staleness)
        assert r["async/staleness_mean"] == r["async/staleness_max"] == expect
        assert r["async/dropped"] == 0
        assert r["time/trainer_idle_s"] >= 0 and r["time/sampler_idle_s"] >= 0
    for done, version, old, mu, mask in seen:
        assert (version == max(0, done - staleness)).all()
        if done - int(version[0]) > 0:  # stale: π_prox (old_logp) differs from μ (the sampler's)
            assert (old - mu).abs()[mask].max() > 0
        else:
            torch.testing.assert_close(old[mask], mu[mask], atol=1e-5, rtol=0)
    assert "rollout_corr/weight_mean" in rows[-1]  # the behaviour weight π_prox/μ (§7a, §8)
    t.rollouts.close()


def test_a_batch_older_than_max_staleness_is_dropped_and_counted(make_config, tmp_path):
    cfg = make_config({**_async({}, 2, "thread"), "max_steps": 5, "eval": {"every": 0}})
    b = Trainer(cfg, tmp_path / "run")
    _interrupt_after(b, 3)
    b.train()
    tighter = make_config({**_async({}, 1, "thread"), "max_steps": 5, "eval": {"every": 0}})
    c = Trainer(tighter, tmp_path / "run", resume=True)
    r4 = c.train_step()  # batch 4 was sampled after step 1: 2 updates old > 1
    assert r4["async/dropped"] == 1 and r4["async/staleness_max"] == 0
    r5 = c.train_step()  # batch 5 (queued before the resume) was sampled after step 2
    assert r5["async/dropped"] == 1
    c.rollouts.close()


def test_decoupled_ppo_worked_example():
    """docs/rollout-engines.md §8: μ −1.0, π_prox −0.8, π_θ −0.7, A = +1, ε = 0.2, C = 2: w = e^0.2,
    r = e^0.1 (unclipped), loss term −1.350; with π_prox −0.2: w = e^0.8 → TIS 2.0, MIS 0."""

    class Cfg:
        eps_low = eps_high = 0.2
        clip_c = None

    mask = torch.ones(1, 1, dtype=torch.bool)
    mu, prox, theta = (torch.tensor([[x]], dtype=torch.float32) for x in (-1.0, -0.8, -0.7))
    per_tok, _ = ppo_loss(theta, prox, torch.tensor([1.0]), mask, Cfg)  # clip on π_θ/π_prox
    c = rollout_correction(prox, mu, mask, "token-truncate", 2.0)  # w = π_prox/μ
    assert float(c.weight) == pytest.approx(math.exp(0.2), abs=1e-6)
    assert float(per_tok) == pytest.approx(-math.exp(0.1), abs=1e-6)
    assert float(per_tok * c.weight) == pytest.approx(-1.350, abs=1e-3)
    prox2 = torch.tensor([[-0.2]])
    assert float(rollout_correction(prox2, mu, mask, "token-truncate", 2.0).weight) == 2.0
    masked = rollout_correction(prox2, mu, mask, "token-mask", 2.0)
    assert float(masked.weight) == 0.0 and not bool(masked.keep)


def test_decoupled_vespo_worked_example():
    """VESPO under §8: μ −1.0, π_prox −0.8, π_θ −0.7 (one token), A = +1. Its W is measured
    against the sampler, W = π_θ/π_prox · π_prox/μ = e^0.1·e^0.2 = e^0.3 (PPO's ratio would be
    e^0.1, weighted by e^0.2 outside the clip); φ = W²·e^{3(1−W)} = 1.822119·0.350086 = 0.637898,
    loss term −φ·A·logp = −0.637898·(−0.7) = 0.446529."""

    class Cfg:
        vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg = 2.0, 3.0, 3.0, 2.0

    mask = torch.ones(1, 1, dtype=torch.bool)
    mu, prox, theta = (torch.tensor([[x]], dtype=torch.float64) for x in (-1.0, -0.8, -0.7))
    c = rollout_correction(prox, mu, mask, "token-truncate", 2.0)
    per_tok, m = vespo_loss(theta, prox, torch.tensor([1.0], dtype=torch.float64), mask, Cfg,
                            behaviour_log_weight=sequence_log_weight(c.weight, c.keep))
    assert m["loss/ratio_mean"].item() == pytest.approx(math.exp(0.3))
    assert m["loss/vespo_phi_mean"].item() == pytest.approx(0.637898, abs=1e-6)
    assert float(per_tok) == pytest.approx(0.446529, abs=1e-6)


def test_vespo_takes_the_stale_behaviour_weight_into_w(make_config, tmp_path, monkeypatch):
    """With staleness 1 the update hands VESPO log Π_t min(π_prox/μ, 2) of each response (0 for
    a batch sampled by the trainer's own weights), and does not multiply its loss by w."""
    cfg = make_config({**_async({"algorithm": {"loss": "vespo"}}, 1, "thread"), "max_steps": 2,
                       "eval": {"every": 0}})
    t = Trainer(cfg, tmp_path / "run")
    seen, run, vespo = [], t.update.run, LOSSES["vespo"]

    def spy_run(ro, *args, **kw):
        seen.append({"stale": t.step - int(ro.version[0]), "old": ro.old_logp.clone(),
                     "mu": ro.engine_logp.clone(), "mask": ro.response_mask.clone(),
                     "folded": []})
        return run(ro, *args, **kw)

    def spy_loss(*args, behaviour_log_weight=None, **kw):
        seen[-1]["folded"].append(behaviour_log_weight)
        return vespo(*args, behaviour_log_weight=behaviour_log_weight, **kw)

    t.update.run = spy_run
    monkeypatch.setitem(LOSSES, "vespo", spy_loss)
    rows = [t.train_step() for _ in range(2)]
    t.rollouts.close()
    assert [s["stale"] for s in seen] == [0, 1]
    for s in seen:
        folded = torch.cat(s["folded"])  # one micro-batch per mini-batch here, rows in order
        ell = torch.where(s["mask"], s["old"] - s["mu"], 0.0).clamp(max=math.log(2.0))
        if s["stale"] == 0:
            assert folded.abs().max() < 1e-4  # π_prox = μ up to float noise
        else:
            assert folded.abs().max() > 1e-4
            assert sorted(folded.tolist()) == pytest.approx(sorted(ell.sum(-1).tolist()),
                                                            abs=1e-5)
    assert all("loss/vespo_phi_mean" in r and "rollout_corr/weight_mean" in r for r in rows[1:])


def test_controllers_read_the_knobs_that_sampled_the_batch(make_config, tmp_path):
    """With staleness 1 the bank has decided batch t+1's temperature before step t trains; step
    t's update, its controllers and its logged control/temperature use batch t's own."""
    cfg = make_config({**_async({"control": {"temperature": {"enabled": True}}}, 1, "thread"),
                       "max_steps": 4, "eval": {"every": 0}})
    t = Trainer(cfg, tmp_path / "run")
    sampled, seen = {}, []
    sample = t.rollouts._sample_fn

    def spy_sample(step, draw, policy, version):
        sampled[step] = draw.knobs.temperature
        return sample(step, draw, policy, version)

    t.rollouts._sample_fn = spy_sample
    after = t.control.after_step

    def spy_after(stats, knobs=None):
        seen.append((stats.step, t.control.for_batch(knobs).temperature))
        return after(stats, knobs)

    t.control.after_step = spy_after
    rows = [t.train_step() for _ in range(4)]
    t.rollouts.close()
    assert len(set(sampled.values())) > 1  # the controller moved the temperature
    for step, temp in seen:
        assert temp == sampled[step]
    assert [r["control/temperature"] for r in rows] == [sampled[s] for s in (1, 2, 3, 4)]


def test_config_keys_refusals_and_the_clip_note(make_config):
    cfg = make_config(_async({}, 3))
    assert cfg.rollout.async_.max_staleness == 3
    assert C.to_dict(cfg)["rollout"]["async"]["max_staleness"] == 3
    assert validation.from_dict(C.to_dict(cfg)).rollout.async_.max_staleness == 3
    with pytest.raises(ConfigError, match=r"rollout\.async\.enabled.*control\.eepo\.enabled"):
        make_config({**_async({}, 1), "control": {"eepo": {"enabled": True}}})
    with pytest.raises(ConfigError, match=r"rollout\.async\.max_staleness.*dynamic_sampling"):
        make_config({**_async({}, 2), "algorithm": {"dynamic_sampling": True}})
    with pytest.raises(ConfigError, match=r"rollout\.async\.max_staleness"):
        make_config(_async({}, -1))
    with pytest.raises(ConfigError, match="did you mean"):
        make_config({"rollout": {"asyn": {"enabled": True}}})
    sampler = make_config({**_async({}, 1), "algorithm": {"old_logp": "sampler"}})
    assert "π_θ/μ" in clip_note(sampler, "sampler")
    off = make_config({**_async({}, 1), "algorithm": {"rollout_correction": {"mode": "off"}}})
    assert "π_θ/π_prox" in clip_note(off, "recompute")
    assert clip_note(make_config(_async({}, 1)), "recompute") is None
    assert clip_note(make_config(_async({}, 0)), "sampler") is None


HANDOVER_S = 0.005


@pytest.mark.parametrize("worker", ["thread", "process"])
def test_idle_times_at_staleness_zero(make_config, tmp_path, worker):
    """Without overlap each side waits for the other: the trainer waits at least the step's
    sampling (time/trainer_idle_s ≥ time/generate_s), the worker at least the previous step's
    update (time/sampler_idle_s ≥ the previous row's time/train_s); up to the few milliseconds
    between one side handing over its request and starting its clock (the trainer queues the
    draw before it starts waiting, so the worker may already be sampling: 0.8 ms seen)."""
    cfg = make_config({**_async({"model": {"cpu_threads": 1}}, 0, worker), "max_steps": 3,
                       "eval": {"every": 0}})
    t = Trainer(cfg, tmp_path / "run")
    rows = [t.train_step() for _ in range(3)]
    t.rollouts.close()
    for prev, r in zip(rows, rows[1:]):
        assert r["time/trainer_idle_s"] >= r["time/generate_s"] - HANDOVER_S
        assert r["time/sampler_idle_s"] >= prev["time/train_s"] - HANDOVER_S


def test_dynamic_sampling_refills_in_a_process_worker_advance_the_trainers_data_order(
        make_config, tmp_path):
    """DAPO's refill rounds draw in the worker's copy of the data order; the trainer takes that
    order back with the batch, so every batch drawn (main or refill) is counted once."""
    cfg = make_config({**_async({"model": {"cpu_threads": 1}}, 1, "process"), "max_steps": 4,
                       "eval": {"every": 0}, "algorithm": {"dynamic_sampling": True,
                                                          "max_gen_rounds": 3}})
    t = Trainer(cfg, tmp_path / "run")
    rows = [t.train_step() for _ in range(3)]
    t.rollouts.close()
    o = t.order
    drawn = o.epoch * o.batches_per_epoch + o.offset // o.batch_size
    # the three trained batches with their refill rounds, and batch 4's main draw (queued)
    assert drawn == sum(int(r["rollout/gen_rounds"]) for r in rows) + 1
    assert any(r["rollout/gen_rounds"] > 1 for r in rows)


def test_a_process_worker_exits_on_its_own_when_closed(make_config, tmp_path):
    """Closing the worker closes the child's own verifier pool first, so the child exits with 0
    instead of waiting on the pool's workers until the parent kills it (exit code −9)."""
    cfg = make_config({**_async({"model": {"cpu_threads": 1}}, 1, "process"), "max_steps": 2,
                       "eval": {"every": 0}})
    t = Trainer(cfg, tmp_path / "run")
    t.train_step()
    proc = t.rollouts.worker._proc
    t.rollouts.close()
    assert not proc.is_alive() and proc.exitcode == 0


def test_push_ring_slots_are_shared_with_the_child_and_never_overwritten_unread():
    """A push goes into slot n mod slots of memory the forked child shares; the parent waits
    (here: raises, the child being gone) rather than overwrite a slot whose push the child has
    not loaded."""
    import multiprocessing as mp

    from explorl.training.worker import _PushRing

    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.LayerNorm(2))
    model[1].weight.data = torch.tensor([1.5, -2.0])
    tensors = [*model.parameters(), *model.buffers()]
    ring = _PushRing(tensors, slots=2)
    assert ring.write(tensors, lambda: True) == 0
    with torch.no_grad():
        model[0].weight.add_(1.0)
    assert ring.write(tensors, lambda: True) == 1
    with pytest.raises(RuntimeError, match="exited"):  # push 0 not loaded: slot 0 is taken
        ring.write(tensors, lambda: False)

    def child(conn):  # loads slot 1 into its own copy and reports it
        copy = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.LayerNorm(2))
        ring.load(copy, 0)
        ring.load(copy, 1)
        conn.send([p.tolist() for p in copy.parameters()])  # plain lists over the pipe

    ctx = mp.get_context("fork")
    parent, end = ctx.Pipe()
    proc = ctx.Process(target=child, args=(end,))
    proc.start()
    got = parent.recv()
    proc.join(timeout=30)
    assert int(ring.loaded[0]) == 2  # the child's count, seen by the parent
    assert got == [p.tolist() for p in model.parameters()]
    assert ring.write(tensors, lambda: False) == 0  # slot 0 is free again
