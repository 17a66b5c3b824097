"""What a training run's checkpoint holds, and putting it back: the trainer's side of
``checkpoint.py`` (which writes and reads the files atomically).

A checkpoint has the policy's weights (``save_pretrained``) and ``trainer_state.pt``: the step,
the optimizer (complete on rank 0 under FSDP), the LR schedule, the loss/shuffle RNGs, the data
order, the non-finite guard, the run watch, the knobs and every controller's state, and under
``rollout.async`` the batches sampled ahead (``training.async_rollouts``). Sampling
seeds depend on the step only and the state holds no per-rank stream, so a checkpoint resumes at
any number of processes, and the resumed run reproduces the uninterrupted one (with the same
torch thread count: on some CPUs one and two threads round differently; a resume at another count
warns).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from explorl.outputs.checkpoint import load_state, rng_state, save_checkpoint, set_rng_state
from explorl.training.watch import TrainingDiverged

log = logging.getLogger(__name__)


def state_of(t) -> dict:
    """The trainer ``t``'s resumable state (everything but the weights)."""
    anneal = t.anneal_order.state_dict() if t.anneal_order else None
    return {"step": t.step, "optimizer": t.dist.optimizer_state(t.scorer, t.optimizer),
            "scheduler": t.scheduler.state_dict(), "rng": rng_state(t.generators),
            "data": t.order.state_dict(), "anneal_data": anneal,
            "guard": t.watch.guard.state_dict(), "watch": t.watch.state_dict(),
            "torch_threads": torch.get_num_threads(), "memory": t.update.memory.state_dict(),
            **({"async": t.rollouts.state_dict()} if t.rollouts is not None else {}),
            **t.control.state_dict()}


def restore(t, ckpt: Path) -> None:
    """Put the state of checkpoint ``ckpt`` back into trainer ``t`` (its weights are loaded
    with the model)."""
    state = load_state(ckpt)
    t.step = state["step"]
    t.watch.guard.load_state_dict(state.get("guard", {}))
    t.watch.load_state_dict(state.get("watch", {}))
    t.update.memory.load_state_dict(state.get("memory", {}))  # micro-batches halved on an OOM
    t.dist.load_optimizer_state(t.scorer, t.optimizer, state["optimizer"])
    t.scheduler.load_state_dict(state["scheduler"])
    t.order.load_state_dict(state["data"])
    if t.anneal_order and state.get("anneal_data"):
        t.anneal_order.load_state_dict(state["anneal_data"])
    t.control.load_state_dict(state, where=f"checkpoint {ckpt}")
    set_rng_state(state["rng"], t.generators)
    if t.rollouts is not None:  # the batches sampled ahead (rollout.async)
        t.rollouts.load_state_dict(state.get("async"), version=t.step)
    threads = state.get("torch_threads")
    if threads is not None and threads != torch.get_num_threads():
        log.warning(
            "checkpoint %s was written with %d torch threads and this process has %d: on some "
            "CPUs the thread count changes float rounding, so the resumed run may not reproduce "
            "the uninterrupted one bit for bit (set model.cpu_threads=%d, or OMP_NUM_THREADS=%d "
            "when the recipe leaves it unset, to match)",
            ckpt, threads, torch.get_num_threads(), threads, threads)


def save(t) -> Path:
    """Rank 0 writes ``checkpoints/step-N`` (weights and state are the same on every rank); the
    others wait. Non-finite weights are never written: the last good checkpoint stays the latest."""
    state, policy = state_of(t), t._policy_now()
    if not all(bool(torch.isfinite(p).all()) for p in policy.parameters()):
        raise TrainingDiverged(f"step {t.step}: the weights are not finite; no checkpoint written")
    path = t.out / "checkpoints" / f"step-{t.step}"
    if t.dist.is_main:
        path = save_checkpoint(t.out, t.step, policy, t.tokenizer, state,
                               save_model=t.cfg.log.save_model, keep=t.cfg.log.keep_checkpoints)
    t.dist.barrier()
    return path
