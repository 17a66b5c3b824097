"""From a study's finished runs to its documents (``analyse``): each run's numbers, its
per-problem pass@k at every evaluation temperature and checkpoint, and the models' before RL,
handed to the report (``explorl.report``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from explorl.analysis import make_report
from explorl.analysis.frontier import BASELINE, is_baseline
from explorl.analysis.runs import Run, load_run
from explorl.report.checkpoints import Checkpoints, analyse_long
from explorl.report.claims import evaluate_claims
from explorl.report.declared import SECTIONS, as_claim
from explorl.report.documents import write_documents
from explorl.report.endpoints import draw_endpoints
from explorl.report.evidence import Evidence
from explorl.report.figures import draw_figures
from explorl.report.frontier import analyse_frontier
from explorl.report.frontier_report import draw as draw_frontier
from explorl.report.frontier_report import frontier_claims
from explorl.report.numbers import build_table, pooled_law, run_numbers
from explorl.report.stats import problem_counts, problem_passk
from explorl.study.jobs import JobResult
from explorl.study.plan import (
    RunPlan,
    base_of,
    checkpoint_of,
    eval_done,
    eval_done_at,
    final_evals,
    frontier_points,
    order_rows,
    policy_evals,
)
from explorl.study.spec import StudySpec, frontier_k
from explorl.study.tuning import tuning_markdown


def gather_evidence(out: Path, spec: StudySpec, done: list[RunPlan], rows: list[str],
                    per_run: dict[str, list[dict]], groups: dict,
                    plans: list[RunPlan] | None = None) -> Evidence:
    """Per-problem pass@k of every finished run and of each model they start from before RL
    (``base_folders`` of ``plans``, default ``done``) at each evaluation temperature, with the
    per-run numbers and the pooled law."""
    ks = spec.eval.k
    passk, seeds = collect_passk(done, rows, ks)
    evals = policy_evals(final_evals(spec))  # the checkpoints' have their own table

    def base_at(folder: str) -> dict[float, dict[int, np.ndarray]]:
        got = {}
        for sub, e in evals:
            d = out / folder / sub
            if spec.base_eval and eval_done_at(d, e):
                got[e.temperature] = {k: v[None, :] for k, v in
                                      problem_passk(d / "problems.jsonl", ks).items()}
        return got

    main = base_at("base")
    ev = Evidence(per_run, passk, seeds, main.get(spec.eval.temperature), sorted(set(ks)),
                  pooled_law(groups), temperature=spec.eval.temperature,
                  stand_ins=stand_ins(spec))
    ev.unfinished = {p.name for p in plans or done} - {p.name for p in done}
    ev.base_label, ev.base_short = base_names(spec)
    if len(spec.eval.all_temperatures()) > 1:
        for folder, e in evals:
            ev.passk_t[e.temperature] = collect_passk(done, rows, ks, folder)[0]
        ev.base_t = main
    for name, folder in base_of(plans or done).items():
        if folder != "base" and name in passk:
            ev.base_for[name] = folder
            got = base_at(folder)
            if spec.eval.temperature in got:
                ev.bases[folder] = got
    return ev


def base_names(spec: StudySpec) -> tuple[str, str]:
    """The figures' names for the study's ``base`` row (legend, short): the model before RL,
    or with a ``start:`` run the policy every run continues from."""
    if spec.start is None:
        return "base (before RL)", "base"
    st = spec.start
    return f"start ({st.recipe} seed {st.seed}, {st.steps} steps)", "start"


def baseline_row(spec: StudySpec, rows: list[str]) -> str | None:
    """The study's GRPO row, which the summary's overheads divide by: ``grpo``, else the row a
    library claim reads as GRPO (``claims: - {check: …, as: {grpo: real-grpo}}``), else a
    recipe folder's GRPO (``real-grpo``: ``analysis.frontier.is_baseline``); None when the
    study runs none of them."""
    if BASELINE in rows:
        return BASELINE
    named = [d.renames["grpo"] for d in spec.claims or [] if "grpo" in d.renames]
    return next((n for n in named if n in rows), next((n for n in rows if is_baseline(n)), None))


def stand_ins(spec: StudySpec) -> dict[str, list[str]]:
    """Each tuned recipe's variants whose every override sets its tuned knob (``eepo_open``:
    EEPO at another α), not the ablations that switch parts of it off."""
    out: dict[str, list[str]] = {}
    for v in spec.variants:
        grid = spec.tune.get(v.recipe)
        if grid and v.set and all(s.split("=", 1)[0].strip() == grid.key for s in v.set):
            out.setdefault(v.recipe, []).append(v.name)
    return out


def analyse(out: Path, spec: StudySpec, spec_path: Path, quick: bool, plans: list[RunPlan],
            failed: list[JobResult], wall_s: float, tuned: dict | None = None,
            jobs: list[int] | None = None) -> dict:
    """Report (``explorl report``), per-run numbers, table, claims, figures and documents."""
    bad = {j.plan.key for j in failed}
    done = [p for p in plans if p.key not in bad and eval_done(p, spec)]
    if not done:
        raise RuntimeError("no run of the study finished; see the logs under " + str(out / "logs"))
    make_report([p.out for p in done], out / "report")
    rows = [n for n in order_rows(spec, plans) if any(p.name == n for p in done)]
    per_run, groups = collect(done, rows, spec.eval.k)
    baseline = baseline_row(spec, rows)
    table = build_table(rows, per_run, spec.eval.k, baseline)
    ev = gather_evidence(out, spec, done, rows, per_run, groups, plans)
    ev.baseline = baseline or BASELINE
    declared = spec.claims

    def wants(section: str, section_claims: list[dict]) -> list[dict]:
        """A section's claims: all of them without ``claims:``, else if it selects them."""
        return section_claims if declared is None or any(d.check == section for d in declared) \
            else []

    claims = evaluate_claims(ev, None if declared is None else [
        as_claim(d) for d in declared if d.check not in SECTIONS])
    figures = draw_figures(groups, out / "report", ev)
    fr = None
    if spec.frontier.arms:  # the sweep's claims replace those of arms the study does not run
        fr = analyse_frontier(ev.passk, ev.seeds, frontier_points(spec), spec.frontier.baseline,
                              frontier_k(spec), ev.base, collect_counts(done, rows),
                              base_counts(out, spec))
        claims = wants("frontier", frontier_claims(fr)) + [c for c in claims
                                                           if c["verdict"] != "not run"]
        figures = draw_frontier(fr, out / "report", f"lab:{spec.task}") + figures
    long = None
    if spec.eval.checkpoints:  # a long horizon: entropy and pass@k at each evaluated checkpoint
        cp = checkpoint_passk(done, rows, frontier_k(spec), spec.frontier.baseline, ev.base)
        long = analyse_long(groups, cp, [*spec.eval.checkpoints, spec.max_steps],
                            frontier_k(spec), spec.frontier.baseline, out / "report", spec.task,
                            base_counts(out, spec))
        figures = long.figures + figures
        got = [*wants("along", [c for c in long.claims if c["id"].startswith("T-")]),
               *wants("horizon", [c for c in long.claims if not c["id"].startswith("T-")])]
        claims = [*[c for c in claims if c["id"].startswith("F-")], *got,  # they replace the
                  *[c for c in claims if not c["id"].startswith("F-")  # claims not run
                    and (c["verdict"] != "not run" or not got)]]
    own = {d.id for d in declared or [] if d.check is None}  # the spec's own endpoints
    if file := draw_endpoints(claims, own, out / "report"):
        figures.insert(0, ("The declared endpoints: each arm − the baseline, paired by seed",
                           file))
    cfg0 = done[0].cfg
    budget = f"{cfg0.data.prompts_per_step} prompts × {cfg0.rollout.n_samples} samples"
    return write_documents(out, spec, spec_path, quick, rows, table, claims, figures, per_run,
                           failed, wall_s, budget, ev, tuned or {}, jobs, frontier=fr,
                           long=long, tuning_md=tuning_markdown(spec, tuned) if tuned else [],
                           baseline=baseline)


