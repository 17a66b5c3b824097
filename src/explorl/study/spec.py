"""The study spec: its keys (``StudySpec``), reading and checking it, and finding its recipes."""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from explorl import config as C
from explorl.config.recipes import read_recipe
from explorl.lab import TASKS, parse_lab_spec
from explorl.report.declared import Declared, check_claims, parse_claims
from explorl.report.numbers import value_text


@dataclass
class VariantSpec:
    name: str
    """Name of the variant: its runs' ``name`` and its row in the tables."""
    recipe: str
    """The recipe it modifies: a name under ``recipe_dir`` or a YAML path (relative to the spec)."""
    set: list[str] = field(default_factory=list)
    """``key=value`` overrides that make the variant (applied after the study's ``set``)."""
    why: str = ""
    """What the variant is for (one line in the study document)."""


@dataclass
class StudyEvalSpec:
    n: int = 16
    """Samples per problem for the final evaluation."""
    temperature: float = 1.0
    """Sampling temperature of the final evaluation."""
    k: list[int] = field(default_factory=lambda: [1, 16])
    """pass@k values reported (each ≤ n)."""
    split: Literal["train", "val", "test"] = "test"
    """Lab split the final policies are evaluated on."""
    max_problems: int | None = None
    """Evaluate on the first N problems of the split; None = all."""
    seed: int = 0
    """Sampling seed of the evaluation (the same for every run)."""
    temperatures: list[float] = field(default_factory=list)
    """More evaluation temperatures: each final policy (and the base model) is also evaluated
    at each (into ``eval_T<T>/``), and the large-k claims are judged with each arm at its best
    temperature as well as at ``temperature``. Empty = only ``temperature``."""
    checkpoints: list[int] = field(default_factory=list)
    """Training steps before the last whose checkpoints are evaluated too (into
    ``eval_step<N>/``, at ``temperature``): pass@k along a long run. The runs must keep them
    (``log.checkpoint_every`` divides each step, ``log.keep_checkpoints`` reaches back to the
    first). Empty = the final policy only."""

    def all_temperatures(self) -> list[float]:
        """``temperature`` first, then the others in the spec's order, without repeats."""
        return list(dict.fromkeys([self.temperature, *self.temperatures]))


@dataclass
class TuneGrid:
    key: str
    """The knob: a config key (``optim.lr``, ``algorithm.kl_cov_coef``, ``rollout.temperature``)."""
    values: list[Any] = field(default_factory=list)
    """The grid: each value is trained with every tuning seed and validated."""


@dataclass
class TuningSpec:
    seeds: list[int] = field(default_factory=lambda: [1000, 1001])
    """Tuning seeds: each grid point trains once per seed; keep them apart from ``seeds`` so
    the final comparison runs on fresh seeds."""
    split: Literal["train", "val", "test"] = "val"
    """Split the grid points are evaluated on (never the final comparison's)."""
    n: int = 64
    """Samples per problem of a grid point's evaluation."""
    k: int | None = None
    """The criterion: mean pass@k over the tuning seeds at this k (None = the largest of
    ``eval.k``); ties go to the higher pass@1."""
    tie: float = 0.0
    """pass@k values within this of the best count as tied (then pass@1 decides)."""
    max_problems: int | None = None
    """Evaluate on the first N problems of ``split``; None = all."""
    max_steps: int | None = None
    """Training steps of a grid point; None = the study's ``max_steps``."""
    seed: int = 0
    """Sampling seed of the grid points' evaluations."""
    extend: int = 0
    """When a recipe's choice is its grid's lowest or highest value, train the next value beyond
    that edge (times the edge's ratio for a grid of positive numbers, plus its step otherwise)
    and choose again, adding at most this many values per recipe; a value the recipe's config
    refuses ends the extension. 0 = the grid as written."""
    share: dict[str, str] = field(default_factory=dict)
    """``{config key: recipe}``: that recipe's tuned value of the key (its ``tune`` grid's key)
    is used by every other recipe and variant that does not tune the key itself, in its grid
    runs and its final runs; the recipe is tuned first. ``{optim.lr: grpo}`` gives every method
    the baseline's tuned learning rate and tunes each method's own knob at it."""


