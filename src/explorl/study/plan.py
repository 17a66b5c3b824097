"""Which runs a study makes (``plan_runs``), in which table order, and how far each has got."""

from __future__ import annotations

import dataclasses
import difflib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from explorl import config as C
from explorl import validation
from explorl.algorithms.losses import loss_agg
from explorl.outputs.checkpoint import latest_checkpoint
from explorl.report.numbers import value_text
from explorl.study.spec import (
    StudyEvalSpec,
    StudySpec,
    resolve_recipe,
    spec_error,
    tuning_k,
)
from explorl.training.plan import PLANNED_FIELDS


@dataclass
class RunPlan:
    """One (recipe, seed) run of the study: what to train, where, and how to evaluate it."""

    name: str
    seed: int
    recipe: Path
    sets: list[str]
    out: Path
    cfg: C.RunConfig
    evals: list[tuple[str, StudyEvalSpec]] = field(default_factory=list)
    """(folder under ``out``, protocol) of each evaluation of the final policy; the first is
    the main one (``eval``)."""
    value: Any = None  # a tuning run's grid value (None: a final run)
    start: RunPlan | None = None
    """The ``start`` run whose final policy this run starts from (None: the task's model)."""

    @property
    def key(self) -> str:
        label = "" if self.value is None else f"@{value_text(self.value)}"
        return f"{self.name}{label}-seed{self.seed}"


def eval_folder(temperature: float, main: float) -> str:
    """Folder of the evaluation at ``temperature``: ``eval`` at the main one, else
    ``eval_T<T>``."""
    return "eval" if temperature == main else f"eval_T{temperature:g}"


def final_evals(spec: StudySpec) -> list[tuple[str, StudyEvalSpec]]:
    """The final policy's evaluations: the main protocol at each evaluation temperature, then
    each checkpoint of ``eval.checkpoints`` at the main temperature (``eval_step<N>``)."""
    e = spec.eval
    one = dataclasses.replace(e, temperatures=[], checkpoints=[])
    return ([(eval_folder(t, e.temperature), dataclasses.replace(one, temperature=t))
             for t in e.all_temperatures()]
            + [(f"{STEP_EVAL}{s}", one) for s in sorted(e.checkpoints)])


STEP_EVAL = "eval_step"  # the folder of a checkpoint's evaluation: eval_step<N>


def checkpoint_of(folder: str) -> int | None:
    """The training step an evaluation folder evaluates (``eval_step250`` → 250); None for the
    final policy's."""
    rest = folder.removeprefix(STEP_EVAL)
    return int(rest) if rest != folder and rest.isdigit() else None


def policy_evals(evals: list[tuple[str, StudyEvalSpec]]) -> list[tuple[str, StudyEvalSpec]]:
    """The evaluations of a final policy alone (no checkpoint's): those the model before RL
    gets too."""
    return [(f, e) for f, e in evals if checkpoint_of(f) is None]


def tuning_eval(spec: StudySpec) -> StudyEvalSpec:
    """The grid points' evaluation: the tuning split, n and problems, at the main temperature,
    reporting pass@1 and the criterion's k."""
    t = spec.tuning
    return StudyEvalSpec(n=t.n, temperature=spec.eval.temperature, k=sorted({1, tuning_k(spec)}),
                         split=t.split, max_problems=t.max_problems, seed=t.seed)


def lab_ref(task: str) -> str:
    """The model/data spec of a study's task: ``lab:<task>`` (``lab:rg:<task>`` for
    reasoning-gym's)."""
    return f"lab:{task}"


