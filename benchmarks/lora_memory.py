"""Trainable parameters, optimizer state and peak memory of one training step: LoRA vs full.

The model is Qwen2.5-0.5B's shape built from its config (random weights, no download: hidden
896, 24 layers, 14 heads, 2 KV heads, intermediate 4864, vocab 151936, tied embeddings). One
step = explorl's loss forward (``response_logprobs``, the packed layout) over a short batch,
backward, and explorl's AdamW step over the parameters the trainer would train (every one, or
the adapters of ``model.lora``'s defaults: rank 8, all linear layers). Each mode runs in its own
subprocess, so its peak resident memory (``ru_maxrss``) is its own; "step" is the peak minus
the resident memory once the model is built.

    python benchmarks/lora_memory.py            # the 0.5B shape (~3 min on one CPU thread)
    python benchmarks/lora_memory.py --smoke    # a tiny shape, seconds
    python benchmarks/lora_memory.py --rank 16 --length 64
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

QWEN_05B = {"vocab_size": 151936, "hidden_size": 896, "num_hidden_layers": 24,
            "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864}
SMOKE = {"vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def current_rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize() / 2**20


def worker(spec: dict) -> dict:
    sys.path.insert(0, str(ROOT / "src"))
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from explorl import adapters
    from explorl.config import LoRAConfig, OptimConfig
    from explorl.policy.forward import response_logprobs
    from explorl.training.optim import make_optimizer

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = Qwen2Config(**spec["shape"], tie_word_embeddings=True, max_position_embeddings=4096)
    model = Qwen2ForCausalLM(cfg)
    if spec["mode"] == "lora":
        model.requires_grad_(False)
        model = adapters.add_adapters(model, LoRAConfig(enabled=True, rank=spec["rank"],
                                                        alpha=2.0 * spec["rank"]))
    model.train()
    total, trainable = adapters.parameter_counts(model)
    optimizer, _ = make_optimizer(OptimConfig(lr=1e-4), model, torch.device("cpu"), "ddp")
    built = current_rss_mb()
    B, P, R, V = spec["batch"], spec["length"], spec["length"], spec["shape"]["vocab_size"]
    prompt = torch.randint(0, V, (B, P))
    response = torch.randint(0, V, (B, R))
    ones_p, ones_r = torch.ones(B, P, dtype=torch.bool), torch.ones(B, R, dtype=torch.bool)
    t0 = time.perf_counter()
    logp, ent = response_logprobs(model, prompt, ones_p, response, ones_r, 1.0)
    (-logp.mean() - 0.01 * ent.mean()).backward()
    optimizer.step()
    seconds = time.perf_counter() - t0
    state = sum(t.numel() * t.element_size() for s in optimizer.state.values()
                for t in s.values() if torch.is_tensor(t))
    return {"mode": spec["mode"], "params": total, "trainable": trainable,
            "optimizer_state_mb": state / 2**20, "built_rss_mb": built,
            "peak_rss_mb": peak_rss_mb(), "step_mb": peak_rss_mb() - built, "step_s": seconds}


def run(spec: dict) -> dict:
    out = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{spec['mode']} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="a tiny model shape (seconds)")
    ap.add_argument("--rank", type=int, default=8, help="LoRA rank (default 8)")
    ap.add_argument("--length", type=int, default=32,
                    help="prompt and response tokens per row (default 32)")
    ap.add_argument("--batch", type=int, default=2, help="responses in the step (default 2)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    shape = SMOKE if args.smoke else QWEN_05B
    import platform

    import torch

    print(f"# {'smoke shape' if args.smoke else 'Qwen2.5-0.5B shape'} {shape}; batch "
          f"{args.batch} x ({args.length} prompt + {args.length} response) tokens; LoRA rank "
          f"{args.rank}, all linear layers; {platform.processor() or platform.machine()}, "
          f"1 torch thread, torch {torch.__version__}")
    rows = [run({"mode": m, "shape": shape, "rank": args.rank, "length": args.length,
                 "batch": args.batch}) for m in ("full", "lora")]
    print(f"{'':6s}{'trainable':>14s}{'of params':>14s}{'optim state MB':>16s}"
          f"{'built RSS MB':>14s}{'peak RSS MB':>13s}{'step MB':>10s}{'step s':>8s}")
    for r in rows:
        print(f"{r['mode']:6s}{r['trainable']:>14,d}{r['params']:>14,d}"
              f"{r['optimizer_state_mb']:>16.1f}{r['built_rss_mb']:>14.0f}"
              f"{r['peak_rss_mb']:>13.0f}{r['step_mb']:>10.0f}{r['step_s']:>8.2f}")
    full, lora = rows
    print(f"LoRA trains {lora['trainable'] / full['trainable']:.2%} of the parameters; optimizer "
          f"state {full['optimizer_state_mb'] / max(lora['optimizer_state_mb'], 1e-9):.0f}x "
          f"smaller; peak resident memory {lora['peak_rss_mb'] / full['peak_rss_mb']:.0%} of full "
          f"fine-tuning's")
    print(json.dumps({"rows": rows}))


if __name__ == "__main__":
    main()
