"""The per-token cost of drawing from a real vocabulary: explorl's counter-based draws before and
after the inverse-CDF sampler, beside ``torch.multinomial`` (figures only).

    .venv/bin/python benchmarks/sampling_vocab.py [--ref 7319040] [--rows 64 256] [--reps 7]

For each vocabulary size and row count, CPU ms per decode position of the work after the model's
logits: the log-softmax, probabilities and entropy every variant computes (``softmax+entropy``),
then the draw:

- ``gumbel, per-row MT``: Gumbel-max with ``torch.rand(|V|)`` from a generator seeded per row
  (the CPU draw before, for every vocabulary; still the draw for |V| ≤ 227);
- ``gumbel, hashed``: Gumbel-max with an int64 hash over the (rows × |V|) block (the
  accelerators' draw before; run here on CPU, where it is far slower than on a GPU, but it is the
  same ~15 passes over the block);
- ``inverse CDF``: one uniform per row, ``inverse_cdf_sample`` (the draw now);
- ``multinomial``: ``torch.multinomial`` with one shared generator (not counter-based: what
  ``model.generate`` does).

The "before" draws are loaded from the tree at ``--ref`` (``git show``). One thread, min over
``--reps`` repetitions of each timing, variants interleaved.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def old_seeding(ref: str):
    """The ``rollout/seeding.py`` module of commit ``ref``."""
    src = subprocess.run(["git", "show", f"{ref}:src/explorl/rollout/seeding.py"], cwd=ROOT,
                         check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "seeding_ref.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("seeding_ref", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ref", default="7319040", help="commit with the draws before")
    ap.add_argument("--vocab", type=int, nargs="+", default=[32_000, 151_936])
    ap.add_argument("--rows", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, one repetition")
    args = ap.parse_args()
    if args.smoke:
        args.vocab, args.rows, args.reps = [1000], [4], 1

    import numpy as np
    import torch

    from explorl.rollout.seeding import NoiseStream, row_keys

    torch.set_num_threads(1)
    try:
        old = old_seeding(args.ref)
    except (subprocess.CalledProcessError, OSError):  # no git history here: no "before" columns
        old = None

    def cpu_ms(fn) -> float:
        fn()
        best = float("inf")
        for _ in range(args.reps):
            c = time.process_time()
            fn()
            best = min(best, time.process_time() - c)
        return best * 1e3

    print(f"torch {torch.__version__}, one thread; CPU ms per position (min of {args.reps})\n")
    print("| vocab | rows | softmax+entropy | gumbel, per-row MT | gumbel, hashed | inverse CDF "
          "| multinomial |")
    print("|---|---|---|---|---|---|---|")
    for V in args.vocab:
        for N in args.rows:
            g = torch.Generator().manual_seed(0)
            z = torch.randn(N, V, generator=g) * 3
            keys = row_keys(list(range(N)), [1] * N)

            def softmax_entropy():
                logp = torch.log_softmax(z, -1)
                p = logp.exp()
                return logp, p, -(p * logp).sum(-1)

            logp, p, _ = softmax_entropy()
            stream = NoiseStream(keys, V, max_len=1)
            stream.sample(logp, 0, p)  # the row uniforms, computed once per call in the engine
            assert not stream.blocked and np.isfinite(float(logp.max()))
            row = [
                cpu_ms(softmax_entropy),
                cpu_ms(lambda: old.gumbel_argmax(logp, old._generator_uniform(keys, 3, V)))
                if old else float("nan"),
                cpu_ms(lambda: old.gumbel_argmax(logp, old._hashed_uniform(keys, 3, V)))
                if old and N * V <= 2e7 else float("nan"),
                cpu_ms(lambda: stream.sample(logp, 0, p)),
                cpu_ms(lambda: torch.multinomial(p, 1, generator=g)),
            ]
            print(f"| {V:,} | {N} | " + " | ".join(f"{x:.1f}" for x in row) + " |", flush=True)


if __name__ == "__main__":
    main()
