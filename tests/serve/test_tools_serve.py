"""Tools (OpenAI's ``tools`` / ``tool_choice``) on the real server, driven by the real ``openai``
client: a random checkpoint with the byte-level BPE tokenizer and the LLaDA2-style template that
renders tools (``make-random --tokenizer bpe``), and the toy whose template renders none.

A random model does not write a call by itself: these tests show the tools reach the prompt (the
ids the server decodes are the tokenizer's rendering of the conversation with the tools, so its
answer is the engine's for those ids), the refusals, and the shape of replies. For the replies of
calls, the same checkpoint's weights are fitted (a few seconds of the float32 reference's training,
``helpers.bpe.train_to_reply``) to answer one conversation with a call: the server reads a call the
model really decoded. The markup parser is tested on its own in tests/engine/test_tools.py."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from blockbatch import DecodeOptions, Engine
from blockbatch.serve import responses
from blockbatch.tools import parse_reply
from helpers.bpe import make_bpe_checkpoint, train_to_reply
from helpers.serve import ServeProcess

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]
OPTIONS = {"policy": "vanilla", "gen_length": 32, "block_length": 32, "steps": 32}


@pytest.fixture(scope="module")
def bpe_model(tmp_path_factory):
    return make_bpe_checkpoint(tmp_path_factory.mktemp("models") / "bpe-tools")


@pytest.fixture(scope="module")
def engine(bpe_model):
    return Engine.from_pretrained(str(bpe_model))


@pytest.fixture(scope="module")
def server(bpe_model, tmp_path_factory):
    s = ServeProcess(["--model", str(bpe_model), "--max-batch", "2"], tmp_path_factory.mktemp("logs") / "tools.log")
    yield s
    assert s.stop() == 0, s.log()


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _rendered_ids(engine, messages, tools=None) -> list[int]:
    """The tokenizer's own encoding of the template's rendering (no server code in between)."""
    text = engine.codec.render_chat(messages, tools=tools)
    return engine.codec.tokenizer.encode(text, add_special_tokens=False).ids


def _expected(engine, ids) -> tuple[str, str, int]:
    [g] = engine.generate(ids, DecodeOptions(**OPTIONS))
    return g.text, "stop" if len(g.ids) < len(g.raw_ids) else "length", g.stats["nfe"]


def test_tools_reach_the_prompt_and_the_answer_is_the_engines(client, engine):
    ids = _rendered_ids(engine, MESSAGES, [WEATHER, SEARCH])
    plain = _rendered_ids(engine, MESSAGES)
    assert len(ids) > len(plain) + 20  # the tools are in the prompt
    text, reason, nfe = _expected(engine, ids)
    done = client.chat.completions.create(
        model="bpe-tools", messages=MESSAGES, tools=[WEATHER, SEARCH], extra_body={"blockbatch": OPTIONS}
    )
    assert done.usage.prompt_tokens == len(ids)
    assert done.model_extra["nfe"] == nfe
    choice = done.choices[0]
    assert parse_reply(text, ["get_weather", "search"]) is None  # a random model writes no call
    assert choice.message.content == text and choice.message.tool_calls is None and choice.finish_reason == reason
    # tool_choice "none": the template gets no tools, the prompt is the one without them
    none = client.chat.completions.create(
        model="bpe-tools", messages=MESSAGES, tools=[WEATHER], tool_choice="none", extra_body={"blockbatch": OPTIONS}
    )
    assert none.usage.prompt_tokens == len(plain) and none.choices[0].message.content == _expected(engine, plain)[0]
    auto = client.chat.completions.create(
        model="bpe-tools", messages=MESSAGES, tools=[WEATHER], tool_choice="auto", extra_body={"blockbatch": OPTIONS}
    )
    assert auto.usage.prompt_tokens == len(_rendered_ids(engine, MESSAGES, [WEATHER]))


def test_a_conversation_with_calls_and_results_is_rendered(client, engine):
    """An assistant turn of calls (content null) and the tool's result go through the template."""
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"celsius": 21}'},
    ]
    rendered = engine.codec.render_chat(
        [*MESSAGES, {"role": "assistant", "content": "", "tool_calls": [call]}, messages[-1]], tools=[WEATHER]
    )
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in rendered
    assert '<tool_response>\n{"celsius": 21}\n</tool_response>' in rendered
    done = client.chat.completions.create(
        model="bpe-tools", messages=messages, tools=[WEATHER], extra_body={"blockbatch": OPTIONS}
    )
    ids = engine.codec.tokenizer.encode(rendered, add_special_tokens=False).ids
    assert done.usage.prompt_tokens == len(ids)
    assert done.choices[0].message.content == _expected(engine, ids)[0]


