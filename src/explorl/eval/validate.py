"""One validation routine: sampled accuracy, pass@k and greedy accuracy of a policy on a split.

The trainer calls it at every validation; each rank samples a contiguous share of the problems
with per-problem seeds (so the result does not depend on the number of processes) and one
gather makes the metrics global.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from explorl.analysis.passk import pass_at_k
from explorl.outputs.completions import completions_of
from explorl.rollout.progress import phase
from explorl.rollout.seeding import mix_seed
from explorl.rollout.types import Rollouts

VAL_STREAM = 1  # first component of the validation sampling seeds after the run seed
EVAL_STREAM = 2  # ... and of ``explorl eval``'s


@dataclass
class Answered:
    """Sampled (and greedy) answers to a list of problems, with their correctness."""

    ro: Rollouts  # n responses per problem; ``prompt_index`` = position in the list
    correct: list[float]  # per response
    greedy_texts: list[str] | None = None  # per problem
    greedy_correct: list[float] | None = None  # per problem


def answer(*, engine, policy, pool, rewarder, records: list, ids: list[list[int]], n: int,
           temperature: float, max_new_tokens: int, seeds: list[int], greedy: bool) -> Answered:
    """The one sampling-and-scoring routine of validation and ``explorl eval``: ``n`` responses
    per problem drawn with per-problem ``seeds`` (so they do not depend on batching or ranks),
    judged by ``rewarder``; with ``greedy``, one greedy answer per problem too."""
    ro = engine.generate(policy, ids, [n] * len(ids), temperature, max_new_tokens, seeds=seeds)
    correct = rewarder.score(pool, ro.texts, [records[i] for i in ro.prompt_index.tolist()],
                             ro.environments).correct
    out = Answered(ro, list(correct))
    if greedy:
        g = engine.generate(policy, ids, [1] * len(ids), 0.0, max_new_tokens)
        out.greedy_texts = list(g.texts)
        out.greedy_correct = list(rewarder.score(pool, g.texts, records, g.environments).correct)
    return out


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
        # progress lines off a terminal: this rank's responses, the greedy ones included
        with phase(f"validation at step {step}", len(ids) * (n_samples + greedy)):
            got = answer(engine=engine, policy=policy, pool=pool, rewarder=rewarder,
                         records=data[mine], ids=ids, n=n_samples, temperature=temperature,
                         max_new_tokens=max_new_tokens, seeds=seeds, greedy=greedy)
        ro, scores = got.ro, got.correct
        problem = ro.prompt_index.cpu() + mine.start
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
            local["greedy"] = torch.tensor(got.greedy_correct, dtype=torch.float64)
    parts = dist.gather(local)  # every rank's columns, in rank order
    rows = {k: torch.cat([p[k] for p in parts]) for k in local}
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