def collect(done: list[RunPlan], rows: list[str],
            k_list: list[int]) -> tuple[dict[str, list[dict]], dict[str, list[Run]]]:
    """Per recipe: each finished run's numbers (with its seed and parameter count) and its
    loaded ``Run``, in ``done`` order."""
    per_run: dict[str, list[dict]] = {n: [] for n in rows}
    groups: dict[str, list[Run]] = {n: [] for n in rows}
    for p in done:
        run = load_run(p.out)
        cfg = yaml.safe_load((p.out / "config.yaml").read_text())
        ev = json.loads((p.out / "eval" / "eval.json").read_text())
        nums = run_numbers(run, cfg, ev, k_list)
        summary = json.loads((p.out / "summary.json").read_text())
        nums.update(seed=p.seed, n_params=summary.get("n_params"))
        per_run[p.name].append(nums)
        groups[p.name].append(run)
    return per_run, groups


def collect_passk(done: list[RunPlan], rows: list[str], k_list: list[int], folder: str = "eval"
                  ) -> tuple[dict[str, dict[int, Any]], dict[str, list[int]]]:
    """Per recipe: k → per-problem pass@k (seeds × problems, rows in seed order) from each
    run's ``<folder>/problems.jsonl``; and the seed of each row."""
    by_name: dict[str, list[tuple[int, dict]]] = {n: [] for n in rows}
    for p in done:
        by_name[p.name].append((p.seed, problem_passk(p.out / folder / "problems.jsonl", k_list)))
    passk, seeds = {}, {}
    for name, got in by_name.items():
        if got:
            got.sort(key=lambda x: x[0])
            seeds[name] = [s for s, _ in got]
            passk[name] = {k: np.stack([g[k] for _, g in got]) for k in k_list}
    return passk, seeds


