"""How a model writes a tool call and reads its result: the formats a multi-turn rollout uses.

A format gives the engine the tokens that end a call (``stop_ids``: sampling stops there as at
EOS), reads the call from the text of the model's turn (``parse``), and gives the tokens of a
result (``result_ids``) that explorl appends before the model's next turn. The model's own
tokens are never re-tokenised: only the results are encoded.

- ``lab``: the lab's character models. A call is ``[<argument>]`` (the text between the
  brackets is the one argument of the run's one tool); its result is appended as
  ``{<result>}``, or ``{?}`` for a failed call (a lab model reads only its task's characters).
- ``chat``: chat models whose template renders tools (Qwen2.5, Llama 3.1, SmolLM3, Hermes
  style). A call is ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (the template's
  own markers, ``</tool_call>`` one token); its result goes through the chat template's
  ``tool`` role: the tokens that close the assistant turn, the tool message and the next
  assistant header, exactly as the template renders them.
"""

from __future__ import annotations

import inspect
import json
import re
from typing import Any

from explorl.tools.functions import ToolCallError
from explorl.tools.sandbox import describe

LAB_OPEN, LAB_CLOSE, LAB_RESULT_OPEN, LAB_RESULT_CLOSE, LAB_ERROR = "[", "]", "{", "}", "?"
TOOL_FORMATS = ("auto", "lab", "chat")


class LabFormat:
    """``[argument]`` → ``{result}`` for the lab's character tokenizer (one tool, one
    parameter)."""

    name = "lab"

    def __init__(self, tokenizer, tool: str, param: str):
        self.tokenizer, self.tool, self.param = tokenizer, tool, param
        ids = tokenizer.convert_tokens_to_ids([LAB_OPEN, LAB_CLOSE])
        if tokenizer.unk_token_id in ids:
            raise ValueError(f"the lab format needs {LAB_OPEN!r} and {LAB_CLOSE!r} in the lab "
                             "model's alphabet (a tool task's alphabet has them)")
        self.stop_ids = [ids[1]]
        self.alphabet = set(tokenizer.init_kwargs.get("explorl_alphabet", ""))

    def parse(self, text: str) -> tuple[str, dict[str, Any]]:
        """The call that ends ``text`` (the model's turn): ``(tool, {param: argument})``."""
        if not text.endswith(LAB_CLOSE) or LAB_OPEN not in text:
            raise ToolCallError(f"no call in {text[-40:]!r}")
        return self.tool, {self.param: text[text.rindex(LAB_OPEN) + 1: -1]}

    def result_ids(self, text: str, error: str | None) -> tuple[list[int], bool]:
        """Token ids of a result, and whether it is shown as an error (a failed call, or a
        result with characters the lab model cannot read)."""
        if error is None and self.alphabet and set(text) - self.alphabet:
            error = "outside the alphabet"
        body = LAB_ERROR if error is not None else text
        ids = self.tokenizer(LAB_RESULT_OPEN + body + LAB_RESULT_CLOSE,
                             add_special_tokens=False)["input_ids"]
        return ids, error is not None


_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>\s*$", re.S)


class ChatFormat:
    """Hermes-style ``<tool_call>`` JSON calls and the chat template's ``tool`` role."""

    name = "chat"
    CALL_END = "</tool_call>"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        end = tokenizer.encode(self.CALL_END, add_special_tokens=False)
        if len(end) != 1:
            raise ValueError(f"the chat tool format needs {self.CALL_END!r} to be one token of "
                             f"the tokenizer (it is {len(end)}); use a model whose chat template "
                             "has tool calls (Qwen2.5, Llama 3.1, SmolLM3)")
        self.stop_ids = end
        self._close, self._open = self._template_pieces()

    def _template_pieces(self) -> tuple[str, str]:
        """The text that closes an assistant turn after its content (``<|im_end|>\\n``), and the
        text from there to the next assistant turn's first token around a tool message (split
        at ``{RESULT}``), read off the template by rendering with sentinels."""
        tok, mark, res = self.tokenizer, "\u2063CALL\u2063", "\u2063RESULT\u2063"
        base = [{"role": "user", "content": "q"}, {"role": "assistant", "content": mark}]
        turn = tok.apply_chat_template(base, tokenize=False)
        close = turn[turn.rindex(mark) + len(mark):]
        full = tok.apply_chat_template(base + [{"role": "tool", "content": res}], tokenize=False,
                                       add_generation_prompt=True)
        after = full[full.rindex(mark) + len(mark):]
        if not after.startswith(close) or res not in after:
            raise ValueError("the chat template renders no tool message after an assistant "
                             "turn; use a model whose template has a tool role")
        return close, after[len(close):]

    def parse(self, text: str) -> tuple[str, dict[str, Any]]:
        m = _CALL.search(text)
        if m is None:
            raise ToolCallError("no <tool_call>...</tool_call> at the end of the turn")
        try:
            c = json.loads(m.group(1))
        except json.JSONDecodeError as e:
            raise ToolCallError(f"the tool call is not JSON: {e}") from None
        if not isinstance(c, dict) or "name" not in c:
            raise ToolCallError('a tool call is {"name": ..., "arguments": {...}}')
        return str(c["name"]), c.get("arguments", {})

    def result_ids(self, text: str, error: str | None) -> tuple[list[int], bool]:
        body = f"Error: {error}" if error is not None else text
        rendered = self._close + self._open.replace("\u2063RESULT\u2063", body)
        return self.tokenizer.encode(rendered, add_special_tokens=False), error is not None


def resolve_format(kind: str, tokenizer) -> str:
    """``rollout.tool_format`` with ``auto`` resolved: ``lab`` for a lab model's tokenizer (it
    records its alphabet), else ``chat``."""
    if kind != "auto":
        return kind
    return "lab" if getattr(tokenizer, "init_kwargs", {}).get("explorl_alphabet") else "chat"


def make_format(kind: str, tokenizer, tools: dict):
    """The format ``kind`` (``rollout.tool_format``) for ``tokenizer`` and the run's ``tools``
    (name -> its JSON schema, as ``tools.sandbox.describe`` reads it, or the function)."""
    kind = resolve_format(kind, tokenizer)
    if kind == "lab":
        if len(tools) != 1:
            raise ValueError(f"the lab tool format calls one tool, and the run has "
                             f"{len(tools)} ({', '.join(tools)})")
        (name, fn), = tools.items()
        params = (list(fn["function"]["parameters"]["properties"]) if isinstance(fn, dict)
                  else list(inspect.signature(fn).parameters))
        if len(params) != 1:
            raise ValueError(f"the lab tool format passes one argument, and {name} takes "
                             f"{len(params)}")
        return LabFormat(tokenizer, name, params[0])
    return ChatFormat(tokenizer)


def prompt_schemas(rollout, tokenizer) -> list | None:
    """The tools' JSON schemas a chat template shows in the prompt (``rollout``: the config's
    section; an environment's methods included), read in the sandbox (``tools.sandbox``);
    None without tools or in the lab format (a lab prompt is the bare problem)."""
    if not (rollout.tools or rollout.environment) or resolve_format(rollout.tool_format,
                                                                    tokenizer) != "chat":
        return None
    return list(describe(rollout.tools, rollout.environment).schemas.values())
