"""What carrying an environment's state costs a tool call (``rollout.environment``).

    .venv/bin/python benchmarks/env_overhead.py [--calls 256] [--reps 5] [--workers 2]

Each side answers one turn's ``--calls`` calls through the worker pool (``reward.num_workers``
workers), as ``ToolEngine`` does: ``tool`` the stateless calculator (``ToolRunner``); ``env`` the
same calculator as a method of an environment whose instance travels to the worker as pickle
bytes and back (``EnvRunner``), with a state of ``--state-kb`` KiB (a ``bytes`` attribute; 0: two
integers). The figure is wall-clock milliseconds per call (the median over ``--reps``
repetitions, the pool warm), and ``env − tool`` is the state's overhead.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from explorl.records import PromptRecord  # noqa: E402
from explorl.tools.calculator import calculator  # noqa: E402
from explorl.tools.environments import EnvRunner, EnvSpec  # noqa: E402
from explorl.tools.runner import ToolRunner, ToolSpec  # noqa: E402


class Register:
    """A running total the model adds expressions to (the docs' example), with ballast."""

    def reset(self, ballast_kb: int = 0) -> None:  # a row's column
        self.total, self.calls = 0, 0
        self.ballast = b"x" * (ballast_kb << 10)

    def add(self, expression: str) -> str:
        """Add an integer expression's value to the register; return the new total.

        Args:
            expression: An integer expression, e.g. "347*29".
        """
        self.total += int(calculator(expression))
        self.calls += 1
        return str(self.total)


def per_call_ms(run, n: int, reps: int) -> float:
    run()  # warm: workers started, the spec resolved in each
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) * 1e3 / n)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--state-kb", type=int, nargs="*", default=[0, 64])
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    if a.smoke:
        a.calls, a.reps, a.state_kb = 8, 1, [0]
    calls = [("calculator", {"expression": f"{i}*7"}) for i in range(a.calls)]
    tool = ToolRunner(ToolSpec(("explorl.tools.calculator:calculator",)), num_workers=a.workers,
                      timeout_s=10.0)
    out = {"calls": a.calls, "workers": a.workers,
           "tool_ms": round(per_call_ms(lambda: tool.run(calls), a.calls, a.reps), 3)}
    tool.close()
    for kb in a.state_kb:
        env = EnvRunner(EnvSpec(f"{Path(__file__).resolve()}:Register",  # room for the ballast
                                max_state_bytes=(kb << 10) + 4096), num_workers=a.workers,
                        timeout_s=10.0)
        states = [blob for _, blob in env.reset(
            [PromptRecord("1*1=", "1", extra={"ballast_kb": kb})] * a.calls)]
        adds = [("add", args) for _, args in calls]
        ms = per_call_ms(lambda: env.run(adds, states), a.calls, a.reps)
        out[f"env_{kb}kb_ms"] = round(ms, 3)
        out[f"env_{kb}kb_state_bytes"] = len(states[0])
        env.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
