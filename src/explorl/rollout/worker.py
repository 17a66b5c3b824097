"""The asynchronous rollout worker (``rollout.async``): sampling jobs and weight pushes run in the
order they were queued, on a copy of the policy, beside the trainer.

Two kinds (``rollout.async.worker``):

- ``process`` (``auto`` on the CPU with the ``hf`` engine): a forked child holding its own copy of
  the policy, the engine and the verifiers. The lab's models are small enough that sampling is
  mostly Python between short ops, and two Python threads share one interpreter lock: on the
  quickstart a sampling thread took 85 ms beside the trainer instead of 28 ms alone, so a thread
  overlapped nothing. A child process has its own interpreter; a push pickles the weights
  through a pipe (a few MB for the lab models). While it overlaps the trainer the child runs
  torch on one intra-op thread: OpenMP is not fork-safe above one thread (the verifier pool
  avoids fork for the same reason).
- ``thread`` (``auto`` on CUDA or with ``vllm``): a thread in the trainer's process. Accelerator
  kernels and vLLM release the lock for the whole sampling call, and CUDA cannot be forked. A
  push is an in-memory copy; the ``vllm`` engine's own push (``sync_weights``) runs in the thread.

Jobs and pushes share one FIFO queue, so the weights a job samples with are fixed when it is
queued (the pushes queued before it), not by timing: a run is reproducible.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing as mp
import queue
import signal
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing import forkserver
from typing import Any

import torch

from explorl.adapters import load_snapshot_, rollout_copy, snapshot
from explorl.rollout.collect import Draw

# sample(step, draw, model, version) -> Collected: phases 1–2 of one step with ``model``, the
# weights after ``version`` trainer steps.
Sample = Callable[[int, Any, torch.nn.Module, int], Any]


class ThreadWorker:
    """Jobs on a thread; ``self.model`` holds the weights of version ``self.version``.

    ``shared``: sample with ``policy`` itself, not a copy (max_staleness 0: the trainer waits
    while the worker samples, so nothing changes the weights meanwhile). A copy's tensors sit at
    other addresses, and CPU matmul kernels round differently by alignment: sharing keeps the
    synchronous run's numbers bit for bit."""

    def __init__(self, sample: Sample, policy: torch.nn.Module, version: int, threads: int, *,
                 shared: bool = False) -> None:
        self.shared = shared
        self.model = policy if shared else rollout_copy(policy)
        self._sample, self.version, self.threads = sample, version, threads
        self._queue: queue.Queue = queue.Queue()
        self._idle_s = 0.0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="explorl-rollout", daemon=True)
        self._thread.start()

    def _submit(self, job: Callable[[], Any]) -> Future:
        fut: Future = Future()
        self._queue.put((fut, job))
        return fut

    def sample(self, step: int, draw) -> Future:
        """Queue step ``step``'s sampling; the future holds its ``Collected``."""
        return self._submit(lambda: self._sample(step, draw, self.model, self.version))

    def push(self, policy: torch.nn.Module, version: int) -> None:
        """Queue the weights ``policy`` holds now (copied here, loaded when the queue reaches
        them: jobs queued earlier keep sampling with the weights they were queued behind)."""
        tensors = None if self.shared else snapshot(policy)
        if tensors and tensors[0].is_cuda:  # the copies are complete before the worker reads them
            torch.cuda.current_stream(tensors[0].device).synchronize()

        def load() -> None:
            if tensors is not None:
                load_snapshot_(self.model, tensors)
            self.version = version

        self._submit(load)

    def drain(self) -> None:
        """Wait until every queued job and push has run."""
        self._submit(lambda: None).result()

    def pop_idle_s(self) -> float:
        """Seconds the worker waited for work since the last call."""
        with self._lock:
            idle, self._idle_s = self._idle_s, 0.0
        return idle

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        torch.set_num_threads(self.threads)  # per calling thread under OpenMP
        device = next(self.model.parameters()).device
        # CUDA: the worker's kernels on a stream of their own, or they would queue behind the
        # update's on the default stream and overlap nothing.
        side = torch.cuda.Stream(device) if device.type == "cuda" and not self.shared else None
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            while True:
                t0 = time.perf_counter()
                item = self._queue.get()
                with self._lock:
                    self._idle_s += time.perf_counter() - t0
                if item is None:
                    return
                fut, job = item
                try:
                    out = job()
                    if side is not None:  # done before the trainer's stream reads it
                        side.synchronize()
                        _hand_over(out, torch.cuda.default_stream(device))
                    fut.set_result(out)
                except BaseException as e:  # handed to the trainer, which waits on the future
                    fut.set_exception(e)


def _hand_over(obj: Any, stream) -> None:
    """Mark the CUDA tensors of a job's result as used by the trainer's ``stream``: the caching
    allocator then keeps their memory from the worker's stream until the trainer is done."""
    if isinstance(obj, torch.Tensor):
        if obj.is_cuda:
            obj.record_stream(stream)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            _hand_over(getattr(obj, f.name), stream)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _hand_over(x, stream)
    elif isinstance(obj, dict):
        for x in obj.values():
            _hand_over(x, stream)


