"""``explorl`` command line: train, eval, export, passk, fit, report, study, config, recipes,
models.

Every error a user can cause (``explorl.errors.ExplorlError``, and ``OSError`` such as a full
disk) is printed as one ``error: …`` line with exit status 2; ``--debug`` (or
``EXPLORL_DEBUG=1``) shows the traceback instead. Ctrl-C outside training exits with 130; a
reader that stops early (``explorl config | head``) ends it quietly. ``train`` stopped by a signal
exits with 130 (Ctrl-C) or 75 (SIGTERM, SIGUSR1) after its checkpoint (training/preemption.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from rich.console import Console

from explorl import __version__, cli_models, cli_recipes, cli_study, validation
from explorl import config as C
from explorl.errors import ExplorlError
from explorl.outputs.tables import print_tables, stacked


def _train(args) -> int:
    def trainer(*a, **k):  # imported once the config is valid: bad recipes fail faster
        from explorl.training.loop import Trainer

        return Trainer(*a, **k)

    if args.resume:
        run_dir = Path(args.resume)
        if not (run_dir / "config.yaml").is_file():
            print(
                f"error: --resume {run_dir}: no config.yaml there (not a run directory)",
                file=sys.stderr,
            )
            return 2
        if args.recipe:
            print(
                "note: resuming uses the run's own config.yaml; the recipe argument is ignored",
                file=sys.stderr,
            )
        what = f"--resume {run_dir}: config.yaml"
        data = C.load_yaml(C.read_utf8((run_dir / "config.yaml").read_bytes(), what), what)
        for text in args.set or []:
            key, value = C.parse_override(text)
            C.set_path(data, key, value)
        if args.max_steps is not None:
            data["max_steps"] = args.max_steps
        cfg = validation.from_dict(data)
        from explorl.outputs.checkpoint import checkpoint_step, latest_checkpoint

        ckpt = latest_checkpoint(run_dir)
        if ckpt is not None and checkpoint_step(ckpt) >= cfg.max_steps:
            done = checkpoint_step(ckpt)
            print(f"{run_dir} is finished: its checkpoint is at step {done} and max_steps is "
                  f"{cfg.max_steps}, so there is nothing to train. To train further: "
                  f"explorl train --resume {run_dir} --max-steps N (N > {done}).")
            return 0
        trainer = trainer(cfg, run_dir, resume=True, allow_changes=args.allow_changes)
    else:
        if not args.recipe:
            print(
                "error: give a RECIPE (a file, or a built-in name such as quickstart) or --resume "
                "RUN_DIR",
                file=sys.stderr,
            )
            return 2
        cfg = validation.load(args.recipe, args.set, max_steps=args.max_steps, seed=args.seed)
        out = Path(args.out) if args.out else Path("runs") / f"{cfg.name}-seed{cfg.seed}"
        if (out / "metrics.jsonl").exists() and not args.force:
            print(f"error: {out} already holds a run; use --resume {out} to continue it, "
                  "--out for a new directory, or --force to overwrite", file=sys.stderr)
            return 2
        if args.force and (out / "metrics.jsonl").exists():
            import shutil

            shutil.rmtree(out, ignore_errors=True)  # under a launcher every rank clears it
        trainer = trainer(cfg, out)
    summary = trainer.train()
    from explorl.training.preemption import stop_message

    stopped, code = stop_message(summary, trainer.out) if summary["interrupted"] else ("", 0)
    if not trainer.dist.is_main:  # several processes: rank 0 reports
        return code
    out = trainer.out
    final = summary["final"]
    print(f"run directory: {out}")
    print(f"  steps {summary['steps']}/{summary['max_steps']} in {summary['seconds']:.0f}s; "
          f"final reward/mean {final.get('reward/mean', float('nan')):.3f}, "
          f"entropy/mean {final.get('entropy/mean', float('nan')):.3f}; "
          f"{final.get('train/skipped_steps', 0):.0f} skipped (non-finite)")
    print(
        f"  metrics: {out / 'metrics.jsonl'}\n  plots:   {out / 'plots'}/\n"
        f"  checkpoint: {summary['checkpoint']}"
    )
    if stopped:
        print(stopped, flush=True)
    return code


def _eval(args) -> int:
    from explorl.eval.run import run_eval

    run_eval(
        model=args.model,
        data=args.data,
        out_dir=Path(args.out),
        n=args.n,
        k_list=args.k,
        temperature=args.temperature,
        max_problems=args.max_problems,
        max_new_tokens=args.max_new_tokens,
        verifier=args.verifier,
        split=args.split,
        seed=args.seed,
        overrides=args.set,
    )
    return 0


def _export(args) -> int:
    from explorl.eval.export import export_model

    out = export_model(args.model, Path(args.out), overrides=args.set, force=args.force)
    print(f"wrote a merged Hugging Face model to {out}/")
    return 0


def _passk(args) -> int:
    from explorl.eval.evaluate import plot_passk_compare, read_eval

    curves = []
    for item in args.evals:
        label, _, path = item.rpartition("=") if "=" in item else ("", "", item)
        summary = read_eval(Path(path))
        curves.append((label or Path(path).name.removesuffix(".json"), summary))
    out = plot_passk_compare(curves, Path(args.out), title=args.title)
    ks = sorted({k for _, s in curves for k in s["k_list"]})
    rows = [[label, *[f"{s['overall'][f'pass@{k}']:.3f}" if f"pass@{k}" in s["overall"] else "—"
                      for k in ks]] for label, s in curves]
    console = Console()
    print_tables(stacked(["run", *[f"pass@{k}" for k in ks]], rows, console.width), console)
    print(f"wrote {out}")
    return 0


def _fit(args) -> int:
    from explorl.analysis import FitError, fit_run
    from explorl.analysis.entropy_law import plot_fit, write_fit

    try:
        fit = fit_run(Path(args.run_dir), fit_fraction=args.fit_fraction)
    except FitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    run_dir = Path(args.run_dir)
    write_fit(run_dir, fit)
    plot_fit(fit, run_dir / "plots" / "entropy_law.png")
    print(f"R = -a·exp(H) + b   a = {fit.a:.4f}  b = {fit.b:.4f}  R² = {fit.r2:.3f}  "
          f"predicted ceiling (H→0) b−a = {fit.ceiling:.4f}")
    if getattr(fit, "rmse", None) is not None:
        print(
            f"fitted on the first {fit.n_fit}/{fit.n_total} points; "
            f"prediction RMSE on the rest = {fit.rmse:.4f}"
        )
    print(f"wrote {run_dir / 'fit.json'} and {run_dir / 'plots' / 'entropy_law.png'}")
    return 0


def _report(args) -> int:
    from explorl.analysis.report import write_report

    rep = write_report([Path(p) for p in args.run_dirs], Path(args.out))
    print(f"report of {len(args.run_dirs)} run(s) in {Path(args.out)}/")
    print(f"  html:     {rep.html}   (open in a browser; self-contained)")
    print(f"  markdown: {rep.markdown}")
    print(f"  numbers:  {rep.json}")
    names = ", ".join(p.name for _, _, p in rep.figures)
    print(f"  figures:  {len(rep.figures)} PNGs beside them ({names})")
    return 0


def _config(args) -> int:
    """Print the recipe reference (every key, type, default and meaning), or a resolved recipe."""
    if args.recipe:
        import yaml

        # Paths are not checked: templates (recipes/math/) hold placeholders.
        cfg = validation.load(args.recipe, args.set, env=False)
        print(yaml.safe_dump(C.to_dict(cfg), sort_keys=False))
        return 0
    for path, tp, default, doc in C.reference():
        print(f"{path:45s} {tp:22s} {default:18s} {doc}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="explorl",
                                description="RL with verifiable rewards, about controlling "
                                            "exploration.",
                                epilog="Commands joined by --then run in turn in one process, e.g. "
                                       "`explorl train R --out D --then eval D --data lab:addition "
                                       "--out D/eval`.")
    p.add_argument("--version", action="version", version=f"explorl {__version__}",
                   help="print the version and exit")
    p.add_argument("--debug", action="store_true", help="show the traceback of an error")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # --debug also after the command; SUPPRESS keeps a subcommand from resetting the flag
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show the traceback of an error")

    def add(name: str, **kwargs) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[debug], **kwargs)

    _add_run_commands(add)
    _add_reading_commands(add)

    cli_study.add_parser(add)

    c = add("config", help="print the recipe reference, or a resolved recipe")
    c.add_argument("recipe", nargs="?",
                   help="a recipe to resolve (base: files and defaults filled in); without one, "
                        "print every key with its type, default and meaning")
    c.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a config field of the resolved recipe, e.g. optim.lr=1e-5")
    c.set_defaults(fn=_config)
    cli_recipes.add_parser(sub, [debug])
    cli_models.add_parser(sub, [debug])
    return p


def _add_run_commands(add) -> None:
    """``train``, ``eval`` and ``export``: the commands that load a model (``add(name, **kw)``
    makes a subcommand's parser)."""
    t = add("train", help="train a policy from a recipe")
    t.add_argument("recipe", nargs="?",
                   help="a YAML recipe file, or a built-in recipe's name (quickstart, lab/dapo: "
                        "explorl recipes lists them)")
    t.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a config field, e.g. optim.lr=1e-5",
    )
    t.add_argument("--out", help="run directory (default runs/<name>-seed<seed>)")
    t.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest checkpoint")
    t.add_argument(
        "--max-steps", type=int, help="override max_steps (with --resume: extend a finished run)"
    )
    t.add_argument("--seed", type=int, help="override seed")
    t.add_argument("--force", action="store_true", help="overwrite an existing run directory")
    t.add_argument("--allow-changes", action="store_true",
                   help="with --resume: allow --set to change the experiment (loss, advantage "
                        "estimator, model, data, reward, seed); other changes need no flag")
    t.set_defaults(fn=_train)

    e = add("eval", help="pass@k evaluation of a model on a dataset")
    e.add_argument(
        "model", help="local HF model dir, lab:<task>, or a run dir (its latest checkpoint)"
    )
    e.add_argument("--data", nargs="+", required=True, help="lab:<task> or jsonl/parquet files")
    e.add_argument(
        "--split", default="test", choices=["train", "val", "test"], help="lab split (default test)"
    )
    e.add_argument("--out", required=True,
                   help="output directory for eval.json, problems.jsonl (every response and its "
                        "score) and passk.png")
    e.add_argument("--n", type=int, default=16, help="samples per problem")
    e.add_argument("--k", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="k values")
    e.add_argument("--temperature", type=float, default=1.0,
                   help="sampling temperature of the n samples (default 1.0; greedy is always T=0)")
    e.add_argument("--max-problems", type=int, default=None,
                   help="evaluate only the first N problems (default: all)")
    e.add_argument(
        "--max-new-tokens", type=int, default=None, help="default: the model's run config or 256"
    )
    e.add_argument("--verifier", default="auto",
                   help="math, exact, countdown, addition or module:function (default auto: the "
                        "run's reward.verifier, else the lab task's, else math)")
    e.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    e.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="config overrides (model.*, reward.*, lab.*)",
    )
    e.set_defaults(fn=_eval)

    x = add("export", help="write a run's policy as a plain HF model dir (LoRA adapters merged)")
    x.add_argument("model", help="a run dir (its latest checkpoint), a checkpoint dir (LoRA "
                                 "adapters or full weights) or a model dir")
    x.add_argument("--out", required=True, help="output model directory")
    x.add_argument("--force", action="store_true", help="write into a non-empty --out")
    x.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="config overrides (model.*, lab.*)")
    x.set_defaults(fn=_export)


