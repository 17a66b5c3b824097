"""build_controllers, the combination rules (docs/methods/combining.md §5), the bank that applies
the controllers' decisions, and exact resume of every controller."""

import dataclasses
import json
import math

import pytest
from control_helpers import make_ctx, make_knobs, make_stats

from explorl import config as C
from explorl import control, validation
from explorl.config import AdaptiveControlConfig, TemperatureControlConfig
from explorl.control import (
    CONTROLLER_ORDER,
    CONTROLLERS,
    AdaptiveController,
    ControlBank,
    ControlError,
    Controller,
    Decision,
    StepStats,
    TemperatureScheduler,
    apply_decision,
    build_controllers,
    check_actuators,
    check_control_config,
)

MAX_STEPS, DATASET, B = 12, 8, 4


def ctx():
    return make_ctx(vocab_size=50, dataset_size=DATASET, max_steps=MAX_STEPS, prompts_per_step=B)


def init_knobs():
    return make_knobs()


def control_config(sections: dict) -> C.ControlConfig:
    """The ``control`` section of a validated recipe enabling ``sections``."""
    data = {name: {"enabled": True, **s} for name, s in sections.items()}
    return validation.from_dict({"max_steps": MAX_STEPS, "control": data}).control


def make_bank(sections) -> ControlBank:
    knobs = init_knobs()
    return ControlBank(build_controllers(control_config(sections), ctx(), knobs), knobs)


