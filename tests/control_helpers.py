"""Builders of the controllers' inputs for the tests/test_control_*.py unit tests: each call
takes the shared defaults below and overrides what its test is about."""

from __future__ import annotations

from explorl.control import ControlBank, ControlContext, Controller, Knobs, StepStats


def make_knobs(**kw) -> Knobs:
    base = {
        "temperature": 1.0,
        "eps_high": 0.2,
        "entropy_coef": 0.0,
        "kl_coef": 0.0,
        "n_samples": 8,
        "max_response_len": 64,
    }
    return Knobs(**{**base, **kw})


def make_ctx(**kw) -> ControlContext:
    base = {
        "vocab_size": 16,
        "dataset_size": 4,
        "max_steps": 10,
        "prompts_per_step": 2,
        "n_samples": 8,
    }
    return ControlContext(**{**base, **kw})


def make_stats(step: int, **kw) -> StepStats:
    base = {
        "step": step,
        "max_steps": 10,
        "entropy": 0.5,
        "prompt_indices": [0, 1],
        "prompt_correct": [1.0, 1.0],
        "prompt_samples": [8, 8],
        "epoch": 0,
        "epoch_end": False,
    }
    return StepStats(**{**base, **kw})


def make_bank(controllers: Controller | list[Controller], ctx: ControlContext,
              knobs: Knobs) -> ControlBank:
    """Set the controllers up (as ``build_controllers`` does); wrap them in the trainer's bank."""
    cs = controllers if isinstance(controllers, list) else [controllers]
    for c in cs:
        c.setup(ctx, knobs)
    return ControlBank(cs, knobs)
