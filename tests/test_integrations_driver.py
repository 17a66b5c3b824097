"""explorl.integrations.driver (no framework needed): knob tables, the once-per-step driver, and
that ``import explorl`` pulls in no integration."""

from __future__ import annotations

import subprocess
import sys

import pytest

from explorl.config import EntropyCoefControlConfig, TemperatureControlConfig
from explorl.control import EntropyCoefController, Knobs, TemperatureScheduler
from explorl.control.base import ACTUATORS
from explorl.errors import ControlError
from explorl.integrations.driver import ControlDriver, KnobTable

READS = {a: "here" for a in ("temperature", "eps_high", "entropy_coef", "kl_coef")}
REFUSED = {a: f"no {a}" for a in ACTUATORS if a not in READS}


def _knobs():
    return Knobs(temperature=1.0, eps_high=0.2, entropy_coef=0.0, kl_coef=0.0, n_samples=4,
                 max_response_len=8)


def _driver(controllers, lag):
    d = ControlDriver(controllers, _knobs(), KnobTable("X", READS, REFUSED), vocab_size=100,
                      dataset_size=8, prompts_per_step=2, lag_update=lag)
    d.setup(max_steps=5)
    return d


def test_import_explorl_loads_no_integration():
    code = ("import sys, explorl, explorl.api; bad = [m for m in sys.modules if m in ('trl', "
            "'verl') or m.startswith('explorl.integrations')]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_knob_table_must_cover_every_actuator_once():
    with pytest.raises(ValueError, match="neither"):
        KnobTable("X", {"temperature": "here"}, {})
    with pytest.raises(ValueError, match="both"):
        KnobTable("X", READS, {**REFUSED, "temperature": "no"})


def test_a_controller_on_a_refused_knob_is_refused_with_the_reason():
    table = KnobTable("X", {k: v for k, v in READS.items() if k != "temperature"},
                      {**REFUSED, "temperature": "X samples greedily"})
    with pytest.raises(ControlError, match="'temperature', which X does not read here: X samples"):
        ControlDriver([TemperatureScheduler(TemperatureControlConfig(enabled=True))], _knobs(),
                      table, vocab_size=100, dataset_size=8, prompts_per_step=2, lag_update=True)


def test_lagged_update_uses_the_previous_steps_entropy():
    coef = EntropyCoefController(EntropyCoefControlConfig(enabled=True, target=0.5, delta=0.01,
                                                          init=0.02, max=0.05))
    d = _driver([coef], lag=True)
    assert d.begin_step().entropy_coef == 0.0  # step 1: no statistics yet, the framework's value
    d.end_step(entropy=0.3)
    # step 1's H = 0.3 < 0.5: c ← 0.02 + 0.01, then applied (update, then apply: Skywork-OR1)
    assert d.begin_step().entropy_coef == pytest.approx(0.03)
    d.end_step(entropy=0.9)
    assert d.begin_step().entropy_coef == 0.0  # step 2's H = 0.9 > 0.5: c ← 0.02, bonus off


def test_state_round_trip_continues_identically():
    a = _driver([TemperatureScheduler(TemperatureControlConfig(enabled=True))], lag=True)
    for h in (1.0, 0.7):
        a.begin_step()
        a.end_step(entropy=h, reward=0.5)
    b = _driver([TemperatureScheduler(TemperatureControlConfig(enabled=True))], lag=True)
    b.load_state_dict(a.state_dict())
    assert b.begin_step() == a.begin_step() and b.step == a.step == 3
    assert a.knobs.temperature > 1.0  # entropy fell below H0: E3 heats up
