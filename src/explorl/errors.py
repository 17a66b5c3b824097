"""Errors a user can cause, under one base class.

The command line prints an ``ExplorlError`` as one ``error: …`` line and exits with status 2
(a traceback only with ``--debug``); anything else is a bug in explorl and keeps its
traceback. Each message names what to fix: the key path of a recipe, the file and row of a
data file, the path that could not be written.

Every class also derives from the built-in it refines (``ValueError``, ``FileNotFoundError``,
``OSError``, ``FloatingPointError``), so code that caught those before keeps working.
"""

from __future__ import annotations


class ExplorlError(Exception):
    """Base of every error caused by the user's input or environment, not by explorl."""


class ConfigError(ExplorlError, ValueError):
    """A configuration problem, reported with the key path that caused it."""


class DataError(ExplorlError, ValueError):
    """A data file that cannot be used; the message names the file, the row and the field."""


class ControlError(ExplorlError, ValueError):
    """A controller configuration that cannot work (e.g. two owners of one actuator)."""


class RewardError(ExplorlError, ValueError):
    """A verifier or reward function that cannot be loaded or used."""


class ModelPathError(ExplorlError, FileNotFoundError):
    """A model directory that does not exist or holds no model."""


class CheckpointError(ExplorlError, OSError):
    """A checkpoint or run file that could not be written (disk full, permissions) or read."""


class NonFiniteError(ExplorlError, FloatingPointError):
    """A NaN or infinity where a finite number is required (weights, loss, gradient norm)."""


class OutOfMemory(ExplorlError, MemoryError):
    """The device ran out of memory again after the update's one retry at half the micro-batch
    (``training.memory``); the message names the setting to lower."""


class EnvironmentFailed(ExplorlError, RuntimeError):
    """``rollout.environment`` could not start a response: its ``reset`` raised, hung, killed
    its worker or went past a limit (``rollout.env_observation_max_chars``,
    ``rollout.env_state_max_bytes``). The environment's fault, not the model's: the run stops
    after a checkpoint."""