def test_streaming_with_tools_sends_the_same_reply(client, engine):
    text, reason, _ = _expected(engine, _rendered_ids(engine, MESSAGES, [WEATHER]))
    chunks = list(
        client.chat.completions.create(
            model="bpe-tools", messages=MESSAGES, tools=[WEATHER], stream=True, extra_body={"blockbatch": OPTIONS}
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    assert chunks[-1].choices[0].finish_reason == reason
    assert all(c.choices[0].delta.tool_calls is None for c in chunks)


@pytest.mark.parametrize(
    "tool_choice, shown",
    [("required", "required"), ({"type": "function", "function": {"name": "get_weather"}}, "a named function")],
)
def test_tool_choice_that_needs_a_grammar_is_400(client, tool_choice, shown):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="bpe-tools", messages=MESSAGES, tools=[WEATHER], tool_choice=tool_choice)
    assert e.value.body["param"] == "tool_choice"
    assert e.value.body["message"].startswith(f"tool_choice: {shown} needs grammar-constrained decoding")


@pytest.mark.parametrize(
    "body, param",
    [
        ({"tools": {"a": 1}}, "tools"),
        ({"tools": [{"type": "code_interpreter"}]}, "tools[0]"),
        ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name"),
        ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
            "tools[0].function.parameters",
        ),
        ({"tools": [{"type": "function", "function": {"name": "f", "strict": True}}]}, "tools[0].function.strict"),
        ({"tool_choice": "auto"}, "tool_choice"),  # auto without tools
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ({"functions": [WEATHER["function"]]}, "functions"),  # the deprecated form stays refused
        (
            {"messages": [{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f"}}]}]},
            "messages[0].tool_calls[0].function.arguments",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}],
                    }
                ]
            },
            "messages[0].tool_calls[0].function.arguments",
        ),
    ],
)
def test_malformed_tools_are_400_naming_the_field(server, body, param):
    r = httpx.post(
        server.url + "/v1/chat/completions", json={"model": "bpe-tools", "messages": MESSAGES, **body}, timeout=30
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


def test_a_template_without_tools_keeps_a_400_naming_tools(tmp_path_factory):
    folder = make_bpe_checkpoint(
        tmp_path_factory.mktemp("models") / "no-tools", template="{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    s = ServeProcess(["--model", str(folder)], tmp_path_factory.mktemp("logs") / "no-tools.log")
    try:
        c = OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model="no-tools", messages=MESSAGES, tools=[WEATHER])
        assert e.value.body["param"] == "tools" and e.value.body["code"] == "tools_not_supported"
        assert "does not render tools" in e.value.body["message"]
        # without tools (or with tool_choice "none") the same request is served
        ok = c.chat.completions.create(
            model="no-tools", messages=MESSAGES, tools=[WEATHER], tool_choice="none", max_tokens=4
        )
        assert ok.choices[0].message.tool_calls is None
    finally:
        assert s.stop() == 0, s.log()


CALLED = 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_a_reply_of_calls_has_openais_shape():
    """The body the server writes for a reply of calls, read by the openai package's own types."""
    reply = parse_reply(CALLED, ["get_weather"])
    usage = responses.Usage(prompt_tokens=3, completion_tokens=5, total_tokens=8)
    report = responses.DecodeReport(policy="vanilla", gen_length=32, nfe=32, wall_ms=1.0)
    body = responses.response(
        True, "chatcmpl-1", 0, "m", [(CALLED, "tool_calls")], responses.Outcome(usage, report), [reply]
    ).body()
    done = ChatCompletion.model_validate(body)
    message = done.choices[0].message
    assert done.choices[0].finish_reason == "tool_calls" and message.content == "Checking."
    [call] = message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}

    chunk = responses.chunk(True, "chatcmpl-1", 0, "m", index=0, calls=reply.calls).body()
    delta = ChatCompletionChunk.model_validate(chunk).choices[0].delta
    assert delta.content is None and [c.index for c in delta.tool_calls] == [0]
    assert delta.tool_calls[0].function.name == "get_weather" and delta.tool_calls[0].id.startswith("call_")