def collect_counts(done: list[RunPlan], rows: list[str], folder: str = "eval"
                   ) -> dict[str, Any]:
    """Per recipe: each run's per-problem (correct answers, samples) from
    ``<folder>/problems.jsonl``, shape (2, seeds, problems), rows in seed order (as
    ``collect_passk``'s)."""
    by_name: dict[str, list[tuple[int, Any]]] = {n: [] for n in rows}
    for p in done:
        by_name[p.name].append((p.seed, problem_counts(p.out / folder / "problems.jsonl")))
    return {name: np.stack([c for _, c in sorted(got, key=lambda x: x[0])], axis=1)
            for name, got in by_name.items() if got}


def base_counts(out: Path, spec: Any, folder: str = "base") -> Any:
    """The model before RL's per-problem (correct answers, samples) at the main evaluation
    temperature (``stats.problem_counts``); None where it was not evaluated."""
    for sub, e in policy_evals(final_evals(spec)):
        d = out / folder / sub
        if spec.base_eval and e.temperature == spec.eval.temperature and eval_done_at(d, e):
            return problem_counts(d / "problems.jsonl")
    return None


def checkpoint_passk(done: list[RunPlan], rows: list[str], k: int, baseline: str = "grpo",
                     base: dict[int, np.ndarray] | None = None) -> Checkpoints | None:
    """Read every finished run's checkpoint evaluations (``eval_step<s>``) and final one; None
    when the study evaluated no intermediate checkpoint. ``base``: k → (1, problems) or
    (problems,), the base model at the main temperature (step 0)."""
    steps = sorted({s for p in done for f, _ in p.evals if (s := checkpoint_of(f)) is not None})
    if not steps:
        return None
    last = max(p.cfg.max_steps for p in done)
    cp = Checkpoints([*steps, last], k, baseline, list(rows))
    if base is not None and 1 in base and k in base:
        cp.base = {kk: np.asarray(base[kk], float).reshape(-1) for kk in (1, k)}
    for p in done:
        for st in cp.steps:
            path = p.out / ("eval" if st == last else f"eval_step{st}") / "problems.jsonl"
            if path.exists():
                for kk, v in problem_passk(path, [1, k]).items():
                    cp.got.setdefault((p.name, kk, st), {})[p.seed] = v
                cp.counts.setdefault((p.name, st), {})[p.seed] = problem_counts(path)
    return cp


