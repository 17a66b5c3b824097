"""Multi-turn sampling speed per generated token vs single-turn, on the static decode path.

    .venv/bin/python benchmarks/multiturn_speed.py [--reps 5] [--calls 10] [--threads 1]
    .venv-vllm/bin/python benchmarks/multiturn_speed.py --engine vllm   # make setup-vllm

Both sample P prompts × G responses of the lab multiply task's model (float32, T = 1, seeded
draws, ≤ 24 response tokens) on the ``hf`` engine's static path (``rollout.hf.static: true``),
or with ``--engine vllm`` on the ``vllm`` engine (its defaults: recompute on, prefix cache on;
0.25 GiB of KV cache).
``single``: one engine call per batch, stopping at EOS. ``multi``: the tool turns
(``rollout.multiturn.ToolEngine``, up to 3 turns) with the calculator answered in-process; the
tool's own time is measured and left out. Generated tokens are the model's own (tool results
excluded); the figure is wall-clock milliseconds per generated token. Each measurement is a fresh
process; the variants alternate.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("single", "multi")


def worker(spec: dict) -> dict:
    import torch

    torch.set_num_threads(spec["threads"])
    sys.path.insert(0, str(ROOT / "src"))
    from explorl.config import ModelConfig
    from explorl.lab import lab_model_path, make_splits
    from explorl.models import load_model, load_tokenizer
    from explorl.rollout.hf import HFEngine
    from explorl.rollout.multiturn import ToolEngine
    from explorl.tools.calculator import calculator
    from explorl.tools.formats import make_format
    from explorl.tools.runner import ToolAnswer

    # the tiny size's 16-dimension heads are below what vLLM's CPU attention takes (32)
    tiny = {"size": "tiny", **({"hidden_size": 64, "intermediate_size": 128}
                               if spec["engine"] == "vllm" else {})}
    path = lab_model_path("multiply", **(tiny if spec["smoke"] else {}))
    tok = load_tokenizer(path, ModelConfig())
    model = load_model(path, ModelConfig(dtype="float32"), torch.device("cpu")).eval()
    train = make_splits("multiply", seed=0, n_train=512, n_val=16, n_test=16)["train"]
    P, G, max_new = spec["prompts"], spec["samples"], 24
    fmt = make_format("lab", tok, {"calculator": calculator})
    tool_s = [0.0]

    class InProcess:  # the calculator, timed so that its time can be left out
        def run(self, calls):
            t0 = time.perf_counter()
            out = []
            for _, args in calls:
                try:
                    out.append(ToolAnswer(calculator(**args)))
                except Exception as e:  # noqa: BLE001 - the model's malformed calls
                    out.append(ToolAnswer("", str(e)))
            tool_s[0] += time.perf_counter() - t0
            return out

    eos = [tok.eos_token_id]
    stops = eos if spec["variant"] == "single" else eos + fmt.stop_ids
    if spec["engine"] == "vllm":
        from explorl.rollout.vllm import VLLMEngine

        engine = VLLMEngine(path, tok, dtype="float32", kv_cache_gib=0.25, eos_ids=stops,
                            score_batch_size=P * G)
    else:
        engine = HFEngine(tok, batch_size=P * G, static=True, eos_ids=stops)
    if spec["variant"] == "multi":
        engine = ToolEngine(engine, fmt, InProcess(), 3, eos_ids=eos)

    def call(i: int) -> tuple[int, int]:
        prompts = [tok(train[(i * P + j) % len(train)].prompt, add_special_tokens=False)
                   ["input_ids"] for j in range(P)]
        ro = engine.generate(model, prompts, [G] * P, 1.0, max_new,
                             seeds=[i * P + j for j in range(P)])
        calls = int(ro.tool_calls.sum()) if ro.tool_calls is not None else 0
        return int(ro.response_mask.sum()), calls

    for i in range(2):  # warm-up
        call(10_000 + i)
    tool_s[0] = 0.0
    tokens = calls = 0
    w0 = time.perf_counter()
    for i in range(spec["calls"]):
        t, c = call(i)
        tokens, calls = tokens + t, calls + c
    wall = time.perf_counter() - w0 - tool_s[0]
    return {"ms_per_token": 1000 * wall / max(1, tokens), "tokens_per_call": tokens / spec["calls"],
            "calls_per_response": calls / (spec["calls"] * P * G), "tool_s": tool_s[0]}


def measure(spec: dict) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(spec["threads"]), "TRANSFORMERS_VERBOSITY": "error"}
    proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)],
                          capture_output=True, text=True, check=False, env=env, cwd=ROOT)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"worker failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")


def spread(xs: list[float], fmt: str = "6.3f") -> str:
    med, half = statistics.median(xs), (max(xs) - min(xs)) / 2
    return f"{med:{fmt}} ± {half:{fmt}}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--calls", type=int, default=10, help="timed generate calls per measurement")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--sizes", nargs="+", default=["8x8", "32x8"], help="PROMPTSxSAMPLES per call")
    p.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    p.add_argument("--smoke", action="store_true", help="tiny model and shapes, one repetition")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(json.loads(args.worker))), flush=True)
        return
    if args.smoke:
        args.reps, args.calls, args.sizes = 1, 1, ["2x2"]

    import platform

    import torch

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f} at start; torch {torch.__version__}; "
          f"{args.threads} torch thread(s); lab multiply model, engine {args.engine}"
          f"{' (static path)' if args.engine == 'hf' else ''}, T=1, ≤24 tokens")
    for size in args.sizes:
        P, G = (int(x) for x in size.split("x"))
        runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
        for _ in range(args.reps):
            for v in VARIANTS:
                runs[v].append(measure(dict(variant=v, prompts=P, samples=G, calls=args.calls,
                                            threads=args.threads, smoke=args.smoke,
                                            engine=args.engine)))
        print(f"{size} ({P * G} rows per call, median ± half-range over {args.reps} "
              "alternating reps):")
        for v in VARIANTS:
            rs = runs[v]

            def med(key: str) -> float:
                return statistics.median(r[key] for r in rs)  # noqa: B023 - used at once
            print(f"  {v:7s} ms/generated token {spread([r['ms_per_token'] for r in rs])}  "
                  f"tokens/call {med('tokens_per_call'):6.1f}  tool calls/response "
                  f"{med('calls_per_response'):.2f}  (tool time left out: {med('tool_s'):.3f} s)")
        ratio = [m["ms_per_token"] / s["ms_per_token"]
                 for m, s in zip(runs["multi"], runs["single"])]
        print(f"  multi/single time per generated token {spread(ratio, '4.2f')}")


if __name__ == "__main__":
    main()