@dataclass
class FrontierSpec:
    key: str = "optim.lr"
    """The knob swept for every arm (each arm's own knob stays at its recipe's setting)."""
    values: list[Any] = field(default_factory=list)
    """The sweep: each arm trains at each value, on every seed."""
    arms: list[str] = field(default_factory=list)
    """Recipes or variants of the spec swept over ``values``: each becomes one row per value,
    named ``<arm>@<value>`` (``grpo@5.0e-05``), and does not run at the spec's own value. The
    baseline's points are trained first. Empty = no sweep."""
    baseline: str = "grpo"
    """The arm whose points make the frontier the others are compared with."""
    k: int | None = None
    """The large k of the (pass@1, pass@k) plane; None = the largest of ``eval.k``."""


@dataclass
class PowerSpec:
    target_mde: float | None = None
    """A minimum detectable pass@k difference to reach: the documents give, per comparison, the
    seeds that would reach it with this many problems. None = report the MDE only."""
    k: int | None = None
    """The k of the power table (None = the largest of ``eval.k``)."""


@dataclass
class StartSpec:
    recipe: str = "grpo"
    """The recipe of the run every arm starts from: a name under ``recipe_dir`` or a YAML path
    (relative to the spec), as variants name theirs."""
    seed: int = 0
    """Its training seed."""
    steps: int = 40
    """Its training steps: every arm starts from its checkpoint of this step."""
    set: list[str] = field(default_factory=list)
    """Its ``key=value`` overrides (after the study's ``set`` and the recipe's ``recipe_set``)."""


@dataclass
class StudySpec:
    name: str = "study"
    """Study name (default output directory ``runs/study-<name>``)."""
    task: str = "addition"
    """Lab task: sets ``model.path`` and ``data.train`` to ``lab:<task>`` before the overrides."""
    recipe_dir: str | None = None
    """Directory (relative to the spec) of the recipes named without a path (``grpo`` →
    ``<recipe_dir>/grpo.yaml``); ``explorl study --recipes DIR`` replaces it. None = every recipe
    must be a YAML path."""
    recipes: list[str] = field(default_factory=list)
    """Recipes: names under ``recipe_dir`` (``grpo``) or YAML paths relative to the spec."""
    variants: list[VariantSpec] = field(default_factory=list)
    """Recipes with extra overrides, each under its own name."""
    seeds: list[int] = field(default_factory=lambda: [0])
    """Seeds; every recipe runs once per seed."""
    max_steps: int = 100
    """Training steps of every run (the same rollout budget for every recipe)."""
    set: list[str] = field(default_factory=list)
    """``key=value`` overrides applied to every run (after the recipe, before a variant's own)."""
    recipe_set: dict[str, list[str]] = field(default_factory=dict)
    """Per-recipe ``key=value`` overrides, applied after ``set``: the task's own values of a
    recipe's targets (e.g. ``{es_constant: [control.adaptive.schedule.target=0.19]}``). A
    variant gets those of the recipe it modifies, then its own ``set``, then any under its own
    name."""
    start: StartSpec | None = None
    """A warm start: this run is trained first (once, into ``<out>/start/``) and every run of
    the study, tuning runs included, starts from its final checkpoint (``model.path``). None =
    every run starts from the task's model."""
    base_eval: bool = True
    """Evaluate the model the runs start from before their RL (the ``base`` row: the task's
    lab model, or the ``start`` run's final policy) with the final evaluation's protocol: the
    reference of the pass@k comparisons."""
    eval: StudyEvalSpec = field(default_factory=StudyEvalSpec)
    """Final evaluation of each run's last checkpoint (``explorl eval``)."""
    keep_finished: Literal["all", "final"] = "all"
    """What a finished run (trained, every evaluation done) keeps on disk: ``all`` the
    checkpoints ``log.keep_checkpoints`` left, or only its ``final`` one (a real model's
    checkpoint is its weights and optimizer state: 1.6 GB for a 135M model)."""
    tune: dict[str, TuneGrid] = field(default_factory=dict)
    """Per recipe or variant: one knob and its grid, run on ``tuning.seeds`` and judged on
    ``tuning.split``; the final runs use the chosen value (a variant also gets the choice of the
    recipe it modifies, before its own ``set``)."""
    tuning: TuningSpec = field(default_factory=TuningSpec)
    """How the ``tune`` grids are run and how a value is chosen."""
    ablations: dict[str, list[str]] = field(default_factory=dict)
    """Per method: the recipes or variants that take it apart (``{e3: [e3_ts, e3_no_anneal]}``);
    the documents compare each with GRPO and with the method."""
    frontier: FrontierSpec = field(default_factory=FrontierSpec)
    """The pass@1–pass@k frontier: arms swept over one knob (the learning rate), each compared
    with the baseline's frontier (``explorl.report.frontier``)."""
    power: PowerSpec = field(default_factory=PowerSpec)
    """The power table: minimum detectable effects and the seeds a target needs."""
    jobs: int | Literal["auto"] = 2
    """Runs trained at once (one torch thread each): the number of cores; ``auto`` = the cores
    this process may use."""
    claims: list[Declared] | None = None
    """The claims the study judges, each a library claim by id (``check: 8a``) or declared:
    id, claim, paper, the arm(s) (``arms:`` gives one claim per arm), ``vs`` (an arm, or
    ``base``), the quantity (``pass@<k>``, ``margin@<k>`` = pass@k − pass@1, ``entropy_ratio``,
    ``run:<key>``, ``ratio:<key>``; ``<k>`` may be ``max``), the claimed ``side`` (1, −1, or 0:
    within ±``null``) and ``null``; several under ``conditions:``
    (``explorl.report.declared``). None = the library's exploration claims (``CLAIMS``)."""
    publish: str | None = None
    """Directory (relative to the working directory; the built-in specs name the repository's
    ``docs/lab-study/…``) that receives study.md, claims.md, study.json and the report's markdown
    and PNGs when the study finishes; None = no copy."""
    archive: str | None = None
    """Where ``publish`` writes the finished runs' numbers (``.tar.xz``: configs, metrics,
    per-response evaluations; no weights; ``--from`` continues or re-analyses from it),
    relative to the working directory; None = ``<publish>/data.tar.xz``. The built-in specs keep
    theirs in the repository's ``study-data/``: data, not documentation."""


