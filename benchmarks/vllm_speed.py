"""Rollout speed and training-step time: the ``vllm`` engine vs the ``hf`` engine (figures only).

    make setup-vllm && .venv-vllm/bin/python benchmarks/vllm_speed.py [--reps 3] [--calls 3]

Two models: the lab addition model (~0.9M parameters, answers of ≤ 5 tokens) and a wider
random-init Llama (``--wide``, default d=768, 4 layers: ~28M parameters; it seldom says EOS,
so rows run to the length limit). For each model and engine, in a fresh process:

- **sampling**: ``--calls`` generate calls of P prompts × G samples at T = 1 after one warm-up
  call; tokens (incl. EOS) per wall-clock second and per CPU second (user + system of the
  process and its live children: vLLM's child-process mode, verifier workers). ``vllm`` is
  the engine as the trainer uses it (weight checksum, probe check, and the forward over the
  responses that gives old_logp and entropy: ``rollout.vllm.recompute``); ``vllm-raw`` skips
  that forward (``recompute: false``, entropy left to the trainer).
- **step**: ``--steps`` training steps of the quickstart recipe (lab: as shipped; wide: its
  model swapped in) after two warm-up steps, with validation and checkpoints off: wall and
  CPU seconds per step (the vLLM step includes the weight push after each update).
- **start-up** of the vLLM engine (wall, CPU).

The machine is shared: wall-clock figures swing with the load, CPU-time figures much less.
Each measurement is a fresh process; the engines alternate within a repetition.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("hf", "vllm", "vllm-raw")


def cpu_seconds() -> float:
    """User + system seconds of this process and its live children."""
    import psutil

    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


def build_wide(out: Path, hidden: int, layers: int) -> Path:
    """A random-init Llama of width ``hidden`` with the lab tokenizer, saved to ``out``."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, str(ROOT / "src"))
    from explorl.lab import lab_model_path

    lab = lab_model_path("addition")
    tok = AutoTokenizer.from_pretrained(lab)
    torch.manual_seed(0)
    heads = max(1, hidden // 64)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=int(hidden * 8 / 3) // 64 * 64,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def worker(spec: dict) -> dict:
    import torch

    torch.set_num_threads(spec["threads"])
    sys.path.insert(0, str(ROOT / "src"))
    from explorl.config import ModelConfig
    from explorl.lab import lab_model_path, make_splits
    from explorl.models import load_model, load_tokenizer, render_prompt

    path = Path(spec["model"]) if spec["model"] != "lab" else lab_model_path("addition")
    if spec["kind"] == "step":
        return step_worker(spec, path)
    tok = load_tokenizer(path, ModelConfig())
    model = load_model(path, ModelConfig(dtype="float32"), torch.device("cpu")).eval()
    train = make_splits("addition", seed=0)["train"]
    P, G, max_new, engine_name = spec["prompts"], spec["samples"], spec["max_new"], spec["engine"]
    out: dict = {}
    w0, c0 = time.perf_counter(), cpu_seconds()
    if engine_name == "hf":
        from explorl.rollout.hf import HFEngine

        engine = HFEngine(tok, batch_size=P * G)
    else:
        from explorl.rollout.vllm import VLLMEngine

        engine = VLLMEngine(
            path,
            tok,
            dtype="float32",
            kv_cache_gib=1.0,
            recompute=engine_name == "vllm",
            in_process=spec["in_process"],
            score_batch_size=P * G,
        )
        out.update(startup_s=time.perf_counter() - w0, startup_cpu_s=cpu_seconds() - c0)

    def call(i: int) -> int:
        prompts = [
            render_prompt(tok, train[(i * P + j) % len(train)].prompt, True) for j in range(P)
        ]
        ro = engine.generate(
            model, prompts, [G] * P, 1.0, max_new, seeds=[i * P + j for j in range(P)]
        )
        return int(ro.response_mask.sum())

    call(10_000)  # warm-up (and vLLM's first weight push)
    tokens, w0, c0 = 0, time.perf_counter(), cpu_seconds()
    for i in range(spec["calls"]):
        tokens += call(i)
    wall, cpu = time.perf_counter() - w0, cpu_seconds() - c0
    if hasattr(engine, "close"):
        engine.close()
    # A smoke run can finish inside the CPU clock's resolution: no rate then, not a crash.
    return {**out, "tokens_per_s": tokens / wall if wall > 0 else float("nan"),
            "tokens_per_cpu_s": tokens / cpu if cpu > 0 else float("nan"),
            "s_per_call": wall / spec["calls"], "tokens_per_call": tokens / spec["calls"]}


def step_worker(spec: dict, path: Path) -> dict:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _common import step_times

    sets = [f"rollout.engine={spec['engine']}", "rollout.vllm.kv_cache_gib=1.0"]
    if spec["model"] != "lab":
        sets.append(f"model.path={path}")
    cpu: list[float] = []
    walls, rows = step_times("src/explorl/recipes/quickstart.yaml", sets, spec["steps"], warmup=2,
                             cpu=cpu)
    return {"step_s": statistics.median(walls), "step_cpu_s": statistics.median(cpu),
            "tokens_per_step": statistics.median(r["response/length_mean"] * r["rollout/n_samples"]
                                                 for r in rows)}


def measure(spec: dict) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(spec["threads"]), "TRANSFORMERS_VERBOSITY": "error",
           "VLLM_LOGGING_LEVEL": "ERROR"}
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", json.dumps(spec)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        cwd=ROOT,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"worker failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")


