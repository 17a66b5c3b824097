"""Stopping a run cleanly: on a signal, by the clock's checkpoints, and on the run's own stops.

- **Signals.** SIGINT (Ctrl-C), SIGTERM (what a cluster sends: SLURM before the time limit or on
  preemption, Kubernetes on eviction, ``timeout``) and SIGUSR1 (SLURM's ``--signal=USR1@90``)
  ask the loop to finish the current step, write a checkpoint and return; a second one aborts.
  The request is one of the values the step's single reduction sums (``dist.sum_dict``), so the
  ranks of a distributed run stop after the same step even when only one got the signal.
- **Checkpoints by the clock.** ``log.checkpoint_every_minutes`` after the last checkpoint, the
  next step ends with one, so a kill -9 loses at most that much work. The decision rides on the
  same reduction: the ranks always save together.
- **Stops of the run's own** (the non-finite guard, failing rewards): ``keep_last_weights``
  writes a checkpoint of the current weights (finite: a skipped update leaves them untouched)
  when none holds them yet, and names it in the error. An out-of-memory stop (``memory``) comes
  mid-step, so it writes none and names the last checkpoint.

Exit codes (``explorl train``, docs/failures.md): 0 finished; 2 an error or a stop of the run's
own; 75 stopped by SIGTERM/SIGUSR1 after writing its checkpoint (sysexits' EX_TEMPFAIL: resume to
continue); 130 stopped by Ctrl-C; 128 + the signal's number when a second signal aborts.
"""

from __future__ import annotations

import contextlib
import signal
import time
from pathlib import Path

from explorl.errors import EnvironmentFailed, ExplorlError, OutOfMemory
from explorl.outputs.checkpoint import checkpoint_step, latest_checkpoint
from explorl.training.watch import RewardFailures, TrainingDiverged

PREEMPTED = 75
"""Exit status of a run stopped by SIGTERM or SIGUSR1 that wrote its checkpoint."""
INTERRUPTED = 130
"""Exit status of a run stopped by Ctrl-C (SIGINT), as a shell reports it."""
STOP_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGINT")
"""The signals that stop a run cleanly, in the order one is reported when ranks got several."""

clock = time.monotonic
"""The checkpoint timer's clock (seconds); tests replace it rather than wait for minutes."""


class SignalAbort(KeyboardInterrupt):
    """A second stop signal: the run aborts without a checkpoint (exit 128 + the signal)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.code = 128 + signum


class StopRequests:
    """This rank's pending stop signal and checkpoint timer, and what the ranks agreed on."""

    def __init__(self, every_minutes: float, every_steps: int = 0) -> None:
        self.every_s = 60.0 * every_minutes  # 0: no checkpoints by the clock
        self.every_steps = every_steps  # 0: none by the step count
        self.pending: str | None = None  # the first stop signal this rank received
        self.agreed: str | None = None  # the stop every rank applies, after a step's reduction
        self.save_due = False
        self.last_save = clock()
        self.saved_at: int | None = None  # the step of the last checkpoint this process wrote

    def on_signal(self, signum: int) -> bool:
        """Record a signal; True when one was already pending (the caller aborts)."""
        was, self.pending = self.pending, self.pending or signal.Signals(signum).name
        return was is not None

    def flags(self) -> dict[str, float]:
        """Values for the step's reduction: each stop signal, and whether a save is due."""
        due = self.every_s > 0 and clock() - self.last_save >= self.every_s
        return {**{f"stop/{s}": float(self.pending == s) for s in STOP_SIGNALS},
                "stop/save_due": float(due)}

    def merge(self, total: dict[str, float]) -> bool:
        """Take the reduced flags out of ``total``; True when the ranks stop after this step."""
        got = [s for s in STOP_SIGNALS if total.pop(f"stop/{s}", 0.0) > 0]
        self.save_due = total.pop("stop/save_due", 0.0) > 0
        self.agreed = self.agreed or (got[0] if got else None)
        return self.agreed is not None

    def checkpoint_due(self, step: int) -> bool:
        """Whether ``step`` ends with a checkpoint: ``log.checkpoint_every`` or the clock."""
        return self.save_due or bool(self.every_steps and step % self.every_steps == 0)

    def saved(self, path: Path) -> Path:
        """A checkpoint was written (``path``, returned): the timer starts again."""
        self.save_due, self.last_save, self.saved_at = False, clock(), checkpoint_step(path)
        return path


@contextlib.contextmanager
def stop_on_signals(requests: StopRequests, say):
    """Route SIGINT, SIGTERM and SIGUSR1 to ``requests`` while training; ``say(text)`` prints.
    A second signal raises ``SignalAbort`` (SIGINT: ``KeyboardInterrupt``)."""

    def handler(signum, frame):
        if requests.on_signal(signum):
            raise KeyboardInterrupt if signum == signal.SIGINT else SignalAbort(signum)
        name = signal.Signals(signum).name
        again = "Ctrl-C" if signum == signal.SIGINT else name
        say(f"[yellow]{name}: finishing this step, then writing a checkpoint ({again} again "
            f"to abort)")

    previous = {}
    for name in STOP_SIGNALS:
        num = getattr(signal, name)
        previous[num] = signal.signal(num, handler)
    try:
        yield
    finally:
        for num, old in previous.items():
            signal.signal(num, old)


@contextlib.contextmanager
def checkpoint_on_stop(trainer):
    """A stop of the run's own (the watch's ``TrainingDiverged``, ``RewardFailures``, an
    environment that cannot reset: ``EnvironmentFailed``) first checkpoints its last finite
    weights (``keep_last_weights``), then goes on."""
    try:
        yield
    except (TrainingDiverged, RewardFailures, EnvironmentFailed) as e:
        keep_last_weights(trainer, e)
        raise
    except OutOfMemory as e:  # mid-step: the weights may hold part of the step's updates
        latest = latest_checkpoint(trainer.out)
        e.args = (f"{e}; " + (f"the last checkpoint, {latest}, is kept" if latest else
                              "the run has no checkpoint yet"),)
        raise


def keep_last_weights(trainer, error: ExplorlError) -> None:
    """The run stops on its own (``error``): checkpoint its weights unless the last checkpoint
    this process wrote holds them already, and end ``error``'s message with the checkpoint it
    leaves, or with why none could be written. Every rank decides alike (from the step, not from
    the files, which another node may not see): ``save`` waits for them all."""
    if trainer.stops.saved_at == trainer.step:
        saved = trainer.out / "checkpoints" / f"step-{trainer.step}"
        note = f"checkpoint {saved} holds the weights of step {trainer.step}"
    else:
        try:
            note = (f"checkpoint {trainer.save()} holds the last finite weights "
                    f"(step {trainer.step})")
        except (ExplorlError, OSError) as e:
            why, latest = " ".join(str(e).split()), latest_checkpoint(trainer.out)
            cause = "" if why == " ".join(str(error).split()) else (
                f"no checkpoint could be written ({why}); ")  # else the error says it already
            note = cause + (f"the latest checkpoint is {latest}" if latest
                            else "the run has no checkpoint")
    error.args = (f"{error}; {note}",)


def stop_message(summary: dict, out: Path) -> tuple[str, int]:
    """The console line and exit status of a run a signal stopped (``Trainer.train``'s
    summary)."""
    by = summary.get("stopped_by") or "SIGINT"
    resume = f"explorl train --resume {out}"
    if by == "SIGINT":
        return f"interrupted; continue with: {resume}", INTERRUPTED
    return (f"stopped by {by} after step {summary['steps']}; checkpoint {summary['checkpoint']}; "
            f"continue with: {resume}", PREEMPTED)
