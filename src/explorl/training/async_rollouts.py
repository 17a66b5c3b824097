"""# 0–2 ahead of the update (``rollout.async``, docs/rollout-engines.md §8): the batches of the
coming steps are drawn, sampled and scored by the rollout worker while the trainer updates on the
current one.

Step t's batch is drawn in the trainer's thread (phase 0: the controllers decide its knobs k_t)
and queued on the worker behind the weights last pushed; after each update the new weights are
pushed. With ``max_staleness`` s the trainer keeps the batches of steps t+1 … t+s queued while it
trains on step t, so batch t+s is sampled with the weights after step t−1: s updates older than
the trainer's at the start of its own update. s = 0 queues step t's batch only once step t−1 has
updated and pushed: the synchronous run, bit for bit.

Each batch keeps the knobs that sampled it: its update (temperature of the log-probs, the
controllers' ``before_update``/``after_step``) reads k_t, not the knobs the controllers have
decided since for the batches queued behind it.

A checkpoint waits for the queued batches and stores them (``state_dict``): a resumed run trains
on the very batches the uninterrupted one would have, sampled with the same (older) weights.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from explorl.errors import ConfigError
from explorl.rewards.pool import VerifierPool
from explorl.training import sampling
from explorl.training.batch import StepBatch
from explorl.training.collect import Collected, Draw
from explorl.training.worker import ProcessWorker, ThreadWorker

log = logging.getLogger(__name__)

__all__ = ["AsyncRollouts", "Draw", "clip_note", "for_trainer", "sampling_entropy",
           "split_threads", "worker_kind"]


@dataclass
class _Queued:
    step: int
    draw: Draw
    metrics: dict[str, float]  # phase 0's (controller decisions), logged with this step
    future: Any = None  # the worker's reply
    got: Collected | None = field(default=None, repr=False)  # restored from a checkpoint

    def result(self) -> Collected:
        if self.got is None:
            self.got = self.future.result()
            state = getattr(self.future, "order_state", None)
            if state is not None:  # a process worker's refill rounds drew from its own copy
                self.draw.order.load_state_dict(state)
            self.future = None
        return self.got


def worker_kind(cfg, device: torch.device) -> str:
    """``rollout.async.worker``: ``auto`` is a process on the CPU with the ``hf`` engine and
    max_staleness > 0, else a thread (training/worker.py says why)."""
    a = cfg.rollout.async_
    if a.worker == "auto":  # max_staleness 0 overlaps nothing: no process needed
        cpu_hf = device.type == "cpu" and cfg.rollout.engine == "hf"
        return "process" if cpu_hf and a.max_staleness > 0 else "thread"
    return a.worker


def split_threads(cpu_threads: int | None, kind: str) -> tuple[int, int]:
    """(trainer, sampler) intra-op threads on the CPU while both phases run: a process worker
    samples on one (training/worker.py), a thread worker on half of the cores; the trainer on
    ``model.cpu_threads`` when set, else on the other cores."""
    cores = os.cpu_count() or 2
    sampler = 1 if kind == "process" else (cpu_threads or max(1, cores // 2))
    return (cpu_threads or max(1, cores - sampler)), sampler


def clip_note(cfg, old_logp: str) -> str | None:
    """What the clip and the behaviour weight see under ``rollout.async`` (printed at start), or
    None when it is the decoupled PPO of docs/rollout-engines.md §8 or there is no staleness."""
    a = cfg.rollout.async_
    if not a.enabled or a.max_staleness == 0:
        return None
    s = a.max_staleness
    if old_logp != "recompute":
        return (f"rollout.async: the loss's ratio (the PPO clip; SAPO's gate; VESPO's W) is "
                f"π_θ/μ, μ the sampler's log-probs (weights up to {s} updates old), not "
                f"π_θ/π_prox: stale tokens are clipped twice as hard and carry no behaviour "
                f"weight (algorithm.old_logp: {cfg.algorithm.old_logp}; auto or recompute gives "
                "decoupled PPO)")
    if cfg.algorithm.rollout_correction.mode == "off":
        return ("rollout.async: the loss's ratio is π_θ/π_prox; algorithm.rollout_correction."
                "mode: off leaves the behaviour weight π_prox/μ out (stale tokens count fully; "
                "VESPO's W misses its staleness factor)")
    return None


class AsyncRollouts:
    """The queue of batches sampled ahead, for one trainer.

    ``draw(step, metrics) -> Draw`` runs phase 0 in the trainer's thread; ``sample(step, draw,
    policy, version) -> Collected`` runs phases 1–2 on the worker; ``data_of(tag)`` gives
    (data, order) for a restored batch; ``after_fork`` runs first in a process worker.
    """

    def __init__(self, max_staleness: int, max_steps: int, draw: Callable, sample: Callable,
                 data_of: Callable, *, stale_logp: bool, kind: str = "thread",
                 after_fork: Callable[[], None] = lambda: None) -> None:
        self.max_staleness, self.max_steps, self.kind = max_staleness, max_steps, kind
        self._draw, self._sample_fn, self._data_of = draw, sample, data_of
        self._after_fork = after_fork
        # The update recomputes π_prox: keep the sampler's log-probs μ for the behaviour weight.
        self.stale_logp = stale_logp and max_staleness > 0
        self.queued: collections.deque[_Queued] = collections.deque()
        self.worker: ThreadWorker | ProcessWorker | None = None
        self._policy = self._version = self._threads = None

    def start(self, policy: torch.nn.Module, version: int, threads: int) -> None:
        """Start the worker, at first use, with a copy of ``policy`` (``version`` trainer steps
        done; a resume replaces it) and ``threads`` intra-op threads."""
        self._policy, self._version, self._threads = policy, version, threads

    def _sample(self, step: int, draw: Draw, model: torch.nn.Module, version: int) -> Collected:
        """Phases 1–2 on the worker, each response marked with the weights' version."""
        got = self._sample_fn(step, draw, model, ("async", version))
        ro = got.rollouts
        ro.version = torch.full((len(ro),), version, dtype=torch.long, device=ro.device)
        if self.stale_logp and ro.engine_logp is None:  # hf: μ is the sampler's own log-probs
            ro.engine_logp = ro.old_logp.clone()
        return got

    def _worker(self) -> ThreadWorker | ProcessWorker:
        if self.worker is None:  # first use: after a resume has loaded the weights
            if self.kind == "process":
                self.worker = ProcessWorker(self._sample, self._policy, self._version,
                                            self._threads, data_of=self._data_of,
                                            after_fork=self._after_fork,
                                            slots=self.max_staleness + 2)
            else:
                self.worker = ThreadWorker(self._sample, self._policy, self._version,
                                           self._threads, shared=self.max_staleness == 0)
        return self.worker

    def _queue(self, item: _Queued) -> None:
        item.future, item.got = self._worker().sample(item.step, item.draw), None
        self.queued.append(item)

    def _draw_and_queue(self, step: int) -> None:
        metrics: dict[str, float] = {}
        self._queue(_Queued(step, self._draw(step, metrics), metrics))

    def next(self, step: int, metrics: dict) -> tuple[Draw, Collected]:
        """Step ``step``'s draw and collected batch; queues the batches up to ``step`` +
        ``max_staleness``. Adds phase 0's metrics and ``async/*`` to ``metrics``."""
        if not self.queued:
            self._draw_and_queue(step)
        item = self.queued.popleft()
        assert item.step == step, f"queued batch of step {item.step}, training step {step}"
        t0 = time.perf_counter()
        got = item.result()
        dropped = 0
        oldest = step - 1 - int(got.rollouts.version.min()) if len(got.rollouts) else 0
        if oldest > self.max_staleness:  # e.g. restored from a run with a larger bound
            dropped = 1
            log.warning("step %d: batch sampled %d updates ago > rollout.async.max_staleness=%d: "
                        "dropped and sampled again", step, oldest, self.max_staleness)
            self._queue(_Queued(step, item.draw, item.metrics))
            item = self.queued.pop()
            got = item.result()
        waited = time.perf_counter() - t0
        last = self.queued[-1].step if self.queued else step
        for j in range(last + 1, min(step + self.max_staleness, self.max_steps) + 1):
            self._draw_and_queue(j)
        stale = (step - 1 - got.rollouts.version).double()
        metrics.update(item.metrics)
        metrics.update({
            "async/staleness_mean": float(stale.mean()) if len(stale) else 0.0,
            "async/staleness_max": float(stale.max()) if len(stale) else 0.0,
            "async/dropped": float(dropped),
            "time/trainer_idle_s": waited,
            "time/sampler_idle_s": self.worker.pop_idle_s() if self.worker else 0.0,
        })
        return item.draw, got

    def push(self, policy: torch.nn.Module, version: int) -> None:
        """The weights after ``version`` trainer steps, for the batches queued from now on."""
        self._worker().push(policy, version)

    def release_engine(self) -> None:
        """Wait until the worker is done with the trainer's engine (before validation uses it): a
        thread worker samples with it, a process worker has its own copy."""
        if self.kind == "thread":
            self.wait_idle()

    def wait_idle(self) -> None:
        """Wait until the worker has sampled everything queued (before anything else uses the
        engine: validation)."""
        if self.worker is not None:
            self.worker.drain()

    def state_dict(self) -> dict:
        """The queued batches, sampled (waits for the worker)."""
        self.wait_idle()
        return {"queued": [{"step": q.step, "knobs": q.draw.knobs, "batch": q.draw.batch,
                            "tag": q.draw.tag, "metrics": q.metrics, "got": q.result()}
                           for q in self.queued]}

    def load_state_dict(self, state: dict | None, version: int) -> None:
        """Put back a checkpoint's queued batches; the worker starts from the restored weights
        (``version`` trainer steps done)."""
        self._version = version
        self.queued.clear()
        for q in (state or {}).get("queued", []):
            data, order = self._data_of(q["tag"])
            draw = Draw(q["knobs"], q["batch"], data, order, q["tag"])
            self.queued.append(_Queued(q["step"], draw, q["metrics"], got=q["got"]))

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None


