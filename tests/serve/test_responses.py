"""The response models of blockbatch.serve.responses write exactly the OpenAI shapes the server
answers with (and the openai client reads): field order, nulls kept where OpenAI writes them,
optional parts (a preset, a chunk's usage) left out unless set."""

from __future__ import annotations

import json

from blockbatch.serve.responses import DecodeReport, ModelCard, ModelList, Outcome, Usage, chunk, response


def _outcome(preset: str | None = None) -> Outcome:
    report = DecodeReport(policy="dual", gen_length=32, nfe=3, wall_ms=1.5)
    if preset is not None:
        report.preset = preset
    return Outcome(Usage(prompt_tokens=3, completion_tokens=2, total_tokens=5), report)


USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
REPORT = {"policy": "dual", "gen_length": 32, "nfe": 3, "wall_ms": 1.5}


def test_completion_and_chat_completion_bodies():
    head = {"id": "cmpl-1", "object": "text_completion", "created": 7, "model": "m"}
    body = response(False, "cmpl-1", 7, "m", [("72", "length")], _outcome()).body()
    assert json.dumps(body) == json.dumps(
        {
            **head,
            "choices": [{"index": 0, "text": "72", "logprobs": None, "finish_reason": "length"}],
            "usage": USAGE,
            "nfe": 3,
            "blockbatch": REPORT,
        }
    )
    body = response(True, "c", 7, "m", [("hi", "stop")], _outcome(preset="blockbatch-best")).body()
    assert body["object"] == "chat.completion"
    assert body["choices"] == [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "logprobs": None, "finish_reason": "stop"}
    ]
    assert body["blockbatch"] == {**REPORT, "preset": "blockbatch-best"}  # the preset only when there is one


def test_stream_chunks():
    role = chunk(True, "c", 7, "m", role=True).body()
    assert role["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    ]
    assert set(role) == {"id", "object", "created", "model", "choices"}  # no usage before the last chunk
    assert chunk(True, "c", 7, "m", "ab").body()["choices"][0]["delta"] == {"content": "ab"}
    last = chunk(True, "c", 7, "m", None, "stop", outcome=_outcome()).body()
    assert last["choices"][0]["delta"] == {} and last["usage"] == USAGE and last["blockbatch"] == REPORT
    text = chunk(False, "x", 7, "m", "", "length", outcome=_outcome()).body()
    assert text["object"] == "text_completion" and text["choices"][0] == {
        "index": 0,
        "text": "",
        "logprobs": None,
        "finish_reason": "length",
    }


def test_model_list():
    card = ModelCard(id="blockbatch-toy", object="model", created=1, owned_by="blockbatch", max_model_len=512)
    assert ModelList(object="list", data=[card]).model_dump() == {
        "object": "list",
        "data": [
            {"id": "blockbatch-toy", "object": "model", "created": 1, "owned_by": "blockbatch", "max_model_len": 512}
        ],
    }
