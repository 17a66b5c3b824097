"""``explorl study``: recipes × seeds on a task, trained, evaluated and judged against the papers'
claims (``explorl.study``); ``--plan`` prices it, ``--pack`` / ``--from`` carry it between
machines, ``--time-limit`` stops it in time to continue later."""

from __future__ import annotations

import argparse

from explorl import config as C
from explorl.config import builtin


def _jobs(text: str) -> int | str:
    return "auto" if text == "auto" else int(text)


def _study(args) -> int:
    from explorl.study import run_study

    used = [f for f, on in (("--plan", args.plan), ("--pack", args.pack),
                            ("--from", args.restore), ("--report", args.report)) if on]
    if len(used) > 1:  # each would silently ignore the other
        raise C.ConfigError(f"explorl study: {' and '.join(used)} do not go together")
    if (args.cost_from or args.calibrate) and not args.plan:
        raise C.ConfigError("explorl study: --cost-from and --calibrate go with --plan")
    if args.calibrate is not None and args.calibrate < 1:
        raise C.ConfigError(f"--calibrate: must be ≥ 1 step, got {args.calibrate}")
    if args.time_limit is not None and (args.plan or args.pack or args.report):
        other = "--plan" if args.plan else "--pack" if args.pack else "--report"
        raise C.ConfigError(f"explorl study: --time-limit and {other} do not go together (it "
                            "limits training)")
    limit = None
    if args.time_limit is not None:
        from explorl.study.jobs import parse_duration

        try:
            limit = parse_duration(args.time_limit)
        except ValueError as e:
            raise C.ConfigError(f"--time-limit: {e}") from None
    if args.plan:
        from explorl.study import plan_study

        return plan_study(builtin.resolve(args.spec, "study"), quick=args.quick, jobs=args.jobs,
                          recipes=args.recipes, cost_from=args.cost_from, out=args.out,
                          calibrate=args.calibrate)
    if args.report:
        from explorl.study.run import report_study

        return report_study(builtin.resolve(args.spec, "study"), quick=args.quick, out=args.out,
                            recipes=args.recipes)
    if args.pack:
        from explorl.study.run import pack_study

        return pack_study(builtin.resolve(args.spec, "study"), args.pack, quick=args.quick,
                          out=args.out, recipes=args.recipes)
    return run_study(builtin.resolve(args.spec, "study"), quick=args.quick, out=args.out,
                     jobs=args.jobs, recipes=args.recipes, restore=args.restore,
                     time_limit=limit)


def add_parser(add) -> argparse.ArgumentParser:
    """The ``study`` subcommand (``add(name, **kw)`` makes a subcommand's parser)."""
    s = add(
        "study", help="recipes × seeds on a lab task: train, eval, report, check the papers' claims"
    )
    s.add_argument("spec", help="a study spec file, or a built-in one's name (lab, subset_sum: "
                                    "explorl recipes --studies)")
    s.add_argument("--quick", action="store_true",
                   help="apply the spec's quick: section (fewer seeds and steps: a pipeline check, "
                        "2 min for the lab study on 2 idle cores)")
    s.add_argument(
        "--out", help="study directory (default runs/study-<name>[-quick]); rerun to continue it"
    )
    s.add_argument("--jobs", type=_jobs,
                   help="runs trained at once, or auto (the cores this process may use; default: "
                        "the spec's jobs)")
    s.add_argument("--recipes", metavar="DIR",
                   help="folder of the recipes the spec names without a path (default: the spec's "
                        "recipe_dir, relative to the spec)")
    s.add_argument("--plan", action="store_true",
                   help="print the runs, steps, the estimated CPU-hours and wall-clock (from the "
                        "measured rates of the study's model: --cost-from, --calibrate, the "
                        "study's own runs or a cached calibration) and how far the study in "
                        "--out has got; run nothing")
    s.add_argument("--report", action="store_true",
                   help="the documents of the runs finished so far, training nothing (a study "
                        "still running, or stopped by --time-limit): marked partial, published "
                        "into the spec's publish folder's partial/ with the runs' archive")
    s.add_argument("--cost-from", nargs="+", metavar="PATH", default=None,
                   help="with --plan: run or study directories of the same model whose measured "
                        "CPU time prices the study (or the lab's committed study.json reports)")
    s.add_argument("--calibrate", nargs="?", type=int, const=2, default=None, metavar="STEPS",
                   help="with --plan: first measure the model's rates with STEPS (default 2) "
                        "training steps of the study's first run, then a validation and an "
                        "evaluation of one generation batch each, one job as the study runs "
                        "it; cached per model and shape")
    s.add_argument("--pack", metavar="FILE",
                   help="write the finished runs' numbers (configs, metrics, per-problem counts; "
                        "no weights) of the study in --out to FILE (.tar.xz) and exit: it "
                        "continues on another machine with --from FILE")
    s.add_argument("--from", dest="restore", metavar="FILE",
                   help="first restore the finished runs of FILE (--pack's, or a published "
                        "study's archive) that --out lacks, then continue (a finished study "
                        "is re-analysed without training)")
    s.add_argument("--time-limit", metavar="DURATION",
                   help="stop in time for a job's time limit (90s, 50m, 2h, 1h30m): says first "
                        "whether the study's estimate (--plan's rates) fits it; no run starts "
                        "that would not end before it (judged by the longest run finished so "
                        "far), the running ones checkpoint and stop at it; exit 75 while runs "
                        "remain (rerun, or --pack, to continue)")
    s.set_defaults(fn=_study)
    return s
