"""The asynchronous rollout worker (``rollout.async``): sampling jobs and weight pushes run in the
order they were queued, on a copy of the policy, beside the trainer.

Two kinds (``rollout.async.worker``):

- ``process`` (``auto`` on the CPU with the ``hf`` engine): a forked child holding its own copy of
  the policy, the engine and the verifiers. The lab's models are small enough that sampling is
  mostly Python between short ops, and two Python threads share one interpreter lock: on the
  quickstart a sampling thread took 85 ms beside the trainer instead of 28 ms alone, so a thread
  overlapped nothing. A child process has its own interpreter. A push copies the weights into
  one of a ring of shared-memory slots mapped before the fork (one memory copy, ~1 ms for the
  lab models; pickling them through the pipe cost the trainer ~17 ms a step, most of it in
  torch's shared-memory file per tensor) and sends the slot's number. Jobs and replies travel
  as plain pickles (a batch's tensors are small: copying their bytes is cheaper than torch's
  file-descriptor passing). While it overlaps the trainer the child runs torch on one intra-op
  thread: OpenMP is not fork-safe above one thread (the verifier pool avoids fork for the same
  reason).
- ``thread`` (``auto`` on CUDA or with ``vllm``): a thread in the trainer's process. Accelerator
  kernels and vLLM release the lock for the whole sampling call, and CUDA cannot be forked. A
  push is an in-memory copy; the ``vllm`` engine's own push (``sync_weights``) runs in the thread.

Jobs and pushes share one FIFO queue, so the weights a job samples with are fixed when it is
queued (the pushes queued before it), not by timing: a run is reproducible.
"""

from __future__ import annotations

import contextlib
import dataclasses
import mmap
import multiprocessing as mp
import pickle
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

from explorl.adapters import copied_tensors, load_snapshot_, rollout_copy, snapshot
from explorl.training.collect import Draw

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
            t0 = time.perf_counter()  # idle from the moment a result is handed over
            while True:
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
                    t0 = time.perf_counter()
                    fut.set_result(out)
                except BaseException as e:  # handed to the trainer, which waits on the future
                    t0 = time.perf_counter()
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


class _PushRing:
    """``slots`` copies of the pushed tensors in anonymous shared memory, mapped before the fork
    so the child sees the parent's writes (an anonymous mapping: not bounded by /dev/shm's size).

    Push n goes to slot n mod ``slots``; before writing it the parent waits until the child has
    loaded push n − ``slots`` (``loaded``, a shared counter). With ``slots`` = max_staleness + 2
    that wait never happens: the trainer pushes n only after receiving a batch queued behind push
    n − max_staleness − 1 (async_rollouts.py)."""

    def __init__(self, tensors: list[torch.Tensor], slots: int) -> None:
        self.slots = slots
        self.sizes = [t.numel() * t.element_size() for t in tensors]
        # each tensor at a 64-byte boundary (the copies vectorise; views need dtype alignment)
        self.offsets, off = [], 0
        for n in self.sizes:
            self.offsets.append(off)
            off += -(-n // 64) * 64
        self.nbytes = max(off, 64)
        self._maps = [mmap.mmap(-1, self.nbytes) for _ in range(slots)]  # MAP_SHARED
        self.views = [[torch.frombuffer(m, dtype=torch.uint8, count=n, offset=o)
                       .view(t.dtype).view(t.shape) if n else torch.empty_like(t)
                       for t, n, o in zip(tensors, self.sizes, self.offsets)]
                      for m in self._maps]
        self._count = mmap.mmap(-1, 8)
        self.loaded = torch.frombuffer(self._count, dtype=torch.int64)  # pushes the child loaded
        self.sent = 0  # pushes the parent wrote

    def write(self, tensors: list[torch.Tensor], alive: Callable[[], bool]) -> int:
        """Copy ``tensors`` into the next slot (waiting for the child to be done with it); its
        number."""
        n = self.sent
        while int(self.loaded[0]) < n - self.slots + 1:  # push n − slots not loaded yet
            if not alive():
                raise RuntimeError("the rollout worker process exited")
            time.sleep(0.001)
        slot = n % self.slots
        with torch.no_grad():
            for d, t in zip(self.views[slot], tensors, strict=True):
                d.copy_(t)
        self.sent = n + 1
        return slot

    def load(self, model: torch.nn.Module, slot: int) -> None:
        """In the child: ``model`` ← the slot's tensors; counted as loaded."""
        load_snapshot_(model, self.views[slot])
        self.loaded[0] += 1


def _send(conn, msg) -> None:
    conn.send_bytes(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))


