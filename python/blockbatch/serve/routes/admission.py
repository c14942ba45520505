"""A generation request's way into the scheduler and its way out: ``admit`` (the checks that need
the scheduler, then submit), ``outcome`` (usage and the decode report of a finished job) and
``failure`` (the error of a job that did not finish)."""

from __future__ import annotations

from typing import Sequence

import torch

from ... import contract
from ...errors import RequestError
from ...scheduler import Event
from ..guard import APIError
from ..jobs import Choices, Job, ServerState
from ..protocol import Params, option_param
from ..responses import DecodeReport, Outcome, Usage


_STATUS = {k.name: k.status for k in contract.ERROR_KINDS}


def admit(state: ServerState, ids: torch.Tensor, params: Params, prompt_param: str, arrival: float) -> Choices:
    """Checks that need the scheduler, then submit the request's n choices, each a request of the
    scheduler (no await in here: the drain check and the submissions are one step of the loop). A
    request is admitted whole or not at all."""
    s = state.settings
    gen = params.options.gen_length
    length = state.engine.canvas_length(ids.numel(), params.options)  # policy block: whole blocks
    if length > s.max_length:
        rounded = " (rounded up to whole blocks of block_length)" if length != ids.numel() + gen else ""
        source = params.sources.get("gen_length", "gen_length")
        what = (
            f"gen_length {gen} ({source} {params.max_tokens} rounded up to a length the policy decodes)"
            if source == params.limit_name
            else f"gen_length {gen}"
        )
        raise APIError(
            413,
            f"the prompt ({ids.numel()} tokens) plus {what} needs {length} "
            f"positions{rounded}, more than this server's max length {s.max_length}: shorten the prompt "
            f"or {source}",
            param=prompt_param,
            code="context_length_exceeded",
        )
    if state.draining:
        raise APIError(503, "the server is shutting down: it takes no new requests", code="shutting_down")
    choice_options = params.choice_options()
    room = s.max_batch + s.max_queue
    if params.n > room:
        raise APIError(
            400,
            f"n: {params.n} choices are {params.n} requests, more than this server ever holds at once "
            f"(max_batch {s.max_batch} + max_queue {s.max_queue} = {room}): ask for fewer",
            param="n",
        )
    if len(state.jobs) + params.n > room:
        raise APIError(
            429,
            f"the server is full: {len(state.jobs)} requests are decoding or queued (max_batch "
            f"{s.max_batch} + max_queue {s.max_queue})"
            + (f", and n = {params.n} choices are {params.n} requests" if params.n > 1 else "")
            + "; retry later",
            code="queue_full",
        )
    choices = Choices(state, arrival)
    try:
        for options in choice_options:
            Job(state, ids, options, params.max_tokens, params.stop, arrival, params.preset, choices).submit()
    except RequestError as e:  # by its kind and the argument it names, never its text
        choices.cancel()  # the choices submitted already: a request is refused whole
        status = _STATUS[e.kind]
        code = "context_length_exceeded" if e.kind == "context_length" else e.kind
        raise APIError(status, str(e), param=option_param(e, params.sources) or prompt_param, code=code) from None
    except ValueError as e:  # a check without a kind (the prompt tensor's shape, say): the prompt's
        choices.cancel()
        raise APIError(400, str(e), param=prompt_param) from None
    except RuntimeError as e:  # the scheduler closed under us
        choices.cancel()
        raise APIError(503, f"the server is shutting down ({e})", code="shutting_down") from None
    return choices


def outcome(choices: Choices, completion_tokens: Sequence[int]) -> Outcome:
    """Usage and the decode report of a request whose choices all finished (``completion_tokens``:
    each choice's): the prompt counted once, the completion tokens and NFE summed over the choices,
    the wall time of the longest."""
    jobs = choices.jobs
    stats = []
    for job in jobs:
        assert job.final is not None and job.final.output is not None  # finished
        stats.append(job.final.output.stats)
    prompt, completion = jobs[0].prompt_ids.numel(), sum(completion_tokens)
    report = DecodeReport(
        policy=stats[0]["policy"],
        gen_length=jobs[0].options.gen_length,
        nfe=sum(s["nfe"] for s in stats),
        wall_ms=max(s["wall_ms"] for s in stats),
    )
    if jobs[0].preset is not None:
        report.preset = jobs[0].preset
    return Outcome(
        Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion),
        report,
    )


def failure(event: Event, sources: dict[str, str] | None = None) -> APIError:
    """The answer to a request whose decode did not finish, by the event's error kind."""
    kind = event.error_kind
    if kind == "timeout":
        return APIError(
            504, f"the decode ran past its timeout_s: {event.error}", param="blockbatch.timeout_s", code="timeout"
        )
    if event.kind == "cancelled" or kind == "cancelled":
        return APIError(503, f"the request was cancelled: {event.error}", code="cancelled")
    if kind in _STATUS and kind != "decode_failed":  # refused when it started
        param = option_param(event.error, sources or {}) if event.error else None
        return APIError(_STATUS[kind], str(event.error), param=param, code=kind)
    return APIError(500, f"the decode failed: {event.error}", code="decode_failed")
