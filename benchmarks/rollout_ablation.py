"""What each rollout/update optimisation buys: the same work with one of them switched off.

    .venv/bin/python benchmarks/rollout_ablation.py [--iters 30] [--sizes 8x8 32x8] [--threads 1]

In one process, on the lab model, the variants take turns on the same batches and each call's
CPU time is recorded (CPU time rather than wall time: on a shared machine it is far less noisy).

Sampling (``HFEngine.generate``, P prompts × G samples, T = 1, ≤ 8 tokens):
  all on                  prompts encoded once per group, finished rows dropped (compact_ratio 0.5)
  no prompt sharing       each of the G rows encodes its prompt (the prompts passed G times,
                          count 1)
  no compaction           finished rows stay in the batch until every row is done
  model.generate          transformers' sampler on the G·P rows (no log-probs or entropy)

Loss forward + backward (``response_logprobs`` on the sampled batch, token-mean of log-probs):
  packed                  distinct prompts once, responses end to end, no padding (the default)
  padded                  one padded row per response
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--sizes", nargs="+", default=["8x8", "32x8"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--entropy", action="store_true", help="the loss pass also computes the entropy (bonus on)"
    )
    p.add_argument("--smoke", action="store_true", help="tiny shapes, one repetition: it runs")
    args = p.parse_args()
    if args.smoke:
        args.iters, args.sizes = 2, ["2x2"]

    import torch
    torch.set_num_threads(args.threads)
    from explorl.config import ModelConfig
    from explorl.lab import lab_model_path, make_splits
    from explorl.models import load_model, load_tokenizer

    path = lab_model_path("addition")
    tok = load_tokenizer(path, ModelConfig())
    model = load_model(path, ModelConfig(dtype="float32"), torch.device("cpu"))
    train = make_splits("addition", seed=0)["train"]
    print(
        f"lab addition model, torch {torch.__version__}, {args.threads} thread(s); "
        "median CPU ms per call "
        f"(± half the interquartile range) over {args.iters} turns"
    )

    for size in args.sizes:
        P, G = (int(x) for x in size.split("x"))
        ablate(model, tok, train, P, G, args)


def ablate(model, tok, train, P: int, G: int, args) -> None:
    """Print the sampling and loss-pass variants' CPU times for P prompts × G samples."""
    import torch

    from explorl.models import render_prompt
    from explorl.policy.forward import response_logprobs
    from explorl.rollout.hf import HFEngine, left_pad

    size = f"{P}x{G}"
    engine, no_compact = (
        HFEngine(tok, batch_size=P * G),
        HFEngine(tok, batch_size=P * G, compact_ratio=0.0),
    )

    def prompts(i):
        return [render_prompt(tok, train[(i * P + j) % len(train)].prompt, True) for j in range(P)]

    def seeds(i, n):
        return [i * 10_000 + j for j in range(n)]

    def hf_generate(i):
        ids, mask = left_pad(
            [q for q in prompts(i) for _ in range(G)], tok.pad_token_id, torch.device("cpu")
        )
        with torch.no_grad():
            model.generate(
                input_ids=ids,
                attention_mask=mask.long(),
                do_sample=True,
                top_k=0,
                top_p=1.0,
                max_new_tokens=8,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
            )

    sampling = {
        "all on": lambda i: engine.generate(model, prompts(i), [G] * P, 1.0, 8, seeds=seeds(i, P)),
        "no prompt sharing": lambda i: engine.generate(
            model,
            [q for q in prompts(i) for _ in range(G)],
            [1] * (P * G),
            1.0,
            8,
            seeds=seeds(i, P * G),
        ),
        "no compaction": lambda i: no_compact.generate(
            model, prompts(i), [G] * P, 1.0, 8, seeds=seeds(i, P)
        ),
        "model.generate": hf_generate,
    }
    batches = [
        engine.generate(model, prompts(i), [G] * P, 1.0, 8, seeds=seeds(i, P)) for i in range(8)
    ]

    def loss_pass(pack):
        def run(i):
            ro = batches[i % len(batches)]
            logp, ent = response_logprobs(
                model,
                ro.prompt_ids,
                ro.prompt_mask,
                ro.response_ids,
                ro.response_mask,
                1.0,
                with_entropy=args.entropy,
                pack=pack,
            )
            loss = logp.sum() / ro.response_mask.sum()
            if ent is not None:
                loss = loss - 0.01 * ent.sum() / ro.response_mask.sum()
            loss.backward()
        return run

    updating = {"packed": loss_pass(None), "padded": loss_pass(False)}
    for title, variants in (("sampling", sampling), ("loss forward + backward", updating)):
        times = {k: [] for k in variants}
        for i in range(args.iters + 2):
            for k, fn in variants.items():
                c0 = time.process_time()
                fn(i)
                if i >= 2:  # warm-up turns
                    times[k].append(time.process_time() - c0)
        base = statistics.median(next(iter(times.values())))
        print(f"{size} {title}:")
        for k, ts in times.items():
            q = statistics.quantiles(ts, n=4)
            med = statistics.median(ts)
            print(
                f"  {k:20s} {1000 * med:7.1f} ms ± {500 * (q[2] - q[0]):5.1f}   "
                f"×{med / base:4.2f} of the first"
            )
    model.zero_grad(set_to_none=True)

if __name__ == "__main__":
    main()
