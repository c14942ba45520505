"""``POST /v1/completions`` and ``POST /v1/chat/completions``: parse and check the request, admit
it to the scheduler (``admission``), then wait for its result or stream its stable prefix (a
diffusion decode commits positions out of order: only the prefix no later step can change is
sent, so the streamed text ends up equal to the non-streamed one)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from ... import tools
from .. import responses
from ..guard import APIError
from ..jobs import Choices, Job, ServerState
from ..logprobs import Entries, covered
from ..protocol import chat_ids, parse_params, precheck_length, prompt_ids
from ..responses import Outcome
from .access import authorize, error_response, read_body, served
from .admission import admit, failure, outcome

log = logging.getLogger("blockbatch.serve")

router = APIRouter()


@router.post("/v1/completions")
async def completions(request: Request):
    return await generate(request, chat=False)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request):
    return await generate(request, chat=True)


async def watch_disconnect(request: Request, choices: Choices) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            choices.cancel()
            return


async def generate(request: Request, chat: bool):
    arrival = time.perf_counter()
    app = served(request)
    state = app.state
    authorize(request, state)
    if state.draining:
        raise APIError(503, "the server is shutting down: it takes no new requests", code="shutting_down")
    body = await read_body(request, state)
    params = parse_params(body, chat, state.settings.preset, app.family_defaults)
    prompt_param = "messages" if chat else "prompt"
    precheck_length(state.engine, body, chat, state.settings.max_length)
    # Tokenizing (and rendering the chat template) runs off the event loop: a long prompt must
    # not hold up the other streams and /health.
    if chat:
        ids = await asyncio.to_thread(chat_ids, state.engine, body, params.tools)
    else:
        ids = await asyncio.to_thread(prompt_ids, state.engine, body)
    choices = admit(state, ids, params, prompt_param, arrival)
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    created = int(time.time())
    name = state.settings.served_model_name
    if params.stream:
        return StreamingResponse(
            _stream(state, request, choices, chat, rid, created, name, _tool_names(params.tools)),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    watcher = asyncio.create_task(watch_disconnect(request, choices))
    try:
        left = len(choices.jobs)
        while left:
            _, event = await choices.events.get()
            if not event.final:
                continue
            if event.kind != "finished":  # the request fails with its first choice that does
                return error_response(failure(event))
            left -= 1
    finally:
        watcher.cancel()
        choices.cancel()  # a choice failed, or the handler was cancelled (server stopping): so is the decode
    texts, counts, calls, logprobs = [], [], [], []
    names = _tool_names(params.tools)
    for job in choices.jobs:
        generated = _generated(job)
        text, completion_tokens, reason = job.visible(generated, final=True)
        reply = tools.parse_reply(text, names) if names else None
        texts.append((text, "tool_calls" if reply is not None else reason))
        calls.append(reply)
        counts.append(completion_tokens)
        logprobs.append(_logprobs(job, generated, 0, completion_tokens, chat))
    state.metrics.generated_tokens.inc(sum(counts))
    done = outcome(choices, counts)
    return JSONResponse(responses.response(chat, rid, created, name, texts, done, calls, logprobs).body())


def _tool_names(request_tools: list[dict] | None) -> list[str]:
    """The names of the functions a reply may call (none: the reply is text)."""
    return [t["function"]["name"] for t in request_tools or ()]


def _logprobs(job: Job, ids: list[int], start: int, end: int, chat: bool, rows=None) -> dict | None:
    """The logprobs of a choice's tokens [start, end) (None when the request did not ask for them):
    the finished decode's rows, or ``rows`` (a stream's stable tokens')."""
    if job.options.logprobs is None:
        return None
    if rows is None:
        assert job.final is not None and job.final.output is not None and job.final.output.logprobs is not None
        rows = job.final.output.logprobs
    return Entries(job.codec, ids, rows, start, end).body(chat)


def _generated(job: Job) -> list[int]:
    """A finished choice's generated ids (its canvas after the prompt)."""
    assert job.final is not None and job.final.output is not None  # a finished event carries its output
    return job.final.output.tokens[job.prompt_ids.numel() :].tolist()


async def _stream(
    state: ServerState,
    request: Request,
    choices: Choices,
    chat: bool,
    rid: str,
    created: int,
    name: str,
    names: list[str] | None = None,
) -> AsyncIterator[str]:
    """The request's chunks: each choice's role (chat), its stable text as it grows and its finish
    reason, each chunk naming its choice's index; the last chunk also carries the usage and the
    decode report. A choice that fails ends the stream with the error event (and the other choices).

    With tools (``names``: the functions a reply may call) the text from the first ``<tool_call>`` on
    is held back until the choice ends (``tools.shown_prefix``): no piece of markup is ever sent as
    content. Then a reply of well-formed calls sends them in one delta (each whole, with its index)
    and ends with finish_reason "tool_calls"; any other reply sends the rest of its text."""

    def chunk(
        index: int,
        text: str | None = None,
        reason: str | None = None,
        role: bool = False,
        outcome: Outcome | None = None,
        calls=None,
        logprobs: dict | None = None,
    ) -> str:
        body = responses.chunk(chat, rid, created, name, text, reason, role, outcome, index, calls, logprobs).body()
        return f"data: {json.dumps(body)}\n\n"

    watcher = asyncio.create_task(watch_disconnect(request, choices))
    jobs = choices.jobs
    sent = [""] * len(jobs)
    sent_tokens = [0] * len(jobs)  # with logprobs: the tokens whose entries were sent (their text was)
    counts = [0] * len(jobs)
    left = len(jobs)
    try:
        if chat:
            for job in jobs:
                yield chunk(job.index, role=True)
        while True:
            i, event = await choices.events.get()
            job = jobs[i]
            if event.kind == "tokens":
                text, count, _ = job.visible(job.stable, final=False)
                if names:
                    text = tools.shown_prefix(text)
                if len(text) > len(sent[i]) and text.startswith(sent[i]):
                    lp = None
                    if job.options.logprobs is not None:  # the tokens whose text this chunk completes
                        upto = covered(job.codec, job.stable[:count], len(text))
                        lp = _logprobs(job, job.stable, sent_tokens[i], upto, chat, job.stable_rows)
                        sent_tokens[i] = upto
                    yield chunk(i, text[len(sent[i]) :], logprobs=lp)
                    sent[i] = text
                continue
            if event.kind != "finished":
                yield f"data: {json.dumps(failure(event).body())}\n\n"
                yield "data: [DONE]\n\n"
                return
            ids = _generated(job)
            text, counts[i], reason = job.visible(ids, final=True)
            reply = tools.parse_reply(text, names) if names else None
            if reply is not None:
                text, reason = reply.content or "", "tool_calls"
            rest = _logprobs(job, ids, sent_tokens[i], counts[i], chat) if counts[i] > sent_tokens[i] else None
            if not text.startswith(sent[i]):  # a tokenizer whose text of a prefix is not a prefix of its text
                log.warning("request %s: streamed text %r is not a prefix of the result %r", rid, sent[i], text)
            elif len(text) > len(sent[i]):
                yield chunk(i, text[len(sent[i]) :], logprobs=rest)
                rest = None
            if reply is not None:
                yield chunk(i, calls=reply.calls)
            state.metrics.generated_tokens.inc(counts[i])
            left -= 1
            done = outcome(choices, counts) if left == 0 else None
            yield chunk(i, "" if not chat else None, reason=reason, outcome=done, logprobs=rest)
            if left == 0:
                yield "data: [DONE]\n\n"
                return
    finally:
        watcher.cancel()
        choices.cancel()
