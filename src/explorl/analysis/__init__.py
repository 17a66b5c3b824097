"""Reading runs back: a run's curves (``plots``), the entropy–performance law, multi-run reports
and the unbiased pass@k estimator (``passk``)."""

from explorl.analysis.entropy_law import (
    EntropyLawFit,
    FitError,
    fit_entropy_law,
    fit_run,
    plot_fit,
    write_fit,
)
from explorl.analysis.report import make_report

__all__ = [
    "EntropyLawFit",
    "FitError",
    "fit_entropy_law",
    "fit_run",
    "make_report",
    "plot_fit",
    "write_fit",
]
