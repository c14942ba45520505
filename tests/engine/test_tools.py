"""``blockbatch.tools``: the <tool_call>{json}</tool_call> markup read out of a reply (well formed:
calls; anything else: plain text), the prefix a stream may send, and which templates render tools."""

from __future__ import annotations

import json

import pytest

from blockbatch.random_tokenizer import CHAT_TEMPLATE
from blockbatch.tokenization import TextCodec
from blockbatch.tools import OPEN, parse_reply, shown_prefix, template_markup
from helpers.bpe import make_bpe_checkpoint

NAMES = ["get_weather", "search"]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.mark.parametrize(
    "text, content, calls",
    [
        (CALL, None, [("get_weather", {"city": "Paris"})]),
        ("Let me check.\n" + CALL, "Let me check.", [("get_weather", {"city": "Paris"})]),
        (CALL + "\n\n  ", None, [("get_weather", {"city": "Paris"})]),
        (
            CALL + '\n<tool_call>{"name": "search", "arguments": {"q": "é", "n": [1, {"x": null}]}}</tool_call>',
            None,
            [("get_weather", {"city": "Paris"}), ("search", {"q": "é", "n": [1, {"x": None}]})],
        ),
        # arguments given as the JSON text of an object (as OpenAI writes them) are read the same
        ('<tool_call>{"name": "search", "arguments": "{\\"q\\": 1}"}</tool_call>', None, [("search", {"q": 1})]),
        ('<tool_call>{"name": "search", "arguments": {}}</tool_call>', None, [("search", {})]),
        # a body with '</tool' inside a string is still one JSON object
        ('<tool_call>{"name": "search", "arguments": {"q": "<tool"}}</tool_call>', None, [("search", {"q": "<tool"})]),
    ],
)
def test_well_formed_calls_are_read(text, content, calls):
    reply = parse_reply(text, NAMES)
    assert reply is not None
    assert reply.content == content
    assert [(c.name, json.loads(c.arguments)) for c in reply.calls] == calls
    for c in reply.calls:
        shaped = c.openai()
        assert shaped["type"] == "function" and shaped["id"].startswith("call_")
        assert shaped["function"] == {"name": c.name, "arguments": c.arguments}


@pytest.mark.parametrize(
    "text",
    [
        "",
        "plain text, no calls",
        '{"name": "get_weather", "arguments": {}}',  # JSON without the markup is text
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}',  # unclosed (max_tokens inside it)
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Par',  # cut inside the JSON
        '</tool_call>{"name": "get_weather", "arguments": {}}<tool_call>',  # closed before opened
        'x</tool_call><tool_call>{"name": "search", "arguments": {}}</tool_call>',  # a stray close first
        '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call></tool_call>',  # a stray close after
        '<tool_call><tool_call>{"name": "search", "arguments": {}}</tool_call>',  # nested open
        "<tool_call>not json</tool_call>",
        "<tool_call></tool_call>",
        '<tool_call>["get_weather", {}]</tool_call>',  # not an object
        '<tool_call>{"name": "delete_all", "arguments": {}}</tool_call>',  # not one of the request's tools
        '<tool_call>{"name": "search"}</tool_call>',  # no arguments
        '<tool_call>{"name": "search", "arguments": {}, "extra": 1}</tool_call>',  # a key OpenAI has no place for
        '<tool_call>{"name": "search", "arguments": [1]}</tool_call>',  # arguments not an object
        '<tool_call>{"name": "search", "arguments": "not json"}</tool_call>',
        '<tool_call>{"name": "search", "arguments": "[1]"}</tool_call>',
        '<tool_call>{"name": 3, "arguments": {}}</tool_call>',
        '<tool_call>{"name": "search", "arguments": {}}</tool_call> and then more text',  # text after a call
        CALL + " between " + CALL,  # text between calls
        '<tool_call>{"name": "search", "arguments": {}} {}</tool_call>',  # two values in one body
    ],
)
def test_malformed_markup_is_plain_text(text):
    assert parse_reply(text, NAMES) is None


def test_no_tools_means_no_calls():
    assert parse_reply(CALL, []) is None


@pytest.mark.parametrize(
    "final",
    [
        "Let me check the weather.\n" + CALL,
        "Hello there, friend",
        "Looks like <tool_c is not a call",
        "a < b and <tool_call> never closes",
        "   ",
        CALL,
    ],
)
def test_streamed_prefixes_are_prefixes_of_the_final_content(final):
    """Every stable prefix of the reply gives a shown prefix that the final content starts with
    (calls: the content before them; otherwise the whole text) and that never holds the markup."""
    reply = parse_reply(final, NAMES)
    content = (reply.content or "") if reply is not None else final
    for i in range(len(final) + 1):
        shown = shown_prefix(final[:i])
        assert content.startswith(shown), (final[:i], shown)
        assert OPEN not in shown


def test_template_markup():
    assert template_markup(CHAT_TEMPLATE) == OPEN
    assert template_markup("{% for m in messages %}{{ m.content }}{% endfor %}") is None
    assert template_markup(None) is None


def test_renders_tools_probes_the_template(tmp_path):
    from blockbatch.loading import load_checkpoint

    ck = load_checkpoint(str(make_bpe_checkpoint(tmp_path / "bpe")))
    with_tools = TextCodec(ck.tokenizer, ck.config, ck.chat_template)
    assert with_tools.renders_tools
    assert not TextCodec(ck.tokenizer, ck.config, "{% for m in messages %}{{ m.content }}{% endfor %}").renders_tools
    # a template that mentions tools but never writes them is not one that renders them
    mentions = "{% if tools %}You have tools.{% endif %}{{ messages[0].content }}"
    assert not TextCodec(ck.tokenizer, ck.config, mentions).renders_tools
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    messages = [{"role": "user", "content": "weather?"}]
    text = with_tools.render_chat(messages, tools=[tool])
    assert json.dumps(tool) in text and "<tools>" in text
    assert "<tools>" not in with_tools.render_chat(messages)
    ids = with_tools.encode_chat(messages, tools=[tool])
    assert ids == ck.tokenizer.encode(text, add_special_tokens=False).ids


def test_engine_encode_chat_renders_tools_and_refuses_them_where_the_template_cannot(tmp_path):
    from blockbatch import Engine
    from blockbatch.errors import RequestError

    tool = {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}
    messages = [{"role": "user", "content": "find {x}"}]
    engine = Engine.from_pretrained(str(make_bpe_checkpoint(tmp_path / "bpe")))
    text = engine.codec.render_chat(messages, tools=[tool])
    expected = engine.codec.tokenizer.encode(text, add_special_tokens=False).ids
    assert engine.encode_chat(messages, tools=[tool]).tolist() == expected
    assert engine.encode_chat(messages).tolist() != expected
    plain = Engine.from_pretrained(
        str(make_bpe_checkpoint(tmp_path / "plain", template="{% for m in messages %}{{ m.content }}{% endfor %}"))
    )
    with pytest.raises(RequestError) as e:
        plain.encode_chat(messages, tools=[tool])
    assert e.value.param == "tools" and e.value.kind == "unsupported" and "does not render tools" in str(e.value)
    assert plain.encode_chat(messages).tolist() == plain.codec.tokenizer.encode("find {x}").ids
