"""``explorl study``: recipes × seeds on a lab task at one rollout budget, evaluated, reported, and
checked against the papers' claims with rules fixed in advance.

    explorl study studies/lab.yaml [--quick] [--out DIR] [--jobs N]

A spec (YAML, ``StudySpec``) names the lab task, the recipes (names under ``recipes/lab/`` or
YAML paths), variants of them, the seeds, the shared step count and the overrides every run
gets. Each (recipe, seed) trains in its own subprocess (``python -m explorl train``) with one
torch thread, ``jobs`` at a time; then ``explorl eval`` samples its final policy (n = 16 at
T = 1 on the test split by default). A finished run is not rerun and an interrupted one resumes,
so rerunning the command continues a study. Then ``explorl report`` overlays the runs, and
this module computes the study table (``COLUMNS``) and the claims (``CLAIMS``) into
``study.md``, ``claims.md`` and ``study.json``.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from explorl import config as C
from explorl.analysis.runs import Run, load_run

REPO_ROOT = Path(__file__).resolve().parents[2]
LAB_RECIPES = REPO_ROOT / "recipes" / "lab"


# ----------------------------------------------------------------------------- spec


@dataclass
class VariantSpec:
    name: str
    """Name of the variant: its runs' ``name`` and its row in the tables."""
    recipe: str
    """The recipe it modifies: a name under ``recipes/lab/`` or a YAML path (relative to the spec)."""
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


@dataclass
class StudySpec:
    name: str = "study"
    """Study name (default output directory ``runs/study-<name>``)."""
    task: str = "addition"
    """Lab task: sets ``model.path`` and ``data.train`` to ``lab:<task>`` before the overrides."""
    recipes: list[str] = field(default_factory=list)
    """Recipes: names under ``recipes/lab/`` (``grpo``) or YAML paths relative to the spec."""
    variants: list[VariantSpec] = field(default_factory=list)
    """Recipes with extra overrides, each under its own name."""
    seeds: list[int] = field(default_factory=lambda: [0])
    """Seeds; every recipe runs once per seed."""
    max_steps: int = 100
    """Training steps of every run (the same rollout budget for every recipe)."""
    set: list[str] = field(default_factory=list)
    """``key=value`` overrides applied to every run (after the recipe, before a variant's own)."""
    eval: StudyEvalSpec = field(default_factory=StudyEvalSpec)
    """Final evaluation of each run's last checkpoint (``explorl eval``)."""
    jobs: int = 2
    """Runs trained at once (one torch thread each): the number of cores."""
    publish: str | None = None
    """Directory (relative to the spec) that receives study.md, claims.md, study.json and the
    report's markdown and PNGs when the study finishes; None = no copy."""


SPEC_KEYS = [f.name for f in dataclasses.fields(StudySpec)]


def _spec_error(path: Path, msg: str) -> C.ConfigError:
    return C.ConfigError(f"study spec {path}: {msg}")