def _add_reading_commands(add) -> None:
    """``passk``, ``fit`` and ``report``: the commands that read finished runs and evaluations."""
    k = add("passk", help="pass@k curves of several `explorl eval` outputs in one figure (e.g. "
                           "the model before and after RL)")
    k.add_argument("evals", nargs="+", metavar="[LABEL=]EVAL",
                   help="an `explorl eval --out` directory or its eval.json, optionally labelled, "
                        "e.g. 'before RL=runs/base-eval'")
    k.add_argument("--out", required=True, help="PNG file to write")
    k.add_argument("--title", default="pass@k", help="figure title (default pass@k)")
    k.set_defaults(fn=_passk)

    f = add("fit", help="fit the entropy–performance law R = −a·exp(H) + b to a run")
    f.add_argument("run_dir", help="run directory (its metrics.jsonl needs ≥ 3 validations)")
    f.add_argument(
        "--fit-fraction",
        type=float,
        default=1.0,
        help="fit on the first fraction, predict the rest",
    )
    f.set_defaults(fn=_fit)

    r = add("report", help="overlay runs: plots, tables, report.md and report.html")
    r.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                   help="run directories; runs with the same recipe name are grouped as seeds")
    r.add_argument("--out", default="report",
                   help="output directory for report.html, report.md, report.json and the PNGs "
                        "(default ./report)")
    r.set_defaults(fn=_report)


