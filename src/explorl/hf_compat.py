"""Glue to transformers that every layer may use: its progress bars silenced, and what differs
between the versions explorl supports (``transformers>=4.45``).

transformers renamed the KV-cache argument of the models' ``forward`` from ``past_key_values``
to ``cache`` (and the output's field with it) between 5.19 and 5.24, and warns on the old name.
Decoding loops pass the cache under the name the model's own ``forward`` declares, read from its
signature (never from a version number), so neither side of the rename warns or breaks.
"""

from __future__ import annotations

import contextlib
import functools
import inspect

import torch


def cache_kwarg(model: torch.nn.Module) -> str:
    """``"cache"`` or ``"past_key_values"``: the name ``model``'s forward takes its KV cache under.

    ``model`` may be a wrapper (PEFT, DDP): the first submodule whose ``forward`` declares one of
    the two names decides.
    """
    for module in model.modules():
        name = _declared(type(module))
        if name is not None:
            return name
    return "past_key_values"


@functools.lru_cache(maxsize=None)
def _declared(cls: type) -> str | None:
    try:
        params = inspect.signature(cls.forward).parameters
    except (TypeError, ValueError):  # a builtin or C forward: no signature to read
        return None
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    return None


@contextlib.contextmanager
def quiet_transformers():
    """Silence transformers' own progress bars ("Loading weights", "Writing model shards") for
    the duration: the trainer loads and checkpoints models while its own progress bar runs."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()
