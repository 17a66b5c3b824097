"""The typed record a rollout engine returns (GRPO-Zero's ``Episode``, batched)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch


@dataclass
class Rollouts:
    """N responses to a batch of prompts; prompts may have different sample counts.

    **One device.** Every tensor field lives on one device, ``device`` (the device of the model
    that sampled, the trainer's): the token fields and the per-response metadata alike
    (``prompt_index``, ``stage``, ``truncated``). A tensor built to combine with a field is built
    with ``device=ro.device``; host-side records (``training.batch.StepRows``) take ``.cpu()``
    copies. ``select`` takes indices on the host or on ``device``.

    Sequences are stored as ``prompt_ids`` (left-padded, so every prompt ends at column P)
    and ``response_ids`` (right-padded). ``old_logp`` and ``entropy`` are computed at the
    sampling temperature by the model that sampled each response.
    """

    prompt_ids: torch.Tensor  # (N, P) long, left-padded with pad_id
    prompt_mask: torch.Tensor  # (N, P) bool, True on real prompt tokens
    response_ids: torch.Tensor  # (N, R) long, right-padded with pad_id
    response_mask: torch.Tensor  # (N, R) bool, True on generated tokens (incl. EOS)
    old_logp: torch.Tensor  # (N, R) float, log-prob of each sampled token at the sampling T
    entropy: torch.Tensor  # (N, R) float, token entropy at the sampling T
    prompt_index: torch.Tensor  # (N,) long, position of the response's prompt in the batch
    texts: list[str]  # (N,) decoded responses (special tokens stripped)
    temperature: float = 1.0
    stage: torch.Tensor | None = None  # (N,) long, EEPO stage (1 or 2); None = single stage
    truncated: torch.Tensor | None = None  # (N,) bool, hit the length limit without EOS
    # (N, R) float, the engine's own log-probs of the sampled tokens at the sampling T, where
    # they differ from old_logp's source (vLLM); None: the engine samples with the trained model.
    engine_logp: torch.Tensor | None = None
    # (N,) long, the policy version (trainer steps done) whose weights sampled each response;
    # set by the asynchronous rollout worker (``rollout.async``), None otherwise.
    version: torch.Tensor | None = None
    # Multi-turn rollouts (``rollout.tools``): (N, R) bool, True on the tool results explorl
    # inserted between the model's turns. They are part of the sequence (the forward attends to
    # them: ``token_mask``) but not the policy's: ``response_mask`` is False there, so the loss,
    # entropy and covariance statistics, controllers and KL never see them. None: no tools.
    tool_mask: torch.Tensor | None = None
    turns: torch.Tensor | None = None  # (N,) long, model turns (generation calls) per response
    tool_calls: torch.Tensor | None = None  # (N,) long, tool calls answered
    tool_errors: torch.Tensor | None = None  # (N,) long, of those, answered by an error message
    # (N,) with ``rollout.environment``: each response's environment after its last call
    # (``tools.environments.EnvState``), for the reward functions; None: no environment.
    environments: list | None = None

    def __len__(self) -> int:
        return self.response_ids.shape[0]

    @property
    def device(self) -> torch.device:
        return self.response_ids.device

    @property
    def lengths(self) -> torch.Tensor:  # (N,)
        """The policy's own tokens per response (tool results excluded)."""
        return self.response_mask.sum(-1)

    @property
    def token_mask(self) -> torch.Tensor:  # (N, R) bool
        """Every real response token, the model's and the tools' (what the forward attends to
        and scores); ``response_mask`` where there are no tools."""
        return self.response_mask if self.tool_mask is None else self.response_mask | self.tool_mask

    def select(self, idx: torch.Tensor | list[int]) -> "Rollouts":
        """Rows ``idx`` of every per-response field (a sub-batch)."""
        if not isinstance(idx, torch.Tensor):
            idx = torch.as_tensor(idx, dtype=torch.long)  # host: indexes any device's tensors
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                out[f.name] = v[idx]
            elif isinstance(v, list):
                out[f.name] = [v[i] for i in idx.tolist()]
            else:
                out[f.name] = v
        return replace(self, **out)

    def copy(self) -> "Rollouts":
        """A copy of every tensor field (made outside ``torch.inference_mode``, the copies are
        normal tensors: autograd may save them, in-place ops may change them)."""
        out = {f.name: getattr(self, f.name).clone() for f in fields(self)
               if isinstance(getattr(self, f.name), torch.Tensor)}
        return replace(self, **out)

    @staticmethod
    def concat(parts: list["Rollouts"], pad_id: int) -> "Rollouts":
        """Stack several rollout records (prompt_index is kept as is)."""
        assert parts, "nothing to concatenate"
        P = max(p.prompt_ids.shape[1] for p in parts)
        R = max(p.response_ids.shape[1] for p in parts)

        def lpad(t, width, value):  # left-pad columns
            return torch.nn.functional.pad(t, (width - t.shape[1], 0), value=value)

        def rpad(t, width, value):
            return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value)

        stage = None
        if any(p.stage is not None for p in parts):
            stage = torch.cat(
                [
                    p.stage if p.stage is not None
                    else torch.zeros(len(p), dtype=torch.long, device=p.device)
                    for p in parts
                ]
            )
        trunc = None
        if all(p.truncated is not None for p in parts):
            trunc = torch.cat([p.truncated for p in parts])
        version = None
        if all(p.version is not None for p in parts):
            version = torch.cat([p.version for p in parts])
        tool = {}  # the multi-turn fields: zeros for a part without tools
        if any(p.tool_mask is not None for p in parts):
            tool["tool_mask"] = torch.cat([
                rpad(p.tool_mask if p.tool_mask is not None
                     else torch.zeros_like(p.response_mask), R, False) for p in parts])
            for name in ("turns", "tool_calls", "tool_errors"):
                tool[name] = torch.cat([
                    getattr(p, name) if getattr(p, name) is not None
                    else torch.ones(len(p), dtype=torch.long, device=p.device) * (name == "turns")
                    for p in parts])
        engine_logp = None  # a part without the engine's values: its own (weight 1)
        if any(p.engine_logp is not None for p in parts):
            engine_logp = torch.cat([rpad(p.old_logp if p.engine_logp is None else p.engine_logp,
                                          R, 0.0) for p in parts])
        if all(p.environments is not None for p in parts):
            tool["environments"] = [e for p in parts for e in p.environments]
        return Rollouts(
            prompt_ids=torch.cat([lpad(p.prompt_ids, P, pad_id) for p in parts]),
            prompt_mask=torch.cat([lpad(p.prompt_mask, P, False) for p in parts]),
            response_ids=torch.cat([rpad(p.response_ids, R, pad_id) for p in parts]),
            response_mask=torch.cat([rpad(p.response_mask, R, False) for p in parts]),
            old_logp=torch.cat([rpad(p.old_logp, R, 0.0) for p in parts]),
            entropy=torch.cat([rpad(p.entropy, R, 0.0) for p in parts]),
            prompt_index=torch.cat([p.prompt_index for p in parts]),
            texts=[t for p in parts for t in p.texts],
            temperature=parts[0].temperature,
            stage=stage,
            truncated=trunc,
            engine_logp=engine_logp,
            version=version,
            **tool,
        )