THEN = "--then"
"""Separates commands run in turn in one process (``explorl train … --then eval …``): they pay
the torch import once. ``explorl study`` runs each job's train and eval this way."""


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at each message (a test harness, a redirect, or a
    notebook may replace it after the handler was made)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ sets it
        pass


def setup_logging() -> None:
    """Show explorl's own INFO messages (e.g. the lab-model build's progress) on stderr, once."""
    log = logging.getLogger("explorl")
    if not log.handlers:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def main(argv: list[str] | None = None) -> int:
    """Run one command line; a reader that stops early (``explorl config | head``) ends it
    quietly with the shell's SIGPIPE status instead of a BrokenPipeError traceback."""
    try:
        return _main(argv)
    except BrokenPipeError:
        # Python flushes stdout again at exit; point it at /dev/null so that flush is silent.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


def _main(argv: list[str] | None = None) -> int:
    setup_logging()
    argv = sys.argv[1:] if argv is None else list(argv)
    if THEN in argv:
        commands: list[list[str]] = [[]]
        for a in argv:
            if a == THEN:
                commands.append([])
            else:
                commands[-1].append(a)
        for c in commands:  # stop at the first that fails
            print(f"$ explorl {' '.join(c)}", flush=True)
            rc = _main(c)
            if rc:
                return rc
        return 0
    args = build_parser().parse_args(argv)
    debug = args.debug or os.environ.get("EXPLORL_DEBUG", "") not in ("", "0")
    try:
        return args.fn(args)
    except BrokenPipeError:
        raise  # main() ends quietly: the reader stopped reading, nothing went wrong here
    except (ExplorlError, OSError) as e:
        if debug:
            raise
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        if debug:
            raise
        print("interrupted", file=sys.stderr)
        return getattr(e, "code", 130)  # a second SIGTERM/SIGUSR1: 128 + its number


def _one_line(e: BaseException) -> str:
    """The message of ``e`` on one line; an OSError without its own words gets its type's name."""
    text = " ".join(str(e).split())
    return text or type(e).__name__


if __name__ == "__main__":
    sys.exit(main())
