"""Misbehaving tools for tests/test_tools.py (a light module: each pool worker imports it)."""

import os
import time


def crash(x: str) -> str:
    """Kill the worker."""
    os._exit(3)


def hang(x: str) -> str:
    """Never answer."""
    time.sleep(60)
    return x


def huge(x: str) -> str:
    """Answer with a megabyte."""
    return "9" * 1_000_000


def boom(x: str) -> str:
    """Raise."""
    raise RuntimeError("no luck")


def called_tool(response: str, ground_truth: str) -> float:
    """A reward for a tool call answered without error (mixed rewards from a tiny model)."""
    return float("}" in response and "{?}" not in response)


def untyped(x):
    """A parameter without a type hint."""
    return x
