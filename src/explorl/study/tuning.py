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
    added: bool = False  # beyond the written grid (``tuning.extend``)

    def to_json(self) -> dict:
        return {"value": self.value, "passk": self.passk, "pass1": self.pass1,
                "seeds": self.seeds, "chosen": self.chosen, "added": self.added}


def pick(points: list[GridPoint], tie: float) -> int:
    """Index of the chosen point: the best pass@k, ties (within ``tie``) to the best pass@1,
    then to the first in grid order."""
    best = max(p.passk for p in points)
    tied = [i for i, p in enumerate(points) if p.passk >= best - tie - 1e-12]
    return max(tied, key=lambda i: (points[i].pass1, -i))


def beyond_edge(values: list[Any], chosen: Any) -> Any | None:
    """The next value past the grid edge that ``chosen`` sits on, or None (an interior choice,
    or a grid that is not of numbers). A grid of positive numbers steps by the edge's ratio
    (lr 5e-5, 1e-4, 2e-4 → 2.5e-5), any other by the edge's step; integers stay integers,
    other values keep 3 significant digits."""
    nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if len(nums) != len(values) or len(set(nums)) < 2 or chosen not in (min(nums), max(nums)):
        return None
    ordered = sorted(set(nums))
    edge, inner = (ordered[0], ordered[1]) if chosen == ordered[0] else (ordered[-1], ordered[-2])
    new = edge * (edge / inner) if min(nums) > 0 else edge + (edge - inner)
    if all(isinstance(v, int) for v in nums):
        return int(round(new))
    return float(f"{new:.3g}")


def edge_won(points: list[GridPoint], tie: float) -> bool:
    """Whether the chosen point, on its grid's edge, beats its inner neighbour by the criterion
    itself, not by coming first in grid order (a flat grid gives no direction to extend in)."""
    chosen = next(p for p in points if p.chosen)
    ordered = sorted(points, key=lambda p: p.value)
    i = ordered.index(chosen)
    inner = ordered[1] if i == 0 else ordered[-2]
    return pick([inner, chosen], tie) == 1


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
    picked = choices(table)
    for key, src in t.share.items():
        if src in picked:
            lines[0] += (f" Every recipe that does not tune `{key}` itself uses {src}'s choice, "
                         f"{value_text(picked[src])}, in its grid runs and its final runs "
                         f"({src} is tuned first).")
    for name, pts in table.items():
        numeric = all(isinstance(p.value, (int, float)) for p in pts)
        for p in sorted(pts, key=lambda p: p.value) if numeric else pts:
            mark = "**✓**" if p.chosen else ""
            added = " (added)" if p.added else ""
            lines.append(f"| {name} | `{spec.tune[name].key}` | {value_text(p.value)}{added} | "
                         f"{p.passk:.3f} | {p.pass1:.3f} | {p.seeds} | {mark} |")
    notes = edge_notes(spec, table)
    if notes:
        lead = (f"A choice on its grid's edge adds the next value beyond it (at most {t.extend} "
                "per recipe, marked *added*):" if t.extend else
                "Choices on their grid's edge (the knob's best value may lie beyond them):")
        lines += ["", lead, *[f"- {n}" for n in notes]]
    elif t.extend:
        lines += ["", "No choice sits on its grid's edge."]
    return lines


def edge_notes(spec: StudySpec, table: dict[str, list[GridPoint]]) -> list[str]:
    """One line per recipe whose grid was extended or whose choice still sits on its grid's
    edge (its best value may lie beyond), with the reason the extension stopped."""
    out = []
    for name, pts in table.items():
        values = [p.value for p in pts]
        chosen = next(p.value for p in pts if p.chosen)
        added = [value_text(p.value) for p in pts if p.added]
        nxt = beyond_edge(values, chosen)
        text = f"{name}: added {', '.join(added)}; " if added else f"{name}: "
        if nxt is None:
            if not added:
                continue
            text += f"the choice, {value_text(chosen)}, lies inside the grid"
        elif not edge_won(pts, spec.tuning.tie):
            text += (f"the choice, {value_text(chosen)}, is the grid's edge only by grid order "
                     "(its neighbour scores the same): no direction to extend in")
        elif len(added) >= spec.tuning.extend:
            text += (f"the choice, {value_text(chosen)}, is still the grid's edge"
                     + (f" after {len(added)} added value{'s' * (len(added) > 1)}" if added else "")
                     + ": the knob's best value may lie beyond it")
        else:
            text += (f"the choice, {value_text(chosen)}, is the grid's edge and the next value, "
                     f"{value_text(nxt)}, is outside the knob's range")
        out.append(text)
    return out
