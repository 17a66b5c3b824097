"""Staged curriculum (docs/methods/entropy-scheduling.md §4c): the phase switch and its knobs."""

import pytest
from control_helpers import make_bank, make_ctx, make_knobs

from explorl import config as C
from explorl import validation
from explorl.config import CurriculumControlConfig
from explorl.control import ControlBank, ControlError, Curriculum


def knobs():
    return make_knobs(max_response_len=4096)


def ctx(max_steps=20):
    return make_ctx(max_steps=max_steps)


def curriculum(*, anneal_dataset=False, start_step=None, **kw):
    cfg = CurriculumControlConfig(enabled=True, **kw)
    return Curriculum(cfg, anneal_dataset=anneal_dataset, start_step=start_step)


def run(bank, steps):
    out = []
    for t in steps:
        m = bank.before_batch(t)
        m |= bank.before_step(t, [0, 1])
        k = bank.knobs
        out.append((k.dataset, k.n_samples, k.max_response_len, m["control/curriculum_phase"]))
    return out


def test_switches_at_the_start_of_the_annealing_phase():
    # max_steps 20, start_ratio 0.1 → start = 20 − 2 = 18 (same convention as E3/WSD)
    cur = curriculum(start_ratio=0.1, n_samples=32, max_response_len=16384, anneal_dataset=True)
    bank = make_bank(cur, ctx(20), knobs())
    assert cur.start == 18
    out = run(bank, range(16, 21))
    assert out == [("train", 8, 4096, 0.0)] * 2 + [("anneal", 32, 16384, 1.0)] * 3


def test_the_dataset_is_switched_before_the_prompts_are_drawn():
    # before_batch alone (the prompts are drawn between the two hooks) already switches
    cur = curriculum(start_step=3, n_samples=32, anneal_dataset=True)
    bank = make_bank(cur, ctx(20), knobs())
    assert bank.before_batch(2) == {} and bank.knobs.dataset == "train"
    bank.before_batch(3)
    assert (bank.knobs.dataset, bank.knobs.n_samples) == ("anneal", 32)


def test_explicit_start_step_and_unchanged_knobs():
    cur = curriculum(start_step=3, n_samples=16)  # no dataset switch, length unchanged
    bank = make_bank(cur, ctx(20), knobs())
    assert run(bank, [1, 2, 3, 4]) == [("train", 8, 4096, 0.0)] * 2 + [("train", 16, 4096, 1.0)] * 2


def test_no_phase_when_the_ratio_rounds_to_zero_steps():
    cur = curriculum(start_ratio=0.01, n_samples=32)
    bank = make_bank(cur, ctx(20), knobs())
    assert cur.start is None
    assert [o[3] for o in run(bank, range(1, 21))] == [0.0] * 20
    assert bank.knobs == knobs()


def test_resume_needs_no_state():
    # knobs rebuilt from the config at resume are put back into the phase at once
    cur = curriculum(start_step=2, n_samples=32, anneal_dataset=True)
    cur.setup(ctx(), knobs())
    cur.load_state_dict(cur.state_dict())
    assert run(ControlBank([cur], knobs()), [5]) == [("anneal", 32, 4096, 1.0)]


def test_dataset_must_be_set_before_prompts_are_drawn():
    cur = curriculum(start_step=2, anneal_dataset=True)
    bank = make_bank(cur, ctx(), knobs())
    with pytest.raises(ControlError, match="before_batch"):
        bank.before_step(2, [0, 1])  # the trainer skipped before_batch


def test_invalid_configuration_names_the_key():
    for ratio in (0.0, 1.0):
        with pytest.raises(C.ConfigError) as e:
            validation.from_dict(
                {"control": {"curriculum": {"enabled": True, "start_ratio": ratio}}})
        assert str(e.value).startswith("control.curriculum.start_ratio:")


# The controller used to reject these itself; validation.validate checks them (config.RANGES).
@pytest.mark.parametrize("key", ["n_samples", "max_response_len"])
def test_phase_sizes_must_be_positive(key):
    with pytest.raises(C.ConfigError) as e:
        validation.from_dict({"control": {"curriculum": {"enabled": True, key: 0}}})
    assert str(e.value).startswith(f"control.curriculum.{key}:")
