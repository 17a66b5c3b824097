"""Run explorl's controllers against another framework's training step (no framework imports).

Each integration describes what its framework's loss and sampler actually read as a
``KnobTable``: for every knob (``control.base.KNOB_ACTUATOR``'s actuators) either *where* the
framework reads it, or *why* it cannot. ``ControlDriver`` refuses, before training, a controller
that writes a knob the framework does not read (the contract explorl's own trainer enforces), then
runs the controllers once per step::

    knobs = driver.begin_step()            # before sampling: temperature and the loss knobs
    ...                                    # the framework samples, scores and updates
    driver.end_step(entropy=H, reward=R)   # the step's statistics: controllers update

``before_update`` controllers (entropy_coef, entropic) decide a step's loss knobs from
statistics of the step's own rollouts. A framework that measures entropy before its update
(verl's old-log-prob pass) calls ``driver.before_update(entropy=…)`` between sampling and the
update; one that measures it only inside the loss (TRL) gets the previous step's statistics in
``begin_step`` (``lag_update=True``), the same one-step lag as TRL's own adaptive entropy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from explorl.control import ControlBank, ControlContext, Controller, Knobs, StepStats
from explorl.control.base import ACTUATORS
from explorl.errors import ControlError


@dataclass(frozen=True)
class KnobTable:
    """Which knobs a framework reads for a given configuration.

    ``reads``: actuator -> where the framework reads it (shown in docs and errors).
    ``refused``: actuator -> why this configuration cannot read it. Every actuator of
    ``control.base.ACTUATORS`` is in exactly one of the two.
    """

    framework: str
    reads: Mapping[str, str]
    refused: Mapping[str, str]

    def __post_init__(self) -> None:
        both = set(self.reads) & set(self.refused)
        missing = set(ACTUATORS) - set(self.reads) - set(self.refused)
        if both or missing:
            raise ValueError(f"{self.framework} knob table: in both {sorted(both)}, "
                             f"in neither {sorted(missing)}")

    def check(self, controllers: Sequence[Controller]) -> None:
        """Raise ``ControlError`` for a controller whose knob this framework does not read."""
        for c in controllers:
            for act in c.actuators:
                if act in self.refused:
                    raise ControlError(
                        f"controller {c.name!r} drives {act!r}, which {self.framework} does not "
                        f"read here: {self.refused[act]}"
                    )


@dataclass
class StepRecord:
    """What the framework logged for one step (the part controllers read)."""

    entropy: float
    reward: float = float("nan")
    extra: dict[str, float] = field(default_factory=dict)


class ControlDriver:
    """explorl's controllers, once per framework step, with ownership and knob support checked.

    ``knobs`` holds the framework's configured values (its temperature, clip, coefficients);
    a knob no controller owns keeps that value. ``max_steps`` is the number of *controller
    steps* of the run (one per sampling round). State (``state_dict``) holds the step counter,
    every controller's state, the knobs and the last step's statistics.
    """

    def __init__(self, controllers: Sequence[Controller], knobs: Knobs, table: KnobTable, *,
                 vocab_size: int, dataset_size: int, prompts_per_step: int,
                 lag_update: bool) -> None:
        table.check(controllers)
        self.controllers, self.table, self.lag_update = list(controllers), table, lag_update
        self.initial_knobs = knobs
        self.ctx_args = dict(vocab_size=vocab_size, dataset_size=dataset_size,
                             prompts_per_step=prompts_per_step, n_samples=knobs.n_samples)
        self.bank: ControlBank | None = None
        self.step = 0  # controller steps begun
        self.last: StepRecord | None = None
        self.metrics: dict[str, float] = {}  # control/* metrics of the current step

    def setup(self, max_steps: int) -> None:
        """Set the controllers up for a run of ``max_steps`` controller steps (once, before
        ``load_state_dict`` on resume)."""
        ctx = ControlContext(max_steps=max_steps, **self.ctx_args)
        for c in self.controllers:
            c.setup(ctx, self.initial_knobs)
        self.bank = ControlBank(self.controllers, self.initial_knobs)
        self.max_steps, self.step, self.last = max_steps, 0, None

    @property
    def ready(self) -> bool:
        return self.bank is not None

    @property
    def knobs(self) -> Knobs:
        assert self.bank is not None, "call setup(max_steps) first"
        return self.bank.knobs

    def _stats(self, step: int, rec: StepRecord) -> StepStats:
        return StepStats(step=step, max_steps=self.max_steps, entropy=float(rec.entropy),
                         prompt_indices=[], prompt_correct=[], prompt_samples=[], epoch=0,
                         epoch_end=False, extra={"reward/mean": float(rec.reward), **rec.extra})

    def begin_step(self) -> Knobs:
        """Knobs of the coming step (the sampling temperature included)."""
        assert self.bank is not None, "call setup(max_steps) first"
        self.step += 1
        m = self.bank.before_batch(self.step)
        m.update(self.bank.before_step(self.step, []))
        if self.lag_update and self.last is not None:
            m.update(self.bank.before_update(self._stats(self.step - 1, self.last)))
        self.metrics = m
        return self.bank.knobs

    def before_update(self, entropy: float, reward: float = float("nan")) -> Knobs:
        """Loss knobs of this step from its own rollouts' entropy (frameworks that measure it
        before the update; not with ``lag_update``)."""
        assert self.bank is not None and not self.lag_update
        self.metrics.update(self.bank.before_update(self._stats(self.step, StepRecord(entropy,
                                                                                      reward))))
        return self.bank.knobs

    def end_step(self, entropy: float, reward: float = float("nan"), **extra: float) -> dict:
        """Feed the finished step's statistics to the controllers; returns the metrics their
        ``after_step`` logs (``metrics`` then holds the whole step's)."""
        assert self.bank is not None and self.step >= 1, "begin_step first"
        rec = StepRecord(float(entropy), float(reward), dict(extra))
        after = self.bank.after_step(self._stats(self.step, rec))
        self.metrics.update(after)
        self.last = rec
        return after

    def state_dict(self) -> dict[str, Any]:
        assert self.bank is not None
        return {"step": self.step, "bank": self.bank.state_dict(),
                "last": None if self.last is None else dataclasses.asdict(self.last)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        assert self.bank is not None, "call setup(max_steps) before load_state_dict"
        self.step = int(state["step"])
        self.bank.load_state_dict(state["bank"], where="the integration checkpoint")
        self.last = None if state["last"] is None else StepRecord(**state["last"])
