"""Staged curriculum for the entropy-annealing phase (Entropy Scheduling §5;
docs/methods/entropy-scheduling.md §4c).

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

from explorl.config import CurriculumControlConfig
from explorl.control.base import ControlContext, ControlError, Controller, Decision, Knobs
from explorl.control.schedules import anneal_start
from explorl.control.spec import ControllerSpec


class Curriculum(Controller):
    """Switch dataset, rollout count and length limit at the start of the annealing phase.

    Settings: ``control.curriculum`` (``CurriculumControlConfig``): start_ratio (ES: the last
    10%), n_samples and max_response_len in the phase (None = unchanged). ``anneal_dataset``:
    switch ``knobs.dataset`` to ``"anneal"`` (the trainer sets it when the recipe has a
    ``data.anneal`` dataset); ``start_step``: an explicit first step (1-based) of the phase.

    Metric (before_step): ``control/curriculum_phase``: 1.0 in the annealing phase, else 0.0.
    """

    name = "curriculum"
    actuators = ("curriculum",)

    def __init__(self, cfg: CurriculumControlConfig, *, anneal_dataset: bool = False,
                 start_step: int | None = None) -> None:
        self.start_ratio, self.start_step = cfg.start_ratio, start_step
        self.n_samples, self.max_response_len = cfg.n_samples, cfg.max_response_len
        self.anneal_dataset = anneal_dataset
        self.start: int | None = None  # first step of the phase; None = no phase

    def setup(self, ctx: ControlContext, knobs: Knobs) -> None:
        if self.start_step is not None:
            self.start = self.start_step
        else:
            self.start = anneal_start(ctx.max_steps, self.start_ratio)

    def in_phase(self, step: int) -> bool:
        return self.start is not None and step >= self.start

    def _changes(self) -> dict:
        out: dict = {}
        if self.anneal_dataset:
            out["dataset"] = "anneal"
        if self.n_samples is not None:
            out["n_samples"] = self.n_samples
        if self.max_response_len is not None:
            out["max_response_len"] = self.max_response_len
        return out

    def before_batch(self, step: int, knobs: Knobs) -> Decision:
        # The dataset decides which prompts step t draws, so it must be set before they are.
        return Decision(knobs=self._changes() if self.in_phase(step) else {})

    def before_step(self, step: int, knobs: Knobs, prompt_indices: list[int]) -> Decision:
        phase = self.in_phase(step)
        if phase and self.anneal_dataset and knobs.dataset != "anneal":
            raise ControlError(
                f"curriculum: step {step} is in the annealing phase but its prompts were drawn "
                f"from {knobs.dataset!r}; the trainer must call before_batch before drawing prompts"
            )
        return Decision(metrics={"control/curriculum_phase": float(phase)})

    def state_dict(self) -> dict[str, Any]:
        return {}  # the phase is a function of the step

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


SPEC = ControllerSpec(
    name="curriculum",
    cls=Curriculum,
    build=lambda section, anneal_dataset=False: Curriculum(section, anneal_dataset=anneal_dataset),
    metrics={"control/curriculum_phase": "1 in the annealing phase, else 0"},
)
