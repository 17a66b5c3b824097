"""How the verifier pool starts and stops its worker processes: what they must not inherit from
the caller (its ``__main__`` script, its stop-signal handlers) and the exit hook that kills them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import types
import weakref
from collections.abc import Collection, Iterator

PARENT_DECIDES = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


@contextlib.contextmanager
def stop_signals_ignored() -> Iterator[None]:
    """Start processes that ignore the stop signals from their first instruction: else a
    SIGUSR1 sent to the whole job (SLURM's ``--signal``) kills the forkserver (started with the
    first worker), and with it (``PR_SET_PDEATHSIG``) the workers of the step being finished."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {sig: signal.signal(sig, signal.SIG_IGN) for sig in PARENT_DECIDES}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def main_hidden() -> Iterator[None]:
    """Start processes without making them re-import the caller's ``__main__`` script.

    forkserver and spawn children normally re-run the main script (as ``__mp_main__``) so
    that objects defined there can be unpickled; our workers need nothing from it, and a
    script that builds a trainer at top level (no ``if __name__ == "__main__"`` guard) would
    build one again in every worker. multiprocessing decides what to re-import from
    ``sys.modules["__main__"]`` when a process (or the forkserver) starts, so a module with no
    file or spec stands in for it during ``start()``.
    """
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def close_if_alive(ref: weakref.ref) -> None:
    """The exit hook of a ``VerifierPool`` (a weak reference): close it if it still exists."""
    pool = ref()
    if pool is not None:
        pool.close()


MARK = "EXPLORL_POOL_WORKER"
"""An environment variable every worker sets to its own token. The kernel's view of a process's
environment (``/proc/PID/environ``) is the block it was started with, so it shows the mark in
the programs a worker's descendants start (``exec`` copies the environment), not in the worker
nor its forked children: those carry the token in their name (``process_name``), which ``fork``
copies. Either way a descendant that escaped the worker's tree (its death reparented it) can
still be found (``marked``)."""

_NAME_PREFIX = "xrl-"


def process_name(token: str) -> str:
    """The name (``/proc/PID/comm``, 15 bytes at most) a worker with ``token`` and its forked
    descendants carry: ``xrl-`` and the token's first 10 hex digits."""
    return _NAME_PREFIX + token[:10]

_PR_SET_PDEATHSIG, _PR_SET_NAME, _PR_SET_CHILD_SUBREAPER = 1, 15, 36


def isolate_worker(token: str, quiet: bool) -> None:
    """Run first in a worker: what a tool or verifier does to its own process group, its parent
    or its output must not reach the trainer.

    - A session and process group of its own (``os.setsid``): ``os.killpg(0, ...)`` in user code
      reaches this worker's tree, not the trainer's group; Ctrl-C (the terminal's group) no
      longer reaches it (the parent decides when workers stop, ``PARENT_DECIDES``).
    - Linux: it dies with its parent, the forkserver (``PR_SET_PDEATHSIG``), and adopts its
      orphaned descendants (``PR_SET_CHILD_SUBREAPER``): a double-forked, ``setsid`` grandchild
      stays in its tree, where ``kill_tree`` finds it.
    - It closes the descriptors multiprocessing hands every child (the forkserver's "alive"
      pipe, the resource tracker's): a grandchild that inherited them would keep the
      forkserver and the tracker running after the trainer ends.
    - ``quiet``: standard input, output and error are ``/dev/null`` (a tool's prints stay out
      of the run's log, its children's too).
    - Its token marks it and what it starts (``MARK``, ``process_name``).
    """
    os.environ[MARK] = token
    try:
        os.setsid()
    except OSError:  # already a session leader
        pass
    if sys.platform == "linux":
        try:
            import ctypes

            libc = ctypes.CDLL(None)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            libc.prctl(_PR_SET_CHILD_SUBREAPER, 1)
            libc.prctl(_PR_SET_NAME, process_name(token).encode())
        except Exception:
            pass
    try:
        from multiprocessing import forkserver, resource_tracker

        for owner, attr in ((forkserver._forkserver, "_forkserver_alive_fd"),
                            (resource_tracker._resource_tracker, "_fd")):
            fd = getattr(owner, attr, None)
            if fd is not None:
                setattr(owner, attr, None)  # a later use starts its own
                with contextlib.suppress(OSError):
                    os.close(fd)
    except (ImportError, AttributeError):
        pass
    if quiet:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)


def _descendants(pid: int) -> list:
    """``pid``'s live descendants (zombies left out), or [] when it is gone or psutil is not
    installed."""
    try:
        import psutil

        out = []
        for p in psutil.Process(pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
        return out
    except Exception:  # NoSuchProcess, ImportError
        return []


def kill_tree(pid: int, passes: int = 20) -> None:
    """SIGKILL a worker, its process group and every descendant it has adopted (it is a
    subreaper, ``isolate_worker``): the worker is killed last, so descendants orphaned meanwhile
    are still its children. A tree that forks while it is being killed is swept again, up to
    ``passes`` times."""
    for _ in range(passes):
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)  # its group (ESRCH before its setsid: none yet)
        kids = _descendants(pid)
        for p in kids:
            with contextlib.suppress(Exception):
                p.kill()
        if not kids:
            break
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


def marked(tokens: Collection[str]) -> list:
    """The processes (psutil) that carry one of ``tokens``: by name (a worker and its forked
    descendants) or by ``MARK`` in their environment (the programs they started); [] without
    psutil."""
    try:
        import psutil
    except ImportError:
        return []
    if not tokens:
        return []
    names, me, out = {process_name(t) for t in tokens}, os.getpid(), []
    for p in psutil.process_iter():
        if p.pid == me:
            continue
        try:
            if ((p.name() in names or p.environ().get(MARK) in tokens)
                    and p.status() != psutil.STATUS_ZOMBIE):  # a zombie is dead already
                out.append(p)
        except (psutil.Error, OSError):
            pass
    return out


def sweep(tokens: Collection[str]) -> int:
    """SIGKILL every process that carries one of ``tokens`` (``marked``: a worker's descendant
    that its worker's death left behind, or a worker itself); returns how many."""
    n = 0
    for p in marked(tokens):
        with contextlib.suppress(Exception):
            p.kill()
            n += 1
    return n


def _own_children() -> list[int]:
    """This process's children, zombies included (Linux: ``/proc/self/task/*/children``, a
    few microseconds; elsewhere psutil)."""
    try:
        out = []
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/children") as f:
                out += [int(p) for p in f.read().split()]
        return out
    except OSError:
        try:
            import psutil

            return [p.pid for p in psutil.Process().children()]
        except Exception:
            return []


def end_children(passes: int = 20) -> int:
    """In a worker, after each job: SIGKILL every process the job started, their descendants
    included (orphans came back to the worker, a subreaper), and reap them; returns how many
    children it found. Nothing a call starts outlives the call."""
    found = 0
    for _ in range(passes):
        kids = _own_children()
        if not kids:
            break
        found += len(kids)
        for pid in kids:
            for p in _descendants(pid):
                with contextlib.suppress(Exception):
                    p.kill()
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for pid in kids:
            with contextlib.suppress(OSError):
                os.waitpid(pid, 0)
    return found
