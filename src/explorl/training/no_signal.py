"""The no-signal check: a start on which (almost) every group's advantages are 0.

GRPO-family advantages are rewards minus their group's mean: a group whose responses all score
alike (typically all 0, when a pretrained model never writes the answer format the verifier
reads) gives advantages of 0 and no gradient. A run that starts that way spends its steps on
nothing. Over the run's first ``watch.signal_steps`` training steps this monitor averages the
share of groups whose advantages are all 0 (``adv/zero_group_frac``; under dynamic sampling the
groups it filtered out count too) and, when it reaches ``watch.signal_zero_frac``, warns once with
what the responses lacked (``ResponseShapes``) and where the docs say how to get a signal
(docs/real-models.md). When most of those groups had rewards that differ (the groups all right
or all wrong are few: ``rollout/all_wrong_frac`` + ``rollout/all_correct_frac``) the estimator
zeroed them, and the warning names ``algorithm.advantage`` instead. The run goes on: a few groups
with signal may still start it.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

from explorl.config.watch_sections import WatchConfig
from explorl.rewards.verifiers import final_answer

log = logging.getLogger(__name__)

DOCS = "docs/real-models.md#getting-a-learning-signal"
SIGNAL_ADVICE = (f"see {DOCS}: a system prompt that shows the answer format, a format reward "
                 "(boxed_format), a verifier that reads unboxed answers (math), the sampling "
                 "temperature")


@dataclass
class ResponseShapes:
    """Counts over responses: how many have a complete ``\\boxed{…}``, empty or not (``boxed``),
    and how many commit to a non-blank answer (``answer``: what ``rewards.verifiers.final_answer``
    finds, the reading of the ``math`` verifier: a box, an ``Answer: …`` line, or a response that
    is only a number or formula). One ``final_answer`` call per response gives both."""

    responses: int = 0
    boxed: int = 0
    answer: int = 0

    @classmethod
    def of(cls, texts: list[str]) -> ResponseShapes:
        found = [final_answer(t) for t in texts]
        return cls(len(texts), sum(f is not None and f[1] for f in found),
                   sum(f is not None and bool(f[0].strip()) for f in found))

    def add(self, other: ResponseShapes) -> None:
        self.responses += other.responses
        self.boxed += other.boxed
        self.answer += other.answer


def zero_signal_share(metrics: dict) -> float:
    """The share of the step's sampled prompt groups that gave no gradient: groups whose
    advantages are all 0 (``adv/zero_group_frac``, over the trained groups) plus, under dynamic
    sampling, the groups it filtered out (``rollout/filtered_frac``)."""
    filtered = float(metrics.get("rollout/filtered_frac", 0.0))
    return filtered + (1.0 - filtered) * float(metrics.get("adv/zero_group_frac", 0.0))


class NoSignalMonitor:
    """Warns once when the first ``signal_steps`` steps had ≥ ``signal_zero_frac`` of their
    groups without signal (module docstring)."""

    def __init__(self, cfg: WatchConfig) -> None:
        self.cfg = cfg
        self.zero: list[float] = []  # per window step: ``zero_signal_share``
        self.uniform: list[float] = []  # per window step: groups all right or all wrong
        self.sums = {"n": 0.0, "reward": 0.0, "accuracy": 0.0, "length": 0.0, "truncated": 0.0}
        self.shapes = ResponseShapes()
        self.warned = False

    def active(self, step: int) -> bool:
        """Whether step ``step`` is in the window (every rank answers alike)."""
        return not self.warned and 1 <= step <= self.cfg.signal_steps

    def check(self, step: int, metrics: dict, texts: list[str], dist=None) -> str | None:
        """Fold in step ``step``: its global ``metrics`` (``batch_metrics`` and ``adv/*``) and this
        rank's response ``texts`` (summed over the ranks with ``dist``). Returns the warning the
        one time it fires (also logged); else None. Outside the window it does nothing."""
        if not self.active(step):
            return None
        shapes = ResponseShapes.of(texts)
        if dist is not None and getattr(dist, "world_size", 1) > 1:
            shapes = ResponseShapes(**{k: int(v) for k, v in dist.sum_dict(
                {k: float(v) for k, v in asdict(shapes).items()}).items()})
        self.shapes.add(shapes)
        self.zero.append(zero_signal_share(metrics))
        self.uniform.append(float(metrics.get("rollout/all_wrong_frac", 0.0))
                            + float(metrics.get("rollout/all_correct_frac", 0.0)))
        n = float(metrics.get("rollout/n_trained", 0.0))
        for key, name in (("reward", "reward/mean"), ("accuracy", "reward/accuracy"),
                          ("length", "response/length_mean"),
                          ("truncated", "response/truncated_frac")):
            self.sums[key] += n * float(metrics.get(name, 0.0))
        self.sums["n"] += n
        if step < self.cfg.signal_steps:
            return None
        share = sum(self.zero) / len(self.zero)
        if share < self.cfg.signal_zero_frac:
            self.warned = True  # decided: the window is over
            return None
        self.warned = True
        text = self.message(share)
        log.warning("warning: %s", text)
        return text

    def message(self, share: float) -> str:
        """The warning: the zero-signal share and what the window's responses looked like."""
        c, s, n = self.cfg, self.shapes, self.sums["n"]

        def mean(key: str) -> float:
            return self.sums[key] / n if n else 0.0

        def pct(k: int) -> str:
            return f"{k / s.responses:.0%}" if s.responses else "n/a"

        steps = f"{c.signal_steps} step{'s' * (c.signal_steps != 1)}"
        text = (f"no learning signal: over the first {steps}, {share:.0%} of the prompt groups "
                f"had advantages of 0 (adv/zero_group_frac; watch.signal_zero_frac="
                f"{c.signal_zero_frac:g}), so they added nothing to the gradient. The responses: "
                f"{pct(s.boxed)} hold a \\boxed{{}}, {pct(s.answer)} an answer the math "
                f"verifier can read (a box, an 'Answer:' line or a bare number); mean reward "
                f"{mean('reward'):.3f}, accuracy {mean('accuracy'):.3f}, mean length "
                f"{mean('length'):.1f} tokens, {mean('truncated'):.0%} cut off at "
                f"rollout.max_response_len. ")
        uniform = sum(self.uniform) / len(self.uniform)
        if uniform < share / 2:
            return text + (f"Yet only {uniform:.0%} of the groups were all right or all wrong: "
                           "the advantage estimator gives their responses equal advantages "
                           "(algorithm.advantage; e.g. passk_training with algorithm.passk_k "
                           "equal to rollout.n_samples).")
        if mean("accuracy") >= 0.5:
            return text + ("Most groups were all right: the problems are too easy for the "
                           "model; harder data gives it something to learn.")
        if mean("truncated") >= 0.5:
            text += ("Most responses were cut off before their answer: a larger "
                     "rollout.max_response_len, or a prompt asking for a short answer; ")
        else:
            text += "The model rarely writes what the reward pays for: "
        return text + SIGNAL_ADVICE

    def state_dict(self) -> dict:
        return {"zero": list(self.zero), "uniform": list(self.uniform), "sums": dict(self.sums),
                "shapes": asdict(self.shapes), "warned": self.warned}

    def load_state_dict(self, state: dict) -> None:
        self.zero = [float(x) for x in state.get("zero", [])]
        self.uniform = [float(x) for x in state.get("uniform", [])]
        self.sums.update(state.get("sums", {}))
        self.shapes = ResponseShapes(**state.get("shapes", {}))
        self.warned = bool(state.get("warned", False))
