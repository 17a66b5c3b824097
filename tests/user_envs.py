"""Environments for tests/test_environments.py (a light module: each pool worker imports it)."""

import os
import time


class Counter:
    """Counts the calls made on its own instance."""

    def reset(self, **row):
        self.n = 0
        self.row = row

    def tally(self, x: str) -> str:
        """Count this call and return the count so far.

        Args:
            x: Anything; "crash" kills the worker, "hang" never answers, "boom" (or "99")
                raises after changing the count.
        """
        if x == "crash":
            os._exit(3)
        if x == "hang":
            time.sleep(60)
        if x in ("boom", "99"):
            self.n += 100
            raise RuntimeError("no luck")
        self.n += 1
        return str(self.n)


class Hint(Counter):
    """A Counter whose reset adds the answer's last digit to the prompt."""

    def reset(self, ground_truth: str) -> str:
        self.n = 0
        return ground_truth[-1]


def calls_made(completions, environments, **kwargs) -> list[float]:
    """A TRL-style reward: how many calls the response's environment counted."""
    return [float(e.n) for e in environments]


class NoReset:
    """No reset."""

    def tally(self, x: str) -> str:
        """Echo.

        Args:
            x: Anything.
        """
        return x


class NoTools:
    """Only reset."""

    def reset(self, **row):
        pass

    def _private(self, x: str) -> str:
        return x


class Untyped(NoTools):
    """A method without type hints."""

    def tally(self, x):
        """Echo."""
        return x


class NeedsArgs(Counter):
    """A constructor with an argument."""

    def __init__(self, size: int):
        self.size = size


class Rewarded(Counter):
    """A Counter that owns a reward."""

    def get_reward(self) -> float:
        return float(self.n)


def not_a_class(x: str) -> str:
    """A function."""
    return x


class BadReset(Counter):
    """A reset that raises."""

    def reset(self, **row):
        raise KeyError("no such level")
