"""Memory and compute of the loss pass with and without ``model.gradient_checkpointing``.

One micro-batch through explorl's loss forward (``forward.response_logprobs``: the packed layout,
G responses per prompt, chunked log-prob and entropy) and its backward, on a random-init
Llama-shaped model, with transformers' non-reentrant checkpointing off and on. Each side runs
in its own subprocess (so neither inherits the other's peak) and reports its peak resident set
size above what it held before the pass (weights, optimizer-free), its CPU seconds per pass, and
whether the gradients equal the other side's bit for bit (a checksum). Figures only.

    .venv/bin/python benchmarks/checkpointing.py          # d 512, 8 layers, 4 × 8 × ≤ 512 tokens
    .venv/bin/python benchmarks/checkpointing.py --small    # seconds
    .venv/bin/python benchmarks/checkpointing.py --prompts 4 --samples 8 --length 1024
    python benchmarks/checkpointing.py --device cuda --bf16 --length 4096   # on a GPU

On a CPU the memory figure is the peak resident set size above what the process held before
the pass and the time is CPU seconds; on CUDA they are ``torch.cuda.max_memory_allocated``
above the weights and wall seconds (synchronised). ``--bf16``: autocast, as explorl runs on GPUs.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

SHAPES = {
    "default": {"hidden": 512, "layers": 8, "heads": 8, "ffn": 1536, "vocab": 32000},
    "small": {"hidden": 128, "layers": 4, "heads": 4, "ffn": 384, "vocab": 2000},
}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def worker(spec: dict) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from explorl.models import enable_checkpointing
    from explorl.policy.forward import response_logprobs

    torch.manual_seed(0)
    torch.set_num_threads(1)
    s = spec["shape"]
    cfg = LlamaConfig(hidden_size=s["hidden"], num_hidden_layers=s["layers"],
                      num_attention_heads=s["heads"], num_key_value_heads=s["heads"],
                      intermediate_size=s["ffn"], vocab_size=s["vocab"],
                      max_position_embeddings=4096, attn_implementation="sdpa")
    device = torch.device(spec.get("device", "cpu"))
    cuda = device.type == "cuda"
    model = LlamaForCausalLM(cfg).to(device).train()
    if spec["checkpointing"]:
        enable_checkpointing(model, "random init")
    P, G, R = spec["prompt"], spec["samples"], spec["length"]
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(3, s["vocab"], (spec["prompts"], P), generator=g)
    prompt_ids = prompts.repeat_interleave(G, 0)
    prompt_mask = torch.ones_like(prompt_ids, dtype=torch.bool)
    response_ids = torch.randint(3, s["vocab"], (len(prompt_ids), R), generator=g)
    # Lengths from R/4 to R, so that packing has work to do.
    lengths = torch.randint(R // 4, R + 1, (len(prompt_ids),), generator=g)
    response_mask = torch.arange(R)[None] < lengths[:, None]
    prompt_ids, prompt_mask, response_ids, response_mask = (
        t.to(device) for t in (prompt_ids, prompt_mask, response_ids, response_mask))
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=spec.get("bf16", False))

    def once():
        with amp:
            logp, ent = response_logprobs(model, prompt_ids, prompt_mask, response_ids,
                                          response_mask, 1.0)
        (-(logp * response_mask).sum() - 0.01 * (ent * response_mask).sum()).backward()

    def clock():
        if cuda:
            torch.cuda.synchronize()
            return time.perf_counter()
        return time.process_time()

    def memory():
        return torch.cuda.max_memory_allocated() / 2**20 if cuda else peak_rss_mb()

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() / 2**20 if cuda else peak_rss_mb()
    c0 = clock()
    once()
    first = clock() - c0
    peak = memory()
    times = [first]
    for _ in range(spec["reps"] - 1):
        model.zero_grad(set_to_none=True)
        c0 = clock()
        once()
        times.append(clock() - c0)
    checksum = sum(float(p.grad.double().sum()) + float(p.grad.double().abs().sum())
                   for p in model.parameters() if p.grad is not None)
    return {"above_mb": peak - base, "base_mb": base, "cpu_s": sorted(times)[len(times) // 2],
            "checksum": checksum, "tokens": int(response_mask.sum())}


def run(spec: dict) -> dict:
    out = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", action="store_true", help="a 1M-parameter model, short sequences")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--prompt", type=int, default=64, help="prompt tokens")
    p.add_argument("--length", type=int, default=512, help="longest response (R/4 … R)")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast over fp32 weights")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, one repetition: it runs")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    if args.smoke:
        args.small, args.reps, args.prompts, args.samples, args.prompt = True, 1, 2, 2, 8
    shape = SHAPES["small" if args.small else "default"]
    length = 64 if args.small else args.length
    print(f"model {shape}; {args.prompts} prompts × {args.samples} samples, prompt {args.prompt}"
          f" tokens, responses {length // 4}–{length} tokens; {args.device}"
          f"{' bf16 autocast' if args.bf16 else ' fp32'}; "
          f"{'wall time, CUDA memory' if args.device != 'cpu' else 'one thread, CPU time, RSS'}")
    rows = {}
    for on in (False, True):
        rows[on] = run({"shape": shape, "checkpointing": on, "prompts": args.prompts,
                        "samples": args.samples, "prompt": args.prompt, "length": length,
                        "reps": args.reps, "device": args.device, "bf16": args.bf16})
    print(f"response tokens per pass: {rows[False]['tokens']}\n")
    print("| gradient_checkpointing | peak memory above the weights (MB) | s per pass "
          "| gradients |")
    print("|---|---|---|---|")
    for on, r in rows.items():
        same = "reference" if not on else (
            "same bit for bit" if r["checksum"] == rows[False]["checksum"] else
            f"differ (checksum {r['checksum']:.6g} vs {rows[False]['checksum']:.6g})")
        print(f"| {str(on).lower()} | {r['above_mb']:.0f} | {r['cpu_s']:.2f} | {same} |")
    a, b = rows[False], rows[True]
    print(f"\ncheckpointing: {b['above_mb'] / max(a['above_mb'], 1e-9):.2f}× the memory, "
          f"{b['cpu_s'] / a['cpu_s']:.2f}× the time")


if __name__ == "__main__":
    main()
