"""Peak resident memory and CPU time of one update of a SmolLM2-135M-shaped policy on a CPU, with
and without the fused log-probs (``algorithm.fused_logprobs``) and the packed layout.

    .venv/bin/python benchmarks/update_memory.py                 # 8 prompts × 8 × ≤ 128 tokens
    .venv/bin/python benchmarks/update_memory.py --smoke         # tiny shapes: it runs
    .venv/bin/python benchmarks/update_memory.py --variants fused-packed logits-packed

The model is SmolLM2-135M-Instruct's configuration (Llama: hidden 576, 30 layers, 9 heads of 64
with 3 key/value heads, MLP 1536, vocabulary 49,152, tied embeddings) with random weights in
float32, built by transformers from its config: nothing is downloaded. The batch is what a step
of 8 prompts × 8 responses hands the update: prompts of 40–100 tokens (left-padded), responses of
8–128 tokens (right-padded), drawn with a fixed seed. An update is the trainer's loss pass
(``forward.response_logprobs`` on the whole batch, one micro-batch as on a CPU by default:
``plan.CPU_MICRO_BATCH_ROWS`` = 64 rows), a GRPO token-mean loss with an entropy bonus, its
backward, and a fused AdamW step; ``--updates`` of them per process (AdamW's state allocated
before the first, as it is from a run's second step on), each variant in a fresh process.

Figures: peak RSS of the process (``ru_maxrss``), its RSS before the first update (weights,
AdamW's state and inputs), and the median CPU time (user + system) of the updates after the
first (of the first when there is one). Every worker
runs under an ``RLIMIT_DATA`` cap (``--mem-limit-gb``): a variant over it fails its own row.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")
SMOLLM2 = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
               num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
               max_position_embeddings=2048, rope_theta=100000.0, tie_word_embeddings=True,
               rms_norm_eps=1e-5)
TINY = dict(SMOLLM2, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)
VARIANTS = {"fused-packed": (True, None), "logits-packed": (False, None),
            "fused-padded": (True, False), "logits-padded": (False, False)}
"""name -> (fused, pack): the trainer's default is fused-packed."""


def _rss_mb(who=resource.RUSAGE_SELF) -> float:
    return resource.getrusage(who).ru_maxrss / 1024  # Linux: KiB


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def batch(spec: dict, vocab: int):
    """(prompt_ids, prompt_mask, response_ids, response_mask) of prompts × samples rows."""
    import torch

    g = torch.Generator().manual_seed(0)
    n_p, G = spec["prompts"], spec["samples"]
    lo, hi = spec["prompt_len"]
    p_len = torch.randint(lo, hi + 1, (n_p,), generator=g).repeat_interleave(G)  # (N,)
    r_len = torch.randint(spec["min_response"], spec["max_response"] + 1, (n_p * G,), generator=g)
    P, R = int(p_len.max()), int(r_len.max())
    prompt_mask = torch.arange(P)[None] >= P - p_len[:, None]
    response_mask = torch.arange(R)[None] < r_len[:, None]
    prompt_ids = torch.randint(3, vocab, (n_p, P), generator=g).repeat_interleave(G, 0)
    response_ids = torch.randint(3, vocab, (n_p * G, R), generator=g)
    return (prompt_ids.masked_fill(~prompt_mask, 0), prompt_mask,
            response_ids.masked_fill(~response_mask, 0), response_mask)


def worker(spec: dict) -> dict:
    limit = int(spec["mem_limit_gb"] * 2**30)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    sys.path.insert(0, SRC)
    import torch
    import transformers

    from explorl.policy.forward import _pack_plan, pack_length, response_logprobs
    from explorl.training.optim import micro_batch_sizes

    torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**spec["model"])
    cfg._attn_implementation = "sdpa"
    model = transformers.LlamaForCausalLM(cfg).float().train()
    if spec.get("checkpointing"):  # as models.py does for model.gradient_checkpointing: true
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
    pids, pmask, rids, rmask = batch(spec, cfg.vocab_size)
    adv = torch.randn(len(rids), generator=torch.Generator().manual_seed(1))
    fused, pack = spec["fused"], spec["pack"]
    plan = _pack_plan(pids, pmask, rmask, pack_length(model)) if pack is None else None
    tokens = plan["tokens"] if plan else int(pids.shape[0] * (pids.shape[1] + rids.shape[1] - 1))
    # micro-batches as the trainer cuts them: ≤ 64 rows, ≤ micro_batch_tokens (prompt + response)
    rows_tokens = (pmask.sum(-1) + rmask.sum(-1)).tolist()
    sizes = micro_batch_sizes(rows_tokens, 64, spec.get("micro_batch_tokens"))
    # AdamW's state exists from a run's first step on: allocate it before measuring (a step on
    # zero gradients), so one update's peak is a steady step's.
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    before = _rss_mb()
    cpu = []
    n = rmask.sum()
    for _ in range(spec["updates"]):
        t0 = _cpu()
        for sl in torch.arange(len(rids)).split(sizes):
            logp, ent = response_logprobs(model, pids[sl], pmask[sl], rids[sl], rmask[sl], 1.0,
                                          chunk_size=spec["chunk"], fused=fused, pack=pack)
            ratio = torch.exp(logp - logp.detach())  # (n, R): on-policy, 1 with a gradient
            m = rmask[sl]
            loss = -(adv[sl, None] * ratio * m).sum() / n - 1e-3 * (ent * m).sum() / n
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        cpu.append(_cpu() - t0)
        del logp, ent, ratio, loss
    return {"before_mb": before, "peak_mb": _rss_mb(), "tokens": tokens,
            "micro_batches": len(sizes),
            "response_tokens": int(rmask.sum()),
            "cpu_s": statistics.median(cpu[1:] or cpu), "first_cpu_s": cpu[0]}


