"""# 0–2 of a step for the loop and the rollout worker (``rollout.async``): the controllers decide
the knobs and the prompts are drawn (``draw``, in the trainer's process), then the batch is
sampled and scored with given weights (``sample``, ``collect``)."""

from __future__ import annotations

from explorl.rollout.progress import phase
from explorl.training.collect import Collected, Draw, collect
from explorl.training.metrics import timed


def draw(t, step: int, metrics: dict) -> Draw:
    """# 0. trainer ``t``'s controllers decide step ``step``'s knobs (the dataset before the
    prompts are drawn); their metrics go to ``metrics``."""
    with timed(metrics, "time/control_s"):
        metrics.update(t.control.before_batch(step))
        anneal = t.knobs.dataset == "anneal" and t.anneal_order is not None
        data, order, tag = ((t.anneal_data, t.anneal_order, "anneal") if anneal
                            else (t.train_data, t.order, "train"))
        batch = order.next_batch()
        metrics.update(t.control.before_step(step, batch[0]))
    return Draw(t.knobs, batch, data, order, tag)


def sample(t, step: int, d: Draw, policy, version) -> Collected:
    """# 1. sample  2. score this rank's share of ``d`` with ``policy`` (weights ``version``)."""
    with t.amp(), phase(f"step {step} sampling"):  # named in progress lines
        return collect(cfg=t.cfg, step=step, knobs=d.knobs, batch=d.batch, order=d.order,
                       data=d.data, prompt_ids=t.prompts.ids_of(d.data, d.tag),
                       sampler=t.sampler, policy=policy, version=version, pool=t.pool,
                       rewarder=t.rewarder, dist=t.dist)
