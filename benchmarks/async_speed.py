"""Per-step wall-clock of a recipe run synchronously and with asynchronous rollouts
(``rollout.async``, max_staleness 1), side by side, and their ratio (figures, not assertions).

    .venv/bin/python benchmarks/async_speed.py [--recipe quickstart] [--rounds 8] [--block 8]

The setups are trained in one process, **interleaved**: round after round, each setup's trainer
runs a block of steps in turn (the others wait), so every setup sees the same stretch of machine
speed. On a shared virtual machine the same synchronous run reads 89 ms/step in one minute and
130 ms in the next: separate runs compare the machine's moods, not the setups. The ratio printed
is the median over rounds of (setup's median step in the round) / (synchronous median step in
the same round), with the rounds' range. The first step of each block is not counted (its batch
was sampled while another setup ran).

Also printed per setup: sample + score and update time per step, the sampler's and the trainer's
idle seconds per step, and, for contrast, the async run without the π_prox recompute
(``algorithm.old_logp: sampler``: the clip on π_θ/μ, docs/rollout-engines.md §8), and the load
average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

from _common import ROOT, Trainer, machine, validation

RECIPES = {"quickstart": "src/explorl/recipes/quickstart.yaml",
           "lab/grpo": "src/explorl/recipes/lab/grpo.yaml"}
ASYNC = ["rollout.async.enabled=true", "rollout.async.max_staleness=1"]
SETUPS = {"sync": [], "async s=1": ASYNC,
          "async s=1, old_logp sampler": [*ASYNC, "algorithm.old_logp=sampler"]}
QUIET = ["log.progress=false", "log.plots=false", "eval.every=0", "log.checkpoint_every=0",
         "log.save_model=false"]


def interleaved(recipe: str, setups: dict[str, list[str]], rounds: int, block: int,
                seed: int = 0) -> dict[str, dict]:
    """Train one trainer per setup, ``rounds`` × ``block`` steps each, in turns. Per setup: the
    per-round medians (``rounds``), every counted step's metrics (``rows``)."""
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        trainers = {}
        for i, (name, sets) in enumerate(setups.items()):
            cfg = validation.load(ROOT / recipe, [*QUIET, *sets, f"seed={seed}"],
                                  max_steps=rounds * block + 1)
            trainers[name] = Trainer(cfg, os.path.join(tmp, str(i)))
            trainers[name].train_step()  # warm-up: first-call costs, the worker's start
            out[name] = {"rounds": [], "rows": []}
        try:
            for _ in range(rounds):
                for name, t in trainers.items():
                    rows = [t.train_step() for _ in range(block)][1:]
                    out[name]["rounds"].append(statistics.median(r["time/step_s"] for r in rows))
                    out[name]["rows"] += rows
        finally:
            for t in trainers.values():
                t.pool.close()
                if t.rollouts is not None:  # rollout.async: the worker
                    t.rollouts.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--recipe", choices=sorted(RECIPES), action="append")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--block", type=int, default=8, help="steps per setup per round (≥ 2)")
    p.add_argument("--smoke", action="store_true", help="tiny run: it runs")
    args = p.parse_args()
    recipes = args.recipe or ["quickstart", "lab/grpo"]
    if args.smoke:
        recipes, args.rounds, args.block = ["quickstart"], 1, 2
    print(f"machine: {machine()}; {os.cpu_count()} cores; load average {os.getloadavg()}")
    print(f"{args.rounds} rounds × {args.block} steps per setup, interleaved")
    for name in recipes:
        res = interleaved(RECIPES[name], SETUPS, args.rounds, max(2, args.block))
        sync = res["sync"]["rounds"]
        for setup, r in res.items():
            rows = r["rows"]
            step = statistics.median(x["time/step_s"] for x in rows)
            gen = statistics.median(x["time/generate_s"] + x["time/score_s"] for x in rows)
            train = statistics.median(x["time/train_s"] + x.get("time/old_logp_s", 0.0)
                                      for x in rows)
            line = (f"{name:10s} {setup:28s} {step * 1000:6.1f} ms/step (median of {len(rows)}; "
                    f"sample+score {gen * 1000:.0f} ms, update {train * 1000:.0f} ms")
            if "time/trainer_idle_s" in rows[0]:
                waits = [statistics.median(x[f"time/{who}_idle_s"] for x in rows) * 1000
                         for who in ("trainer", "sampler")]
                line += f"; idle: trainer {waits[0]:.0f} ms, sampler {waits[1]:.0f} ms"
            print(line + ")")
        for setup in list(res)[1:]:
            ratios = sorted(a / s for a, s in zip(res[setup]["rounds"], sync))
            print(f"{name:10s} {setup:28s} ratio to sync: {statistics.median(ratios):.2f} "
                  f"(rounds {ratios[0]:.2f}–{ratios[-1]:.2f})")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