def run(spec: dict) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)],
                          capture_output=True, text=True, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode == 0 and lines:
        return json.loads(lines[-1])
    err = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
    if "can't allocate memory" in proc.stderr or "MemoryError" in proc.stderr:
        err = f"out of memory (over the {spec['mem_limit_gb']:g} GB cap)"
    return {"error": err[:160]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--max-response", type=int, default=128)
    p.add_argument("--updates", type=int, default=1)
    p.add_argument("--chunk", type=int, default=512, help="algorithm.logprob_chunk")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--micro-batch-tokens", type=int, help="optim.micro_batch_tokens (None: rows)")
    p.add_argument("--checkpointing", action="store_true", help="model.gradient_checkpointing")
    p.add_argument("--layers", type=int, help="decoder layers (default SmolLM2's 30): a cheaper "
                   "run for the layouts' relative cost; the head's memory does not depend on it")
    p.add_argument("--mem-limit-gb", type=float, default=14.0)
    p.add_argument("--json", help="also write the rows to this file")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, one update: it runs")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    spec = dict(model=SMOLLM2, prompts=args.prompts, samples=args.samples, prompt_len=(40, 100),
                min_response=8, max_response=args.max_response, updates=args.updates,
                chunk=args.chunk, threads=args.threads, mem_limit_gb=args.mem_limit_gb,
                micro_batch_tokens=args.micro_batch_tokens, checkpointing=args.checkpointing)
    if args.layers:
        spec["model"] = dict(SMOLLM2, num_hidden_layers=args.layers)
    if args.smoke:
        spec.update(model=TINY, prompts=2, samples=2, prompt_len=(4, 8), max_response=16,
                    updates=1, chunk=16)
        args.variants = ["fused-packed", "logits-padded"]
    import platform

    import torch

    m = spec["model"]
    cpu = platform.processor() or platform.machine()
    print(f"{time.strftime('%Y-%m-%d', time.gmtime())}  {cpu}, {spec['threads']} torch "
          f"thread(s), torch {torch.__version__}")
    print(f"model: Llama hidden {m['hidden_size']}, {m['num_hidden_layers']} layers, vocabulary "
          f"{m['vocab_size']:,} (tied), float32; batch {spec['prompts']} prompts × "
          f"{spec['samples']} responses of ≤ {spec['max_response']} tokens; chunk {spec['chunk']}"
          f"; micro-batches ≤ 64 rows, ≤ {spec['micro_batch_tokens'] or '∞'} tokens"
          f"{'; gradient checkpointing' if spec['checkpointing'] else ''}")
    print(f"{'variant':14} {'tokens':>7} {'micro':>5} {'RSS before MB':>14} {'peak RSS MB':>12} "
          f"{'update CPU s':>13} {'first CPU s':>12}")
    rows = []
    for name in args.variants:
        fused, pack = VARIANTS[name]
        r = run(dict(spec, fused=fused, pack=pack))
        rows.append({"variant": name, **r})
        if "error" in r:
            print(f"{name:14} {'-':>7} {'-':>5} {'-':>14} {'-':>12} {'-':>13} {'-':>12}  "
                  f"{r['error']}")
        else:
            print(f"{name:14} {r['tokens']:7d} {r['micro_batches']:5d} {r['before_mb']:14.0f} "
                  f"{r['peak_mb']:12.0f} "
                  f"{r['cpu_s']:13.2f} {r['first_cpu_s']:12.2f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"spec": spec, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
