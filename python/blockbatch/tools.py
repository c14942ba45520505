"""Tool calls (OpenAI's ``tools``): which chat templates render them, the markup a model writes a
call in, and that markup read back out of a reply.

The markup is the one LLaDA2 (Ling 2.0's template), Dream (Qwen2.5's) and the byte-level BPE random
checkpoints (``random_tokenizer.CHAT_TEMPLATE``) teach their models: each call a JSON object
``{"name": ..., "arguments": {...}}`` between ``<tool_call>`` and ``</tool_call>``, after the reply's
text if it has any::

    Let me look that up.
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

A reply is read as tool calls only when all of its markup is well formed (``parse_reply``): every
``<tool_call>`` closed, each body one JSON object with a ``name`` among the request's tools and
``arguments`` an object (or the JSON text of one), nothing but white space between and after the
calls. Otherwise it is plain text, markup included, and the client sees what the model wrote: a call
is never made up from a reply that does not spell one out."""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Any, Sequence

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
_PROBE_NAME = "blockbatch_probe_7f3a9c"  # a tool name no template writes unless it renders the tools it is given


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One call: the function's name and its arguments as JSON text (OpenAI's ``arguments``)."""

    name: str
    arguments: str

    def openai(self, call_id: str | None = None) -> dict[str, Any]:
        """The call in OpenAI's shape (``id``, ``type``, ``function {name, arguments}``)."""
        return {
            "id": call_id or "call_" + uuid.uuid4().hex[:24],
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclasses.dataclass(frozen=True)
class Reply:
    """A reply read as tool calls: its text before the first call (None when only white space) and the calls."""

    content: str | None
    calls: tuple[ToolCall, ...]


def template_renders_tools(render) -> bool:
    """Whether a chat template puts the tools it is given into the prompt: ``render(messages,
    tools)`` (a codec's ``render_chat``) with a probe tool writes the probe's name."""
    probe = [{"type": "function", "function": {"name": _PROBE_NAME, "description": "", "parameters": {}}}]
    try:
        return _PROBE_NAME in render([{"role": "user", "content": "hi"}], probe)
    except ValueError:  # the template refuses such a conversation: it does not take tools as they come
        return False


def template_markup(template: str | None) -> str | None:
    """The call markup a template teaches (``"<tool_call>"``), None when it names none this module reads."""
    return OPEN if template is not None and OPEN in template and CLOSE in template else None


def parse_reply(text: str, names: Sequence[str]) -> Reply | None:
    """``text`` read as tool calls to the functions ``names``, or None when it holds no call or its
    markup is not well formed (then it is plain text: the module's docstring)."""
    start = text.find(OPEN)
    if start < 0:
        return None
    if CLOSE in text[:start]:
        return None
    content, rest, calls = text[:start], text[start:], []
    while rest:
        if not rest.startswith(OPEN):
            return None
        end = rest.find(CLOSE)
        if end < 0:
            return None  # unclosed: the reply ended (EOS, max_tokens) inside a call
        body = rest[len(OPEN) : end]
        if OPEN in body:
            return None
        call = _parse_call(body.strip(), names)
        if call is None:
            return None
        calls.append(call)
        rest = rest[end + len(CLOSE) :].lstrip()
    content = content.rstrip()
    return Reply(content or None, tuple(calls))


def _parse_call(body: str, names: Sequence[str]) -> ToolCall | None:
    try:
        value = json.loads(body)
    except (json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(value, dict) or set(value) != {"name", "arguments"}:
        return None
    name, arguments = value["name"], value["arguments"]
    if not isinstance(name, str) or name not in names:
        return None
    if isinstance(arguments, str):  # the JSON text of the arguments object
        try:
            arguments = json.loads(arguments)
        except (json.JSONDecodeError, RecursionError):
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(name, json.dumps(arguments, ensure_ascii=False))


def shown_prefix(text: str) -> str:
    """The part of a reply still being decoded that a stream may send as content when the request
    has tools: the text before the first ``<tool_call>``, less its trailing white space (which
    comes before a call, and a reply of calls has no content after its last non-space character)
    and less a tail that could still grow into ``<tool_call>`` (when the tokenizer spells it in
    pieces). Every prefix it returns is a prefix of the final content, calls or not."""
    cut = text.find(OPEN)
    if cut >= 0:
        text = text[:cut]
    for k in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if text.endswith(OPEN[:k]):
            text = text[:-k]
            break
    return text.rstrip()