def _rows(spec: StudySpec, spec_path: Path, chosen: dict[str, Any],
          out: Path) -> list[tuple[str, Path, list[str], str]]:
    """(name, recipe file, overrides, parent recipe name) of every recipe and variant, with the
    tuned values of ``chosen`` (a variant gets its recipe's choice before its own ``set``)."""
    rows: list[tuple[str, Path, list[str], str]] = []
    task_sets = [f"model.path={lab_ref(spec.task)}", f"data.train=[{lab_ref(spec.task)}]"]
    own = spec.recipe_set

    def pick(name: str) -> list[str]:
        if name not in chosen or name not in spec.tune:  # a later tuning stage: tuned already
            return []
        return [f"{spec.tune[name].key}={value_text(chosen[name])}"]

    def shared(*names: str) -> list[str]:
        """``tuning.share``: the source's choice of each key, unless the row tunes it."""
        tuned = {spec.tune[n].key for n in names if n in spec.tune}
        return [f"{key}={value_text(chosen[src])}" for key, src in spec.tuning.share.items()
                if src in chosen and key not in tuned]

    for i, ref in enumerate(spec.recipes):
        path = resolve_recipe(ref, spec, f"recipes[{i}]", spec_path)
        name = validation.load(path).name
        rows.append((name, path, [*task_sets, *spec.set, *shared(name), *own.get(name, []),
                                  *pick(name)], name))
    for i, v in enumerate(spec.variants):
        path = resolve_recipe(v.recipe, spec, f"variants[{i}].recipe", spec_path)
        parent = validation.load(path).name
        rows.append((v.name, path, [*task_sets, *spec.set, *shared(parent, v.name),
                                    *own.get(parent, []), *pick(parent), *v.set,
                                    *own.get(v.name, []), *pick(v.name), f"name={v.name}"],
                     parent))
    if spec.start is not None:  # every row starts from the start run's final policy
        last = [f"model.path={start_checkpoint(spec, out)}"]
        rows = [(n, p, [*[s for s in sets if not s.startswith("name=")], *last,
                        *[s for s in sets if s.startswith("name=")]], parent)
                for n, p, sets, parent in rows]
    names = [r[0] for r in rows]
    named = [("recipe_set", k) for k in own] + [("tune", k) for k in spec.tune]
    named += [("frontier.arms", a) for a in spec.frontier.arms]
    named += [("tuning.share", src) for src in spec.tuning.share.values()]
    named += [("ablations", k) for k in spec.ablations]
    named += [(f"ablations.{k}", a) for k, arms in spec.ablations.items() for a in arms]
    for where, key in named:
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise spec_error(spec_path, f"{where}.{key}: no recipe or variant of that "
                                        f"name{hint} (names: {', '.join(names)})")
    return _swept(spec, rows)


def point_name(arm: str, value: Any) -> str:
    """The row of ``arm`` at a frontier value: ``grpo@5.0e-05``."""
    return f"{arm}@{value_text(value)}"


def _swept(spec: StudySpec, rows: list[tuple[str, Path, list[str], str]]
           ) -> list[tuple[str, Path, list[str], str]]:
    """``frontier``: each swept arm's row replaced by one row per value (the baseline's
    first), the knob set after every other override."""
    f = spec.frontier
    if not f.arms:
        return rows
    by = {r[0]: r for r in rows}
    out = [r for r in rows if r[0] not in f.arms]
    for arm in sorted(f.arms, key=lambda a: a != f.baseline):
        _, path, sets, parent = by[arm]
        keep = [s for s in sets if not s.startswith("name=")]
        for v in f.values:
            out.append((point_name(arm, v), path,
                        [*keep, f"{f.key}={value_text(v)}", f"name={point_name(arm, v)}"], parent))
    return out


def frontier_points(spec: StudySpec) -> dict[str, list[tuple[Any, str]]]:
    """Per swept arm (the baseline first): its (value, row name) in the spec's order."""
    f = spec.frontier
    return {a: [(v, point_name(a, v)) for v in f.values]
            for a in sorted(f.arms, key=lambda a: a != f.baseline)}


