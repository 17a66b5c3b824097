"""Multi-turn rollouts with tools: a sampling strategy around any token-in, token-out engine.

Turn 1 samples every response as a single-turn engine call would (the same draws), except
that a tool call's end (``ToolFormat.stop_ids``) stops a row as EOS does. Each row that
stopped at a call gets the call run (``ToolRunner``: the worker pool, its limits; a failure
is an error message), the result's tokens appended, and takes its next turn from the whole
context so far: prompt, its own sampled tokens, the results. Up to ``max_turns`` turns and
``max_new_tokens`` response tokens (the model's and the tools' together) per response.

**Token in, token out.** The next turn's context is the ids the model sampled, never its text
re-encoded, and only a result is encoded; the record's model tokens are exactly the sampled
ones, with the engine's own log-probs and entropy. The result tokens are in the sequence
(``Rollouts.tool_mask``) but not the policy's (``response_mask`` False there, log-prob and
entropy 0), so no loss, statistic, controller or KL sees them.

Each turn re-encodes its context in one batched prefill (the ``hf`` engine shares no KV cache
between calls; ``vllm``'s prefix cache, on by default, reuses the context's blocks that are
already cached); the decode steps, where the time goes, are the engine's own, static path
included. An engine that records its own log-probs beside old_logp (``vllm``: ``engine_logp``,
for the rollout correction) has them carried turn by turn, 0 on the results.
Seeded draws: turn 1 uses the caller's seeds exactly; turn k > 1 of response j of prompt i
draws from ``mix_seed(row key, k)``, so a response depends only on (seed, j), not the batch.

**ARPO's look-ahead** (``rollout.arpo.entropy_at: after_result``): after a round's tool results,
each response that got one samples the first ``window`` tokens of its next turn in one engine
call, the branching reads their entropy, and the next call goes on from them (drawing from
``mix_seed(row key, k, CONTINUE)``): a turn may take two engine calls, and no token is sampled
twice. A branch copies its source as it was right after the result (``_Row.fork``).

**Environments** (``rollout.environment``, ``tools.environments``): with an ``EnvRunner`` each
response gets its own instance, reset with its prompt's record (``prompt_ids[i].record``, which
``models.PromptTokens.ids_of`` gives), and its calls run on that instance's state (``_Row.env``,
the instance's bytes). A text ``reset`` returns extends that response's prompt
(``prompt_ids[i].with_observation``); then turn 1 samples each response from its own prompt,
drawing from ``mix_seed(row key, 1)`` as any later turn. An ARPO branch copies its source's
bytes; a new response from the prompt gets a new instance.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from explorl.rollout.hf import left_pad
from explorl.rollout.seeding import mix_seed, row_keys
from explorl.rollout.types import Rollouts
from explorl.tools.functions import ToolCallError
from explorl.tools.runner import ToolAnswer

CONTINUE = 0xC047  # seed component of a turn's tokens after its look-ahead


@dataclass
class _Row:
    """One response being built: its prompt, its segments and its counters."""

    prompt: int  # index of its prompt in the call
    key: int | None  # its counter-based sampling key (None: the generator draws)
    ids: list[int] = field(default_factory=list)
    logp: list[torch.Tensor] = field(default_factory=list)
    ent: list[torch.Tensor] = field(default_factory=list)
    elogp: list[torch.Tensor] = field(default_factory=list)  # the engine's own (vllm), if any
    tool: list[bool] = field(default_factory=list)  # per token: inserted by a tool
    turns: int = 0
    calls: int = 0
    errors: int = 0
    finished: bool = False  # ended with EOS
    window: list[float] = field(default_factory=list)  # Σ entropy of each turn's first tokens
    branch_of: int = -1  # ARPO: the row it was copied from (-1: none)
    shared: int = 0  # ARPO: response tokens shared with that row
    env: bytes | None = None  # its environment's instance, pickled (rollout.environment)
    head: list[int] | None = None  # its own prompt ids (reset's observation), else its prompt's
    start: int = 0  # where its last turn begins in ``ids``
    open: bool = False  # its turn began with a look-ahead and goes on in the next engine call
    fork: _Row | None = None  # ARPO look-ahead: the row right after its last tool result

    def copy(self, key: int | None, source: int) -> _Row:
        """A branch: this row's tokens and environment so far, its own draws from here on."""
        return _Row(self.prompt, key, list(self.ids), list(self.logp), list(self.ent),
                    list(self.elogp), list(self.tool), self.turns, self.calls, self.errors, False,
                    list(self.window), source, len(self.ids), self.env, self.head, len(self.ids))

    def snapshot(self) -> _Row:
        """This row as it is now, for branches to copy once it has moved on."""
        out = self.copy(self.key, self.branch_of)
        out.shared, out.start = self.shared, self.start
        return out


