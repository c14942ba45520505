"""The response bodies of ``/v1/completions``, ``/v1/chat/completions`` and ``/v1/models`` as
pydantic models, in the OpenAI shape. A field whose absence means something (a preset, a chunk's
usage) defaults to None and is left out unless set (``model_dump(exclude_unset=True)``);
``logprobs`` and ``finish_reason`` are always written, null included, as OpenAI writes them."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import BaseModel


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class DecodeReport(BaseModel):
    """The ``"blockbatch"`` field of a response: how the request was decoded."""

    policy: str
    gen_length: int
    nfe: int
    wall_ms: float
    preset: str | None = None  # the preset the options came from, when one did


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: dict[str, Any] | None  # serve/logprobs.py: the request's logprobs, else null
    finish_reason: str | None


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text of an object


class ToolCall(BaseModel):
    id: str
    type: Literal["function"]
    function: FunctionCall


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str | None
    tool_calls: list[ToolCall] | None = None  # written only when the reply is calls (finish_reason "tool_calls")


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: dict[str, Any] | None
    finish_reason: str | None


class ChunkToolCall(ToolCall):
    index: int  # the call's place in the reply (a stream sends each call whole, in one delta)


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ChunkToolCall] | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: dict[str, Any] | None
    finish_reason: str | None


class GenerationResponse(BaseModel):
    """A completion, a chat completion or one chunk of either stream (the last chunk carries the
    usage and the decode report)."""

    id: str
    object: Literal["text_completion", "chat.completion", "chat.completion.chunk"]
    created: int
    model: str
    choices: list[CompletionChoice | ChatChoice | ChatChunkChoice]
    usage: Usage | None = None
    nfe: int | None = None
    blockbatch: DecodeReport | None = None

    def body(self) -> dict[str, Any]:
        return self.model_dump(exclude_unset=True)


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


@dataclasses.dataclass
class Outcome:
    """What a finished request reports: its usage and how it was decoded."""

    usage: Usage
    report: DecodeReport


def tool_calls(calls, stream: bool = False) -> list:
    """``blockbatch.tools.ToolCall``s in the response's shape (a stream's carry their index)."""
    shaped = [c.openai() for c in calls]
    if stream:
        return [ChunkToolCall(index=i, **c) for i, c in enumerate(shaped)]
    return [ToolCall(**c) for c in shaped]


def response(
    chat: bool,
    rid: str,
    created: int,
    model: str,
    texts: list[tuple[str, str | None]],
    outcome: Outcome,
    calls: list | None = None,
    logprobs: list[dict[str, Any] | None] | None = None,
) -> GenerationResponse:
    """The whole (non-streamed) response of a finished request: its choices' (text, finish reason)
    in index order; ``calls[i]``: choice i's tool calls (``blockbatch.tools.Reply``) or None; their
    logprobs (serve/logprobs.py) when the request asked for them."""
    choices: list[CompletionChoice | ChatChoice | ChatChunkChoice] = []
    for index, (text, reason) in enumerate(texts):
        lp = logprobs[index] if logprobs is not None else None
        if chat:
            reply = calls[index] if calls else None
            message = (
                AssistantMessage(role="assistant", content=text)
                if reply is None
                else AssistantMessage(role="assistant", content=reply.content, tool_calls=tool_calls(reply.calls))
            )
            choices.append(
                ChatChoice(
                    index=index,
                    message=message,
                    logprobs=lp,
                    finish_reason=reason,
                )
            )
        else:
            choices.append(CompletionChoice(index=index, text=text, logprobs=lp, finish_reason=reason))
    return GenerationResponse(
        id=rid,
        object="chat.completion" if chat else "text_completion",
        created=created,
        model=model,
        choices=choices,
        usage=outcome.usage,
        nfe=outcome.report.nfe,
        blockbatch=outcome.report,
    )


def chunk(
    chat: bool,
    rid: str,
    created: int,
    model: str,
    text: str | None = None,
    reason: str | None = None,
    role: bool = False,
    outcome: Outcome | None = None,
    index: int = 0,
    calls: list | None = None,
    logprobs: dict[str, Any] | None = None,
) -> GenerationResponse:
    """One chunk of choice ``index``'s stream: the role (chat's first chunk), a piece of text, or its
    last chunk (``reason``: an empty text, or chat's empty delta; the request's last chunk carries
    ``outcome`` too) or, chat, its tool calls (``calls``: ``blockbatch.tools.ToolCall``s);
    ``logprobs``: those of the tokens the chunk carries (serve/logprobs.py)."""
    choice: ChatChunkChoice | CompletionChoice
    if chat:
        delta = (
            ChatDelta(role="assistant", content="")
            if role
            else ChatDelta(tool_calls=tool_calls(calls, stream=True))
            if calls
            else ChatDelta()
            if text is None
            else ChatDelta(content=text)
        )
        choice = ChatChunkChoice(index=index, delta=delta, logprobs=logprobs, finish_reason=reason)
    else:
        choice = CompletionChoice(index=index, text=text or "", logprobs=logprobs, finish_reason=reason)
    more: dict[str, Any] = (
        {} if outcome is None else {"usage": outcome.usage, "nfe": outcome.report.nfe, "blockbatch": outcome.report}
    )
    return GenerationResponse(
        id=rid,
        object="chat.completion.chunk" if chat else "text_completion",
        created=created,
        model=model,
        choices=[choice],
        **more,
    )
