"""The Python API: ``explorl.train`` for scripts and notebooks, the same run as ``explorl train``.

    import explorl
    from datasets import Dataset

    def brevity(completions, **kw):              # TRL's reward signature
        return [1.0 / (1 + len(c)) for c in completions]

    summary = explorl.train("recipes/quickstart.yaml", out="runs/api",
                            overrides={"max_steps": 3, "optim.lr": 1e-4},
                            reward_funcs=[brevity], reward_weights=[0.1],
                            train_dataset=Dataset.from_list(
                                [{"prompt": "2+3=", "answer": "5"}, ...]))

Works in a plain script with no ``if __name__ == "__main__":`` guard: verifier workers never
re-import ``__main__``, and when explorl loads a reward function from the script file (its
reference is ``/path/script.py:fn``), the import stops at the script's ``explorl.train`` call,
after the functions it passes were defined.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from explorl import config as C
from explorl import validation
from explorl.errors import ExplorlError
from explorl.refs import StopScript, loading_script, ref_of
from explorl.training.loop import Trainer  # after the config is valid: bad input fails fast


def train(recipe: str | Path | Mapping | C.RunConfig | None = None, *, out: str | Path,
          overrides: Mapping[str, Any] | None = None,
          reward_funcs: Sequence[Callable | str] | None = None,
          reward_weights: Sequence[float] | None = None,
          train_dataset: Any = None, val_dataset: Any = None,
          resume: bool = False, force: bool = False, allow_changes: bool = False) -> dict:
    """Train and return the run's summary (``summary.json``).

    ``recipe``: a recipe path, a dict shaped like a recipe, a ``RunConfig``, or None (defaults).
    ``overrides``: dotted keys as with ``--set`` (``{"optim.lr": 1e-5, "max_steps": 3}``).
    ``reward_funcs``: callables (explorl's ``(response, ground_truth)``, verl's
    ``compute_score(data_source, solution_str, ground_truth, extra_info)`` or TRL's
    ``f(prompts, completions, **columns)``; module-level functions) or references
    (``"module:function"``), with ``reward_weights`` (default 1 each); they replace
    ``reward.functions``. ``train_dataset`` / ``val_dataset``: a ``datasets.Dataset``, dicts or
    ``PromptRecord``s, read with ``data.prompt_key`` / ``data.answer_key``. ``resume``:
    continue the run in ``out`` (``allow_changes``: even with ``overrides`` that make it another
    experiment, such as another loss or model); ``force``: overwrite a finished one.
    """
    if loading_script():  # a worker (or a reference check) importing the user's script
        raise StopScript
    if resume:
        data = C.load_yaml(C.read_utf8((Path(out) / "config.yaml").read_bytes(), "config.yaml"))
    elif recipe is None or isinstance(recipe, (str, Path)):
        data = C.to_dict(validation.load(recipe, env=False))
    elif isinstance(recipe, C.RunConfig):
        data = C.to_dict(recipe)
    elif isinstance(recipe, Mapping):
        data = C.to_dict(validation.from_dict(dict(recipe), env=False))
    else:
        raise C.ConfigError(
            f"recipe: expected a path, a dict or a RunConfig, got {type(recipe).__name__}"
        )
    for key, value in (overrides or {}).items():
        C.set_path(data, key, value)
    if reward_funcs:
        weights = list(reward_weights) if reward_weights is not None else [1.0] * len(reward_funcs)
        if len(weights) != len(reward_funcs):
            raise C.ConfigError(
                f"reward_weights: {len(weights)} weights for {len(reward_funcs)} functions"
            )
        data.setdefault("reward", {})["functions"] = [
            {"name": f if isinstance(f, str) else ref_of(f), "weight": float(w)}
            for f, w in zip(reward_funcs, weights)]
    cfg = validation.from_dict(data)
    out = Path(out)
    if not resume and (out / "metrics.jsonl").exists() and not force:
        raise ExplorlError(
            f"{out} already holds a run; pass resume=True to continue it or force=True"
        )
    trainer = Trainer(cfg, out, resume=resume, train_data=train_dataset, val_data=val_dataset,
                      allow_changes=allow_changes)
    try:
        return trainer.train()
    finally:
        # The trainer's parts refer to one another, so without a collection its model,
        # optimizer state and the sampler's static decode buffers stay allocated (on a GPU:
        # ~50–200 MB per lab run, several GB for a 0.5B model) until Python's cycle collector
        # happens to run: the next run in the same process (a sweep, a notebook) would start
        # with them still there.
        del trainer
        gc.collect()
