"""Staged curriculum (ALGORITHMS 4c): the phase switch and its knobs."""

import pytest
from control_helpers import make_ctx, make_knobs

from explorl.control import ControlError, Curriculum


def knobs():
    return make_knobs(max_response_len=4096)


def ctx(max_steps=20):
    return make_ctx(max_steps=max_steps)


def run(cur, steps, k=None):
    k = k or knobs()
    out = []
    for t in steps:
        cur.before_batch(t, k)
        m = cur.before_step(t, k, [0, 1])
        out.append((k.dataset, k.n_samples, k.max_response_len, m["control/curriculum_phase"]))
    return out


def test_switches_at_the_start_of_the_annealing_phase():
    # max_steps 20, start_ratio 0.1 → start = 20 − 2 = 18 (same convention as E3/WSD)
    cur = Curriculum(start_ratio=0.1, n_samples=32, max_response_len=16384, anneal_dataset=True)
    cur.setup(ctx(20), knobs())
    assert cur.start == 18
    out = run(cur, range(16, 21))
    assert out == [("train", 8, 4096, 0.0)] * 2 + [("anneal", 32, 16384, 1.0)] * 3


def test_explicit_start_step_and_unchanged_knobs():
    cur = Curriculum(start_step=3, n_samples=16)  # no dataset switch, length unchanged
    cur.setup(ctx(20), knobs())
    assert run(cur, [1, 2, 3, 4]) == [("train", 8, 4096, 0.0)] * 2 + [("train", 16, 4096, 1.0)] * 2


def test_no_phase_when_the_ratio_rounds_to_zero_steps():
    cur = Curriculum(start_ratio=0.01, n_samples=32)
    cur.setup(ctx(20), knobs())
    assert cur.start is None
    assert [o[3] for o in run(cur, range(1, 21))] == [0.0] * 20


def test_resume_needs_no_state():
    # knobs rebuilt from the config at resume are put back into the phase at once
    cur = Curriculum(start_step=2, n_samples=32, anneal_dataset=True)
    cur.setup(ctx(), knobs())
    cur.load_state_dict(cur.state_dict())
    assert run(cur, [5]) == [("anneal", 32, 4096, 1.0)]


def test_dataset_must_be_set_before_prompts_are_drawn():
    cur = Curriculum(start_step=2, anneal_dataset=True)
    cur.setup(ctx(), knobs())
    k = knobs()
    with pytest.raises(ControlError, match="before_batch"):
        cur.before_step(2, k, [0, 1])  # the trainer skipped before_batch
