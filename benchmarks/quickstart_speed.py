"""Steps/s and peak memory of the quickstart recipe (figures, not assertions).

    .venv/bin/python benchmarks/quickstart_speed.py [--steps 30]
"""

from __future__ import annotations

import argparse
import statistics

from _common import machine, peak_rss_mb, step_times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--smoke", action="store_true", help="tiny shapes, one repetition: it runs")
    args = p.parse_args()
    if args.smoke:
        args.steps = 1
    times, rows = step_times("src/explorl/recipes/quickstart.yaml", [], args.steps)
    med = statistics.median(times)
    gen = statistics.median(r["time/generate_s"] for r in rows)
    train = statistics.median(r["time/train_s"] for r in rows)
    score = statistics.median(r["time/score_s"] for r in rows)
    print(f"machine: {machine()}")
    print(
        f"quickstart (8 prompts x 8 samples, lab addition): {1 / med:.2f} steps/s "
        f"(median step {med * 1000:.0f} ms over {len(times)} steps; generate {gen * 1000:.0f} ms, "
        f"verify {score * 1000:.0f} ms, update {train * 1000:.0f} ms)"
    )
    print(f"peak memory (RSS): {peak_rss_mb():.0f} MB")


if __name__ == "__main__":
    main()