class ProcessWorker:
    """Jobs in a forked child, on its copy of ``policy`` (a fork keeps the addresses, so the
    kernels round as the trainer's would). ``data_of(tag) -> (data, order)``; ``after_fork()``
    runs first in the child (fresh verifier workers). A job sends its draw's data-order state
    and gets back the state after its refill rounds (dynamic sampling), which the trainer loads
    (``order_state``).

    A reader thread takes the child's replies as they come: a push (megabytes) and a reply can
    then cross in the pipe without each side waiting for the other to read."""

    def __init__(self, sample: Sample, policy: torch.nn.Module, version: int, threads: int, *,
                 data_of: Callable, after_fork: Callable) -> None:
        ctx = mp.get_context("fork")
        self._conn, child = ctx.Pipe(duplex=True)
        self._proc = ctx.Process(target=_serve, name="explorl-rollout", daemon=True,
                                 args=(child, sample, policy, version, threads, data_of,
                                       after_fork))
        self._proc.start()
        child.close()
        self._waiting: deque[Future] = deque()  # replies come back in this order
        self._lock = threading.Lock()
        self._idle_s = 0.0
        self._reader = threading.Thread(target=self._read, name="explorl-rollout-reader",
                                        daemon=True)
        self._reader.start()

    def _ask(self, msg: tuple) -> Future:
        fut: Future = Future()
        with self._lock:
            self._waiting.append(fut)
        self._conn.send(msg)
        return fut

    def _read(self) -> None:
        while True:
            try:
                kind, value, extra, idle = self._conn.recv()
            except (EOFError, OSError):
                with self._lock:
                    waiting, self._waiting = list(self._waiting), deque()
                for fut in waiting:
                    fut.set_exception(RuntimeError("the rollout worker process exited"))
                return
            with self._lock:
                self._idle_s += idle
                fut = self._waiting.popleft()
            if kind == "error":
                fut.set_exception(RuntimeError(f"in the rollout worker process:\n{value}"))
            else:
                fut.order_state = extra
                fut.set_result(value)

    def sample(self, step: int, draw) -> Future:
        """Queue step ``step``'s sampling; the future holds its ``Collected`` and, as
        ``order_state``, the data order after it (None when it drew no refill round)."""
        return self._ask(("sample", step, draw.knobs, draw.batch, draw.tag,
                          draw.order.state_dict()))

    def push(self, policy: torch.nn.Module, version: int) -> None:
        self._conn.send(("push", snapshot(policy), version))

    def drain(self) -> None:
        self._ask(("ping",)).result()

    def pop_idle_s(self) -> float:
        with self._lock:
            idle, self._idle_s = self._idle_s, 0.0
        return idle

    def close(self) -> None:
        if self._proc.is_alive():
            try:
                self._conn.send(("close",))
            except (BrokenPipeError, OSError):
                pass
            self._proc.join(timeout=30)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout=5)
        self._reader.join(timeout=5)
        self._conn.close()


def _serve(conn, sample: Sample, model: torch.nn.Module, version: int, threads: int,
           data_of: Callable, after_fork: Callable) -> None:
    """The child's loop: the parent's memory at the fork is its own copy (``model`` included)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    # Daemonic (it dies with the trainer) yet allowed children: its own verifier workers.
    mp.current_process()._config["daemon"] = False
    # The parent's forkserver (its verifier workers' parent) is not this process's child: start
    # our own on first use instead of waiting on a pid we cannot wait for.
    fs = forkserver._forkserver
    fs._forkserver_pid = fs._forkserver_address = fs._forkserver_alive_fd = None
    torch.set_num_threads(threads)
    cleanup = after_fork()  # what the child closes before it exits (its verifier pool)
    idle = 0.0
    while True:
        t0 = time.perf_counter()
        try:
            msg = conn.recv()
        except EOFError:
            msg = ("close",)
        idle += time.perf_counter() - t0
        if msg[0] == "close":  # else the exit waits on the pool's workers (the parent's 30 s)
            if callable(cleanup):
                cleanup()
            return
        if msg[0] == "push":
            load_snapshot_(model, msg[1])
            version = msg[2]
            continue
        try:
            if msg[0] == "ping":
                reply = ("ok", None, None)
            else:
                _, step, knobs, batch, tag, order_state = msg
                data, order = data_of(tag)
                order.load_state_dict(order_state)
                got = sample(step, Draw(knobs, batch, data, order, tag), model, version)
                after = order.state_dict()
                reply = ("ok", got, after if after != order_state else None)
        except BaseException:
            reply = ("error", traceback.format_exc(), None)
        conn.send((*reply, idle))
        idle = 0.0
