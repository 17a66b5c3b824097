"""``explorl study``: recipes × seeds on a lab task at one rollout budget, evaluated, reported, and
checked against the papers' claims with rules fixed in advance.

    explorl study studies/lab.yaml [--quick] [--out DIR] [--jobs N|auto] [--recipes DIR] [--plan]

A spec (YAML, ``StudySpec``) names the lab task, the recipes (names under its ``recipe_dir`` or
YAML paths), variants of them, the seeds, the shared step count and the overrides every run
gets. Each (recipe, seed) trains in its own process (``python -m explorl train``) with one torch
thread, ``jobs`` at a time; then ``explorl eval`` samples its final policy (n = 16 at T = 1 on
the test split by default). A finished run is not rerun and an interrupted one resumes, so
rerunning the command continues a study. Then ``explorl report`` overlays the runs, and the
report computes its table (``columns``) and judges the claims (the spec's ``claims:``, or the
library's ``CLAIMS``) into ``study.md``, ``claims.md`` and ``study.json``.

Modules, in the order a study uses them:

- ``spec``: the spec's keys, reading and checking it, finding its recipes;
- ``plan``: the tuning and final (recipe, seed) runs, their evaluations, the table's row
  order, how far each run has got;
- ``rates``, ``calibrate``, ``pricing``: what a study will cost (``--plan``, ``--time-limit``),
  from its model's measured CPU rates (runs' metrics, or a short calibration, cached);
  ``cost``: the older estimate from the lab's committed reports' CPU seconds per step;
- ``jobs``: each run's train-then-eval process, ``jobs`` at a time, skipping finished work;
- ``tuning``: each ``tune:`` grid's table and the chosen value (validation pass@k, ties to
  pass@1); the final runs train the choice on fresh seeds;
- ``analyse``: the finished runs' numbers and per-problem pass@k handed to the report
  (``explorl.report``: intervals, the claims the spec declares, tables, figures, documents);
- ``run``: ``run_study``, the whole pipeline.

The study runs the command line only as a child process (``python -m explorl``), never by import:
``explorl.cli`` imports this package, not the reverse.
"""

from explorl.report.claims import CLAIMS, Claim, Evidence, Precondition, combine, evaluate_claims
from explorl.report.numbers import Stat, build_table, columns, run_numbers
from explorl.report.stats import Power
from explorl.study.cost import plan_study
from explorl.study.jobs import JobResult, eval_args, execute, job_command, train_args
from explorl.study.plan import RunPlan, eval_done, order_rows, plan_runs, plan_tuning, run_state
from explorl.study.run import analyse, run_study
from explorl.study.spec import (
    PowerSpec,
    StudyEvalSpec,
    StudySpec,
    TuneGrid,
    TuningSpec,
    VariantSpec,
    archive_path,
    load_spec,
    resolve_recipe,
)

__all__ = [
    "Evidence", "Power", "PowerSpec", "TuneGrid", "TuningSpec", "plan_tuning",
    "combine",
    "CLAIMS", "Claim", "JobResult", "Precondition", "RunPlan", "Stat", "StudyEvalSpec",
    "StudySpec", "VariantSpec", "analyse", "archive_path", "build_table", "columns",
    "eval_args", "eval_done",
    "evaluate_claims", "execute", "job_command", "load_spec", "order_rows", "plan_runs",
    "plan_study", "resolve_recipe", "run_numbers", "run_state", "run_study", "train_args",
]
