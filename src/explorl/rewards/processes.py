"""How the verifier pool starts and stops its worker processes: what they must not inherit from
the caller (its ``__main__`` script, its stop-signal handlers) and the exit hook that kills them.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import types
import weakref
from collections.abc import Iterator

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
