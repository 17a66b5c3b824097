"""Staged curriculum for the entropy-annealing phase (Entropy Scheduling §5; ALGORITHMS 4c).

In the annealing phase the paper switches to high-quality data, raises the rollout count
(8 → 32) and the response-length limit (4k → 16k). The phase starts at

    start = start_step                                   if given, else
    start = max_steps − floor(max_steps · start_ratio)   (the same convention as E3's and
                                                          WSD's anneal_start)

and runs to the end: every step t ≥ start is in the phase. ``start_ratio`` should match the
schedule's ``anneal_ratio`` so the curriculum and the entropy annealing begin together.

The dataset decides which prompts a step draws, so the knobs are set in ``before_batch``
(called before the prompts are drawn; ``before_step`` checks that it was). The curriculum
rewrites its knobs at every step of the phase, so a resumed run needs no state: the phase is
a function of the step. Interaction with ``BudgetAllocator``: the
allocator reads ``knobs.n_samples`` as n_default at every step, so raising ``n_samples`` here
raises its batch total N_tot = n_samples·B; the curriculum therefore runs before the budget
(see ``CONTROLLER_ORDER``). Once the dataset switches to ``"anneal"`` the allocator falls back
to ``n_samples`` per prompt.
"""

from __future__ import annotations

from typing import Any

from explorl.control.base import ControlContext, ControlError, Controller, Knobs
from explorl.control.schedules import anneal_start


class Curriculum(Controller):
    """Switch dataset, rollout count and length limit at the start of the annealing phase.

    Args:
        start_ratio: the last fraction of steps that form the phase (ES: the last 10%).
        start_step: explicit first step of the phase (1-based); overrides ``start_ratio``.
        n_samples: samples per prompt in the phase; ``None`` = unchanged.
        max_response_len: length limit in the phase; ``None`` = unchanged.
        anneal_dataset: switch ``knobs.dataset`` to ``"anneal"`` (set it when the recipe has
            a ``data.anneal`` dataset).

    Metric (before_step): ``control/curriculum_phase``: 1.0 in the annealing phase, else 0.0.
    """

    name = "curriculum"
    actuators = ("curriculum",)

    def __init__(
        self,
        start_ratio: float = 0.1,
        start_step: int | None = None,
        n_samples: int | None = None,
        max_response_len: int | None = None,
        anneal_dataset: bool = False,
    ) -> None:
        if start_step is None and not 0 <= start_ratio <= 1:
            raise ControlError(f"curriculum: start_ratio must be in [0, 1], got {start_ratio}")
        if n_samples is not None and n_samples < 1:
            raise ControlError(f"curriculum: n_samples must be ≥ 1, got {n_samples}")
        if max_response_len is not None and max_response_len < 1:
            raise ControlError(f"curriculum: max_response_len must be ≥ 1, got {max_response_len}")
        self.start_ratio, self.start_step = start_ratio, start_step
        self.n_samples, self.max_response_len = n_samples, max_response_len
        self.anneal_dataset = anneal_dataset
        self.start: int | None = None  # first step of the phase; None = no phase

    def setup(self, ctx: ControlContext, knobs: Knobs) -> None:
        if self.start_step is not None:
            self.start = self.start_step
        else:
            self.start = anneal_start(ctx.max_steps, self.start_ratio)

    def in_phase(self, step: int) -> bool:
        return self.start is not None and step >= self.start

    def _apply(self, knobs: Knobs) -> None:
        if self.anneal_dataset:
            knobs.dataset = "anneal"
        if self.n_samples is not None:
            knobs.n_samples = self.n_samples
        if self.max_response_len is not None:
            knobs.max_response_len = self.max_response_len

    def before_batch(self, step: int, knobs: Knobs) -> dict[str, float]:
        # The dataset decides which prompts step t draws, so it must be set before they are.
        if self.in_phase(step):
            self._apply(knobs)
        return {}

    def before_step(self, step: int, knobs: Knobs, prompt_indices: list[int]) -> dict[str, float]:
        phase = self.in_phase(step)
        if phase:
            if self.anneal_dataset and knobs.dataset != "anneal":
                raise ControlError(
                    f"curriculum: step {step} is in the annealing phase but its prompts were drawn "
                    f"from {knobs.dataset!r}; the trainer must call before_batch before drawing prompts"
                )
            self._apply(knobs)
        return {"control/curriculum_phase": float(phase)}

    def state_dict(self) -> dict[str, Any]:
        return {}  # the phase is a function of the step

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