def _recv(conn):
    return pickle.loads(conn.recv_bytes())


class ProcessWorker:
    """Jobs in a forked child, on its copy of ``policy`` (a fork keeps the addresses, so the
    kernels round as the trainer's would). ``data_of(tag) -> (data, order)``; ``after_fork()``
    runs first in the child (fresh verifier workers). A job sends its draw's data-order state
    and gets back the state after its refill rounds (dynamic sampling), which the trainer loads
    (``order_state``). ``slots``: the push ring's size (``_PushRing``: max_staleness + 2).

    A reader thread takes the child's replies as they come, so the trainer's thread never
    blocks on the pipe."""

    def __init__(self, sample: Sample, policy: torch.nn.Module, version: int, threads: int, *,
                 data_of: Callable, after_fork: Callable, slots: int = 3) -> None:
        ctx = mp.get_context("fork")
        self._conn, child = ctx.Pipe(duplex=True)
        self._ring = _PushRing(copied_tensors(policy), max(2, slots))
        self._proc = ctx.Process(target=_serve, name="explorl-rollout", daemon=True,
                                 args=(child, sample, policy, version, threads, data_of,
                                       after_fork, self._ring))
        self._proc.start()
        child.close()
        self._waiting: deque[Future] = deque()  # replies come back in this order
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()  # one message at a time on the pipe
        self._idle_s = 0.0
        self._reader = threading.Thread(target=self._read, name="explorl-rollout-reader",
                                        daemon=True)
        self._reader.start()

    def _ask(self, msg: tuple) -> Future:
        fut: Future = Future()
        with self._lock:
            self._waiting.append(fut)
        with self._send_lock:
            _send(self._conn, msg)
        return fut

    def _read(self) -> None:
        while True:
            try:
                kind, value, extra, idle = _recv(self._conn)
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
        """The weights ``policy`` holds now, into the ring; the child loads them when its queue
        reaches the message (jobs queued earlier sample with the weights they were queued
        behind)."""
        slot = self._ring.write(copied_tensors(policy), self._proc.is_alive)
        with self._send_lock:
            _send(self._conn, ("push", slot, version))

    def drain(self) -> None:
        self._ask(("ping",)).result()

    def pop_idle_s(self) -> float:
        with self._lock:
            idle, self._idle_s = self._idle_s, 0.0
        return idle

    def close(self) -> None:
        if self._proc.is_alive():
            try:
                with self._send_lock:
                    _send(self._conn, ("close",))
            except (BrokenPipeError, OSError):
                pass
            self._proc.join(timeout=30)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout=5)
        self._reader.join(timeout=5)
        self._conn.close()


def _serve(conn, sample: Sample, model: torch.nn.Module, version: int, threads: int,
           data_of: Callable, after_fork: Callable, ring: _PushRing) -> None:
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
    idle, t0 = 0.0, time.perf_counter()  # idle from the moment a reply is sent
    while True:
        try:
            msg = _recv(conn)
        except EOFError:
            msg = ("close",)
        idle += time.perf_counter() - t0
        if msg[0] == "close":  # else the exit waits on the pool's workers (the parent's 30 s)
            if callable(cleanup):
                cleanup()
            return
        if msg[0] == "push":
            ring.load(model, msg[1])
            version = msg[2]
            t0 = time.perf_counter()
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
        t0, sent = time.perf_counter(), idle
        idle = 0.0
        try:
            _send(conn, (*reply, sent))
        except Exception:  # noqa: BLE001 - an unpicklable result: say so instead of hanging
            _send(conn, ("error", traceback.format_exc(), None, sent))
