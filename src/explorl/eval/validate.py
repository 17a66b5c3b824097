"""One validation routine: sampled accuracy, pass@k and greedy accuracy of a policy on a split.

The trainer calls it at every validation; each rank samples a contiguous share of the problems
with per-problem seeds (so the result does not depend on the number of processes) and one
gather makes the metrics global.
"""

from __future__ import annotations

import numpy as np
import torch

from explorl.completions import completions_of
from explorl.eval.passk import pass_at_k
from explorl.rollout.seeding import mix_seed
from explorl.step_batch import concat_rows

VAL_STREAM = 1  # first component of the validation sampling seeds after the run seed


@torch.no_grad()
def validate(
    *,
    engine,
    policy,
    pool,
    rewarder,
    data: list,
    prompt_ids,
    n_samples: int,
    ks: list[int],
    temperature: float,
    max_new_tokens: int,
    seed: int,
    step: int,
    greedy: bool,
    dist,
    samples: list | None = None,
) -> dict:
    """``val/accuracy``, ``val/entropy``, ``val/pass@k`` and ``val/greedy_accuracy`` over ``data``.

    ``prompt_ids(i)`` gives problem i's token ids; ``rewarder`` (``rewards.rewarder``) decides
    which responses are correct. Sampling seeds are (seed, VAL_STREAM, step, problem), so the
    same step validates on the same draws after a resume. ``samples``: when a list is given, this
    rank's sampled responses are appended to it as ``Completion`` rows.
    """
    if not data:
        return {}
    mine = dist.shard(len(data))
    ids = [prompt_ids(i) for i in range(mine.start, mine.stop)]
    local = {
        "problem": torch.zeros(0, dtype=torch.long),
        "score": torch.zeros(0, dtype=torch.float64),
        "entropy_sum": torch.zeros(0, dtype=torch.float64),
        "length": torch.zeros(0, dtype=torch.long),
        "greedy": torch.zeros(0, dtype=torch.float64),
    }
    if ids:
        seeds = [mix_seed(seed, VAL_STREAM, step, p) for p in range(mine.start, mine.stop)]
        ro = engine.generate(
            policy, ids, [n_samples] * len(ids), temperature, max_new_tokens, seeds=seeds
        )
        problem = ro.prompt_index.cpu() + mine.start
        scores = rewarder.score(pool, ro.texts, [data[i] for i in problem]).correct
        if samples is not None:
            samples.extend(
                completions_of(step, "val", [data[i] for i in problem.tolist()], ro.texts, scores)
            )
        mask = ro.response_mask.cpu()
        local.update(
            problem=problem,
            score=torch.tensor(scores, dtype=torch.float64),
            entropy_sum=(ro.entropy.cpu() * mask).sum(-1).double(),
            length=mask.sum(-1).long(),
        )
        if greedy:
            g = engine.generate(policy, ids, [1] * len(ids), 0.0, max_new_tokens)
            gs = rewarder.score(pool, g.texts, data[mine]).correct
            local["greedy"] = torch.tensor(gs, dtype=torch.float64)
    rows = concat_rows(dist.gather(local))
    correct = torch.zeros(len(data), dtype=torch.float64).index_add_(
        0, rows["problem"], rows["score"]
    )
    out = {"val/accuracy": float(rows["score"].mean()),
           "val/entropy": float(rows["entropy_sum"].sum() / rows["length"].sum().clamp_min(1))}
    for k in ks:
        out[f"val/pass@{k}"] = float(
            np.mean([pass_at_k(n_samples, int(c), k) for c in correct.tolist()])
        )
    if greedy:
        out["val/greedy_accuracy"] = float(rows["greedy"].mean())
    return out
