"""build_controllers, the combination rules (ALGORITHMS §5) and exact resume of every controller."""

import dataclasses
import json
import math

import pytest
from control_helpers import make_ctx, make_knobs

from explorl import control
from explorl.control import (
    CONTROLLER_ORDER,
    CONTROLLERS,
    ControlError,
    StepStats,
    build_controllers,
)

MAX_STEPS, DATASET, B = 12, 8, 4


def ctx():
    return make_ctx(vocab_size=50, dataset_size=DATASET, max_steps=MAX_STEPS, prompts_per_step=B)


def init_knobs():
    return make_knobs()


def drive(specs, resume_after=None):
    """Emulate the trainer for MAX_STEPS steps; optionally checkpoint after a step and resume.

    The checkpoint holds only ``{c.name: c.state_dict()}`` (through JSON, as a file would);
    the resumed run rebuilds knobs from the config, as a fresh process would.
    Returns per step: (knobs as used by the step, all metrics logged for the step).
    """
    knobs = init_knobs()
    ctrls = build_controllers(specs, ctx(), knobs)
    log = []
    for t in range(1, MAX_STEPS + 1):
        if resume_after is not None and t == resume_after + 1:
            ckpt = json.loads(json.dumps({c.name: c.state_dict() for c in ctrls}))
            knobs = init_knobs()
            ctrls = build_controllers(specs, ctx(), knobs)
            for c in ctrls:
                c.load_state_dict(ckpt[c.name])
        epoch, pos = divmod(t - 1, DATASET // B)
        idx = [(pos * B + j * 3 + epoch) % DATASET for j in range(B)]  # a fixed "shuffle"
        metrics = {}
        for c in ctrls:
            metrics |= c.before_batch(t, knobs)
        for c in ctrls:
            metrics |= c.before_step(t, knobs, idx)
        used = dataclasses.asdict(knobs)
        samples = knobs.budgets_for(B)
        stats = StepStats(
            step=t,
            max_steps=MAX_STEPS,
            entropy=0.35 + 0.25 * math.sin(t) * knobs.temperature,
            prompt_indices=idx,
            prompt_correct=[float(min(n, (i * 5 + t) % 7)) for i, n in zip(idx, samples)],
            prompt_samples=samples,
            epoch=epoch,
            epoch_end=pos == DATASET // B - 1,
        )
        for c in ctrls:
            metrics |= c.after_step(stats, knobs)
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
        "curriculum": {"start_ratio": 0.25, "n_samples": 16, "anneal_dataset": False},
    },
}


@pytest.mark.parametrize("name", list(SPEC_SETS))
def test_resume_reproduces_the_uninterrupted_run(name):
    specs = SPEC_SETS[name]
    full = drive(specs)
    for cut in (1, 2, 4, 5, 7, 11):
        assert drive(specs, resume_after=cut) == full, f"resume after step {cut}"


def test_the_traces_exercise_every_controller():
    log = drive(SPEC_SETS["e3+eepo+curriculum"])
    temps = [u["temperature"] for u, _ in log]
    assert len(set(temps)) > 3  # the temperature moved
    budgets = [u["budgets"] for u, _ in log]
    assert budgets[0] == [8] * 4 and any(
        len(set(b)) > 1 for b in budgets[2:9]
    )  # widened after epoch 1
    assert [u["n_samples"] for u, _ in log] == [8] * 8 + [12] * 4  # 12 − floor(12·0.25) = step 9 on
    assert all(sum(b) == u["n_samples"] * B for b, (u, _) in zip(budgets, log))
    assert any(u["unlearn"] for u, _ in log) and not all(u["unlearn"] for u, _ in log)


# Every key a controller may log, with where its meaning is pinned.
METRIC_KEYS = {
    "control/temperature",
    "control/temperature_next",
    "control/target_entropy",  # test_control_temperature
    "control/temperature_clamped",
    "rollout/budget_min",
    "rollout/budget_max",
    "control/budget_n_min",
    "control/budget_n_max",  # _budget
    "eepo/active",
    "eepo/entropy_ma",  # test_control_eepo
    "control/eps_high",
    "control/kl_coef",
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
    specs = {
        "eepo": {},
        "budget": {},
        "curriculum": {},
        "adaptive": {"schedule": {"kind": "constant", "target": 0.4}},
    }
    ctrls = build_controllers(specs, ctx(), init_knobs())
    assert [c.name for c in ctrls] == ["curriculum", "budget", "adaptive", "eepo"]
    assert CONTROLLER_ORDER == ("curriculum", "temperature", "budget", "adaptive", "eepo")
    assert set(CONTROLLER_ORDER) == set(CONTROLLERS)
    assert all(cls.name == key for key, cls in CONTROLLERS.items())  # checkpoint keys


def test_setup_is_called():
    knobs = init_knobs()
    knobs.temperature = 1.25
    (ts,) = build_controllers({"temperature": {}}, ctx(), knobs)
    assert ts.T == 1.25


def test_two_owners_of_one_actuator_are_named():
    specs = {
        "temperature": {},
        "adaptive": {"schedule": {"kind": "constant", "target": 0.4}, "actuator": "temperature"},
    }
    with pytest.raises(
        ControlError, match="'temperature' is owned by both 'temperature' and 'adaptive'"
    ):
        build_controllers(specs, ctx(), init_knobs())


def test_two_entropy_trackers_are_rejected():
    specs = {"temperature": {}, "adaptive": {"schedule": {"kind": "constant", "target": 0.4}}}
    with pytest.raises(ControlError, match="fight"):
        build_controllers(specs, ctx(), init_knobs())


def test_unknown_controller_and_bad_kwargs():
    with pytest.raises(ControlError, match="temperature, budget, eepo, adaptive, curriculum"):
        build_controllers({"entropy_bonus": {}}, ctx(), init_knobs())
    with pytest.raises(ControlError, match="'budget'"):
        build_controllers({"budget": {"n_max": 12}}, ctx(), init_knobs())


def test_public_api():
    assert sorted(control.__all__) == sorted(
        [
            "ACTUATORS",
            "ACTUATOR_DEFAULTS",
            "CONTROLLERS",
            "CONTROLLER_ORDER",
            "SCHEDULES",
            "ActuatorSpec",
            "AdaptiveController",
            "BudgetAllocator",
            "ControlContext",
            "ControlError",
            "Controller",
            "Curriculum",
            "EEPOGate",
            "Knobs",
            "Schedule",
            "StepStats",
            "TemperatureScheduler",
            "allocate_budgets",
            "build_controllers",
            "check_actuators",
            "make_schedule",
            "sample_then_forget",
            "unlearn_step",
        ]
    )
    assert all(hasattr(control, n) for n in control.__all__)
