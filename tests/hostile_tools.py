"""Hostile tools and environments for tests/test_hostile_tools.py: each does one thing a tool
must not be able to do to the trainer. Only the pool's sandboxed workers import this module
(the test checks the trainer never does). Everything is bounded: the forks are counted, the
sleeps end, nothing here can load the machine if it escaped."""

import ctypes
import os
import signal
import sys
import time

FORKS = 4  # the fork bomb's rounds: 2**4 - 1 = 15 processes beside the worker
SLEEP_S = 120  # how long an escaped process would live


def hang(x: str) -> str:
    """Never answer (sleeps past every time limit).

    Args:
        x: Anything.
    """
    time.sleep(SLEEP_S)
    return x


def crash(x: str) -> str:
    """Raise.

    Args:
        x: Anything.
    """
    raise RuntimeError("hostile tool raised")


def segfault(x: str) -> str:
    """Dereference a null pointer (SIGSEGV in the worker).

    Args:
        x: Anything.
    """
    ctypes.string_at(0)
    return x


def kill_parent(x: str) -> str:
    """SIGKILL the worker's parent process.

    Args:
        x: Anything.
    """
    os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(SLEEP_S)  # the worker dies with its parent
    return x


def killpg(x: str) -> str:
    """SIGKILL the worker's own process group.

    Args:
        x: Anything.
    """
    os.killpg(0, signal.SIGKILL)
    return x


def fork_bomb(x: str) -> str:
    """Fork FORKS times in every process (2**FORKS - 1 children that sleep), then answer.

    Args:
        x: Anything.
    """
    me = os.getpid()
    for _ in range(FORKS):
        os.fork()
    if os.getpid() != me:  # a child: never returns into the worker's loop
        time.sleep(SLEEP_S)
        os._exit(0)
    return "7"


def noisy(x: str) -> str:
    """Print a megabyte to standard output and error (through Python and the raw descriptors),
    then answer.

    Args:
        x: Anything.
    """
    line = "NOISE " * 1000 + "\n"
    for _ in range(85):
        sys.stdout.write(line)
        sys.stderr.write(line)
    os.write(1, line.encode())
    os.write(2, line.encode())
    sys.stdout.flush()
    return "7"


def huge_result(x: str) -> str:
    """Answer with ten million characters.

    Args:
        x: Anything.
    """
    return "9" * 10_000_000


def not_text(x: str) -> str:
    """Answer with bytes, not text.

    Args:
        x: Anything.
    """
    return b"\x00\x01"


def detached(x: str) -> str:
    """Leave a grandchild behind: double fork, ``setsid``, sleep; then answer.

    Args:
        x: Anything.
    """
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            for fd in (0, 1, 2):  # a daemon's manners: no terminal, no pipes
                os.close(fd)
            time.sleep(SLEEP_S)
        os._exit(0)
    os.wait()
    return "7"


def detach_and_crash(x: str) -> str:
    """Leave a detached grandchild behind, then kill the worker (its death orphans the
    grandchild to init, out of the worker's tree).

    Args:
        x: Anything.
    """
    detached(x)
    os._exit(3)


class Hoarder:
    """An environment whose tool grows its state by 8 MB a call."""

    def reset(self, **row):
        self.data = b""

    def grow(self, x: str) -> str:
        """Add 8 MB to the state.

        Args:
            x: Anything.
        """
        self.data += os.urandom(8 << 20)
        return str(len(self.data))


class Chatty:
    """An environment whose reset returns 20,000 characters (appended to the prompt)."""

    def reset(self, **row):
        return "x" * 20_000

    def grow(self, x: str) -> str:
        """Echo.

        Args:
            x: Anything.
        """
        return x


class Wordy(Chatty):
    """An environment whose reset returns 1,500 digits: under
    rollout.env_observation_max_chars (2,000), but a lab model's prompt with them is over
    data.max_prompt_len (1,024 tokens, one a character)."""

    def reset(self, **row):
        return "1" * 1_500


class Foreign(Chatty):
    """An environment whose reset returns letters, outside a lab model's alphabet."""

    def reset(self, **row):
        return "hello"


def answered(response: str, ground_truth: str) -> float:
    """A reward for a call answered without error (mixed rewards from a tiny model)."""
    return float("}" in response and "{?}" not in response)