SPEC_KEYS = [f.name for f in dataclasses.fields(StudySpec)]


def auto_jobs() -> int:
    """The cores this process may use (``jobs: auto``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def spec_error(path: Path, msg: str) -> C.ConfigError:
    return C.ConfigError(f"study spec {path}: {msg}")


def load_spec(path: str | Path, quick: bool = False) -> StudySpec:
    """Read and validate a study spec; with ``quick`` apply its ``quick:`` section first.

    ``quick`` keys replace the top-level ones, except ``set`` (appended, replacing the spec's
    overrides of the same keys) and ``eval``, ``tuning``, ``power``, ``frontier`` (merged key
    by key). Errors name the key, as the recipe config does.
    """
    path = Path(path)
    if not path.is_file():
        raise C.ConfigError(f"study spec {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise spec_error(path, f"not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise spec_error(path, "must be a mapping of keys")
    data = dict(data)
    overrides = data.pop("quick", None) or {}
    if not isinstance(overrides, dict):
        raise spec_error(path, f"quick: expected a mapping of spec keys, got {overrides!r}")
    for key in overrides:
        if key not in SPEC_KEYS:
            close = difflib.get_close_matches(str(key), SPEC_KEYS, n=1, cutoff=0.5)
            hint = f"; did you mean 'quick.{close[0]}'?" if close else ""
            raise spec_error(path, f"quick.{key}: unknown key{hint} "
                                   f"(valid keys here: {', '.join(SPEC_KEYS)})")
    if quick:
        _apply_quick(data, overrides)
    start, claims = data.pop("start", None), data.pop("claims", None)
    try:
        spec = C.build(StudySpec, data)
        if start is not None:  # built alone: an unknown key's error names its closest one
            spec.start = C.build(StartSpec, start, "start") if isinstance(start, dict) else \
                C.build(StudySpec, {"start": start}).start
        spec.claims = None if claims is None else parse_claims(claims)
    except (C.ConfigError, ValueError) as e:
        raise spec_error(path, str(e)) from None
    ev = spec.eval
    checks = [
        ("recipes", spec.recipes or spec.variants, "name at least one recipe or variant"),
        ("seeds", bool(spec.seeds), "name at least one seed"),
        ("seeds", len(set(spec.seeds)) == len(spec.seeds), f"seeds repeat: {spec.seeds}"),
        ("max_steps", spec.max_steps >= 1, "must be ≥ 1"),
        ("jobs", spec.jobs == "auto" or spec.jobs >= 1, "must be ≥ 1 or auto"),
        ("start.steps", spec.start is None or spec.start.steps >= 1, "must be ≥ 1"),
        ("eval.n", ev.n >= 1, "must be ≥ 1"),
        ("eval.k", bool(ev.k) and all(1 <= k <= ev.n for k in ev.k),
         "every k must be in [1, eval.n]"),
        ("eval.max_problems", ev.max_problems is None or ev.max_problems >= 1, "must be ≥ 1"),
        ("eval.temperatures", all(t > 0 for t in ev.temperatures), "every temperature must be > 0"),
        ("power.target_mde", spec.power.target_mde is None or spec.power.target_mde > 0,
         "must be > 0"),
        ("power.k", spec.power.k is None or spec.power.k in ev.k, "must be one of eval.k"),
        ("eval.checkpoints", all(1 <= s < spec.max_steps for s in ev.checkpoints)
         and len(set(ev.checkpoints)) == len(ev.checkpoints),
         f"each step once, in [1, max_steps = {spec.max_steps}) (the last is the final "
         "evaluation)"),
        *_tuning_checks(spec),
        *_frontier_checks(spec),
        *check_claims(spec.claims or [], arm_names(spec, path), ev.k,
                      ({"frontier"} if spec.frontier.arms else set())
                      | ({"along", "horizon"} if ev.checkpoints else set())),
    ]
    for key, ok, msg in checks:
        if not ok:
            raise spec_error(path, f"{key}: {msg}")
    try:
        parse_lab_spec(f"lab:{spec.task}")
    except (ValueError, ImportError) as e:
        raise spec_error(path, f"task: {spec.task!r} is not a lab task ({e}; built-in: "
                               f"{', '.join(TASKS)}, or rg:<task>)") from None
    for key, sets in spec.recipe_set.items():
        if not isinstance(sets, list) or not all(isinstance(x, str) for x in sets):
            raise spec_error(path, f"recipe_set.{key}: expected a list of key=value strings")
    return spec


def _apply_quick(data: dict, overrides: dict) -> None:
    """``quick:``'s keys into ``data``: ``set`` appended (its keys replace the spec's), the
    mapping sections merged key by key, the rest replaced."""
    for key, value in overrides.items():
        if key == "set":  # quick's overrides win; the spec's for the same key are dropped
            mine = {str(x).split("=", 1)[0].strip() for x in value or []}
            data["set"] = [x for x in data.get("set") or []
                           if str(x).split("=", 1)[0].strip() not in mine] + list(value or [])
        elif (key in ("eval", "tuning", "power", "frontier", "start") and isinstance(value, dict)
              and isinstance(data.get(key), dict)):
            data[key] = {**data[key], **value}
        else:
            data[key] = value


def _tuning_checks(spec: StudySpec) -> list[tuple[str, bool, str]]:
    t = spec.tuning
    checks = [(f"tune.{name}.values", len(g.values) >= 1, "give at least one value")
              for name, g in spec.tune.items()]
    checks += [(f"tune.{name}.values", len(set(map(repr, g.values))) == len(g.values),
                f"values repeat: {g.values}") for name, g in spec.tune.items()]
    if not spec.tune:
        return checks
    return checks + [
        ("tuning.seeds", bool(t.seeds) and len(set(t.seeds)) == len(t.seeds),
         "name distinct seeds"),
        ("tuning.seeds", not set(t.seeds) & set(spec.seeds),
         f"must differ from seeds (the final runs use fresh seeds): both have "
         f"{sorted(set(t.seeds) & set(spec.seeds))}"),
        ("tuning.split", t.split != spec.eval.split,
         f"must differ from eval.split ({spec.eval.split}): choose on other problems than the "
         "final comparison's"),
        ("tuning.n", t.n >= 1, "must be ≥ 1"),
        ("tuning.k", 1 <= tuning_k(spec) <= t.n, f"must be in [1, tuning.n = {t.n}]"),
        ("tuning.tie", t.tie >= 0, "must be ≥ 0"),
        ("tuning.max_steps", t.max_steps is None or t.max_steps >= 1, "must be ≥ 1"),
        ("tuning.max_problems", t.max_problems is None or t.max_problems >= 1, "must be ≥ 1"),
        ("tuning.extend", t.extend >= 0, "must be ≥ 0"),
        *[(f"tuning.share.{key}", src in spec.tune and spec.tune[src].key == key,
           f"{src} must tune {key} (tune.{src}.key: {key}) for the others to share its choice")
          for key, src in t.share.items()],
    ]


def _frontier_checks(spec: StudySpec) -> list[tuple[str, bool, str]]:
    f = spec.frontier
    if not f.arms:
        return []
    return [
        ("frontier.values", len(f.values) >= 2 and len(set(map(repr, f.values))) == len(f.values),
         "give at least two distinct values"),
        ("frontier.arms", len(set(f.arms)) == len(f.arms), f"arms repeat: {f.arms}"),
        ("frontier.baseline", f.baseline in f.arms, f"{f.baseline!r} must be one of the arms"),
        ("frontier.k", f.k is None or (f.k in spec.eval.k and f.k > 1),
         "must be one of eval.k, above 1"),
        ("frontier.k", max(spec.eval.k) > 1 and 1 in spec.eval.k,
         "the frontier needs eval.k to hold 1 and a larger k"),
        ("frontier.arms", not set(f.arms) & set(spec.tune),
         f"a swept arm cannot also be tuned: {sorted(set(f.arms) & set(spec.tune))}"),
    ]


def arm_names(spec: StudySpec, spec_path: Path | None = None) -> list[str]:
    """The study's arms as its tables name them: each recipe's own ``name`` (real/grpo's is
    ``real-grpo``; its file's stem without ``spec_path`` or when the recipe cannot be read: that
    error is the run plan's), each variant's, and each frontier arm's points (``<arm>@<value>``,
    ``plan.point_name``)."""
    names = [_recipe_name(r, spec, spec_path) for r in spec.recipes] + [
        v.name for v in spec.variants]
    swept = [n for n in names if n in spec.frontier.arms]
    return [n for n in names if n not in swept] + [
        f"{a}@{value_text(v)}" for a in swept for v in spec.frontier.values]


def _recipe_name(ref: str, spec: StudySpec, spec_path: Path | None) -> str:
    if spec_path is not None:
        try:
            name = read_recipe(resolve_recipe(ref, spec, "recipes", spec_path)).get("name")
        except (C.ConfigError, OSError, ValueError):
            name = None
        if isinstance(name, str) and name:
            return name
    return Path(ref).stem


def archive_path(spec: StudySpec) -> Path:
    """The published archive of the study's runs (``archive``, or beside its documents)."""
    if spec.archive:
        return Path(spec.archive)
    if not spec.publish:
        raise ValueError("a study without publish has no published archive")
    return Path(spec.publish) / "data.tar.xz"


