"""Rank 0's record of a training run: ``metrics.jsonl``, ``completions.jsonl`` and the trackers.

One object for the trainer to hold, so the loop makes one call per row of metrics and one per
sample of completions, and a resumed run truncates and reopens all three in one place.
"""

from __future__ import annotations

from pathlib import Path

from explorl import config as C
from explorl.outputs.completions import Completion, CompletionsLog
from explorl.outputs.runlog import MetricsLog
from explorl.outputs.trackers import Trackers


class RunOutputs:
    """``metrics.jsonl`` + ``completions.jsonl`` + ``log.report_to``'s trackers of one run.

    ``step``: the step the run starts from (0, or a resumed checkpoint's); a resume drops the
    rows the interrupted run wrote after it, a fresh run any rows a directory already held.
    """

    def __init__(self, cfg: C.RunConfig, run_dir: str | Path, *, resume: bool = False,
                 step: int = 0):
        run_dir = Path(run_dir)
        keep_through = step if resume else -1
        self.metrics = MetricsLog(run_dir / "metrics.jsonl", truncate_after=keep_through)
        self.completions = CompletionsLog(
            run_dir / "completions.jsonl", every=cfg.log.completions_every,
            per_step=cfg.log.completions_per_step, seed=cfg.seed, truncate_after=keep_through)
        try:
            self.trackers = Trackers(cfg, run_dir, resume, start_step=step)
        except BaseException:
            self.metrics.close()
            self.completions.close()
            raise

    def log(self, metrics: dict) -> None:
        """One row of metrics (with its ``step``): to metrics.jsonl and every tracker."""
        self.metrics.write(metrics)
        self.trackers.log(metrics, metrics["step"])

    def completions_due(self, step: int) -> bool:
        """Whether training step ``step`` samples completions (validations always do)."""
        return self.completions.due(step)

    def log_completions(self, rows: list[Completion], step: int, split: str) -> None:
        """A seeded sample of ``rows`` to completions.jsonl and the trackers' tables."""
        self.trackers.log_completions(self.completions.log(rows, step, split), step)

    def close(self) -> None:
        self.metrics.close()
        self.completions.close()
        self.trackers.close()