def spread(xs: list[float], fmt: str = "6.0f") -> str:
    med, half = statistics.median(xs), (max(xs) - min(xs)) / 2
    return f"{med:{fmt}} ± {half:{fmt}}"


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--calls", type=int, default=3, help="timed generate calls per measurement")
    p.add_argument("--steps", type=int, default=3, help="timed training steps per measurement")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--wide", default="768x4", help="HIDDENxLAYERS of the random-init model")
    p.add_argument("--lab-size", default="64x8:8", help="PROMPTSxSAMPLES:MAX_NEW for the lab model")
    p.add_argument(
        "--wide-size", default="16x8:32", help="PROMPTSxSAMPLES:MAX_NEW for the wide model"
    )
    p.add_argument(
        "--child-process", action="store_true", help="vLLM in a child process (default: in-process)"
    )
    p.add_argument("--no-steps", action="store_true", help="skip the training-step measurements")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, one repetition: it runs")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(json.loads(args.worker))), flush=True)
        return
    if args.smoke:
        args.reps, args.calls, args.steps = 1, 1, 1
        args.wide, args.lab_size, args.wide_size = "64x1", "2x2:4", "2x2:4"

    import platform

    import torch
    import transformers
    try:
        import vllm
    except ImportError:  # explorl's HF engine only
        vllm = None
    engines = ENGINES if vllm else ENGINES[:1]

    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f} at start; torch {torch.__version__}, "
        f"transformers {transformers.__version__}, "
        f"vllm {vllm.__version__ if vllm else 'not installed (its side skipped)'}; "
        f"{args.threads} torch thread(s); float32; vLLM "
        f"{'child process' if args.child_process else 'in-process'}; "
        f"median ± half-range over {args.reps} reps"
    )
    hidden, layers = (int(x) for x in args.wide.split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        wide = str(build_wide(Path(tmp) / "wide", hidden, layers))
        for name, model, size in (
            ("lab", "lab", args.lab_size),
            (f"wide {args.wide}", wide, args.wide_size),
        ):
            shape, max_new = size.split(":")
            P, G = (int(x) for x in shape.split("x"))
            base = {
                "model": model,
                "prompts": P,
                "samples": G,
                "max_new": int(max_new),
                "calls": args.calls,
                "threads": args.threads,
                "in_process": not args.child_process,
                "steps": args.steps,
            }
            runs: dict[str, list[dict]] = {e: [] for e in engines}
            steps: dict[str, list[dict]] = {e: [] for e in engines[:2]}
            for _ in range(args.reps):
                for e in engines:
                    runs[e].append(measure({**base, "kind": "sample", "engine": e}))
                if not args.no_steps:
                    for e, rs in steps.items():
                        rs.append(measure({**base, "kind": "step", "engine": e}))
            print(f"{name}: sampling {P}x{G} rows per call, <= {max_new} new tokens, T = 1")
            for e in engines:
                rs = runs[e]
                extra = (
                    f"  start-up {statistics.median(r['startup_s'] for r in rs):4.1f} s "
                    f"({statistics.median(r['startup_cpu_s'] for r in rs):4.1f} CPU-s)"
                    if e != "hf"
                    else ""
                )
                print(
                    f"  {e:9s} tokens/s {spread([r['tokens_per_s'] for r in rs])}  tokens/CPU-s "
                    f"{spread([r['tokens_per_cpu_s'] for r in rs])}  "
                    f"{statistics.median(r['tokens_per_call'] for r in rs):6.0f} tokens/call{extra}"
                )
            for e, rs in steps.items():
                if rs:
                    print(
                        f"  step ({e:4s}) {spread([r['step_s'] for r in rs], '6.2f')} s  "
                        f"{spread([r['step_cpu_s'] for r in rs], '6.2f')} CPU-s  "
                        f"~{statistics.median(r['tokens_per_step'] for r in rs):5.0f} tokens/step"
                    )


if __name__ == "__main__":
    main()
