"""Which runs a study makes (``plan_runs``), in which table order, and how far each has got."""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from explorl import config as C
from explorl import validation
from explorl.study.spec import StudySpec, resolve_recipe, spec_error
from explorl.training.checkpoint import latest_checkpoint


@dataclass
class RunPlan:
    """One (recipe, seed) run of the study: what to train and where."""

    name: str
    seed: int
    recipe: Path
    sets: list[str]
    out: Path
    cfg: C.RunConfig

    @property
    def key(self) -> str:
        return f"{self.name}-seed{self.seed}"


def lab_ref(task: str) -> str:
    """The model/data spec of a study's task: ``lab:<task>`` (``lab:rg:<task>`` for
    reasoning-gym's)."""
    return f"lab:{task}"


def plan_runs(spec: StudySpec, spec_path: Path, out: Path) -> list[RunPlan]:
    """Every (recipe, seed) run, seed-major (an interrupted study has whole seeds first).

    Each run's config is resolved and validated here, before any work starts.
    """
    spec_path = Path(spec_path)
    rows: list[tuple[str, Path, list[str]]] = []
    task_sets = [f"model.path={lab_ref(spec.task)}", f"data.train=[{lab_ref(spec.task)}]"]
    own = spec.recipe_set
    for i, ref in enumerate(spec.recipes):
        path = resolve_recipe(ref, spec, f"recipes[{i}]", spec_path)
        name = validation.load(path).name
        rows.append((name, path, [*task_sets, *spec.set, *own.get(name, [])]))
    for i, v in enumerate(spec.variants):
        path = resolve_recipe(v.recipe, spec, f"variants[{i}].recipe", spec_path)
        parent = validation.load(path).name
        rows.append((v.name, path, [*task_sets, *spec.set, *own.get(parent, []), *v.set,
                                    *own.get(v.name, []), f"name={v.name}"]))
    names = [n for n, _, _ in rows]
    for key in own:
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise spec_error(spec_path, f"recipe_set.{key}: no recipe or variant of that "
                                        f"name{hint} (names: {', '.join(names)})")
    seen: dict[str, int] = {}
    for name, _, _ in rows:
        seen[name] = seen.get(name, 0) + 1
    dup = sorted(n for n, c in seen.items() if c > 1)
    if dup:
        raise spec_error(spec_path, f"recipes: names used twice: {', '.join(dup)} "
                                    "(give a variant its own name)")
    plans = []
    for seed in spec.seeds:
        for name, path, sets in rows:
            sets = [*sets, "log.progress=false"]
            try:
                cfg = validation.load(path, sets, max_steps=spec.max_steps, seed=seed)
            except C.ConfigError as e:
                raise spec_error(spec_path, f"recipe {name} ({path}): {e}") from None
            plans.append(RunPlan(name, seed, path, sets, out / "runs" / f"{name}-seed{seed}", cfg))
    return plans


def order_rows(spec: StudySpec, plans: list[RunPlan]) -> list[str]:
    """Table row order: the spec's recipes, each variant right after the recipe it modifies."""
    names = list(dict.fromkeys(p.name for p in plans))
    base_of = {v.name: Path(v.recipe).stem for v in spec.variants}
    rows = [n for n in names if n not in base_of]
    for v in spec.variants:
        after = [i for i, n in enumerate(rows)
                 if n == base_of[v.name] or base_of.get(n) == base_of[v.name]]
        rows.insert(after[-1] + 1 if after else len(rows), v.name)
    return rows


def run_state(plan: RunPlan) -> str:
    """``done`` (finished: skip), ``resume`` (has a checkpoint), ``fresh`` or ``restart``
    (overwrite).

    A run directory that holds a different configuration (the spec changed) is an error rather
    than silently mixed into the table.
    """
    out = plan.out
    if not (out / "metrics.jsonl").exists() and not (out / "config.yaml").exists():
        return "fresh"
    if (out / "config.yaml").exists():
        found = C.to_dict(validation.from_dict(yaml.safe_load((out / "config.yaml").read_text())))
        want = C.to_dict(plan.cfg)
        if found != want:
            diff = ", ".join(f"{k}: {a!r} ≠ {b!r}" for k, a, b in _dict_diff(found, want)[:5])
            raise C.ConfigError(f"{out} holds a run with another configuration ({diff}); "
                                "delete it or use another --out")
    summary = out / "summary.json"
    if summary.exists():
        s = json.loads(summary.read_text())
        if s.get("steps") == plan.cfg.max_steps and not s.get("interrupted"):
            return "done"
    return "resume" if latest_checkpoint(out) is not None else "restart"


def _dict_diff(a: dict, b: dict, prefix: str = "") -> list[tuple[str, Any, Any]]:
    out = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += _dict_diff(va, vb, f"{prefix}{k}.")
        elif va != vb:
            out.append((f"{prefix}{k}", va, vb))
    return out


def eval_done(plan: RunPlan, spec: StudySpec) -> bool:
    """Whether the run's final evaluation exists with the spec's current settings."""
    return eval_done_at(plan.out / "eval", spec)


def eval_done_at(folder: Path, spec: StudySpec) -> bool:
    """Whether ``folder`` holds an evaluation with the spec's current settings."""
    path = folder / "eval.json"
    if not path.exists():
        return False
    s = json.loads(path.read_text()).get("settings", {})
    e = spec.eval
    return (s.get("n") == e.n and s.get("k") == sorted(set(e.k))
            and s.get("temperature") == e.temperature and s.get("split") == e.split
            and s.get("seed") == e.seed)