class ToolEngine:
    """Wraps an engine whose stop tokens include the format's and that keeps the stop token in
    the response as it keeps EOS (``HFEngine(eos_ids=...)``, ``VLLMEngine(eos_ids=...)``).

    ``fmt``: a ``tools.formats`` format; ``runner``: a ``ToolRunner`` (or anything with
    ``run(calls) -> [ToolAnswer]``); ``max_turns``: model turns per response (tool calls
    answered: at most ``max_turns - 1``). Each turn's first ``window`` tokens' entropy is summed
    into ``_Row.window`` (what ARPO's branching reads; its ``window`` when it branches).
    ``last_calls``: the tool calls answered in the last ``generate`` call (a call that fails to
    parse is answered by an error, and counts).
    """

    window = 20

    def __init__(self, engine, fmt, runner, max_turns: int, eos_ids: list[int]):
        self.engine, self.fmt, self.runner, self.max_turns = engine, fmt, runner, max_turns
        self.stop_ids = set(fmt.stop_ids)
        self.eos_ids = set(eos_ids)
        self.tokenizer = engine.tokenizer
        self.last_rows: list[_Row] = []  # the last call's rows, in record order
        self.last_calls = 0
        self.envs = hasattr(runner, "reset")  # an EnvRunner: one environment per response

    def __getattr__(self, name):  # pad_id, sync_weights, pop_metrics, resident_bytes, ...
        if name == "engine":
            raise AttributeError(name)
        return getattr(self.engine, name)

    def close_tools(self) -> None:
        """Stop the tools' worker processes (a later call starts them again)."""
        close = getattr(self.runner, "close", None)
        if close is not None:
            close()

    def generate(self, model, prompt_ids, n_samples, temperature, max_new_tokens,
                 generator=None, seeds=None, branching=None) -> Rollouts:
        """``branching`` (ARPO, ``rollout.arpo``): turn 1 samples ``branching.first(n)`` of each
        prompt's n responses, and after each tool result ``branching.expand`` may add rows that
        continue a copy of a row (or start afresh) until the prompt has its n. With
        ``branching.look_ahead``, each row that just got a result first samples the first
        ``window`` tokens of its next turn (its own tokens, kept), so that ``expand`` reads their
        entropy; the copies start from the row as it was before them."""
        first_n = branching.first(n_samples) if branching is not None else list(n_samples)
        self._window = branching.window if branching is not None else self.window
        look = branching is not None and getattr(branching, "look_ahead", False)
        self.last_calls = 0
        keys = row_keys(seeds, first_n).tolist() if seeds is not None else None
        rows = [_Row(i, None if keys is None else keys[k])
                for k, i in enumerate(i for i, n in enumerate(first_n) for _ in range(n))]
        self._reset(prompt_ids, rows)
        if any(r.head is not None for r in rows):  # observations: a prompt per response
            first = self.engine.generate(
                model, [self._context(prompt_ids, r) for r in rows], [1] * len(rows),
                temperature, max_new_tokens, generator=generator,
                seeds=None if keys is None else [mix_seed(k, 1) for k in keys])
        else:
            first = self.engine.generate(model, prompt_ids, first_n, temperature,
                                         max_new_tokens, generator=generator, seeds=seeds)
        live, _ = self._take(first, rows, list(range(len(rows))), max_new_tokens)
        limit = getattr(self.engine, "max_len", None)  # vllm: max_model_len, prompt included
        while True:
            sources, called = live, []
            if look:  # the first window tokens after each result, before deciding
                live = sources = self._fits(prompt_ids, rows, live, limit)
            if look and live:
                for r in live:
                    rows[r].fork = rows[r].snapshot()
                ro = self._sample(model, prompt_ids, rows, live, temperature,
                                  min(self._window, max_new_tokens), generator, keys)
                called, live = self._take(ro, rows, live, max_new_tokens, cap=self._window)
            if branching is not None:
                live += branching.expand(rows, sources, n_samples, seeds, generator)
                self._reset(prompt_ids, rows)  # its new responses (not the branches)
            for r in sources:
                rows[r].fork = None
            live = self._fits(prompt_ids, rows, live, limit)
            if not live:
                if called:  # look-aheads that ended their turn in another call
                    live = called
                    continue
                break
            ro = self._sample(model, prompt_ids, rows, live, temperature,
                              max(max_new_tokens - len(rows[r].ids) for r in live), generator, keys)
            live, _ = self._take(ro, rows, live, max_new_tokens)
            live = called + live
        order = sorted(range(len(rows)), key=lambda r: rows[r].prompt)  # stable: by prompt
        self.last_rows = [rows[r] for r in order]
        return self._record(prompt_ids, self.last_rows, temperature, first.old_logp.device)

    def _fits(self, prompt_ids, rows, live: list[int], limit: int | None) -> list[int]:
        """The rows of ``live`` whose context leaves the engine room (vllm's ``max_model_len``,
        prompt included): a context that fills it ends its response there."""
        if limit is None:
            return live
        return [r for r in live if len(self._context(prompt_ids, rows[r])) < limit]

    def _sample(self, model, prompt_ids, rows, live, temperature, budget, generator, keys):
        """One engine call: the next tokens of each row in ``live``, from its whole context. Its
        seed is the row's key mixed with its next turn's number, so a row's draws depend on
        (row key, turn) only (seeding: key = mix_seed(seed, 0)); a turn a look-ahead began goes
        on with the key mixed with (turn, ``CONTINUE``)."""
        ctx = [self._context(prompt_ids, rows[r]) for r in live]
        sub_seeds = (None if keys is None else
                     [mix_seed(rows[r].key, rows[r].turns, CONTINUE) if rows[r].open
                      else mix_seed(rows[r].key, rows[r].turns + 1) for r in live])
        return self.engine.generate(model, ctx, [1] * len(live), temperature, budget,
                                    generator=generator, seeds=sub_seeds)

    @staticmethod
    def _context(prompt_ids, row: _Row) -> list[int]:
        """The row's context so far: its prompt (with its observation), then its tokens."""
        return (row.head if row.head is not None else prompt_ids[row.prompt]) + row.ids

    def _reset(self, prompt_ids, rows: list[_Row]) -> None:
        """A new environment for each row without one; an observation becomes its prompt."""
        new = [r for r in rows if self.envs and r.env is None]
        if not new:
            return
        records = [getattr(prompt_ids[r.prompt], "record", None) for r in new]
        if any(rec is None for rec in records):
            raise ValueError("rollout.environment: resetting an environment needs each prompt's "
                             "record (prompt ids from models.PromptTokens.ids_of)")
        for r, (obs, blob) in zip(new, self.runner.reset(records)):
            r.env = blob
            if obs:
                r.head = prompt_ids[r.prompt].with_observation(obs)

    def _take(self, ro: Rollouts, rows: list[_Row], live: list[int], max_new: int,
              cap: int | None = None) -> tuple[list[int], list[int]]:
        """Append one engine call's sampled tokens (``ro``'s rows are ``live``'s, in order) to
        each row's turn, run the calls the turns ended with, append their results. Returns the
        rows that got a result and the rows whose turn goes on: with a look-ahead (``cap``), a
        row that sampled ``cap`` tokens without ending its turn or its budget."""
        lengths = ro.response_mask.sum(-1).tolist()
        calls, callers, going = [], [], []
        for k, r in enumerate(live):
            row = rows[r]
            n = min(int(lengths[k]), max_new - len(row.ids))  # the row's own budget
            ids = ro.response_ids[k, :n].tolist()
            if not row.open:  # a new turn (else the rest of one a look-ahead began)
                row.start, row.turns = len(row.ids), row.turns + 1
                row.window.append(float(ro.entropy[k, : min(n, self._window)].sum()))
            row.ids += ids
            row.logp.append(ro.old_logp[k, :n])
            row.ent.append(ro.entropy[k, :n])
            if ro.engine_logp is not None:
                row.elogp.append(ro.engine_logp[k, :n])
            row.tool += [False] * n
            whole = n == lengths[k]
            last = ids[-1] if ids else None
            row.finished = whole and last in self.eos_ids
            row.open = False
            if (whole and last in self.stop_ids and row.turns < self.max_turns
                    and len(row.ids) < max_new):
                text = self.tokenizer.decode(row.ids[row.start:], skip_special_tokens=False)
                try:
                    calls.append(self.fmt.parse(text))
                except ToolCallError as e:
                    calls.append(e)
                callers.append(r)
            elif (cap is not None and whole and n == cap and last not in self.stop_ids
                  and last not in self.eos_ids and len(row.ids) < max_new):
                row.open = True
                going.append(r)
        self.last_calls += len(calls)
        good = [c for c in calls if not isinstance(c, Exception)]
        if self.envs:  # each call on its own response's instance
            states = [rows[r].env for r, c in zip(callers, calls) if not isinstance(c, Exception)]
            answers = iter(self.runner.run(good, states))
        else:
            answers = iter(self.runner.run(good))
        go_on = []
        for r, c in zip(callers, calls):
            row = rows[r]
            ans = ToolAnswer("", str(c)) if isinstance(c, Exception) else next(answers)
            if ans.state is not None:  # a failed call leaves the state as it was
                row.env = ans.state
            ids, failed = self.fmt.result_ids(ans.text, ans.error)
            ids = ids[: max_new - len(row.ids)]  # a result cut by the budget ends the response
            row.ids += ids
            row.logp.append(ro.old_logp.new_zeros(len(ids)))
            row.ent.append(ro.entropy.new_zeros(len(ids)))
            if ro.engine_logp is not None:
                row.elogp.append(ro.engine_logp.new_zeros(len(ids)))
            row.tool += [True] * len(ids)
            row.calls, row.errors = row.calls + 1, row.errors + failed
            if len(row.ids) < max_new:
                go_on.append(r)
        return go_on, going

    def _record(self, prompt_ids, rows: list[_Row], temperature: float, device) -> Rollouts:
        """The typed record (rows grouped by prompt; R = the longest response)."""
        N = len(rows)
        R = max([len(r.ids) for r in rows] + [1])
        pad = self.engine.pad_id
        p_ids, p_mask = left_pad([r.head if r.head is not None else prompt_ids[r.prompt]
                                  for r in rows], pad, device)
        ids = torch.full((N, R), pad, dtype=torch.long, device=device)
        tool = torch.zeros((N, R), dtype=torch.bool, device=device)
        logp = torch.zeros((N, R), device=device)
        ent = torch.zeros((N, R), device=device)
        elogp = torch.zeros((N, R), device=device) if any(r.elogp for r in rows) else None
        for i, r in enumerate(rows):
            n = len(r.ids)
            if not n:
                continue
            ids[i, :n] = torch.as_tensor(r.ids, dtype=torch.long, device=device)
            tool[i, :n] = torch.as_tensor(r.tool, dtype=torch.bool, device=device)
            logp[i, :n], ent[i, :n] = torch.cat(r.logp).float(), torch.cat(r.ent).float()
            if elogp is not None:
                elogp[i, :n] = torch.cat(r.elogp).float()
        lengths = torch.as_tensor([len(r.ids) for r in rows], dtype=torch.long, device=device)
        mask = (torch.arange(R, device=device)[None, :] < lengths[:, None]) & ~tool  # (N, R)
        texts = self.tokenizer.batch_decode([r.ids for r in rows], skip_special_tokens=True)

        def col(values) -> torch.Tensor:
            return torch.as_tensor(values, dtype=torch.long, device=device)

        return Rollouts(
            prompt_ids=p_ids, prompt_mask=p_mask, response_ids=ids, response_mask=mask,
            old_logp=logp, entropy=ent, prompt_index=col([r.prompt for r in rows]),
            texts=texts, temperature=temperature,
            truncated=torch.as_tensor([not r.finished for r in rows], dtype=torch.bool,
                                      device=device),
            engine_logp=elogp, tool_mask=tool, turns=col([r.turns for r in rows]),
            tool_calls=col([r.calls for r in rows]), tool_errors=col([r.errors for r in rows]),
            environments=[self.runner.state_of(r.env) for r in rows] if self.envs else None)