@contextlib.contextmanager
def sampling_entropy(rollouts: AsyncRollouts | None, sb: StepBatch):
    """Keep the batch's sampling-time entropy through the π_prox recompute when it may be stale
    (docs/rollout-engines.md §8: an entropy target compares with the policy that sampled, not with
    later weights); nothing to keep without ``rollout.async`` or at max_staleness 0."""
    if rollouts is None or rollouts.max_staleness == 0:
        yield
        return
    kept = sb.rows.entropy_sum.clone()
    yield
    sb.rows.entropy_sum = kept


def for_trainer(t) -> AsyncRollouts | None:
    """Trainer ``t``'s rollout worker queue (``rollout.async``), or None when it is off. On the
    CPU with max_staleness > 0 the trainer's torch threads drop to its share of the cores."""
    a = t.cfg.rollout.async_
    if not a.enabled:
        return None
    if t.dist.world_size > 1:
        raise ConfigError("rollout.async.enabled: one training process only (the worker's "
                          "gathers would interleave with the update's collectives)")
    kind, threads = worker_kind(t.cfg, t.device), torch.get_num_threads()
    if t.device.type == "cpu" and a.max_staleness > 0:  # each phase gets its cores
        trainer, threads = split_threads(t.cfg.model.cpu_threads, kind)
        torch.set_num_threads(trainer)
    data_of = {"train": (t.train_data, t.order), "anneal": (t.anneal_data, t.anneal_order)}

    def own_verifiers():  # in a forked worker: closing the inherited pool would kill the
        t.pool._closed = True  # parent's verifier workers; it gets its own instead, and closes
        t._parent_pool, t.pool = t.pool, VerifierPool.from_config(t.cfg.reward)  # it on exit
        return t.pool.close

    out = AsyncRollouts(a.max_staleness, t.cfg.max_steps, functools.partial(sampling.draw, t),
                        functools.partial(sampling.sample, t), data_of.get,
                        stale_logp=t.recompute, kind=kind, after_fork=own_verifiers)
    out.start(t._policy_now(), 0, threads)
    note = clip_note(t.cfg, t.plan.old_logp)
    if note and t.dist.is_main:
        print(note, flush=True)
    return out
