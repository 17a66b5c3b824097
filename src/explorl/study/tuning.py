"""Tuning: each ``tune:`` grid point trained on the tuning seeds and evaluated on the tuning
split; the study picks each recipe's value by the declared criterion (``choose``).

The criterion: the mean over tuning seeds of pass@k on ``tuning.split`` at ``tuning.k`` (the
study's largest k unless set); values within ``tuning.tie`` of the best are tied, and the tie
goes to the higher mean pass@1 (then to the earlier value of the grid). The final comparison
then trains the chosen values on the study's own seeds and evaluates them on ``eval.split``.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from typing import Any

from explorl.study.plan import RunPlan, value_text
from explorl.study.spec import StudySpec, tuning_k


@dataclass
class GridPoint:
    """One value of a recipe's grid: its mean validation pass@k and pass@1 over tuning seeds."""

    value: Any
    passk: float
    pass1: float
    seeds: int
    chosen: bool = False

    def to_json(self) -> dict:
        return {"value": self.value, "passk": self.passk, "pass1": self.pass1,
                "seeds": self.seeds, "chosen": self.chosen}


def pick(points: list[GridPoint], tie: float) -> int:
    """Index of the chosen point: the best pass@k, ties (within ``tie``) to the best pass@1,
    then to the first in grid order."""
    best = max(p.passk for p in points)
    tied = [i for i, p in enumerate(points) if p.passk >= best - tie - 1e-12]
    return max(tied, key=lambda i: (points[i].pass1, -i))


def grid_table(spec: StudySpec, plans: list[RunPlan]) -> dict[str, list[GridPoint]]:
    """Per tuned recipe: each grid value's mean pass@k (criterion k) and pass@1 over the tuning
    seeds, read from the runs' ``eval/eval.json``, with the chosen value marked.

    Raises ``RuntimeError`` when a grid point has no finished evaluation (rerun the study)."""
    k = tuning_k(spec)
    out: dict[str, list[GridPoint]] = {}
    for name, grid in spec.tune.items():
        points = []
        for value in grid.values:
            runs = [p for p in plans if p.name == name and p.value == value]
            got = []
            for p in runs:
                path = p.out / "eval" / "eval.json"
                if not path.exists():
                    raise RuntimeError(f"tuning run {p.key} has no evaluation ({path}); rerun the "
                                       "study to finish it")
                overall = json.loads(path.read_text())["overall"]
                got.append((overall[f"pass@{k}"], overall["pass@1"]))
            points.append(GridPoint(value, statistics.fmean(a for a, _ in got),
                                    statistics.fmean(b for _, b in got), len(got)))
        points[pick(points, spec.tuning.tie)].chosen = True
        out[name] = points
    return out


def choices(table: dict[str, list[GridPoint]]) -> dict[str, Any]:
    """``{recipe: chosen value}``."""
    return {name: next(p.value for p in pts if p.chosen) for name, pts in table.items()}


def tuning_markdown(spec: StudySpec, table: dict[str, list[GridPoint]]) -> list[str]:
    """The grid tables of study.md: one row per recipe and value, the choice in bold."""
    if not table:
        return []
    t, k = spec.tuning, tuning_k(spec)
    probs = f"first {t.max_problems} problems of the " if t.max_problems else ""
    lines = [f"Each grid value trained with tuning seeds {{{', '.join(map(str, t.seeds))}}} for "
             f"{t.max_steps or spec.max_steps} steps and evaluated on the {probs}{t.split} split "
             f"({t.n} samples per problem at T = {spec.eval.temperature}); the choice: the best "
             f"mean pass@{k} (values within {t.tie:g} tied, then the best pass@1). The final "
             f"runs use the chosen value on seeds {{{', '.join(map(str, spec.seeds))}}} and the "
             f"{spec.eval.split} split.", "",
             f"| recipe | knob | value | {t.split} pass@{k} | {t.split} pass@1 | seeds | chosen |",
             "|---|---|---|---|---|---|---|"]
    for name, pts in table.items():
        for p in pts:
            mark = "**✓**" if p.chosen else ""
            lines.append(f"| {name} | `{spec.tune[name].key}` | {value_text(p.value)} | "
                         f"{p.passk:.3f} | {p.pass1:.3f} | {p.seeds} | {mark} |")
    return lines
