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

from .. import responses
from ..guard import APIError
from ..jobs import Job, ServerState
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


async def watch_disconnect(request: Request, job: Job) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel()
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
    ids = await asyncio.to_thread(chat_ids if chat else prompt_ids, state.engine, body)
    job = admit(state, ids, params, prompt_param, arrival)
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    created = int(time.time())
    name = state.settings.served_model_name
    if params.stream:
        return StreamingResponse(
            _stream(state, request, job, chat, rid, created, name),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    watcher = asyncio.create_task(watch_disconnect(request, job))
    try:
        while True:
            event = await job.events.get()
            if event.final:
                break
    finally:
        watcher.cancel()
        job.cancel()  # the handler was cancelled (server stopping): so is the decode
    if event.kind != "finished":
        return error_response(failure(event))
    output = event.output
    assert output is not None  # a finished event carries its output
    raw = output.tokens[ids.numel() :].tolist()
    text, completion_tokens, reason = job.visible(raw, final=True)
    state.metrics.generated_tokens.inc(completion_tokens)
    done = outcome(job, completion_tokens, output.stats)
    return JSONResponse(responses.response(chat, rid, created, name, text, reason, done).body())


async def _stream(
    state: ServerState, request: Request, job: Job, chat: bool, rid: str, created: int, name: str
) -> AsyncIterator[str]:
    def chunk(
        text: str | None = None, reason: str | None = None, role: bool = False, outcome: Outcome | None = None
    ) -> str:
        body = responses.chunk(chat, rid, created, name, text, reason, role, outcome).body()
        return f"data: {json.dumps(body)}\n\n"

    watcher = asyncio.create_task(watch_disconnect(request, job))
    sent = ""
    try:
        if chat:
            yield chunk(role=True)
        while True:
            event = await job.events.get()
            if event.kind == "tokens":
                text, _, _ = job.visible(job.stable, final=False)
                if len(text) > len(sent) and text.startswith(sent):
                    yield chunk(text[len(sent) :])
                    sent = text
                continue
            if event.kind == "finished":
                output = event.output
                assert output is not None  # a finished event carries its output
                raw = output.tokens[job.prompt_ids.numel() :].tolist()
                text, completion_tokens, reason = job.visible(raw, final=True)
                if not text.startswith(sent):  # a tokenizer whose text of a prefix is not a prefix of its text
                    log.warning("request %s: streamed text %r is not a prefix of the result %r", rid, sent, text)
                elif len(text) > len(sent):
                    yield chunk(text[len(sent) :])
                state.metrics.generated_tokens.inc(completion_tokens)
                yield chunk(
                    "" if not chat else None, reason=reason, outcome=outcome(job, completion_tokens, output.stats)
                )
            else:
                yield f"data: {json.dumps(failure(event).body())}\n\n"
            yield "data: [DONE]\n\n"
            return
    finally:
        watcher.cancel()
        job.cancel()