def _load(spec_path: Path, name: str, path: Path, sets: list[str], steps: int,
          seed: int, start: RunPlan | None = None) -> C.RunConfig:
    """The run's config, validated. A run after a ``start`` one is checked with the start's
    model (its checkpoint need not exist yet), then starts from the checkpoint."""
    ckpt = f"model.path={start_checkpoint_of(start)}" if start is not None else None
    if start is not None:
        sets = [s for s in sets if s != ckpt] + [f"model.path={start.cfg.model.path}"]
    try:
        cfg = validation.load(path, sets, max_steps=steps, seed=seed)
    except C.ConfigError as e:
        raise spec_error(spec_path, f"recipe {name} ({path}): {e}") from None
    if start is None:
        return cfg
    return dataclasses.replace(cfg, model=dataclasses.replace(
        cfg.model, path=str(start_checkpoint_of(start))))


def plan_tuning(spec: StudySpec, spec_path: Path, out: Path,
                chosen: dict[str, Any] | None = None) -> list[RunPlan]:
    """Every (tuned recipe, grid value, tuning seed) run, seed-major, under ``out/tune/``; each
    is evaluated on the tuning split (``tuning_eval``). Validated here, before any work.
    ``chosen``: choices already made (the ``tuning.share`` sources'), shared with the others."""
    spec_path = Path(spec_path)
    rows = {r[0]: r for r in _rows(spec, spec_path, chosen or {}, out)}
    start = plan_start(spec, spec_path, out)
    steps = spec.tuning.max_steps or spec.max_steps
    ev = [("eval", tuning_eval(spec))]
    plans = []
    for seed in spec.tuning.seeds:
        for name, grid in spec.tune.items():
            _, path, sets, _ = rows[name]
            for value in grid.values:
                where = f"tune.{name}: {grid.key}={value_text(value)}"
                pre = [s for s in sets if not s.startswith("name=")]
                extra = [f"{grid.key}={value_text(value)}", "log.progress=false"]
                extra += [s for s in sets if s.startswith("name=")]
                cfg = _load(spec_path, where, path, [*pre, *extra], steps, seed, start)
                folder = out / "tune" / "runs" / f"{name}@{value_text(value)}-seed{seed}"
                plans.append(RunPlan(name, seed, path, [*pre, *extra], folder, cfg, ev, value,
                                     start))
    return plans


def plan_runs(spec: StudySpec, spec_path: Path, out: Path,
              chosen: dict[str, Any] | None = None) -> list[RunPlan]:
    """Every (recipe, seed) run of the final comparison, seed-major (an interrupted study has
    whole seeds first), with the tuned values of ``chosen`` (``{name: value}``).

    Each run's config is resolved and validated here, before any work starts.
    """
    spec_path = Path(spec_path)
    rows = [(n, p, s) for n, p, s, _ in _rows(spec, spec_path, chosen or {}, out)]
    start = plan_start(spec, spec_path, out)
    seen: dict[str, int] = {}
    for name, _, _ in rows:
        seen[name] = seen.get(name, 0) + 1
    dup = sorted(n for n, c in seen.items() if c > 1)
    if dup:
        raise spec_error(spec_path, f"recipes: names used twice: {', '.join(dup)} "
                                    "(give a variant its own name)")
    plans = []
    evals = final_evals(spec)
    for seed in spec.seeds:
        for name, path, sets in rows:
            sets = [*sets, "log.progress=false"]
            cfg = _load(spec_path, name, path, sets, spec.max_steps, seed, start)
            _keeps_checkpoints(spec, spec_path, name, cfg)
            plans.append(RunPlan(name, seed, path, sets, out / "runs" / f"{name}-seed{seed}", cfg,
                                 evals, start=start))
    if spec.frontier.arms:  # the baseline's frontier first, every seed of it
        first = {n for _, n in frontier_points(spec)[spec.frontier.baseline]}
        plans.sort(key=lambda p: p.name not in first)
    return plans


START = "start"  # the start run's folder under the study's, and its name in the logs