def load_spec(path: str | Path, quick: bool = False) -> StudySpec:
    """Read and validate a study spec; with ``quick`` apply its ``quick:`` section first.

    ``quick`` keys replace the top-level ones, except ``set`` (appended, so it wins) and
    ``eval`` (merged key by key). Errors name the key, as the recipe config does.
    """
    path = Path(path)
    if not path.is_file():
        raise C.ConfigError(f"study spec {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise _spec_error(path, f"not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise _spec_error(path, "must be a mapping of keys")
    data = dict(data)
    overrides = data.pop("quick", None) or {}
    if not isinstance(overrides, dict):
        raise _spec_error(path, f"quick: expected a mapping of spec keys, got {overrides!r}")
    for key in overrides:
        if key not in SPEC_KEYS:
            close = difflib.get_close_matches(str(key), SPEC_KEYS, n=1, cutoff=0.5)
            hint = f"; did you mean 'quick.{close[0]}'?" if close else ""
            raise _spec_error(path, f"quick.{key}: unknown key{hint} (valid keys here: {', '.join(SPEC_KEYS)})")
    if quick:
        for key, value in overrides.items():
            if key == "set":
                data["set"] = list(data.get("set") or []) + list(value or [])
            elif key == "eval" and isinstance(value, dict) and isinstance(data.get("eval"), dict):
                data["eval"] = {**data["eval"], **value}
            else:
                data[key] = value
    try:
        spec = C.build(StudySpec, data)
    except C.ConfigError as e:
        raise _spec_error(path, str(e)) from None
    checks = [
        ("recipes", spec.recipes or spec.variants, "name at least one recipe or variant"),
        ("seeds", bool(spec.seeds), "name at least one seed"),
        ("seeds", len(set(spec.seeds)) == len(spec.seeds), f"seeds repeat: {spec.seeds}"),
        ("max_steps", spec.max_steps >= 1, "must be ≥ 1"),
        ("jobs", spec.jobs >= 1, "must be ≥ 1"),
        ("eval.n", spec.eval.n >= 1, "must be ≥ 1"),
        ("eval.k", bool(spec.eval.k) and all(1 <= k <= spec.eval.n for k in spec.eval.k),
         "every k must be in [1, eval.n]"),
        ("eval.max_problems", spec.eval.max_problems is None or spec.eval.max_problems >= 1, "must be ≥ 1"),
    ]
    for key, ok, msg in checks:
        if not ok:
            raise _spec_error(path, f"{key}: {msg}")
    from explorl.lab import TASKS

    if spec.task not in TASKS:
        raise _spec_error(path, f"task: {spec.task!r} is not a lab task (choices: {', '.join(TASKS)})")
    return spec


def resolve_recipe(ref: str, base_dir: Path, where: str, spec_path: Path) -> Path:
    """A recipe reference → its file: a YAML path (relative to the spec, then the working
    directory) or a name under ``recipes/lab/``."""
    if ref.endswith((".yaml", ".yml")) or "/" in ref:
        for candidate in (base_dir / ref, Path(ref)):
            if candidate.is_file():
                return candidate
        raise _spec_error(spec_path, f"{where}: recipe file {ref!r} not found (relative to {base_dir} or the "
                                     "working directory)")
    candidate = LAB_RECIPES / f"{ref}.yaml"
    if candidate.is_file():
        return candidate
    names = sorted(p.stem for p in LAB_RECIPES.glob("*.yaml"))
    close = difflib.get_close_matches(ref, names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise _spec_error(spec_path, f"{where}: unknown recipe {ref!r}{hint} (recipes/lab/: {', '.join(names)})")


# ----------------------------------------------------------------------------- plan


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


def plan_runs(spec: StudySpec, spec_path: Path, out: Path) -> list[RunPlan]:
    """Every (recipe, seed) run, seed-major (an interrupted study has whole seeds first).

    Each run's config is resolved and validated here, before any work starts.
    """
    spec_path = Path(spec_path)
    base_dir = spec_path.parent
    rows: list[tuple[str, Path, list[str]]] = []
    task_sets = [f"model.path=lab:{spec.task}", f"data.train=[lab:{spec.task}]"]
    for i, ref in enumerate(spec.recipes):
        path = resolve_recipe(ref, base_dir, f"recipes[{i}]", spec_path)
        name = C.load(path).name
        rows.append((name, path, [*task_sets, *spec.set]))
    for i, v in enumerate(spec.variants):
        path = resolve_recipe(v.recipe, base_dir, f"variants[{i}].recipe", spec_path)
        rows.append((v.name, path, [*task_sets, *spec.set, *v.set, f"name={v.name}"]))
    seen: dict[str, int] = {}
    for name, _, _ in rows:
        seen[name] = seen.get(name, 0) + 1
    dup = sorted(n for n, c in seen.items() if c > 1)
    if dup:
        raise _spec_error(spec_path, f"recipes: names used twice: {', '.join(dup)} (give a variant its own name)")
    plans = []
    for seed in spec.seeds:
        for name, path, sets in rows:
            sets = [*sets, "log.progress=false"]
            try:
                cfg = C.load(path, sets, max_steps=spec.max_steps, seed=seed)
            except C.ConfigError as e:
                raise _spec_error(spec_path, f"recipe {name} ({path}): {e}") from None
            plans.append(RunPlan(name, seed, path, sets, out / "runs" / f"{name}-seed{seed}", cfg))
    return plans


def order_rows(spec: StudySpec, plans: list[RunPlan]) -> list[str]:
    """Table row order: the spec's recipes, each variant right after the recipe it modifies."""
    names = list(dict.fromkeys(p.name for p in plans))
    base_of = {v.name: Path(v.recipe).stem for v in spec.variants}
    rows = [n for n in names if n not in base_of]
    for v in spec.variants:
        after = [i for i, n in enumerate(rows) if n == base_of[v.name] or base_of.get(n) == base_of[v.name]]
        rows.insert(after[-1] + 1 if after else len(rows), v.name)
    return rows


def run_state(plan: RunPlan) -> str:
    """``done`` (finished: skip), ``resume`` (has a checkpoint), ``fresh`` or ``restart`` (overwrite).

    A run directory that holds a different configuration (the spec changed) is an error rather
    than silently mixed into the table.
    """
    from explorl.checkpoint import latest_checkpoint

    out = plan.out
    if not (out / "metrics.jsonl").exists() and not (out / "config.yaml").exists():
        return "fresh"
    if (out / "config.yaml").exists():
        found = C.to_dict(C.from_dict(yaml.safe_load((out / "config.yaml").read_text())))
        want = C.to_dict(plan.cfg)
        if found != want:
            diff = ", ".join(f"{k}: {a!r} ≠ {b!r}" for k, a, b in _dict_diff(found, want)[:5])
            raise C.ConfigError(f"{out} holds a run with another configuration ({diff}); delete it or use "
                                "another --out")
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


def _eval_done(plan: RunPlan, spec: StudySpec) -> bool:
    path = plan.out / "eval" / "eval.json"
    if not path.exists():
        return False
    s = json.loads(path.read_text()).get("settings", {})
    e = spec.eval
    return (s.get("n") == e.n and s.get("k") == sorted(set(e.k)) and s.get("temperature") == e.temperature
            and s.get("split") == e.split and s.get("seed") == e.seed)


def train_args(plan: RunPlan, state: str) -> list[str]:
    """``explorl train`` arguments that start (``fresh``/``restart``) or ``resume`` the run."""
    if state == "resume":
        return ["train", "--resume", str(plan.out)]
    args = ["train", str(plan.recipe), "--out", str(plan.out), "--seed", str(plan.seed),
            "--max-steps", str(plan.cfg.max_steps)]
    for s in plan.sets:
        args += ["--set", s]
    return args + (["--force"] if state == "restart" else [])


def eval_args(plan: RunPlan, spec: StudySpec) -> list[str]:
    """``explorl eval`` arguments that evaluate the run's final checkpoint into ``<run>/eval/``."""
    e = spec.eval
    args = ["eval", str(plan.out), "--data", f"lab:{spec.task}", "--split", e.split, "--n", str(e.n),
            "--k", *map(str, e.k), "--temperature", str(e.temperature), "--seed", str(e.seed),
            "--out", str(plan.out / "eval")]
    return args + (["--max-problems", str(e.max_problems)] if e.max_problems else [])


THEN = "--then"  # separates the explorl commands that one job process runs in turn


def job_command(commands: list[list[str]]) -> list[str]:
    """The child process of one job: ``explorl train …`` then ``explorl eval …`` in one Python,
    so the run pays the torch/transformers import once (``python -m explorl.study``)."""
    argv = [sys.executable, "-m", "explorl.study"]
    for i, c in enumerate(commands):
        argv += ([THEN] if i else []) + c
    return argv


def job_main(argv: list[str]) -> int:
    """Run ``explorl`` commands separated by ``--then`` in turn; stop at the first that fails."""
    from explorl.cli import main

    commands: list[list[str]] = [[]]
    for a in argv:
        if a == THEN:
            commands.append([])
        else:
            commands[-1].append(a)
    for c in commands:
        print(f"$ explorl {' '.join(c)}", flush=True)
        rc = main(c)
        if rc:
            return rc
    return 0


def _env() -> dict[str, str]:
    # One thread per job: `jobs` runs share the cores; more threads per run only contend.
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


@dataclass
class JobResult:
    plan: RunPlan
    status: str  # "done" | "skipped" | "failed" | "interrupted"
    detail: str = ""
    seconds: float = 0.0


def execute(plan: RunPlan, spec: StudySpec, logs: Path, stop: threading.Event) -> JobResult:
    """Train (or resume) one run, then evaluate its final policy; skip what is already done."""
    t0 = time.perf_counter()
    state = run_state(plan)
    commands = []
    if state != "done":
        shutil.rmtree(plan.out / "eval", ignore_errors=True)  # a stale evaluation of an older policy
        commands.append(train_args(plan, state))
    if state != "done" or not _eval_done(plan, spec):
        commands.append(eval_args(plan, spec))
    if not commands:
        return JobResult(plan, "skipped", state)
    if stop.is_set():
        return JobResult(plan, "interrupted", "not started")
    log = logs / f"{plan.key}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as f:
        rc = subprocess.call(job_command(commands), stdout=f, stderr=subprocess.STDOUT, env=_env())
    seconds = time.perf_counter() - t0
    if rc == 130 or stop.is_set():
        return JobResult(plan, "interrupted", f"exit code {rc}", seconds)
    if rc != 0 or run_state(plan) != "done" or not _eval_done(plan, spec):
        return JobResult(plan, "failed", f"exit code {rc}; log {log}", seconds)
    return JobResult(plan, "done", state, seconds)


# ----------------------------------------------------------------------------- per-run numbers

WINDOW = 0.1  # "initial" / "final" = mean over the first / last 10% of steps (at least one)
LAW_FIT_FRACTION = 0.4  # the early fit: the first 40% of validation points predict the rest


def _w(n: int) -> int:
    return max(1, math.ceil(WINDOW * n))


def _mean(xs: list[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def run_numbers(run: Run, cfg: dict, eval_summary: dict | None, k_list: list[int]) -> dict[str, Any]:
    """Every per-run figure the table and the claims use (None where a run cannot have it)."""
    from explorl.analysis.entropy_law import FitError, fit_entropy_law, law_points
    from explorl.control.schedules import anneal_start

    recs = run.records
    n = len(recs)
    w = _w(n)
    H = [float(r["entropy/mean"]) for r in recs]
    R = [float(r["reward/mean"]) for r in recs]
    out: dict[str, Any] = {"steps": n}
    out["initial_entropy"] = _mean(H[:w])
    out["final_entropy"] = _mean(H[-w:])
    out["entropy_ratio"] = (out["final_entropy"] / out["initial_entropy"]
                            if out["initial_entropy"] else None)
    out["initial_reward"] = _mean(R[:w])
    out["final_reward"] = _mean(R[-w:])
    out["all_wrong_frac"] = _mean([float(r["rollout/all_wrong_frac"]) for r in recs if "rollout/all_wrong_frac" in r])
    out["rollouts_per_step"] = _mean([float(r["rollout/n_samples"]) for r in recs if "rollout/n_samples" in r])
    out["clip_frac"] = _mean([float(r["loss/clip_frac"]) for r in recs if "loss/clip_frac" in r])
    overall = (eval_summary or {}).get("overall", {})
    for k in k_list:
        out[f"eval_pass@{k}"] = overall.get(f"pass@{k}")

    # Tracking: steps after the first 10% (the controllers' warm-up), where a target is logged.
    tracked = [(float(r["entropy/mean"]), float(r["control/target_entropy"])) for r in recs[w:]
               if "control/target_entropy" in r]
    out["tracked_entropy_mean"] = _mean(H[w:])
    out["H0"] = float(recs[0]["control/target_entropy"]) if recs and "control/target_entropy" in recs[0] else None
    if tracked:
        target = statistics.fmean(t for _, t in tracked)
        out["tracking_error"] = statistics.fmean(abs(h - t) for h, t in tracked)
        out["tracking_bias"] = statistics.fmean(h - t for h, t in tracked)
        out["target_mean"] = target
        out["tracking_rel_bias"] = out["tracking_bias"] / target if target else None
    else:
        out["tracking_error"] = out["tracking_bias"] = out["target_mean"] = out["tracking_rel_bias"] = None

    # E3 annealing: entropy over the last 10% of steps vs the 10% of steps before the phase starts.
    t = cfg.get("control", {}).get("temperature", {})
    start = anneal_start(n, t.get("annealing_ratio", 0.0)) if t.get("enabled") and t.get("anneal") else None
    if start is not None and start - 1 >= w:
        pre = H[start - 1 - w: start - 1]
        out["anneal_entropy_ratio"] = statistics.fmean(H[-w:]) / statistics.fmean(pre)
    else:
        out["anneal_entropy_ratio"] = None

    # EEPO: stage-2 minus stage-1 entropy on the steps where the unlearning step ran.
    active = [r for r in recs if "eepo/active" in r]
    on = [r for r in active if r["eepo/active"] >= 0.5 and "entropy/stage1" in r and "entropy/stage2" in r]
    out["eepo_active_frac"] = len(on) / len(active) if active else None
    out["eepo_dH"] = _mean([float(r["entropy/stage2"]) - float(r["entropy/stage1"]) for r in on])

    # Seconds per training step, validation excluded (it runs every eval.every steps).
    out["step_s"] = _mean([float(r["time/step_s"]) - float(r.get("time/val_s", 0.0)) for r in recs
                           if "time/step_s" in r])

    # Entropy–performance law on (training-batch entropy, val accuracy) at the validation steps.
    steps, Hv, Rv = law_points(run)
    out["law_points"] = len(Hv)
    for key in ("law_r2", "law_rmse", "law_naive_rmse", "law_final_error", "law_ceiling"):
        out[key] = None
    try:
        full = fit_entropy_law(Hv, Rv, 1.0, steps=steps)
        out["law_r2"], out["law_ceiling"] = full.r2, full.ceiling
        early = fit_entropy_law(Hv, Rv, LAW_FIT_FRACTION, steps=steps)
        if early.heldout_predictions:
            held = Rv[early.n_fit:]
            naive = Rv[early.n_fit - 1]  # persistence: the last fitted accuracy, held constant
            out["law_rmse"] = early.rmse
            out["law_naive_rmse"] = math.sqrt(statistics.fmean((naive - r) ** 2 for r in held))
            out["law_final_error"] = abs(early.heldout_predictions[-1] - held[-1])
    except FitError:
        pass
    return out


# ----------------------------------------------------------------------------- table


@dataclass
class Stat:
    """Mean and sample standard deviation over seeds (std None with one value)."""

    mean: float | None
    std: float | None
    n: int
    values: list[float]

    @classmethod
    def of(cls, values: list[float | None]) -> Stat:
        vals = [float(v) for v in values if v is not None]
        return cls(statistics.fmean(vals) if vals else None, statistics.stdev(vals) if len(vals) > 1 else None,
                   len(vals), vals)

    def fmt(self, digits: int = 3) -> str:
        if self.mean is None:
            return "—"
        text = f"{self.mean:.{digits}f}"
        return text + (f" ± {self.std:.{digits}f}" if self.std is not None else "")


# (key, title, digits, timing?) — timing columns vary between reruns and stay out of the fingerprint.
def columns(k_list: list[int]) -> list[tuple[str, str, int, bool]]:
    return [
        ("entropy_ratio", "H final / H initial", 3, False),
        ("final_entropy", "H final (nats)", 3, False),
        ("final_reward", "final reward", 3, False),
        *[(f"eval_pass@{k}", f"test pass@{k}", 3, False) for k in k_list],
        ("all_wrong_frac", "all-wrong groups", 3, False),
        ("tracking_error", "tracking error (nats)", 3, False),
        ("eepo_dH", "EEPO H2 − H1 (nats)", 3, False),
        ("rollouts_per_step", "rollouts / step", 1, False),
        ("clip_frac", "PPO clip frac", 4, False),
        ("step_s", "s / step", 3, True),
        ("overhead", "overhead vs GRPO", 2, True),
    ]


def build_table(rows: list[str], per_run: dict[str, list[dict]], k_list: list[int]) -> dict[str, dict[str, Stat]]:
    """Per recipe, per column: ``Stat`` over its seeds. Overhead = s/step ÷ GRPO's mean s/step − 1."""
    base = Stat.of([r["step_s"] for r in per_run.get("grpo", [])]).mean
    table = {}
    for name in rows:
        runs = per_run.get(name, [])
        for r in runs:
            r["overhead"] = r["step_s"] / base - 1 if base and r.get("step_s") is not None else None
        table[name] = {key: Stat.of([r.get(key) for r in runs]) for key, *_ in columns(k_list)}
    return table


# ----------------------------------------------------------------------------- claims

# The rules, fixed before the study's results were seen. "A clearly above B": mean(A) − mean(B)
# exceeds √(sA² + sB²), the combined sample standard deviation over seeds (0 with one seed), and
# ROUND_OFF. ENTROPY_FALL was set after one 300-step GRPO pilot (see RULE_NOTES).
ENTROPY_FALL = 0.85  # GRPO: H final / H initial at most this (a ≥ 15% fall)
REWARD_RISE = 0.05  # GRPO: final − initial training reward at least this
NEAR_H0 = 0.15  # E3 TS: |H final / H0 − 1| at most this
ANNEAL_DROP = 0.95  # E3: H over the last 10% ÷ H over the 10% before annealing, at most this
TRACK_BIAS = 0.10  # ES constant: |mean(H − target)| / target at most this after the first 10%
EEPO_ACTIVE = 0.10  # EEPO: the gate open on at least this fraction of steps
LAW_R2 = (0.3, 0.7)  # law fit: R² ≥ 0.3 partial, ≥ 0.7 yes
LAW_MIN_POINTS = 5  # fewer validation points per run: the law claims are n/a (two coefficients)
LAW_RMSE = 0.03  # early fit: held-out RMSE of val accuracy at most this (3 points)
SAME_BUDGET = 0.01  # budgets: rollouts / step within 1% of the no-budget run's


ROUND_OFF = 1e-6  # differences below this are float round-off, never "clearly above"


def _clearly_above(a: Stat, b: Stat) -> bool | None:
    if a.mean is None or b.mean is None:
        return None
    return a.mean - b.mean > max(math.hypot(a.std or 0.0, b.std or 0.0), ROUND_OFF)


def _f(x: float | None, digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


@dataclass
class Precondition:
    """A claim's check returns this instead of conditions when the lab cannot test the claim."""

    reason: str


@dataclass
class Claim:
    """A paper's claim, the recipes it needs, its fixed rule and the check that applies it."""

    id: str
    claim: str
    paper: str
    rule: str
    needs: tuple[str, ...]
    check: Callable[[dict[str, dict[str, Stat]], dict[str, list[dict]]],
                    tuple[str, list[bool | None] | Precondition]]


def _c_grpo(t, runs):
    g = t["grpo"]
    rise = Stat.of([r["final_reward"] - r["initial_reward"] for r in runs["grpo"]])
    text = (f"GRPO H final/initial = {g['entropy_ratio'].fmt()}; training reward "
            f"{Stat.of([r['initial_reward'] for r in runs['grpo']]).fmt()} → {g['final_reward'].fmt()} "
            f"(rise {rise.fmt()})")
    return text, [None if g["entropy_ratio"].mean is None else g["entropy_ratio"].mean <= ENTROPY_FALL,
                  None if rise.mean is None else rise.mean >= REWARD_RISE]


def _c_ts(t, runs):
    ts = runs["e3_ts"]
    rel = Stat.of([r["final_entropy"] / r["H0"] if r.get("H0") else None for r in ts])
    text = (f"e3_ts H final / H0 = {rel.fmt()} (H0 = {Stat.of([r['H0'] for r in ts]).fmt()}); "
            f"H final: e3_ts {t['e3_ts']['final_entropy'].fmt()} vs GRPO {t['grpo']['final_entropy'].fmt()}")
    return text, [None if rel.mean is None else abs(rel.mean - 1) <= NEAR_H0,
                  _clearly_above(t["e3_ts"]["final_entropy"], t["grpo"]["final_entropy"])]


def _c_anneal(t, runs):
    a = Stat.of([r["anneal_entropy_ratio"] for r in runs["e3"]])
    return (f"e3 H over the last 10% / H before annealing = {a.fmt()}",
            [None if a.mean is None else a.mean <= ANNEAL_DROP])


def _c_cov(t, runs):
    g, cc, kc = t["grpo"]["final_entropy"], t["clip_cov"]["final_entropy"], t["kl_cov"]["final_entropy"]
    return (f"H final: GRPO {g.fmt()}, clip_cov {cc.fmt()}, kl_cov {kc.fmt()}",
            [_clearly_above(cc, g), _clearly_above(kc, g)])


def _c_cov_more(t, runs):
    cc, ccm = t["clip_cov"]["final_entropy"], t["clip_cov_more"]["final_entropy"]
    kc, kcs = t["kl_cov"]["final_entropy"], t["kl_cov_strong"]["final_entropy"]
    text = (f"H final: clip_cov {cc.fmt()} → clip_cov_more {ccm.fmt()}; kl_cov {kc.fmt()} → "
            f"kl_cov_strong {kcs.fmt()}")
    return text, [_clearly_above(ccm, cc), _clearly_above(kcs, kc)]


def _c_eepo(t, runs):
    act = Stat.of([r["eepo_active_frac"] for r in runs["eepo"]])
    d = t["eepo"]["eepo_dH"]
    text = f"gate open on {act.fmt()} of steps; H stage 2 − stage 1 on those steps = {d.fmt()} nats"
    if act.mean is None or act.mean < EEPO_ACTIVE:
        return text, Precondition(f"the gate was open on fewer than {EEPO_ACTIVE:.0%} of steps")
    return text, [_clearly_above(d, Stat(0.0, None, 1, [0.0]))]


def _c_track(t, runs):
    es = runs["es_constant"]
    rel = Stat.of([r["tracking_rel_bias"] for r in es])
    target = Stat.of([r["target_mean"] for r in es]).mean
    grpo_bias = (Stat.of([r["tracked_entropy_mean"] - target for r in runs["grpo"]])
                 if target is not None else Stat.of([]))
    es_bias = Stat.of([r["tracking_bias"] for r in es])
    text = (f"es_constant target {_f(target)}: mean(H − target) = {es_bias.fmt()} "
            f"(relative {rel.fmt()}), mean |H − target| = {t['es_constant']['tracking_error'].fmt()}; "
            f"GRPO's mean(H − target) over the same steps = {grpo_bias.fmt()}")
    closer = _clearly_above(Stat.of([abs(v) for v in grpo_bias.values]), Stat.of([abs(v) for v in es_bias.values]))
    return text, [None if rel.mean is None else abs(rel.mean) <= TRACK_BIAS, closer]


def _c_wsd(t, runs):
    c, w = t["es_constant"], t["es_wsd"]
    text = (f"H final: WSD {w['final_entropy'].fmt()} vs constant {c['final_entropy'].fmt()}; "
            f"test pass@1: WSD {w['eval_pass@1'].fmt()} vs constant {c['eval_pass@1'].fmt()}")
    return text, [_clearly_above(c["final_entropy"], w["final_entropy"]),
                  _clearly_above(w["eval_pass@1"], c["eval_pass@1"])]


def _c_budget(t, runs):
    e, nb = t["e3"], t["e3_no_budget"]
    same = (None if e["rollouts_per_step"].mean is None or not nb["rollouts_per_step"].mean
            else abs(e["rollouts_per_step"].mean / nb["rollouts_per_step"].mean - 1) <= SAME_BUDGET)
    text = (f"all-wrong groups: e3 {e['all_wrong_frac'].fmt()} vs e3_no_budget {nb['all_wrong_frac'].fmt()}; "
            f"rollouts / step {e['rollouts_per_step'].fmt(1)} vs {nb['rollouts_per_step'].fmt(1)}")
    if not same:
        return text, Precondition(f"the two recipes' rollouts / step differ by more than {SAME_BUDGET:.0%}")
    return text, [_clearly_above(nb["all_wrong_frac"], e["all_wrong_frac"])]


def _c_law(t, runs):
    r2 = Stat.of([r["law_r2"] for r in runs["grpo"]])
    pts = Stat.of([r["law_points"] for r in runs["grpo"]])
    if r2.mean is None or pts.mean < LAW_MIN_POINTS:
        r2 = Stat.of([])
    text = f"GRPO R² = {r2.fmt()} over {pts.fmt(0)} validation points per run"
    return text, [None if r2.mean is None else r2.mean >= LAW_R2[0], None if r2.mean is None else r2.mean >= LAW_R2[1]]


def _c_predict(t, runs):
    g = runs["grpo"]
    rmse, naive = Stat.of([r["law_rmse"] for r in g]), Stat.of([r["law_naive_rmse"] for r in g])
    final = Stat.of([r["law_final_error"] for r in g])
    text = (f"fit on the first {LAW_FIT_FRACTION:.0%} of validation points: held-out RMSE {rmse.fmt()}, "
            f"final-point error {final.fmt()}; persistence baseline RMSE {naive.fmt()}")
    return text, [None if rmse.mean is None else rmse.mean <= LAW_RMSE,
                  None if rmse.mean is None or naive.mean is None else rmse.mean < naive.mean]


EM, E3, EEPO, ES = "Entropy Mechanism", "E3", "EEPO", "Entropy Scheduling"
CLAIMS = [
    Claim("1", "GRPO's entropy falls while reward rises", f"{EM} §2; {E3} Fig. 1",
          f"GRPO H final / H initial ≤ {ENTROPY_FALL}; final − initial training reward ≥ {REWARD_RISE}",
          ("grpo",), _c_grpo),
    Claim("2a", "The temperature scheduler keeps entropy near H0", f"{E3} §4.2",
          f"e3_ts |H final / H0 − 1| ≤ {NEAR_H0}; e3_ts H final clearly above GRPO's",
          ("grpo", "e3_ts"), _c_ts),
    Claim("2b", "Annealing lowers entropy in the last phase", f"{E3} §4.2 (Eq. 5)",
          f"e3: H over the last 10% of steps ÷ H over the 10% before the annealing phase ≤ {ANNEAL_DROP}",
          ("e3",), _c_anneal),
    Claim("3a", "Clip-Cov and KL-Cov keep entropy higher than GRPO", f"{EM} §4.4",
          "H final of clip_cov, and of kl_cov, clearly above GRPO's", ("grpo", "clip_cov", "kl_cov"), _c_cov),
    Claim("3b", "More clipping / a larger coefficient gives higher entropy", f"{EM} §4.4 (Fig. 13)",
          "H final: clip_cov_more clearly above clip_cov; kl_cov_strong clearly above kl_cov",
          ("clip_cov", "clip_cov_more", "kl_cov", "kl_cov_strong"), _c_cov_more),
    Claim("4", "EEPO's stage-2 entropy exceeds stage-1 when the gate is active", f"{EEPO} §5",
          f"mean H2 − H1 over the steps with the gate open clearly above 0 (n/a when the gate is open on "
          f"< {EEPO_ACTIVE:.0%} of steps)",
          ("eepo",), _c_eepo),
    Claim("5a", "The adaptive clip controller tracks a constant target", f"{ES} §4.1 (Fig. 5a)",
          f"es_constant |mean(H − target)| / target ≤ {TRACK_BIAS} after the first 10% of steps; and clearly "
          "smaller than GRPO's |mean(H − target)| over the same steps", ("grpo", "es_constant"), _c_track),
    Claim("5b", "WSD ends with lower entropy and higher pass@1 than constant", f"{ES} §4.2",
          "es_wsd H final clearly below es_constant's; es_wsd test pass@1 clearly above es_constant's",
          ("es_constant", "es_wsd"), _c_wsd),
    Claim("6", "Dynamic budgets lower the all-wrong fraction at equal total rollouts", f"{E3} Fig. 8",
          f"all-wrong fraction over training: e3 clearly below e3_no_budget (n/a unless rollouts / step "
          f"agree within {SAME_BUDGET:.0%})", ("e3", "e3_no_budget"), _c_budget),
    Claim("7a", "The entropy–performance law R = −a·e^H + b fits GRPO runs", f"{EM} §2.4 (Eq. 6)",
          f"mean R² over GRPO seeds ≥ {LAW_R2[0]} (partial), ≥ {LAW_R2[1]} (yes); needs ≥ {LAW_MIN_POINTS} "
          "validation points per run", ("grpo",), _c_law),
    Claim("7b", "An early fit predicts the final accuracy", f"{EM} §2.4 (Fig. 5)",
          f"fit on the first {LAW_FIT_FRACTION:.0%} of GRPO's validation points: held-out RMSE ≤ {LAW_RMSE}; "
          "and below the persistence baseline (last fitted accuracy held constant)", ("grpo",), _c_predict),
]


def evaluate_claims(table: dict[str, dict[str, Stat]], per_run: dict[str, list[dict]]) -> list[dict]:
    """Apply each claim's rule: yes = every condition holds, no = none, partial = some.

    A claim whose recipes were not run is ``not run``; one the lab cannot test (a
    ``Precondition`` failed, or a number could not be measured) is ``n/a``, with the reason.
    """
    out = []
    for c in CLAIMS:
        row = {"id": c.id, "claim": c.claim, "paper": c.paper, "rule": c.rule, "needs": list(c.needs)}
        missing = [n for n in c.needs if not per_run.get(n)]
        if missing:
            row.update(numbers=f"recipes not in this study: {', '.join(missing)}", conditions=[], verdict="not run")
        else:
            numbers, conds = c.check(table, per_run)
            if isinstance(conds, Precondition):
                row.update(numbers=f"{numbers} (not testable: {conds.reason})", conditions=[], verdict="n/a")
                out.append(row)
                continue
            if any(v is None for v in conds):
                verdict = "n/a"
                numbers += " (a number the rule needs could not be measured)"
            elif all(conds):
                verdict = "yes"
            elif any(conds):
                verdict = "partial"
            else:
                verdict = "no"
            row.update(numbers=numbers, conditions=conds, verdict=verdict)
        out.append(row)
    return out


# ----------------------------------------------------------------------------- figures


FIGURES = [
    # (file, title, ylabel, recipes, [(key, style, suffix)])
    ("claim_grpo", "Claim 1: GRPO entropy and training reward", "nats / reward", ["grpo"],
     [("entropy/mean", "-", " entropy"), ("reward/mean", "--", " reward")]),
    ("claim_temperature", "Claims 2a/2b: E3 temperature scheduler (dotted = target)", "mean token entropy (nats)",
     ["grpo", "e3_ts", "e3"], [("entropy/mean", "-", ""), ("control/target_entropy", ":", " target")]),
    ("claim_cov", "Claims 3a/3b: Clip-Cov and KL-Cov", "mean token entropy (nats)",
     ["grpo", "clip_cov", "clip_cov_more", "kl_cov", "kl_cov_strong"], [("entropy/mean", "-", "")]),
    ("claim_eepo", "Claim 4: EEPO stage 1 (dashed) and stage 2 (solid) entropy", "mean token entropy (nats)",
     ["eepo"], [("entropy/stage1", "--", " stage 1"), ("entropy/stage2", "-", " stage 2")]),
    ("claim_adaptive", "Claims 5a/5b: adaptive clip-higher (dotted = target)", "mean token entropy (nats)",
     ["grpo", "es_constant", "es_wsd"], [("entropy/mean", "-", ""), ("control/target_entropy", ":", " target")]),
    ("claim_budget", "Claim 6: prompts with every response wrong", "fraction of prompts",
     ["e3_no_budget", "e3"], [("rollout/all_wrong_frac", "-", "")]),
]
SMOOTH = 10  # figures show a trailing 10-step mean; the tables use the raw per-step values


def draw_figures(groups: dict[str, list[Run]], out_dir: Path) -> list[tuple[str, str]]:
    """The claims' figures (only the recipes each claim compares); returns (title, file name)."""
    from explorl.analysis.report import Group
    from explorl.analysis.runs import new_figure, save_figure

    made = []
    for file, title, ylabel, names, lines in FIGURES:
        present = [n for n in names if groups.get(n)]
        subjects = [n for n in names if n != "grpo"] or names  # GRPO alone is only a baseline
        if not any(n in present for n in subjects):
            continue
        fig, axes = new_figure(width=7.0, height=4.2)
        ax = axes[0][0]
        for name in present:
            color = f"C{names.index(name)}"
            for key, style, suffix in lines:
                steps, mean, lo, hi = Group(name, groups[name]).band(key, SMOOTH)
                if not steps:
                    continue
                ax.plot(steps, mean, color=color, linestyle=style, label=f"{name}{suffix}")
                if len(groups[name]) > 1:
                    ax.fill_between(steps, lo, hi, color=color, alpha=0.15, linewidth=0)
        ax.set_title(title)
        ax.set_xlabel(f"training step ({SMOOTH}-step trailing mean; band = min–max over seeds)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        save_figure(fig, out_dir / f"{file}.png", dpi=80)
        made.append((title, f"{file}.png"))
    law = [r for r in groups.get("grpo", []) if len(_law_points(r)[1]) >= 3]
    if law:
        made.append(("Claims 7a/7b: entropy–performance law on GRPO runs", _draw_law(law, out_dir)))
    return made


def _law_points(run: Run):
    from explorl.analysis.entropy_law import law_points

    return law_points(run)


def _draw_law(runs: list[Run], out_dir: Path) -> str:
    from explorl.analysis.entropy_law import FitError, fit_entropy_law
    from explorl.analysis.runs import new_figure, save_figure

    fig, axes = new_figure(width=7.0, height=4.2)
    ax = axes[0][0]
    for i, run in enumerate(runs):
        _steps, H, R = _law_points(run)
        color = f"C{i}"
        ax.scatter(H, R, color=color, s=12, label=f"seed {run.seed}")
        try:
            fit = fit_entropy_law(H, R, 1.0)
            early = fit_entropy_law(H, R, LAW_FIT_FRACTION)
        except FitError:
            continue
        grid = sorted(H)
        ax.plot(grid, [fit.predict(h) for h in grid], color=color, label=f"fit (R² = {fit.r2:.2f})")
        ax.plot(grid, [early.predict(h) for h in grid], color=color, linestyle="--",
                label=f"early fit, first {early.n_fit} pts (RMSE = {_f(early.rmse)})")
    ax.set_title("Claims 7a/7b: R = −a·exp(H) + b on GRPO runs")
    ax.set_xlabel("training-batch entropy H at the validation step (nats)")
    ax.set_ylabel("validation accuracy (mean@16)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small")
    save_figure(fig, out_dir / "claim_law.png", dpi=80)
    return "claim_law.png"


# ----------------------------------------------------------------------------- documents


def _round(x: Any) -> Any:
    if isinstance(x, float):
        return float(f"{x:.10g}") if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_round(v) for v in x]
    return x


def fingerprint(table_json: dict, claims: list[dict], timing: set[str]) -> str:
    """sha256 of every non-timing number of the table and the claims (rounded to 10 digits)."""
    payload = {name: {k: v for k, v in cols.items() if k not in timing} for name, cols in table_json.items()}
    blob = json.dumps(_round({"table": payload, "claims": claims}), sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _md(text: str) -> str:
    return str(text).replace("|", "\\|")


COLUMN_NOTES = """\
- **H final / H initial**: mean `entropy/mean` over the last 10% of steps ÷ over the first 10%
  (entropy at the step's sampling temperature, so E3's temperature changes are included).
- **final reward**: mean `reward/mean` over the last 10% of steps.
- **test pass@k**: `explorl eval` of the final checkpoint: {n} samples per problem at T = {T} on
  the {split} split{maxp}; unbiased pass@k (pass@1 = mean@{n}).
- **all-wrong groups**: mean over all steps of `rollout/all_wrong_frac` (prompts whose every
  response was wrong; DAPO counts its extra rounds' prompts too).
- **tracking error**: mean |H − target| over the steps after the first 10%, for runs with a target
  (E3's H0 or annealed target; Entropy Scheduling's schedule). Per step, so it includes the
  batch's sampling noise.
- **EEPO H2 − H1**: mean of `entropy/stage2 − entropy/stage1` over the steps where the gate was
  open (the unlearning step ran).
- **rollouts / step**: mean `rollout/n_samples` (DAPO's dynamic sampling generates extra rounds).
- **PPO clip frac**: mean `loss/clip_frac`, the fraction of tokens whose clip is active: the
  lever of every method that moves `eps_high` (DAPO's clip-higher, the adaptive controller).
- **s / step**: mean wall-clock seconds of a training step without validation (`time/step_s −
  time/val_s`), with `jobs` runs sharing the machine; **overhead vs GRPO**: s / step ÷ GRPO's − 1.
  Timing columns vary between reruns and machines; every other column is reproduced exactly by
  rerunning with the same seeds (see the fingerprint).
- ± is the sample standard deviation over seeds; no ± with one seed."""

RULE_NOTES = f"""\
Rules are fixed in `explorl/study.py` (`CLAIMS` and the constants above it) and were written
before the study's results were seen, except `ENTROPY_FALL` = {ENTROPY_FALL}, set after one
300-step GRPO pilot (seed 0) showed the lab's entropy falls by about a fifth in 300 steps (the
papers' falls are far steeper). A claim is **yes** when every condition of its rule holds on
the means over seeds, **partial** when some hold, **no** when none hold, and **n/a** when the
lab cannot test it (the rule's precondition fails, e.g. EEPO's gate never opened). "A clearly above B"
means mean(A) − mean(B) > √(s_A² + s_B²), the combined sample standard deviation over seeds
(0 with a single seed), and > 1e-6 (float round-off is not a difference). "Final" numbers are
means over the last 10% of steps; the tracking numbers skip the first 10% of steps (the controllers' warm-up)."""


def write_documents(out: Path, spec: StudySpec, spec_path: Path, quick: bool, rows: list[str],
                    table: dict[str, dict[str, Stat]], claims: list[dict], figures: list[tuple[str, str]],
                    per_run: dict[str, list[dict]], failed: list[JobResult], wall_s: float,
                    budget: str) -> dict:
    """Write study.md, claims.md and study.json into ``out``; returns the study.json payload."""
    cols = columns(spec.eval.k)
    timing = {k for k, _, _, t in cols if t}
    table_json = {name: {k: dataclasses.asdict(s) for k, s in table[name].items()} for name in rows}
    fp = fingerprint(table_json, claims, timing)
    seeds = ", ".join(map(str, spec.seeds))
    a_run = next((runs[0] for runs in per_run.values() if runs), {})
    cmd = f"explorl study {spec_path}" + (" --quick" if quick else "")

    claims_md = ["| # | claim | paper | lab numbers | rule | shown? |", "|---|---|---|---|---|---|"]
    for c in claims:
        claims_md.append(f"| {c['id']} | {_md(c['claim'])} | {_md(c['paper'])} | {_md(c['numbers'])} | "
                         f"{_md(c['rule'])} | **{c['verdict']}** |")
    header = ["recipe", "seeds", *[title for _, title, _, _ in cols]]
    table_md = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in rows:
        cells = [name, str(len(per_run.get(name, [])))]
        cells += [table[name][k].fmt(d) for k, _, d, _ in cols]
        table_md.append("| " + " | ".join(_md(c) for c in cells) + " |")
    maxp = f" (first {spec.eval.max_problems} problems)" if spec.eval.max_problems else ""
    variants = [f"- `{v.name}` = `{v.recipe}` + `{' '.join(v.set)}`" + (f": {v.why}" if v.why else "")
                for v in spec.variants]

    md = [f"# Lab study: {spec.name}{' (quick)' if quick else ''}", "",
          (f"Task `lab:{spec.task}`, {len(rows)} recipes × seeds {{{seeds}}}, {spec.max_steps} steps each "
          f"({budget} per step for every recipe; DAPO's dynamic sampling adds generation rounds, see "
          f"rollouts / step). Overrides for every run: "
          f"`{' '.join(spec.set) or '—'}`. Produced by `{cmd}` in {wall_s / 60:.1f} min of wall-clock "
          f"({spec.jobs} jobs, summed over the command's invocations); the overlay report with every curve is [report/report.md](report/report.md)."), ""]
    if failed:
        md += ["**Incomplete:** these runs failed and are missing from the tables: "
               + "; ".join(f"{j.plan.key} ({j.detail})" for j in failed), ""]
    md += ["## Summary (mean ± std over seeds)", "", *table_md, "", COLUMN_NOTES.format(
        n=spec.eval.n, T=spec.eval.temperature, split=spec.eval.split, maxp=maxp), ""]
    md += ["## Claims", "", *claims_md, "", RULE_NOTES, ""]
    if variants:
        md += ["## Variants", "", *variants, ""]
    if figures:
        md += ["## Figures", ""]
        for title, file in figures:
            md += [f"### {title}", "", f"![{title}](report/{file})", ""]
    md += ["## Reproducing", "",
           (f"`{cmd}` reruns nothing that is finished; with a fresh `--out` it retrains every run and "
           "reproduces every number above except the timing columns (wall-clock). Fingerprint of the "
           f"non-timing numbers: `{fp}` (`study.json`)."), ""]
    (out / "study.md").write_text("\n".join(md))
    (out / "claims.md").write_text("\n".join([f"# Claims: lab study {spec.name}{' (quick)' if quick else ''}", "",
                                              *claims_md, "", RULE_NOTES, ""]))
    payload = {
        "spec": {**dataclasses.asdict(spec), "quick": quick, "path": str(spec_path)},
        "columns": [{"key": k, "title": t, "timing": tm} for k, t, _, tm in cols],
        "rows": rows,
        "table": table_json,
        "claims": claims,
        "runs": {f"{name}-seed{r['seed']}": {k: v for k, v in r.items()} for name, rs in per_run.items() for r in rs},
        "failed": [j.plan.key for j in failed],
        "fingerprint": fp,
        "timing": {"wall_s": wall_s, "model_params": a_run.get("n_params")},
    }
    (out / "study.json").write_text(json.dumps(_round(payload), indent=1) + "\n")
    return payload


def publish(out: Path, dest: Path) -> None:
    """Copy the study's markdown, JSON and PNGs (not the runs, logs or the HTML) to ``dest``."""
    if dest.exists():
        shutil.rmtree(dest)
    (dest / "report").mkdir(parents=True)
    for name in ("study.md", "claims.md", "study.json"):
        shutil.copy2(out / name, dest / name)
    for p in (out / "report").iterdir():
        if p.suffix in (".md", ".png", ".json"):
            shutil.copy2(p, dest / "report" / p.name)


# ----------------------------------------------------------------------------- main


def analyse(out: Path, spec: StudySpec, spec_path: Path, quick: bool, plans: list[RunPlan],
            failed: list[JobResult], wall_s: float) -> dict:
    """Report (``explorl report``), per-run numbers, table, claims, figures and documents."""
    from explorl.analysis import make_report

    bad = {j.plan.key for j in failed}
    done = [p for p in plans if p.key not in bad and _eval_done(p, spec)]
    if not done:
        raise RuntimeError("no run of the study finished; see the logs under " + str(out / "logs"))
    make_report([p.out for p in done], out / "report")
    rows = [n for n in order_rows(spec, plans) if any(p.name == n for p in done)]
    per_run: dict[str, list[dict]] = {n: [] for n in rows}
    groups: dict[str, list[Run]] = {n: [] for n in rows}
    for p in done:
        run = load_run(p.out)
        cfg = yaml.safe_load((p.out / "config.yaml").read_text())
        ev = json.loads((p.out / "eval" / "eval.json").read_text())
        nums = run_numbers(run, cfg, ev, spec.eval.k)
        summary = json.loads((p.out / "summary.json").read_text())
        nums.update(seed=p.seed, n_params=summary.get("n_params"))
        per_run[p.name].append(nums)
        groups[p.name].append(run)
    table = build_table(rows, per_run, spec.eval.k)
    claims = evaluate_claims(table, per_run)
    figures = draw_figures(groups, out / "report")
    cfg0 = done[0].cfg
    budget = f"{cfg0.data.prompts_per_step} prompts × {cfg0.rollout.n_samples} samples"
    return write_documents(out, spec, spec_path, quick, rows, table, claims, figures, per_run, failed, wall_s,
                           budget)


def run_study(spec_path: str | Path, *, quick: bool = False, out: str | Path | None = None,
              jobs: int | None = None, log: Callable[[str], None] = print) -> int:
    """Run (or continue) a study end to end; returns an exit code (0 ok, 1 failed runs, 130 interrupted)."""
    spec_path = Path(spec_path)
    spec = load_spec(spec_path, quick=quick)
    if jobs is not None:
        if jobs < 1:
            raise C.ConfigError(f"--jobs must be ≥ 1, got {jobs}")
        spec.jobs = jobs
    out = Path(out) if out else Path("runs") / f"study-{spec.name}{'-quick' if quick else ''}"
    plans = plan_runs(spec, spec_path, out)
    states = {p.key: run_state(p) for p in plans}
    todo = sum(s != "done" for s in states.values())
    log(f"study {spec.name}{' (quick)' if quick else ''}: {len(plans)} runs ({todo} to train, "
        f"{len(plans) - todo} finished), {spec.max_steps} steps each, {spec.jobs} at a time → {out}")

    # The lab model is built once (under a file lock) before the jobs start, not by all of them at once.
    if any(p.cfg.model.path.startswith("lab:") for p in plans):
        from explorl.models import resolve_model_path

        for path in sorted({p.cfg.model.path for p in plans if p.cfg.model.path.startswith("lab:")}):
            resolve_model_path(path)

    t0 = time.perf_counter()
    stop = threading.Event()
    results: list[JobResult] = []
    logs = out / "logs"
    pool = ThreadPoolExecutor(max_workers=spec.jobs)
    futures = {pool.submit(execute, p, spec, logs, stop): p for p in plans}
    try:
        for i, fut in enumerate(as_completed(futures), 1):
            try:
                r = fut.result()
            except Exception as e:  # noqa: BLE001 — one broken run must not lose the others
                r = JobResult(futures[fut], "failed", f"{type(e).__name__}: {e}")
            results.append(r)
            log(f"  [{i}/{len(plans)}] {r.plan.key}: {r.status}"
                + (f" ({r.detail})" if r.status in ("failed", "interrupted") else f" in {r.seconds:.0f}s")
                + f"  [{(time.perf_counter() - t0) / 60:.1f} min]")
    except KeyboardInterrupt:
        stop.set()
        log("interrupt: the running jobs checkpoint and stop; rerun the same command to continue")
        for f in futures:
            f.cancel()
        pool.shutdown(wait=True)
        return 130
    pool.shutdown(wait=True)
    if any(r.status == "interrupted" for r in results):
        log("interrupted; rerun the same command to continue")
        return 130
    failed = [r for r in results if r.status == "failed"]
    # Wall-clock adds up over the invocations that built this study (a rerun that only resumes
    # or re-analyses does not reset it).
    wall_s = time.perf_counter() - t0
    previous = out / "study.json"
    if previous.exists():
        wall_s += json.loads(previous.read_text()).get("timing", {}).get("wall_s") or 0.0
    payload = analyse(out, spec, spec_path, quick, plans, failed, wall_s)
    if spec.publish:
        dest = spec_path.parent / spec.publish
        publish(out, dest)
        log(f"published to {dest}")
    log(f"wrote {out / 'study.md'}, {out / 'claims.md'}, {out / 'study.json'} and {out / 'report'}/")
    for c in payload["claims"]:
        log(f"  claim {c['id']:3s} {c['verdict']:8s} {c['claim']}")
    if failed:
        log("failed runs: " + "; ".join(f"{r.plan.key} ({r.detail})" for r in failed))
        return 1
    return 0


if __name__ == "__main__":  # a study job's child process (see ``job_command``)
    sys.exit(job_main(sys.argv[1:]))
