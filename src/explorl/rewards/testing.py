"""Deliberately broken verifiers for testing ``VerifierPool``.

Load them by dotted path, e.g. ``"explorl.rewards.testing:_sleep_forever"``.
"""

from __future__ import annotations

import ctypes
import os
import time


def _sleep_forever(response: str, ground_truth: str) -> float:
    """Hangs (a pathological parse); the pool must cut it off."""
    while True:
        time.sleep(3600)


def _crash(response: str, ground_truth: str) -> float:
    """Kills its own process without cleanup."""
    os._exit(13)


def _segfault(response: str, ground_truth: str) -> float:
    """Dies of SIGSEGV, as a buggy C extension would."""
    ctypes.string_at(0)
    return 0.0


def _raise(response: str, ground_truth: str) -> float:
    """Raises an ordinary exception."""
    raise RuntimeError("verifier failure")


def _memory_bomb(response: str, ground_truth: str) -> float:
    """Allocates 64 GiB; stopped by the worker's address-space limit."""
    return float(len(bytearray(64 << 30)))


def _echo(response: str, ground_truth: str) -> float:
    """Correct iff response == ground truth; an instruction like "sleep:0.5" or "crash"/"hang"
    in the response does that first, so one batch can mix good and bad items."""
    if response.startswith("sleep:"):
        time.sleep(float(response[6:]))
    elif response == "hang":
        _sleep_forever(response, ground_truth)
    elif response == "crash":
        _crash(response, ground_truth)
    elif response == "raise":
        _raise(response, ground_truth)
    return float(response == ground_truth)


def _trl_one(prompts, completions, **columns) -> list[float]:
    """A TRL-style reward function: 1.0 for every completion."""
    return [1.0 for _ in completions]


def _bad_signature(a, b, c) -> float:
    """Three required parameters: no reward signature fits."""
    return 0.0


_ODD_SCORES = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"), "huge": 1e30,
               "negative": -0.5, "two": 2.0, "string": "1.0", "none": None, "list": [1.0]}


def _returns(response: str, ground_truth: str) -> object:
    """Returns what the response names (``"nan"``, ``"string"`` → ``"1.0"``, ``"none"``, …, see
    ``_ODD_SCORES``), else 1.0 — every odd value must count as an error, not a score."""
    return _ODD_SCORES.get(response, 1.0)
