"""Evaluation: unbiased pass@k / mean@n and per-source summaries of sampled answers."""

from explorl.analysis.passk import mean_at_n, pass_at_k, pass_at_k_batch
from explorl.eval.evaluate import plot_passk, summarize, write_eval_json

__all__ = [
    "mean_at_n",
    "pass_at_k",
    "pass_at_k_batch",
    "plot_passk",
    "summarize",
    "write_eval_json",
]