def start_checkpoint(spec: StudySpec, out: Path) -> Path:
    """The checkpoint every run starts from: the ``start`` run's last, ``<out>/start/
    checkpoints/step-<start.steps>`` (a Hugging Face folder: config, weights, tokenizer)."""
    assert spec.start is not None
    return out / START / "checkpoints" / f"step-{spec.start.steps}"


def start_checkpoint_of(start: RunPlan) -> Path:
    """The final checkpoint of the ``start`` run ``start`` (``start_checkpoint``)."""
    return start.out / "checkpoints" / f"step-{start.cfg.max_steps}"


def plan_start(spec: StudySpec, spec_path: Path, out: Path) -> RunPlan | None:
    """The ``start`` run (None without one): its recipe on the task with the study's ``set``,
    the recipe's ``recipe_set`` and ``start.set``, ``start.steps`` steps, its weights saved
    (its last checkpoint is the others' model); no final evaluation of its own (the base
    model's evaluation is of its final policy)."""
    st = spec.start
    if st is None:
        return None
    path = resolve_recipe(st.recipe, spec, "start.recipe", spec_path)
    name = validation.load(path).name
    sets = [f"model.path={lab_ref(spec.task)}", f"data.train=[{lab_ref(spec.task)}]", *spec.set,
            *spec.recipe_set.get(name, []), *st.set, "log.progress=false", "log.save_model=true"]
    cfg = _load(spec_path, f"start ({name})", path, sets, st.steps, st.seed)
    return RunPlan(START, st.seed, path, sets, out / START, cfg)


def with_start(plans: list[RunPlan]) -> list[RunPlan]:
    """``plans`` after the start run they begin from (once), if any."""
    starts = list({p.start.out: p.start for p in plans if p.start is not None}.values())
    return [*starts, *plans]


def _keeps_checkpoints(spec: StudySpec, spec_path: Path, name: str, cfg: C.RunConfig) -> None:
    """``eval.checkpoints`` needs each step's checkpoint written and still kept at the end."""
    every, keep = cfg.log.checkpoint_every, cfg.log.keep_checkpoints
    for step in spec.eval.checkpoints:
        if not every or step % every or step < cfg.max_steps - (keep - 1) * every:
            raise spec_error(spec_path, f"eval.checkpoints: {name} does not keep its step-{step} "
                                        f"checkpoint (log.checkpoint_every = {every}, "
                                        f"log.keep_checkpoints = {keep}; set every to divide "
                                        f"{step} and keep ≥ {cfg.max_steps // max(every, 1)})")


def order_rows(spec: StudySpec, plans: list[RunPlan]) -> list[str]:
    """Table row order: the spec's recipes, each variant right after the recipe it modifies."""
    names = list(dict.fromkeys(p.name for p in plans))
    base_of = {v.name: Path(v.recipe).stem for v in spec.variants}
    rows = [n for n in names if n not in base_of]
    for v in (v for v in spec.variants if v.name in names):  # a swept one: its points' rows
        after = [i for i, n in enumerate(rows)
                 if n == base_of[v.name] or base_of.get(n) == base_of[v.name]]
        rows.insert(after[-1] + 1 if after else len(rows), v.name)
    return rows


def base_folders(plans: list[RunPlan]) -> dict[str, RunPlan]:
    """Each model the study's runs start from, once: folder → the first plan that starts from
    it. The first plan's model is ``base``; another (``grpo_large``'s 9.6M lab model) is
    ``base-<that plan's recipe>``, so every arm's "− base" compares with its own model before
    RL."""
    folders: dict[str, RunPlan] = {}
    seen: dict[str, str] = {}
    for p in plans:
        key = starting_model(p)
        if key not in seen:
            seen[key] = "base" if not folders else f"base-{p.name}"
            folders[seen[key]] = p
    return folders


