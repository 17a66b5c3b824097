"""The lab: synthetic tasks and a tiny warm-started model, so RL runs offline on a CPU.

A recipe says ``model: lab:addition`` and ``data.train: lab:addition``;
``lab_model_path("addition")`` builds (once, cached) the model directory, and
``make_splits("addition")`` gives the train/val/test prompts. A task is a ``LabTask``: the
built-in ``TASKS``, a reasoning-gym task (``rg:<task>``) or a user's object
(``lab:mypkg.tasks:my_task``).
"""

from explorl.lab.registry import get_task, make_splits, parse_lab_spec
from explorl.lab.tasks import TASKS, LabTask, Problem

__all__ = [
    "TASKS",
    "LabTask",
    "Problem",
    "get_task",
    "lab_model_path",
    "make_splits",
    "parse_lab_spec",
]


def __getattr__(name: str):
    # Lazy: parsing a recipe's "lab:" spec or making prompts must not import torch/transformers.
    if name == "lab_model_path":
        from explorl.lab.build import lab_model_path

        return lab_model_path
    raise AttributeError(f"module 'explorl.lab' has no attribute {name!r}")
