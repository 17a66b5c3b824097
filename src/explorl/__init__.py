"""explorl: controlling exploration in RL with verifiable rewards for language models.

The public API. Names resolve lazily, so ``import explorl`` (and the pure math in
``explorl.algorithms``) does not import transformers until something needs it.
"""

from __future__ import annotations

import importlib
from importlib import metadata

try:
    __version__ = metadata.version("explorl")
    """The installed distribution's version (pyproject.toml's ``version``, one place)."""
except metadata.PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"

_EXPORTS = {
    # configuration
    "RunConfig": "explorl.config",
    "ConfigError": "explorl.config",
    "load_config": ("explorl.validation", "load"),
    # training
    "train": "explorl.api",
    "Trainer": "explorl.training.loop",
    # algorithms (pure tensor functions)
    "ADVANTAGES": "explorl.algorithms",
    "LOSSES": "explorl.algorithms",
    "compute_advantages": "explorl.algorithms",
    "aggregate": "explorl.algorithms",
    "token_covariance": "explorl.algorithms",
    # controllers
    "CONTROLLERS": "explorl.control",
    "Controller": "explorl.control",
    "Knobs": "explorl.control",
    "StepStats": "explorl.control",
    # rollouts
    "Rollouts": "explorl.rollout.types",
    "HFEngine": "explorl.rollout.hf",
    "VLLMEngine": "explorl.rollout.vllm",
    "FakeEngine": "explorl.rollout.fake",
    # data and rewards
    "PromptRecord": "explorl.data",
    "load_prompts": "explorl.data",
    "VERIFIERS": "explorl.rewards",
    "VerifierPool": "explorl.rewards",
    "ref_of": "explorl.refs",
    # lab
    "LabTask": "explorl.lab.tasks",
    "lab_model_path": "explorl.lab",
    "make_splits": "explorl.lab",
    # evaluation and analysis
    "pass_at_k": "explorl.eval",
    "fit_entropy_law": "explorl.analysis",
    "make_report": "explorl.analysis",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    target = _EXPORTS.get(name)
    if target is None:
        raise AttributeError(f"module 'explorl' has no attribute {name!r}")
    module, attr = target if isinstance(target, tuple) else (target, name)
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__():
    return __all__