def base_of(plans: list[RunPlan]) -> dict[str, str]:
    """Recipe → the folder of the model it starts from (``base_folders``)."""
    folder = {starting_model(p): f for f, p in base_folders(plans).items()}
    return {p.name: folder[starting_model(p)] for p in plans}


def starting_model(plan: RunPlan) -> str:
    """What identifies the model a run starts from: ``model.path``, and for a lab model the
    lab section it is built from (its size, splits and task parameters)."""
    cfg = plan.cfg
    if not cfg.model.path.startswith("lab:"):
        return cfg.model.path
    return cfg.model.path + json.dumps(dataclasses.asdict(cfg.lab), sort_keys=True, default=str)


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
        # A stored config, compared and not run: its paths may be relative to where the study
        # ran (env=False: not checked against this working directory)
        stored = yaml.safe_load((out / "config.yaml").read_text())
        found = C.to_dict(validation.from_dict(stored, env=False))
        want = C.to_dict(plan.cfg)
        for key in PLANNED_FIELDS:  # left to the device plan (None): whatever it chose
            if want["optim"][key] is None:
                want["optim"][key] = found["optim"][key]
        for cfg in (found, want):  # an unset agg is the loss's own (runs saved before wrote it)
            cfg["algorithm"]["agg"] = loss_agg(cfg["algorithm"]["loss"], cfg["algorithm"]["agg"])
        if plan.start is not None and _same_start(found["model"]["path"], plan.cfg.model.path):
            found["model"]["path"] = want["model"]["path"]  # the study moved (--out, --from)
        if found != want:
            diff = ", ".join(f"{k}: {a!r} ≠ {b!r}" for k, a, b in _dict_diff(found, want)[:5])
            raise C.ConfigError(f"{out} holds a run with another configuration ({diff}); "
                                "delete it or use another --out")
    s = _json_or_none(out / "summary.json")  # unreadable (cut by a kill): not finished
    if s and s.get("steps") == plan.cfg.max_steps and not s.get("interrupted"):
        return "done"
    return "resume" if latest_checkpoint(out) is not None else "restart"


def _same_start(found: str, want: str) -> bool:
    """Whether a run's ``model.path`` is the start checkpoint it should start from, in a study
    folder elsewhere: ``…/start/checkpoints/step-N`` alike (the start run's own configuration
    is checked in its folder)."""
    return Path(found).parts[-3:] == Path(want).parts[-3:]


def _dict_diff(a: dict, b: dict, prefix: str = "") -> list[tuple[str, Any, Any]]:
    out = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += _dict_diff(va, vb, f"{prefix}{k}.")
        elif va != vb:
            out.append((f"{prefix}{k}", va, vb))
    return out


def eval_done(plan: RunPlan, spec: StudySpec | None = None) -> bool:
    """Whether every evaluation of the run exists with the plan's current settings."""
    return all(eval_done_at(plan.out / folder, e) for folder, e in plan.evals)


def eval_done_at(folder: Path, e: StudySpec | StudyEvalSpec) -> bool:
    """Whether ``folder`` holds an evaluation with the protocol ``e`` (a spec: its ``eval``)."""
    e = e.eval if isinstance(e, StudySpec) else e
    data = _json_or_none(folder / "eval.json")
    if data is None:
        return False
    s = data.get("settings", {})
    same = (s.get("n") == e.n and s.get("k") == sorted(set(e.k))
            and s.get("temperature") == e.temperature and s.get("split") == e.split
            and s.get("seed") == e.seed)
    # problems.jsonl whole: one line per problem (a kill can cut it short of eval.json's count)
    want = data.get("overall", {}).get("n_problems")
    return same and (want is None or _lines(folder / "problems.jsonl") == want)


def _json_or_none(path: Path) -> dict | None:
    """A JSON file's content, or None when it is missing or unreadable (a truncated write)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _lines(path: Path) -> int:
    """Complete lines of ``path`` (a last line without its newline is cut, not counted)."""
    if not path.exists():
        return 0
    with open(path, "rb") as fh:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
