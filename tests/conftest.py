"""Shared fixtures: a tiny lab model (built in seconds, cached) and small run configs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from explorl import config as C
from explorl import validation

torch.set_num_threads(1)  # two xdist workers on two cores
# ... and the runs tests start as subprocesses (CLI, kill -9 and resume) use one thread as well:
# on some CPUs (AMD EPYC here) one and two threads round differently in the last bit, so a
# subprocess at the default thread count would not reproduce an in-process reference exactly.
os.environ["OMP_NUM_THREADS"] = "1"

# Lab models the tests build go into the repository's pytest cache, not the user's
# ~/.cache/explorl/lab (shared by the xdist workers: the build holds a file lock). An explicit
# EXPLORL_LAB_CACHE wins, so CI can point it anywhere.
os.environ.setdefault("EXPLORL_LAB_CACHE",
                      str(Path(__file__).resolve().parents[1] / ".pytest_cache" / "explorl-lab"))
# Calibrated study costs likewise (``explorl study --plan --calibrate``): a test never reads or
# writes the user's ~/.cache/explorl/cost.
os.environ.setdefault("EXPLORL_COST_CACHE",
                      str(Path(__file__).resolve().parents[1] / ".pytest_cache" / "explorl-cost"))

EMPTY_MODEL_CACHE = Path(__file__).resolve().parents[1] / ".pytest_cache" / "explorl-models-empty"
"""The model cache of every test but the ``real`` ones: empty, as on a fresh machine, so that no
test passes only because ``explorl models get`` once ran on this one. A test that needs a named
model uses the ``named_model_stand_in`` fixture."""


def pytest_configure(config):
    if "real" not in (config.getoption("markexpr") or "").replace("not real", ""):
        os.environ["EXPLORL_MODEL_CACHE"] = str(EMPTY_MODEL_CACHE)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``real`` (they train SmolLM2-135M, minutes on a CPU) run only when asked
    for (``make test-real``: ``-m real``), never in ``make test``."""
    if "real" in (config.getoption("markexpr") or "").replace("not real", ""):
        return
    skip = pytest.mark.skip(reason="trains the real model: make test-real (pytest -m real)")
    for item in items:
        if "real" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def stand_in_cache(tmp_path_factory):
    """A model cache holding a tiny stand-in under every registered name (``smollm2-135m``): a
    tiny Llama with a ChatML tokenizer, written as a GGUF file and converted as ``explorl models
    get`` converts the real one. Recipes that name a model validate against it without the
    real model."""
    pytest.importorskip("gguf")
    from gguf_helpers import tiny_llama, write_gguf

    from explorl import model_store
    from explorl.model_store.gguf_files import ensure_converted

    cache = tmp_path_factory.mktemp("stand-in-models")
    gguf = write_gguf(tiny_llama(), cache / "stand-in.gguf")
    old = os.environ.get("EXPLORL_MODEL_CACHE")
    os.environ["EXPLORL_MODEL_CACHE"] = str(cache)
    try:
        for name in model_store.KNOWN:
            ensure_converted(gguf, cache / name, {"name": name, "stand_in": True})
    finally:
        if old is None:
            del os.environ["EXPLORL_MODEL_CACHE"]
        else:
            os.environ["EXPLORL_MODEL_CACHE"] = old
    return cache


@pytest.fixture
def named_model_stand_in(stand_in_cache, monkeypatch):
    """Point the model cache at the stand-ins for this test (see ``stand_in_cache``)."""
    monkeypatch.setenv("EXPLORL_MODEL_CACHE", str(stand_in_cache))
    return stand_in_cache


@pytest.fixture(scope="session")
def tiny_model():
    """Directory of a throwaway lab model for the addition task (seconds to build, cached)."""
    from explorl.lab import lab_model_path

    # 1-digit addition, trained just long enough to be right ~30% of the time on its train split,
    # so that RL steps see mixed groups (non-zero advantages) from the first step.
    return lab_model_path(
        "addition",
        size="tiny",
        **TINY_LAB,
        max_steps=100,
        check_every=1000,
        hidden_size=64,
        num_layers=2,
        intermediate_size=128,
        num_heads=2,
    )


TINY_LAB = {"max_digits": 1, "n_train": 30, "n_val": 10, "n_test": 10}
"""``lab_model_path`` arguments of the tiny model: 1-digit addition, small splits."""
TINY_LAB_CONFIG = {"n_train": 30, "n_val": 10, "n_test": 10, "params": {"max_digits": 1}}
"""The same as a recipe's ``lab`` section."""


def tiny_config(
    model_dir, overrides: dict | None = None, sets: list[str] | None = None
) -> C.RunConfig:
    """A run config that trains in about a second per step on the tiny lab model."""
    data = {
        "name": "tiny",
        "max_steps": 2,
        "model": {"path": str(model_dir)},
        "lab": {**TINY_LAB_CONFIG, "params": dict(TINY_LAB_CONFIG["params"])},
        "data": {"train": ["lab:addition"], "prompts_per_step": 4},
        "rollout": {"n_samples": 4, "max_response_len": 6},
        "reward": {"num_workers": 1},
        "optim": {"lr": 1e-3},
        "eval": {"every": 2, "n_samples": 2, "k": [1, 2], "max_problems": 8},
        "log": {"progress": False, "plots": False},
    }
    if overrides:
        C._deep_update(data, overrides)
    for s in sets or []:
        k, v = C.parse_override(s)
        C.set_path(data, k, v)
    return validation.from_dict(data)


@pytest.fixture
def make_config(tiny_model):
    def _make(overrides: dict | None = None, sets: list[str] | None = None) -> C.RunConfig:
        return tiny_config(tiny_model, overrides, sets)

    return _make