def frontier_k(spec: StudySpec) -> int:
    """The large k of the frontier: ``frontier.k`` or the largest of ``eval.k``."""
    return spec.frontier.k or max(spec.eval.k)


def tuning_k(spec: StudySpec) -> int:
    """The k of the tuning criterion: ``tuning.k`` or the largest of ``eval.k``."""
    return spec.tuning.k or max(spec.eval.k)


def resolve_recipe(ref: str, spec: StudySpec, where: str, spec_path: Path) -> Path:
    """A recipe reference → its file: a YAML path (relative to the spec, then the working
    directory) or a name under the spec's ``recipe_dir`` (relative to the spec)."""
    base_dir = spec_path.parent
    if ref.endswith((".yaml", ".yml")) or "/" in ref:
        for candidate in (base_dir / ref, Path(ref)):
            if candidate.is_file():
                return candidate
        raise spec_error(spec_path, f"{where}: recipe file {ref!r} not found "
                                    f"(relative to {base_dir} or the working directory)")
    if spec.recipe_dir is None:
        raise spec_error(spec_path, f"{where}: {ref!r} names a recipe, but the spec has no "
                                    "recipe_dir (add `recipe_dir: DIR` or pass --recipes DIR; "
                                    "or give a YAML path)")
    folder = base_dir / spec.recipe_dir
    if not folder.is_dir():
        raise spec_error(spec_path, f"recipe_dir: {folder} is not a directory")
    candidate = folder / f"{ref}.yaml"
    if candidate.is_file():
        return candidate
    names = sorted(p.stem for p in folder.glob("*.yaml"))
    close = difflib.get_close_matches(ref, names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise spec_error(spec_path, f"{where}: unknown recipe {ref!r}{hint} "
                                f"({folder}: {', '.join(names)})")
