"""A generation request's way into the scheduler and its way out: ``admit`` (the checks that need
the scheduler, then submit), ``outcome`` (usage and the decode report of a finished job) and
``failure`` (the error of a job that did not finish)."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from ... import contract
from ...errors import RequestError
from ...scheduler import Event
from ..guard import APIError
from ..jobs import Job, ServerState
from ..protocol import Params, option_param
from ..responses import DecodeReport, Outcome, Usage


_STATUS = {k.name: k.status for k in contract.ERROR_KINDS}


def admit(state: ServerState, ids: torch.Tensor, params: Params, prompt_param: str, arrival: float) -> Job:
    """Checks that need the scheduler, then submit (no await in here: the drain check and the
    submission are one step of the loop)."""
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
    if len(state.jobs) >= s.max_batch + s.max_queue:
        raise APIError(
            429,
            f"the server is full: {len(state.jobs)} requests are decoding or queued (max_batch "
            f"{s.max_batch} + max_queue {s.max_queue}); retry later",
            code="queue_full",
        )
    job = Job(state, ids, params.options, params.max_tokens, params.stop, arrival, params.preset)
    try:
        job.submit()
    except RequestError as e:  # by its kind and the argument it names, never its text
        status = _STATUS[e.kind]
        code = "context_length_exceeded" if e.kind == "context_length" else e.kind
        raise APIError(status, str(e), param=option_param(e, params.sources) or prompt_param, code=code) from None
    except ValueError as e:  # a check without a kind (the prompt tensor's shape, say): the prompt's
        raise APIError(400, str(e), param=prompt_param) from None
    except RuntimeError as e:  # the scheduler closed under us
        raise APIError(503, f"the server is shutting down ({e})", code="shutting_down") from None
    return job


def outcome(job: Job, completion_tokens: int, stats: Mapping[str, Any]) -> Outcome:
    prompt = job.prompt_ids.numel()
    report = DecodeReport(
        policy=stats["policy"], gen_length=job.options.gen_length, nfe=stats["nfe"], wall_ms=stats["wall_ms"]
    )
    if job.preset is not None:
        report.preset = job.preset
    return Outcome(
        Usage(prompt_tokens=prompt, completion_tokens=completion_tokens, total_tokens=prompt + completion_tokens),
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
