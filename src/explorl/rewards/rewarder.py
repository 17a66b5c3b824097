"""A run's reward and accuracy: the recipe's ``reward`` section applied to responses.

Two numbers per response. The **reward** trains the policy: Σ weight · f over
``reward.functions`` (continuous values allowed), or, when there are none, the verifier's score
mapped by ``reward.convention``. **Correct** (1.0 or 0.0) is what ``reward/accuracy``,
validation accuracy and pass@k, dynamic sampling and the rollout budgets count: the verifier's
score (or the reward, ``reward.accuracy: reward``) ≥ ``reward.accuracy_threshold``. Both are
computed in the verifier pool's workers, with its time limit.
"""

from __future__ import annotations

from dataclasses import dataclass

from explorl.records import PromptRecord
from explorl.refs import search_dirs
from explorl.rewards import to_reward
from explorl.rewards.functions import SCHEMES, RewardSpec, Term
from explorl.rewards.pool import VerifierPool


@dataclass(frozen=True)
class Scored:
    """Reward and correctness of each response of one ``Rewarder.score`` call."""

    correct: list[float]
    rewards: list[float]
    timeouts: int = 0
    """Verifications cut off at the pool's time limit (scored 0), over both passes."""
    errors: int = 0
    """Verifications that raised or killed their worker (scored 0), over both passes."""
    checked: int = 0
    """Verifications made: responses × passes (the verifier's, the reward functions')."""
    problem: str | None = None
    """The first failure of the pass that failed most, naming the function as the user wrote it
    (``pool.describe``)."""
    worst_failed: int = 0
    """Failures (errors and timeouts) of the pass that failed most, out of the responses: what
    the run's failing-reward guard reads (``reward/verify_failed_frac``)."""


def verifier_spec(verifier: str, data_specs: list[str]) -> RewardSpec:
    """The verifier as a per-``data_source`` dispatch. ``auto``: each lab or reasoning-gym
    task's own checker for its records, ``math`` for every other record (files)."""
    dirs = search_dirs()
    if verifier != "auto":
        return RewardSpec((Term(verifier),), "first", dirs)
    terms, files = {}, False
    for spec in data_specs:
        found = next((f for s in SCHEMES if (f := s.data_source(spec)) is not None), None)
        if found is None:
            files = True
            continue
        ref, source = found
        terms.setdefault(source, Term(ref, 1.0, (source,)))
    fallback = (Term("math"),) if files or not terms else ()
    return RewardSpec((*terms.values(), *fallback), "first", dirs)


class Rewarder:
    """Scores responses with a config's ``reward`` section (module docstring)."""

    def __init__(self, reward_cfg, data_specs: list[str], *, verifier: str | None = None):
        """``data_specs``: every data spec the responses can come from (for ``auto``);
        ``verifier``: overrides ``reward.verifier`` (``explorl eval --verifier``)."""
        self.cfg = reward_cfg
        self._to_reward = to_reward
        name = verifier if verifier not in (None, "auto") else reward_cfg.verifier
        self.functions = (
            RewardSpec(tuple(Term(f.name, f.weight, tuple(f.data_source))
                             for f in reward_cfg.functions), "sum", search_dirs(), bounded=False)
            if reward_cfg.functions else None)
        needs_verifier = self.functions is None or reward_cfg.accuracy == "verifier"
        self.verifier = verifier_spec(name, data_specs) if needs_verifier else None
        self.problem: str | None = None
        """The latest failure seen by ``score`` (what a run that stops for failures reports)."""

    def score(self, pool: VerifierPool, texts: list[str], records: list[PromptRecord],
              environments: list | None = None) -> Scored:
        """Reward and correctness of ``texts[i]`` as an answer to ``records[i]``;
        ``environments[i]``: its environment (``Rollouts.environments``), which TRL-style
        functions receive."""
        gts = [r.ground_truth for r in records]
        ctxs = [(r.prompt, r.data_source, r.extra) for r in records]
        if environments is not None:
            ctxs = [(*c, e) for c, e in zip(ctxs, environments)]
        verified = None
        passes = []  # each pass's ScoreResult: the verifier's, the reward functions'
        if self.verifier is not None:
            passes.append(res := pool.score(self.verifier, texts, gts, ctxs))
            verified = res.scores
        if self.functions is not None:
            passes.append(res := pool.score(self.functions, texts, gts, ctxs))
            rewards = res.scores
        else:
            rewards = [self._to_reward(s, self.cfg.convention) for s in verified]
        basis = verified if self.cfg.accuracy == "verifier" else rewards
        threshold = self.cfg.accuracy_threshold
        worst = max(passes, key=lambda r: r.timeouts + r.errors)  # the first on a tie
        problem = worst.problem or next((r.problem for r in passes if r.problem), None)
        if problem is not None:
            self.problem = problem
        return Scored([float(s >= threshold) for s in basis], rewards,
                      sum(r.timeouts for r in passes), sum(r.errors for r in passes),
                      len(texts) * len(passes), problem, worst.timeouts + worst.errors)