def drive(sections, resume_after=None, keep_knobs=True):
    """Emulate the trainer for MAX_STEPS steps; optionally checkpoint after a step and resume.

    The checkpoint is ``ControlBank.state_dict()`` through JSON, as a file would hold it. The
    resumed run rebuilds the controllers from the config, as a fresh process would; with
    ``keep_knobs=False`` it also drops the checkpoint's knobs for the config's, which must not
    matter: every knob a controller owns is rewritten from that controller's state.
    Returns per step: (knobs as used by the step, all metrics logged for the step).
    """
    bank = make_bank(sections)
    log = []
    for t in range(1, MAX_STEPS + 1):
        if resume_after is not None and t == resume_after + 1:
            ckpt = json.loads(json.dumps(bank.state_dict()))
            if not keep_knobs:
                ckpt["knobs"] = dataclasses.asdict(init_knobs())
            bank = make_bank(sections)
            bank.load_state_dict(ckpt)
        epoch, pos = divmod(t - 1, DATASET // B)
        idx = [(pos * B + j * 3 + epoch) % DATASET for j in range(B)]  # a fixed "shuffle"
        metrics = bank.before_batch(t)
        metrics |= bank.before_step(t, idx)
        used = dataclasses.asdict(bank.knobs)
        samples = bank.knobs.budgets_for(B)
        stats = StepStats(
            step=t,
            max_steps=MAX_STEPS,
            entropy=0.35 + 0.25 * math.sin(t) * bank.knobs.temperature,
            prompt_indices=idx,
            prompt_correct=[float(min(n, (i * 5 + t) % 7)) for i, n in zip(idx, samples)],
            prompt_samples=samples,
            epoch=epoch,
            epoch_end=pos == DATASET // B - 1,
        )
        metrics |= bank.after_step(stats)
        log.append((used, metrics))
    return log


SPEC_SETS = {
    "temperature": {"temperature": {"anneal": True, "annealing_ratio": 0.4}},
    "budget": {"budget": {"n_min_limit": 4, "n_max_limit": 12, "widen": 2}},
    "eepo": {"eepo": {"window": 3, "alpha": 0.3}},
    "adaptive": {
        "adaptive": {
            "schedule": {
                "kind": "wsd",
                "target": 0.4,
                "end": 0.2,
                "anneal_ratio": 0.3,
                "release": True,
            },
            "warmup": 2,
            "window": 3,
        }
    },
    "curriculum": {"curriculum": {"start_ratio": 0.25, "n_samples": 12, "max_response_len": 128}},
    "e3+eepo+curriculum": {
        "temperature": {"anneal": True},
        "budget": {},
        "eepo": {},
        "curriculum": {"start_ratio": 0.25, "n_samples": 12},
    },
    "es": {
        "adaptive": {
            "schedule": {"kind": "cosine", "start": 0.6, "end": 0.2},
            "actuator": "kl_coef",
            "warmup": 1,
        },
        "budget": {},
        "curriculum": {"start_ratio": 0.25, "n_samples": 16},
    },
}


@pytest.mark.parametrize("keep_knobs", [True, False], ids=["bank-state", "controller-state"])
@pytest.mark.parametrize("name", list(SPEC_SETS))
def test_resume_reproduces_the_uninterrupted_run(name, keep_knobs):
    specs = SPEC_SETS[name]
    full = drive(specs)
    for cut in (1, 2, 4, 5, 7, 11):
        resumed = drive(specs, resume_after=cut, keep_knobs=keep_knobs)
        assert resumed == full, f"resume after step {cut}"


def test_the_traces_exercise_every_controller():
    log = drive(SPEC_SETS["e3+eepo+curriculum"])
    temps = [u["temperature"] for u, _ in log]
    assert len(set(temps)) > 3  # the temperature moved
    budgets = [u["budgets"] for u, _ in log]
    assert budgets[0] == (8,) * 4 and any(
        len(set(b)) > 1 for b in budgets[2:9]
    )  # widened after epoch 1
    # the phase starts at 12 − floor(12·0.25) = step 9
    assert [u["n_samples"] for u, _ in log] == [8] * 8 + [12] * 4
    assert all(sum(b) == u["n_samples"] * B for b, (u, _) in zip(budgets, log))
    assert any(u["unlearn"] for u, _ in log) and not all(u["unlearn"] for u, _ in log)


# Every key a controller may log, with where its meaning is pinned. The knobs a step used
# (control/temperature, control/<actuator>) are logged by the trainer, and eepo/active by
# the two-stage sampler: no controller emits them.
METRIC_KEYS = {
    "control/temperature_next",
    "control/target_entropy",  # test_control_temperature
    "control/temperature_clamped",
    "rollout/budget_min",
    "rollout/budget_max",
    "control/budget_n_min",
    "control/budget_n_max",  # _budget
    "eepo/entropy_ma",  # test_control_eepo
    "control/tracking_error",
    "control/adaptive_released",  # _adaptive
    "control/curriculum_phase",  # test_control_curriculum
}


def test_metric_keys_are_the_documented_ones():
    seen = set()
    for specs in SPEC_SETS.values():
        for _, metrics in drive(specs):
            seen |= set(metrics)
    assert seen == METRIC_KEYS


def test_order_is_fixed_and_curriculum_precedes_budget():
    cfg = control_config({"eepo": {}, "budget": {}, "curriculum": {},
                          "adaptive": {"schedule": {"kind": "constant", "target": 0.4}}})
    ctrls = build_controllers(cfg, ctx(), init_knobs())
    assert [c.name for c in ctrls] == ["curriculum", "budget", "adaptive", "eepo"]
    assert CONTROLLER_ORDER == ("curriculum", "temperature", "budget", "adaptive", "entropic",
                                "entropy_coef", "eepo")
    assert set(CONTROLLER_ORDER) == set(CONTROLLERS)
    assert all(cls.name == key for key, cls in CONTROLLERS.items())  # checkpoint keys
    assert build_controllers(C.ControlConfig(), ctx(), init_knobs()) == []  # all disabled


def test_setup_is_called():
    knobs = make_knobs(temperature=1.25)
    (ts,) = build_controllers(control_config({"temperature": {}}), ctx(), knobs)
    assert ts.T == 1.25


def test_anneal_dataset_reaches_the_curriculum():
    cfg = control_config({"curriculum": {"start_ratio": 0.25}})
    (cur,) = build_controllers(cfg, ctx(), init_knobs(), anneal_dataset=True)
    bank = ControlBank([cur], init_knobs())
    bank.before_batch(MAX_STEPS)
    assert bank.knobs.dataset == "anneal"
    (cur,) = build_controllers(cfg, ctx(), init_knobs())
    bank = ControlBank([cur], init_knobs())
    bank.before_batch(MAX_STEPS)
    assert bank.knobs.dataset == "train"


def test_two_owners_of_one_actuator_are_named():
    ts = TemperatureScheduler(TemperatureControlConfig(enabled=True))
    ac = AdaptiveController(AdaptiveControlConfig(enabled=True, actuator="temperature"))
    both = "'temperature' is owned by both 'temperature' and 'adaptive'"
    with pytest.raises(ControlError, match=both):
        check_actuators([ts, ac])
    with pytest.raises(ControlError, match=both):
        ControlBank([ts, ac], init_knobs())


def test_two_entropy_trackers_are_rejected():
    # the pair is refused whatever knob adaptive drives
    for actuator in ("eps_high", "temperature"):
        sections = {
            "temperature": {"enabled": True},
            "adaptive": {"enabled": True, "actuator": actuator},
        }
        with pytest.raises(ControlError, match="fight"):  # validation.validate refuses it first
            control_config({"temperature": {}, "adaptive": {"actuator": actuator}})
        cfg = C.build(C.ControlConfig, sections)  # the section alone, not validated
        with pytest.raises(ControlError, match="fight"):
            check_control_config(cfg)
        with pytest.raises(ControlError, match="fight"):
            build_controllers(cfg, ctx(), init_knobs())


def test_unknown_controller_and_bad_keys_name_the_key():
    with pytest.raises(C.ConfigError) as e:
        validation.from_dict({"control": {"entropy_bonus": {}}})
    assert str(e.value).startswith("control.entropy_bonus: unknown key")
    assert "temperature, budget, eepo, adaptive, curriculum" in str(e.value)
    with pytest.raises(C.ConfigError) as e:
        validation.from_dict({"control": {"budget": {"n_max": 12}}})
    assert str(e.value).startswith("control.budget.n_max: unknown key")


# ----------------------------------------------------------------------------- the bank


class Claims(Controller):
    """A controller that claims ``actuators`` and returns the given decisions."""

    name = "claims"

    def __init__(self, actuators=(), before=None, after=None):
        self.actuators = tuple(actuators)
        self.before, self.after = before or {}, after or {}

    def before_step(self, step, knobs, prompt_indices):
        return Decision(knobs=dict(self.before), metrics={"claims/before": float(step)})

    def after_step(self, stats, knobs):
        return Decision(knobs=dict(self.after), metrics={"claims/after": float(stats.step)})


def test_knobs_are_read_only():
    with pytest.raises(dataclasses.FrozenInstanceError):
        init_knobs().temperature = 2.0


def test_apply_decision_sets_owned_knobs_and_leaves_the_input_alone():
    k = init_knobs()
    c = Claims(["temperature", "budgets"])
    out = apply_decision(k, Decision(knobs={"temperature": 0.7, "budgets": [3, 5]}), c)
    assert (out.temperature, out.budgets) == (0.7, (3, 5))  # budgets stored as a tuple
    assert k == init_knobs()
    assert apply_decision(k, Decision(), c) == k
    # one actuator may own several knobs
    d = Decision(knobs={"dataset": "anneal", "n_samples": 16})
    out = apply_decision(k, d, Claims(["curriculum"]))
    assert (out.dataset, out.n_samples) == ("anneal", 16)


def test_apply_decision_rejects_an_unclaimed_knob():
    k = init_knobs()
    with pytest.raises(ControlError, match=r"'claims' set knob 'eps_high'.*did not claim"):
        apply_decision(k, Decision(knobs={"eps_high": 0.3}), Claims(["temperature"]))
    # n_samples belongs to the curriculum actuator, not to the budgets
    with pytest.raises(ControlError, match="'n_samples', owned by actuator 'curriculum'"):
        apply_decision(k, Decision(knobs={"n_samples": 16}), Claims(["budgets"]))
    with pytest.raises(ControlError, match="unknown knob 'top_p'"):
        apply_decision(k, Decision(knobs={"top_p": 0.9}), Claims(["temperature"]))


def test_bank_rejects_an_unclaimed_knob_and_keeps_its_knobs():
    bank = ControlBank([Claims(["temperature"], before={"kl_coef": 0.1})], init_knobs())
    with pytest.raises(ControlError, match="did not claim"):
        bank.before_step(1, [0])
    assert bank.knobs == init_knobs()


def test_bank_after_step_rejects_knob_changes():
    # even a knob the controller owns: after_step updates state, before_step sets knobs
    bank = ControlBank([Claims(["temperature"], after={"temperature": 0.7})], init_knobs())
    assert bank.before_step(1, [0]) == {"claims/before": 1.0}
    with pytest.raises(ControlError, match="changed knobs in after_step"):
        bank.after_step(make_stats(1))
    assert bank.knobs == init_knobs()


def test_bank_applies_in_order_and_merges_metrics():
    # a later controller sees the knobs an earlier one set in the same hook
    seen = []

    class Reader(Claims):
        name = "reader"

        def before_step(self, step, knobs, prompt_indices):
            seen.append(knobs.temperature)
            return Decision(metrics={"reader/t": knobs.temperature})

    writer = Claims(["temperature"], before={"temperature": 0.7})
    bank = ControlBank([writer, Reader()], init_knobs())
    assert bank.before_step(1, [0]) == {"claims/before": 1.0, "reader/t": 0.7}
    assert seen == [0.7] and bank.knobs.temperature == 0.7
    assert bank.after_step(make_stats(1)) == {"claims/after": 1.0}


def test_bank_state_round_trip():
    sections = SPEC_SETS["e3+eepo+curriculum"]

    def step(bank, t):
        metrics = bank.before_batch(t) | bank.before_step(t, list(range(B)))
        used = bank.knobs
        metrics |= bank.after_step(make_stats(
            t, max_steps=MAX_STEPS, entropy=0.5 - 0.04 * t, prompt_indices=list(range(B)),
            prompt_correct=[1.0, 2.0, 0.0, 4.0], prompt_samples=used.budgets_for(B),
            epoch_end=t % 2 == 0))
        return used, metrics

    a = make_bank(sections)
    for t in range(1, 8):
        step(a, t)
    state = json.loads(json.dumps(a.state_dict()))  # through JSON, as a checkpoint file holds it
    assert set(state["controllers"]) == {"curriculum", "temperature", "budget", "eepo"}
    assert len(set(state["knobs"]["budgets"])) > 1  # widened after the first epoch
    b = make_bank(sections)
    assert json.loads(json.dumps(b.state_dict())) != state
    b.load_state_dict(state)
    assert b.knobs == a.knobs and isinstance(b.knobs.budgets, tuple)
    assert json.loads(json.dumps(b.state_dict())) == state
    rest = [step(b, t) for t in range(8, 13)]  # on into the curriculum's phase (step 9 on)
    assert rest == [step(a, t) for t in range(8, 13)]
    assert [u.n_samples for u, _ in rest] == [8, 12, 12, 12, 12]


def test_bank_state_must_cover_every_controller():
    state = make_bank({"temperature": {}, "eepo": {}}).state_dict()
    del state["controllers"]["eepo"]
    with pytest.raises(ControlError, match="no state for controller 'eepo'"):
        make_bank({"temperature": {}, "eepo": {}}).load_state_dict(state)


def test_public_api():
    assert sorted(control.__all__) == sorted(
        [
            "ACTUATORS",
            "ACTUATOR_DEFAULTS",
            "CONTROLLERS",
            "CONTROLLER_ORDER",
            "CONTROLLER_SPECS",
            "SCHEDULES",
            "ActuatorSpec",
            "AdaptiveController",
            "BudgetAllocator",
            "ControlBank",
            "ControlContext",
            "ControlError",
            "Controller",
            "ControllerSpec",
            "Curriculum",
            "Decision",
            "EEPOGate",
            "EntroPICController",
            "EntropyCoefController",
            "Knobs",
            "Schedule",
            "StepStats",
            "TemperatureScheduler",
            "allocate_budgets",
            "apply_decision",
            "bank_from_config",
            "build_controllers",
            "check_actuators",
            "check_control_config",
            "enabled_controllers",
            "make_schedule",
            "EntroPICLaw",
            "EntropyCoefLaw",
            "PIGains",
            "PILaw",
            "pi_step",
        ]
    )
    assert all(hasattr(control, n) for n in control.__all__)