CALL_REPLY = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture(scope="module")
def caller(tmp_path_factory):
    """(server, engine) of a checkpoint fitted to answer MESSAGES with tools [WEATHER] by CALL_REPLY."""
    folder = make_bpe_checkpoint(tmp_path_factory.mktemp("models") / "caller")
    engine = Engine.from_pretrained(str(folder))
    train_to_reply(folder, engine.encode_chat(MESSAGES, tools=[WEATHER]).tolist(), CALL_REPLY)
    engine = Engine.from_pretrained(str(folder))
    s = ServeProcess(["--model", str(folder), "--max-batch", "2"], tmp_path_factory.mktemp("logs") / "caller.log")
    yield s, engine
    assert s.stop() == 0, s.log()


def _caller_client(caller) -> OpenAI:
    return OpenAI(base_url=caller[0].url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_a_decoded_call_is_answered_as_tool_calls(caller):
    server, engine = caller
    [g] = engine.generate(engine.encode_chat(MESSAGES, tools=[WEATHER]), DecodeOptions(**OPTIONS))
    assert g.text == CALL_REPLY  # the model really writes the call
    done = _caller_client(caller).chat.completions.create(
        model="caller", messages=MESSAGES, tools=[WEATHER], n=2, extra_body={"blockbatch": OPTIONS}
    )
    assert done.usage.completion_tokens == 2 * len(g.ids) and done.model_extra["nfe"] == 2 * g.stats["nfe"]
    for choice in done.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        [call] = choice.message.tool_calls
        assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert done.choices[0].message.tool_calls[0].id != done.choices[1].message.tool_calls[0].id
    # without tools in the request the same reply is plain text (nothing is read as a call)
    plain = _caller_client(caller).chat.completions.create(
        model="caller", messages=MESSAGES, extra_body={"blockbatch": OPTIONS}
    )
    assert plain.choices[0].message.tool_calls is None and plain.choices[0].finish_reason in ("stop", "length")


def test_a_streamed_call_never_leaks_markup(caller):
    chunks = list(
        _caller_client(caller).chat.completions.create(
            model="caller", messages=MESSAGES, tools=[WEATHER], stream=True, extra_body={"blockbatch": OPTIONS}
        )
    )
    assert not any("<" in (c.choices[0].delta.content or "") for c in chunks)
    calls = [t for c in chunks for t in c.choices[0].delta.tool_calls or ()]
    assert [(t.index, t.type, t.function.name) for t in calls] == [(0, "function", "get_weather")]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"} and calls[0].id.startswith("call_")
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert [c.choices[0].finish_reason for c in chunks].count(None) == len(chunks) - 1


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_cut_by_max_tokens_is_content_not_a_call(caller, stream):
    """max_tokens ends inside the call: unclosed markup is plain text, finish_reason "length", and
    a stream sends the same text (held back to the end, then whole)."""
    server, engine = caller
    [g] = engine.generate(engine.encode_chat(MESSAGES, tools=[WEATHER]), DecodeOptions(**OPTIONS))
    cut = engine.codec.decode(g.ids[:8])
    assert cut.startswith("<tool_call>") and "</tool_call>" not in cut
    kwargs = dict(model="caller", messages=MESSAGES, tools=[WEATHER], max_tokens=8, extra_body={"blockbatch": OPTIONS})
    if stream:
        chunks = list(_caller_client(caller).chat.completions.create(stream=True, **kwargs))
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == cut
        assert all(c.choices[0].delta.tool_calls is None for c in chunks)
        assert chunks[-1].choices[0].finish_reason == "length"
    else:
        done = _caller_client(caller).chat.completions.create(**kwargs)
        assert done.choices[0].message.content == cut and done.choices[0].message.tool_calls is None
        assert done.choices[0].finish_reason == "length"
