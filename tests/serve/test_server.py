"""``blockbatch serve``: the real server in a subprocess on a loopback port, driven by the real
``openai`` client (sync and async) and by httpx for the raw protocol. Texts and NFE are checked
against the engine decoding the same request in this process (a request's result does not depend
on what shares its forwards)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import math
import re
import signal
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
from openai import AsyncOpenAI, OpenAI

from blockbatch import DecodeOptions, Engine, presets
from blockbatch.toy import checkpoint_path
from helpers.serve import ROOT, ServeProcess, parse_metrics

PROMPT = "72-2=__-3=__-3=__...............?"  # the toy task; greedy answer 72-2=70-3=67-3=64;64
KEY = "test-key"
# A decode long enough to watch (about 20 ms a forward on the toy): one token per step, 256 steps
# in 8 blocks of 32, so the stable prefix first grows after 32 forwards.
LONG = {"policy": "vanilla", "gen_length": 256, "block_length": 32, "threshold": None, "steps": 256}
PASS_THROUGH_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


class Server(ServeProcess):
    """``python -m blockbatch.cli serve`` on a free loopback port, up once /health answers."""

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics: name{labels} -> value."""
        return parse_metrics(httpx.get(self.url + "/metrics", timeout=10).text)

    def wait_idle(self, timeout: float = 30) -> float:
        """Seconds until no request runs or waits."""
        t0 = time.monotonic()
        while True:
            m = self.metrics()
            if m["blockbatch_running"] == 0 and m["blockbatch_queued"] == 0:
                return time.monotonic() - t0
            assert time.monotonic() - t0 < timeout, "requests still running"
            time.sleep(0.02)


@pytest.fixture(scope="module")
def engine():
    return Engine.from_pretrained()


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory) -> Path:
    """The toy model with a chat template (the toy has none): the messages' contents, concatenated."""
    folder = tmp_path_factory.mktemp("models") / "toy-chat"
    folder.mkdir()
    for f in Path(checkpoint_path()).iterdir():
        (folder / f.name).symlink_to(f)
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": PASS_THROUGH_TEMPLATE}))
    return folder


@pytest.fixture(scope="module")
def server(chat_model, tmp_path_factory):
    """The toy with a chat template, served as "toy-chat" (its folder's name), with an API key."""
    s = Server(
        ["--model", str(chat_model), "--api-key", KEY, "--max-batch", "4"],
        tmp_path_factory.mktemp("logs") / "server.log",
    )
    yield s
    assert s.stop() == 0, s.log()


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """The shipped toy (no chat template, default name blockbatch-toy, no key); one request at a
    time and one waiting."""
    s = Server(["--max-batch", "1", "--max-queue", "1"], tmp_path_factory.mktemp("logs") / "small.log")
    yield s
    assert s.stop() == 0, s.log()


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def _expected(engine, blockbatch: dict, max_tokens=None, stop=(), **sampling):
    """(text, completion tokens, finish reason, nfe, gen_length) the server must answer, from the
    engine: gen_length is max_tokens rounded up to what the policy decodes."""
    options = dict(blockbatch, **sampling)
    if "gen_length" not in options and max_tokens is not None:
        unit = 32
        if options.get("policy") == "blockbatch" and options.get("block_sizes"):
            unit = math.lcm(*options["block_sizes"])
        elif options.get("policy", "dual") != "blockbatch":
            unit = options.get("block_length", 32)
        options["gen_length"] = -(-max_tokens // unit) * unit
    [g] = engine.generate(PROMPT, DecodeOptions(**options), chat=False)
    ids, reason = g.ids, "stop" if len(g.ids) < len(g.raw_ids) else "length"
    if max_tokens is not None and len(ids) >= max_tokens:
        ids, reason = ids[:max_tokens], "length"
    text = engine.codec.decode(ids)
    cuts = [text.find(s) for s in stop if s in text]
    if cuts:
        text, reason = text[: min(cuts)], "stop"
        ids = ids[: len(text)]  # the toy's tokens are single characters
    return text, len(ids), reason, g.stats["nfe"], len(g.raw_ids)


CASES = {
    "dual default": ({}, {}),
    "blockbatch": ({"policy": "blockbatch"}, {}),
    "vanilla blocks of 8": ({"policy": "vanilla", "block_length": 8}, {}),
    "stop across chunks": ({"policy": "vanilla", "block_length": 8}, {"stop": ["0-3=6", "zz"]}),
    "stop longer than the text so far": ({"policy": "vanilla", "block_length": 8}, {"stop": ["9" * 30]}),
    "max_tokens rounds gen_length up": ({"policy": "blockbatch", "block_sizes": [4, 8]}, {"max_tokens": 10}),
    "sampled": ({"policy": "dual"}, {"temperature": 0.8, "seed": 3}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_completion_stream_equals_non_stream_and_engine(server, client, engine, case):
    blockbatch, kw = CASES[case]
    model = "toy-chat"
    done = client.completions.create(model=model, prompt=PROMPT, extra_body={"blockbatch": blockbatch}, **kw)
    chunks = list(
        client.completions.create(model=model, prompt=PROMPT, extra_body={"blockbatch": blockbatch}, stream=True, **kw)
    )
    sampling = {k: kw[k] for k in ("temperature", "seed") if k in kw}
    text, tokens, reason, nfe, gen_length = _expected(
        engine, blockbatch, kw.get("max_tokens"), kw.get("stop", ()), **sampling
    )
    [choice] = done.choices
    assert (choice.text, choice.finish_reason) == (text, reason)
    assert done.object == "text_completion" and done.model == model
    assert (done.usage.prompt_tokens, done.usage.completion_tokens, done.usage.total_tokens) == (
        33,
        tokens,
        33 + tokens,
    )
    assert done.model_extra["nfe"] == nfe and done.model_extra["blockbatch"]["gen_length"] == gen_length

    assert "".join(c.choices[0].text for c in chunks) == text
    reasons = [c.choices[0].finish_reason for c in chunks]
    assert reasons[-1] == reason and reasons.count(None) == len(reasons) - 1, reasons
    assert chunks[-1].usage == done.usage and chunks[-1].model_extra["nfe"] == nfe
    assert len({c.id for c in chunks}) == 1
    if case == "vanilla blocks of 8":  # the stable prefix grows block by block: several text chunks
        assert sum(bool(c.choices[0].text) for c in chunks) >= 2, [c.choices[0].text for c in chunks]
    if case == "stop across chunks":
        assert text == "72-2=7"


def test_chat_uses_the_template_and_streams_the_same(server, client, engine):
    text, tokens, reason, nfe, _ = _expected(engine, {}, max_tokens=32)
    messages = [{"role": "user", "content": PROMPT}]
    done = client.chat.completions.create(model="toy-chat", messages=messages, max_tokens=32, user="someone")
    assert done.object == "chat.completion"
    assert done.choices[0].message.role == "assistant" and done.choices[0].message.content == text
    assert done.choices[0].finish_reason == reason and done.usage.completion_tokens == tokens
    assert done.model_extra["nfe"] == nfe

    chunks = list(client.chat.completions.create(model="toy-chat", messages=messages, max_tokens=32, stream=True))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    reasons = [c.choices[0].finish_reason for c in chunks]
    assert reasons[-1] == reason and reasons.count(None) == len(reasons) - 1
    assert chunks[-1].usage == done.usage and chunks[-1].model_extra["nfe"] == nfe

    # the template sees every message (here: concatenated), content parts included
    two = client.chat.completions.create(
        model="toy-chat",
        max_completion_tokens=32,
        messages=[{"role": "system", "content": "1"}, {"role": "user", "content": [{"type": "text", "text": PROMPT}]}],
    )
    assert two.usage.prompt_tokens == 34


# n > 1 draws: at temperature 20 the toy's seeds 5, 6, 7 give different texts (at 0.8 it is too sure of itself)
SAMPLED = {"temperature": 20.0, "seed": 5}
N_OPTIONS = {"policy": "dual", "gen_length": 32}


def _alone(engine, seed: int, temperature: float = 0.0) -> tuple[str, str, int, int]:
    """(text, finish reason, completion tokens, nfe) of the engine decoding PROMPT with ``seed``."""
    [g] = engine.generate(PROMPT, DecodeOptions(**N_OPTIONS, temperature=temperature, seed=seed), chat=False)
    return g.text, "stop" if len(g.ids) < len(g.raw_ids) else "length", len(g.ids), g.stats["nfe"]


def _by_index(chunks, chat: bool) -> dict[int, tuple[str, list]]:
    """A stream's text and finish reasons per choice index."""
    out: dict[int, tuple[str, list]] = {}
    for c in chunks:
        [choice] = c.choices
        text, reasons = out.get(choice.index, ("", []))
        piece = (choice.delta.content or "") if chat else choice.text
        out[choice.index] = (text + piece, reasons + [choice.finish_reason])
    return out


def test_n_choices_are_decodes_with_seeds_seed_plus_i(server, client, engine):
    """n=3 sampled: choice i is the engine's decode of seed + i (its text and finish reason), the
    draws differ, usage counts the prompt once and sums the completions, nfe sums the choices'."""
    server.wait_idle()
    before = server.metrics()
    done = client.completions.create(
        model="toy-chat", prompt=PROMPT, n=3, **SAMPLED, extra_body={"blockbatch": N_OPTIONS}
    )
    after = server.metrics()
    alone = [_alone(engine, SAMPLED["seed"] + i, SAMPLED["temperature"]) for i in range(3)]
    assert [c.index for c in done.choices] == [0, 1, 2]
    assert [(c.text, c.finish_reason) for c in done.choices] == [(text, reason) for text, reason, _, _ in alone]
    assert len({text for text, _, _, _ in alone}) >= 2, alone
    tokens = sum(a[2] for a in alone)
    assert (done.usage.prompt_tokens, done.usage.completion_tokens, done.usage.total_tokens) == (
        33,
        tokens,
        33 + tokens,
    )
    assert done.model_extra["nfe"] == sum(a[3] for a in alone)

    def delta(name):
        return after.get(name, 0) - before.get(name, 0)

    # one request, served: counted once; its tokens and forwards are its three decodes'
    assert delta('blockbatch_requests_total{status="200"}') == 1
    assert delta("blockbatch_prompt_tokens_total") == 33
    assert delta("blockbatch_generated_tokens_total") == tokens
    assert delta("blockbatch_nfe_total") == delta("blockbatch_request_forwards_total") == done.model_extra["nfe"]
    assert delta("blockbatch_e2e_request_seconds_count") == delta("blockbatch_time_to_first_token_seconds_count") == 1
    assert delta("blockbatch_step_seconds_count") == 3


def test_n_greedy_choices_are_equal_and_chat_has_n_too(server, client, engine):
    text, reason, tokens, nfe = _alone(engine, 0)
    done = client.completions.create(model="toy-chat", prompt=PROMPT, n=2, extra_body={"blockbatch": N_OPTIONS})
    assert [(c.index, c.text, c.finish_reason) for c in done.choices] == [(0, text, reason), (1, text, reason)]
    assert done.usage.completion_tokens == 2 * tokens and done.model_extra["nfe"] == 2 * nfe

    messages = [{"role": "user", "content": PROMPT}]
    chat = client.chat.completions.create(
        model="toy-chat", messages=messages, n=2, temperature=0, extra_body={"blockbatch": N_OPTIONS}
    )
    assert [(c.index, c.message.content, c.finish_reason) for c in chat.choices] == [
        (0, text, reason),
        (1, text, reason),
    ]
    assert (chat.usage.prompt_tokens, chat.usage.completion_tokens) == (33, 2 * tokens)


@pytest.mark.parametrize("n", [0, 17, "2", True, 2.5])
def test_n_outside_1_to_16_or_not_an_integer_is_400_naming_n(server, client, n):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="toy-chat", prompt=PROMPT, n=n, max_tokens=8)
    assert e.value.body["param"] == "n" and "must be an integer in [1, 16]" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="toy-chat", messages=[{"role": "user", "content": PROMPT}], n=n, max_tokens=8, stream=True
        )
    assert e.value.body["param"] == "n"


# Logprobs: vanilla in blocks of 8, so the stable prefix (and a stream's chunks) grows block by block (the text
# fills the first three blocks, the other thirteen come after it, so text chunks come before the end).
LP_OPTIONS = {"policy": "vanilla", "gen_length": 128, "block_length": 8}


def _engine_entries(
    engine, k: int, count: int | None = None, chat: bool = True, options=LP_OPTIONS, **sampling
) -> list:
    """The engine's (text piece, logprob, [(text, logprob)] top) per completion token of PROMPT
    (completions: the top as OpenAI's {text: logprob}, where equal texts, the special tokens', collapse)."""
    [g] = engine.generate(PROMPT, DecodeOptions(**options, logprobs=k, **sampling), chat=False)
    text = engine.codec.decode
    out = []
    for t in g.logprobs[:count]:
        top = [(text([i]), v) for i, v in t.top]
        out.append((text([t.token]), t.logprob, top if chat else list(dict(top).items())))
    return out


def _joined(chunks, chat: bool, index: int = 0) -> list:
    """A stream's logprobs entries of choice ``index``, chunk after chunk, as (token, logprob, top)."""
    out = []
    for c in chunks:
        [choice] = c.choices
        if choice.index != index or choice.logprobs is None:
            continue
        out.extend(_entries(choice.logprobs, chat))
    return out


def _entries(lp, chat: bool) -> list:
    if chat:
        for e in lp.content:
            assert e.bytes == list(e.token.encode()) and all(t.bytes == list(t.token.encode()) for t in e.top_logprobs)
        return [(e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs]) for e in lp.content]
    return [(t, v, list(top.items())) for t, v, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs)]


@pytest.mark.parametrize("route", ["completions", "chat"])
def test_logprobs_are_the_engines_and_streamed_the_same(server, client, engine, route):
    """logprobs 3 (completions) / logprobs true + top_logprobs 3 (chat): per completion token its text,
    the engine's log-prob and top 3 for the same request (Engine.generate with logprobs=3); the
    stream's chunks carry the entries of their tokens, several chunks, joined equal to the response."""
    chat = route == "chat"
    kw = dict(model="toy-chat", extra_body={"blockbatch": LP_OPTIONS})
    if chat:
        create = client.chat.completions.create
        kw.update(messages=[{"role": "user", "content": PROMPT}], logprobs=True, top_logprobs=3)
    else:
        create = client.completions.create
        kw.update(prompt=PROMPT, logprobs=3)
    done = create(**kw)
    [choice] = done.choices
    n = done.usage.completion_tokens
    want = _engine_entries(engine, 3, n, chat)
    got = _entries(choice.logprobs, chat)
    assert got == want and len(got) == n > 0
    text = choice.message.content if chat else choice.text
    assert "".join(t for t, _, _ in got) == text
    if not chat:
        assert choice.logprobs.text_offset == [len("".join(t for t, _, _ in got[:i])) for i in range(n)]
    chunks = list(create(stream=True, **kw))
    assert _joined(chunks, chat) == got
    assert sum(1 for c in chunks if c.choices[0].logprobs is not None) >= 2  # entries came block by block
    plain = create(**{k: v for k, v in kw.items() if k not in ("logprobs", "top_logprobs")})
    assert plain.choices[0].logprobs is None
    assert (plain.choices[0].message.content if chat else plain.choices[0].text) == text


def test_blockbatch_logprobs_are_the_winners_and_streamed_the_same(server, client, engine):
    """Policy blockbatch: the response's entries are the engine's (the winning branch's records), and
    the stream, which hands a token once every branch holds the same record, joins to the same."""
    options = {"policy": "blockbatch", "gen_length": 64, "block_sizes": [4, 8, 16], "sync_gap": 1}
    kw = dict(model="toy-chat", prompt=PROMPT, logprobs=2, extra_body={"blockbatch": options})
    done = client.completions.create(**kw)
    [choice] = done.choices
    n = done.usage.completion_tokens
    got = _entries(choice.logprobs, False)
    assert got == _engine_entries(engine, 2, n, False, options) and len(got) == n > 0
    assert "".join(t for t, _, _ in got) == choice.text
    assert _joined(list(client.completions.create(stream=True, **kw)), False) == got


def test_logprobs_of_n_choices_are_each_their_own(server, client, engine):
    """n=2 sampled with logprobs 0: choice i's entries are the engine's with seed + i, streamed too."""
    kw = dict(model="toy-chat", prompt=PROMPT, n=2, logprobs=0, **SAMPLED, extra_body={"blockbatch": LP_OPTIONS})
    done = client.completions.create(**kw)
    chunks = list(client.completions.create(stream=True, **kw))
    for i, choice in enumerate(done.choices):
        got = _entries(choice.logprobs, chat=False)
        want = _engine_entries(
            engine, 0, len(got), chat=False, temperature=SAMPLED["temperature"], seed=SAMPLED["seed"] + i
        )
        assert got == want and all(top == [] for _, _, top in got)
        assert _joined(chunks, chat=False, index=i) == got
    assert _entries(done.choices[0].logprobs, False) != _entries(done.choices[1].logprobs, False)


@pytest.mark.parametrize("route", ["completions", "chat"])
def test_n_streams_carry_their_choice_index(server, client, route):
    """n=2 sampled, streamed: chunks of both indices whose texts add up to the non-streamed
    choices, one finish reason per choice, the usage in the last chunk."""
    chat = route == "chat"
    kw = dict(model="toy-chat", n=2, **SAMPLED, extra_body={"blockbatch": N_OPTIONS})
    if chat:
        kw["messages"] = [{"role": "user", "content": PROMPT}]
        create = client.chat.completions.create
    else:
        kw["prompt"] = PROMPT
        create = client.completions.create
    done = create(**kw)
    chunks = list(create(stream=True, **kw))
    streamed = _by_index(chunks, chat)
    assert sorted(streamed) == [0, 1]
    texts = [c.message.content if chat else c.text for c in done.choices]
    assert texts[0] != texts[1]  # so a chunk given the wrong index would show
    for i, choice in enumerate(done.choices):
        text, reasons = streamed[i]
        assert text == texts[i]
        assert [r for r in reasons if r is not None] == [choice.finish_reason]
        assert reasons[-1] == choice.finish_reason  # a choice's last chunk carries its reason
    if chat:
        assert [c.choices[0].delta.role for c in chunks[:2]] == ["assistant", "assistant"]
        assert [c.choices[0].index for c in chunks[:2]] == [0, 1]
    assert chunks[-1].usage == done.usage and chunks[-1].model_extra["nfe"] == done.model_extra["nfe"]
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1


def test_n_choices_are_cancelled_together(server, client):
    """A client gone (streamed or not) cancels all n of its decodes: one cancelled request, and
    fewer forwards than one choice left running would make (256)."""
    server.wait_idle()
    before = server.metrics()
    stream = client.completions.create(
        model="toy-chat", prompt=PROMPT, n=2, stream=True, extra_body={"blockbatch": LONG}
    )
    first = next(iter(stream))
    assert first.choices[0].text and first.choices[0].index in (0, 1)
    stream.close()
    assert server.wait_idle(timeout=10) < 2.0
    after = server.metrics()
    cancelled = 'blockbatch_requests_total{status="cancelled"}'
    assert after[cancelled] - before.get(cancelled, 0) == 1
    forwards = after["blockbatch_request_forwards_total"] - before["blockbatch_request_forwards_total"]
    assert 0 < forwards < 192, forwards

    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            server.url + "/v1/completions",
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=0.5,
            json={"model": "toy-chat", "prompt": PROMPT, "n": 2, "blockbatch": LONG},
        )
    assert server.wait_idle(timeout=10) < 2.0
    final = server.metrics()
    assert final[cancelled] == after[cancelled] + 1
    assert final["blockbatch_request_forwards_total"] - after["blockbatch_request_forwards_total"] < 192


def test_request_preset_sets_the_options_under_the_requests_own(server, client, engine):
    """``"blockbatch": {"preset": NAME, ...}``: the preset's options, the request's others on top;
    gen_length from max_tokens follows the preset's policy; the response names the preset."""
    default = client.completions.create(model="toy-chat", prompt=PROMPT, max_tokens=20)
    assert default.model_extra["blockbatch"]["policy"] == "dual" and "preset" not in default.model_extra["blockbatch"]
    for request, gen_length in (
        ({"preset": "blockbatch-paper"}, 32),
        ({"preset": "dual-fast-dllm"}, 32),
        ({"preset": "dual-fast-dllm", "block_length": 8, "threshold": 0.5}, 24),
        ({"preset": "blockbatch-paper", "block_sizes": [4, 8], "merge": False}, 24),
    ):
        done = client.completions.create(
            model="toy-chat", prompt=PROMPT, max_tokens=20, extra_body={"blockbatch": request}
        )
        own = {k: v for k, v in request.items() if k != "preset"}
        options = presets.values(request["preset"], {**own, "gen_length": gen_length})
        text, tokens, reason, nfe, _ = _expected(engine, options, max_tokens=20)
        used = done.model_extra["blockbatch"]
        assert (used["policy"], used["gen_length"], used["preset"]) == (
            options["policy"],
            gen_length,
            request["preset"],
        )
        assert (done.choices[0].text, done.usage.completion_tokens, done.choices[0].finish_reason) == (
            text,
            tokens,
            reason,
        )
        assert done.model_extra["nfe"] == nfe, request


def test_models_health_and_auth(server, client):
    assert [m.id for m in client.models.list()] == ["toy-chat"]
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    body = {"model": "toy-chat", "prompt": PROMPT}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        for r in (
            httpx.post(server.url + "/v1/completions", json=body, headers=headers),
            httpx.get(server.url + "/v1/models", headers=headers),
        ):
            assert r.status_code == 401, r.text
            assert r.json()["error"]["type"] == "authentication_error"
    with pytest.raises(openai.AuthenticationError):
        OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).completions.create(
            model="toy-chat", prompt=PROMPT
        )
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-4", prompt=PROMPT)
    assert e.value.body["param"] == "model" and "toy-chat" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="toy-chat", prompt=PROMPT, extra_body={"blockbatch": {"policy": "greedy"}})
    assert e.value.body["param"] == "blockbatch.policy" and "policy must be one of" in e.value.body["message"]
    with pytest.raises(openai.APIStatusError) as e:
        client.completions.create(model="toy-chat", prompt=PROMPT, max_tokens=500)
    assert e.value.status_code == 413 and e.value.body["code"] == "context_length_exceeded"


ERRORS = [  # (route, changes to a valid body, status, param)
    ("completions", {"n": 0}, 400, "n"),
    ("completions", {"n": 17}, 400, "n"),
    ("completions", {"n": "2"}, 400, "n"),
    ("completions", {"n": True}, 400, "n"),
    ("completions", {"n": 2.0}, 400, "n"),
    ("chat/completions", {"n": 0}, 400, "n"),
    ("chat/completions", {"n": 17}, 400, "n"),
    ("chat/completions", {"n": "2"}, 400, "n"),
    ("chat/completions", {"n": True}, 400, "n"),
    ("completions", {"n": 3, "seed": (1 << 63) - 2, "temperature": 1}, 400, "seed"),  # choice 2's seed overflows
    ("completions", {"n": 2, "blockbatch": {"seed": (1 << 63) - 1}}, 400, "blockbatch.seed"),
    ("completions", {"temperature": -1}, 400, "temperature"),
    ("completions", {"temperature": "hot"}, 400, "temperature"),
    ("completions", {"seed": -5}, 400, "seed"),
    ("completions", {"max_tokens": 0}, 400, "max_tokens"),
    ("completions", {"max_tokens": 2.5}, 400, "max_tokens"),
    ("completions", {"stream": "yes"}, 400, "stream"),
    ("completions", {"stop": [1]}, 400, "stop"),
    ("completions", {"logprobs": 21}, 400, "logprobs"),
    ("completions", {"logprobs": "3"}, 400, "logprobs"),
    ("completions", {"logprobs": True}, 400, "logprobs"),
    ("completions", {"logprobs": 2, "blockbatch": {"logprobs": 2}}, 400, "logprobs"),
    ("chat/completions", {"logprobs": 1}, 400, "logprobs"),
    ("chat/completions", {"top_logprobs": 2}, 400, "top_logprobs"),  # without logprobs: true, as OpenAI
    ("chat/completions", {"logprobs": False, "top_logprobs": 2}, 400, "top_logprobs"),
    ("chat/completions", {"logprobs": True, "top_logprobs": 21}, 400, "top_logprobs"),
    ("chat/completions", {"logprobs": True, "top_logprobs": 1.5}, 400, "top_logprobs"),
    ("completions", {"blockbatch": "dual"}, 400, "blockbatch"),
    ("completions", {"blockbatch": {"bogus": 1}}, 400, "blockbatch.bogus"),
    ("completions", {"blockbatch": {"preset": "nope"}}, 400, "blockbatch.preset"),
    ("completions", {"blockbatch": {"preset": "/etc/hostname"}}, 400, "blockbatch.preset"),  # no files per request
    ("completions", {"blockbatch": {"preset": ["dual-fast-dllm"]}}, 400, "blockbatch.preset"),
    ("completions", {"blockbatch": {"threshold": "high"}}, 400, "blockbatch.threshold"),
    ("completions", {"blockbatch": {"gen_length": 64, "block_length": 48}}, 400, "blockbatch.block_length"),
    ("completions", {"temperature": 0.5, "blockbatch": {"temperature": 0.5}}, 400, "temperature"),
    ("completions", {"prompt": "72a"}, 400, "prompt"),
    ("completions", {"prompt": [1, 2, 99]}, 400, "prompt"),
    ("completions", {"prompt": ["1", "2"]}, 400, "prompt"),
    ("completions", {"prompt": [20, 3]}, 400, "prompt"),  # the mask id
    ("completions", {"blockbatch": {"timeout_s": 0.001, **LONG}}, 504, "blockbatch.timeout_s"),
    ("completions", {"prompt": None}, 400, "prompt"),
    ("completions", {"model": None}, 400, "model"),
    ("completions", {"model": "gpt-4"}, 404, "model"),
    ("completions", {"max_tokens": 500}, 413, "prompt"),
    ("completions", {"blockbatch": {"gen_length": 480}}, 413, "prompt"),
    ("chat/completions", {"messages": None}, 400, "messages"),
    ("chat/completions", {"messages": [{"role": "user"}]}, 400, "messages[0].content"),
    (
        "chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        400,
        "messages[0].content[0]",
    ),
    ("chat/completions", {"messages": [{"role": "user", "content": "1a"}]}, 400, "messages"),
    ("chat/completions", {"max_tokens": 8, "max_completion_tokens": 8}, 400, "max_completion_tokens"),
]


@pytest.mark.parametrize(
    "route,change,status,param", ERRORS, ids=[f"{r}-{json.dumps(c)[:40]}" for r, c, _, _ in ERRORS]
)
def test_errors_have_openai_shape_and_name_the_field(server, route, change, status, param):
    body = {"model": "toy-chat", "max_tokens": 16}
    body.update({"prompt": PROMPT} if route == "completions" else {"messages": [{"role": "user", "content": PROMPT}]})
    body.update(change)
    body = {k: v for k, v in body.items() if v is not None}
    r = httpx.post(f"{server.url}/v1/{route}", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    assert re.sub(r"\[\d+\]", "", param).split(".")[-1] in error["message"], error["message"]
    assert error["type"] == ("invalid_request_error" if status in (400, 404, 413) else error["type"])


@pytest.mark.parametrize("raw", [b"{", b"[1, 2]", b"\xff\xfe", b'{"model": "toy-chat", "prompt": NaN, }'])
def test_malformed_bodies_are_400(server, raw):
    r = httpx.post(
        server.url + "/v1/completions",
        content=raw,
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
    )
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"], r.text


def test_disconnect_cancels_within_a_step_and_the_loop_stays_free(server, client):
    server.wait_idle()
    before = server.metrics()
    stream = client.completions.create(model="toy-chat", prompt=PROMPT, stream=True, extra_body={"blockbatch": LONG})
    first = next(iter(stream))  # once its first positions are stable: some 20-30 of its 256 forwards
    assert first.choices[0].text and first.choices[0].finish_reason is None
    t0 = time.monotonic()
    assert httpx.get(server.url + "/health", timeout=5).status_code == 200
    assert time.monotonic() - t0 < 1.0, "the event loop waited on the decode"
    stream.close()
    assert server.wait_idle(timeout=10) < 2.0
    after = server.metrics()
    assert (
        after['blockbatch_requests_total{status="cancelled"}']
        - before.get('blockbatch_requests_total{status="cancelled"}', 0)
        == 1
    )
    forwards = after["blockbatch_request_forwards_total"] - before["blockbatch_request_forwards_total"]
    assert 0 < forwards < 128, forwards  # cancelled well before its 256 forwards

    # a non-streamed request whose client gives up is cancelled too
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            server.url + "/v1/completions",
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=0.5,
            json={"model": "toy-chat", "prompt": PROMPT, "blockbatch": LONG},
        )
    assert server.wait_idle(timeout=10) < 2.0
    final = server.metrics()
    assert (
        final['blockbatch_requests_total{status="cancelled"}']
        == after['blockbatch_requests_total{status="cancelled"}'] + 1
    )
    assert final["blockbatch_request_forwards_total"] - after["blockbatch_request_forwards_total"] < 128


def test_metrics_count_what_was_served(server, client):
    server.wait_idle()
    before = server.metrics()
    a = client.completions.create(model="toy-chat", prompt=PROMPT, max_tokens=20)
    b = client.completions.create(model="toy-chat", prompt=PROMPT, extra_body={"blockbatch": {"policy": "blockbatch"}})
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="toy-chat", prompt=PROMPT, n=17)
    after = server.metrics()

    def delta(name):
        return after.get(name, 0) - before.get(name, 0)

    assert delta('blockbatch_requests_total{status="200"}') == 2
    assert delta('blockbatch_requests_total{status="400"}') == 1
    assert delta("blockbatch_nfe_total") == a.model_extra["nfe"] + b.model_extra["nfe"]
    assert delta("blockbatch_generated_tokens_total") == a.usage.completion_tokens + b.usage.completion_tokens
    assert delta("blockbatch_prompt_tokens_total") == 66
    for histogram in ("time_to_first_token_seconds", "e2e_request_seconds", "step_seconds"):
        assert delta(f"blockbatch_{histogram}_count") == 2
        assert delta(f"blockbatch_{histogram}_sum") > 0
    assert delta("blockbatch_request_forwards_total") == a.model_extra["nfe"] + b.model_extra["nfe"]
    assert after["blockbatch_running"] == after["blockbatch_queued"] == after["blockbatch_kv_rows_in_use"] == 0
    assert after["blockbatch_kv_pool_rows"] > 0
    # the CPU pool is pages (all back when idle); the prefix cache is on but serves block-causal
    # models only, so the toy LLaDA leaves it empty
    assert after["blockbatch_kv_pages"] > 0 and after["blockbatch_kv_pages_in_use"] == 0
    assert after["blockbatch_prefix_cache_blocks"] == after["blockbatch_prefix_cache_pages"] == 0
    assert after["blockbatch_prefix_cache_hit_tokens_total"] == after["blockbatch_prefix_cache_evictions_total"] == 0
    assert delta("blockbatch_packed_forwards_total") > 0
    # CPU: packs are not padded and no graph replays (the CUDA graphs' counters exist, at 0)
    assert after["blockbatch_padded_forwards_total"] == after["blockbatch_graph_replays_total"] == 0


def test_full_queue_gets_429_and_no_request_is_lost(small, engine):
    small.wait_idle()
    before = small.metrics()
    options = {"policy": "vanilla", "gen_length": 64, "block_length": 64, "threshold": None, "steps": 64}
    expected = _expected(engine, options)[0]
    n = 12

    async def run():
        client = AsyncOpenAI(base_url=small.url + "/v1", api_key="unused", max_retries=0, timeout=60)

        async def one(stream: bool):
            if not stream:
                return (
                    (
                        await client.completions.create(
                            model="blockbatch-toy", prompt=PROMPT, extra_body={"blockbatch": options}
                        )
                    )
                    .choices[0]
                    .text
                )
            chunks = [
                c
                async for c in await client.completions.create(
                    model="blockbatch-toy", prompt=PROMPT, stream=True, extra_body={"blockbatch": options}
                )
            ]
            return "".join(c.choices[0].text for c in chunks)

        try:
            return await asyncio.gather(*(one(i % 2 == 0) for i in range(n)), return_exceptions=True)
        finally:
            await client.close()

    results = asyncio.run(run())
    texts = [r for r in results if isinstance(r, str)]
    limited = [r for r in results if isinstance(r, openai.RateLimitError)]
    assert len(texts) + len(limited) == n, [r for r in results if not isinstance(r, (str, openai.RateLimitError))]
    assert len(texts) >= 2 and limited, (len(texts), len(limited))  # one running + one queued, the rest refused
    assert all(t == expected for t in texts)
    assert limited[0].body["code"] == "queue_full" and "max_queue 1" in limited[0].body["message"]
    small.wait_idle()
    after = small.metrics()
    assert after['blockbatch_requests_total{status="429"}'] - before.get(
        'blockbatch_requests_total{status="429"}', 0
    ) == len(limited)
    assert after['blockbatch_requests_total{status="200"}'] - before.get(
        'blockbatch_requests_total{status="200"}', 0
    ) == len(texts)


def test_n_beyond_what_the_server_holds_is_400_and_n_that_fits_is_served(small):
    """max_batch 1 + max_queue 1: n=3 could never be admitted (a 400 naming n, not a 429 to retry);
    n=2 fills it and is served (its choices decode one after the other)."""
    client = OpenAI(base_url=small.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="blockbatch-toy", prompt=PROMPT, n=3, max_tokens=8)
    assert e.value.body["param"] == "n" and "max_batch 1 + max_queue 1" in e.value.body["message"]
    done = client.completions.create(model="blockbatch-toy", prompt=PROMPT, n=2, max_tokens=8)
    assert [c.index for c in done.choices] == [0, 1] and done.choices[0].text == done.choices[1].text


def test_a_request_larger_than_the_kv_pool_is_400_naming_block_sizes(small):
    """The pool holds one request of the family's default branches (6) at --max-length (--max-batch
    1): seven branches of a canvas near max_length can never fit. The answer says so by kind (code
    kv_budget) and names the option to change, read from the refusal's data, not its text."""
    sizes = [1, 2, 4, 7, 8, 14, 16]  # each divides 448
    with pytest.raises(openai.BadRequestError) as e:
        OpenAI(base_url=small.url + "/v1", api_key="unused", max_retries=0).completions.create(
            model="blockbatch-toy",
            prompt=PROMPT,
            max_tokens=448,
            extra_body={"blockbatch": {"policy": "blockbatch", "gen_length": 448, "block_sizes": sizes}},
        )
    assert e.value.body["code"] == "kv_budget" and e.value.body["param"] == "blockbatch.block_sizes", e.value.body
    assert "KV" in e.value.body["message"]


def test_chat_without_a_template_is_400(small):
    with pytest.raises(openai.BadRequestError) as e:
        OpenAI(base_url=small.url + "/v1", api_key="unused", max_retries=0).chat.completions.create(
            model="blockbatch-toy", messages=[{"role": "user", "content": PROMPT}]
        )
    assert e.value.body["code"] == "no_chat_template" and e.value.body["param"] == "messages"


def _serve_example(page: str) -> str:
    """The Python block after the "serve example" marker of `page` (a path from the repository root)."""
    text = (ROOT / page).read_text(encoding="utf-8")
    marker = text.index("<!-- serve example:")
    block = text[text.index("```python\n", marker) + len("```python\n") :]
    return block[: block.index("```")]


def test_readme_example_runs_as_is(small):
    """The HTTP example of README.md and of docs/serving.md (the same block) runs as is."""
    code = _serve_example("README.md")
    assert _serve_example("docs/serving.md") == code, "README.md's and docs/serving.md's serve examples differ"
    assert "http://127.0.0.1:8000/v1" in code
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code.replace("http://127.0.0.1:8000/v1", small.url + "/v1"), "README.md", "exec"), {})
    first, second = out.getvalue().splitlines()
    assert first == "72-2=70-3=67-3=64;64 20 2"  # as the example's comment says
    assert second == "72-2=70-3=67-3=64;64"


def test_sigterm_drains_running_requests_then_exits_0(tmp_path, engine):
    s = Server([], tmp_path / "drain.log")
    try:
        options = dict(LONG, gen_length=128, steps=128)
        result = {}

        def long_request():
            r = httpx.post(
                s.url + "/v1/completions",
                timeout=60,
                json={"model": "blockbatch-toy", "prompt": PROMPT, "blockbatch": options},
            )
            result["status"], result["body"] = r.status_code, r.json()

        worker = threading.Thread(target=long_request)
        worker.start()
        deadline = time.monotonic() + 30
        while s.metrics()["blockbatch_running"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        try:  # while draining: refused with 503 (or, once it has stopped listening, no connection)
            late = httpx.post(s.url + "/v1/completions", json={"model": "blockbatch-toy", "prompt": PROMPT}, timeout=10)
            assert late.status_code == 503 and late.json()["error"]["code"] == "shutting_down", late.text
            assert httpx.get(s.url + "/health", timeout=10).status_code == 503
        except httpx.TransportError:
            pass
        worker.join(timeout=60)
        assert result["status"] == 200, result
        assert result["body"]["choices"][0]["text"] == _expected(engine, options)[0]
        assert s.proc.wait(timeout=30) == 0, s.log()
        assert "draining 1 request" in s.log()
    finally:
        s.stop()


# A preset file for the server's --preset: every option differs from the defaults.
SERVER_PRESET = {"policy": "blockbatch", "block_sizes": [8, 16, 48], "threshold": 0.7, "merge_gate": 0.8}


@pytest.fixture(scope="module")
def preset_server(tmp_path_factory):
    """The shipped toy with ``--preset FILE`` (a preset named "house")."""
    folder = tmp_path_factory.mktemp("preset")
    presets.write(str(folder / "house.json"), "house", SERVER_PRESET, description="the server's default")
    s = Server(["--preset", str(folder / "house.json")], folder / "server.log")
    yield s
    assert s.stop() == 0, s.log()


def test_serve_preset_is_every_requests_default(preset_server, engine):
    """``serve --preset FILE``: requests without options decode with the preset's, gen_length from
    max_tokens rounded to its block sizes; a request's fields win; a request may name the server's
    preset or a built-in one instead."""
    client = OpenAI(base_url=preset_server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    assert "preset house" in preset_server.log()

    def check(request: dict, max_tokens: int | None, expected: dict, gen_length: int, name: str, **sampling):
        done = client.completions.create(
            model="blockbatch-toy",
            prompt=PROMPT,
            max_tokens=max_tokens,
            extra_body={"blockbatch": request} if request else None,
            **sampling,
        )
        text, tokens, reason, nfe, _ = _expected(engine, {**expected, "gen_length": gen_length}, max_tokens, **sampling)
        used = done.model_extra["blockbatch"]
        assert (used["policy"], used["gen_length"], used["preset"]) == (expected["policy"], gen_length, name)
        assert (done.choices[0].text, done.usage.completion_tokens, done.choices[0].finish_reason) == (
            text,
            tokens,
            reason,
        ), request
        assert done.model_extra["nfe"] == nfe, request

    house = {k: tuple(v) if isinstance(v, list) else v for k, v in SERVER_PRESET.items()}
    check({}, 20, house, 48, "house")  # 20 rounded up to lcm(8, 16, 48)
    check({}, None, {**house, "block_sizes": (8, 16)}, 128, "house")  # the default 128: the sizes dividing it
    check(
        {"threshold": 0.9, "block_sizes": [8, 16]}, 20, {**house, "threshold": 0.9, "block_sizes": (8, 16)}, 32, "house"
    )
    check({}, 20, house, 48, "house", temperature=0.5, seed=2)
    check({"preset": "house", "merge_gate": 0.5}, 20, {**house, "merge_gate": 0.5}, 48, "house")
    dual = presets.values("dual-fast-dllm", gen_length=32)
    check({"preset": "dual-fast-dllm"}, 20, dual, 32, "dual-fast-dllm")  # replaces the server's preset
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="blockbatch-toy", prompt=PROMPT, extra_body={"blockbatch": {"preset": "x"}})
    assert e.value.body["param"] == "blockbatch.preset"
    assert (
        "the presets are blockbatch-paper, blockbatch-best, dual-fast-dllm, llada2.0, llada2.1-edit, house"
        in e.value.body["message"]
    )
    with pytest.raises(openai.BadRequestError) as e:  # none of the preset's sizes divides the request's gen_length
        client.completions.create(model="blockbatch-toy", prompt=PROMPT, extra_body={"blockbatch": {"gen_length": 12}})
    assert e.value.body["param"] == "blockbatch.gen_length" and "none of its block sizes" in e.value.body["message"]


def test_create_app_checks_the_preset(engine, tmp_path):
    from blockbatch.serve import create_app

    with pytest.raises(ValueError, match="unknown preset 'nope'"):
        create_app(engine, preset="nope")
    bad = tmp_path / "bad.json"
    presets.write(str(bad), "bad", {"threshold": 1.5})  # the right type, out of range
    with pytest.raises(ValueError, match=rf"preset 'bad' \({bad}\): threshold must be in \(0, 1\], got 1.5"):
        create_app(engine, preset=str(bad))
    app = create_app(engine, preset="dual-fast-dllm")
    assert app.state.blockbatch.settings.preset is presets.BUILT_IN["dual-fast-dllm"]


def test_cli_serve_passes_the_preset_to_replicas(monkeypatch):
    """--replicas: every replica's create_app gets the preset read here (not a path to read again)."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed")
    import blockbatch.serve.replicas
    from blockbatch.cli import main

    seen = {}
    monkeypatch.setattr(blockbatch.serve.replicas, "serve_replicas", lambda replicas, **kw: seen.update(kw))
    assert main(["serve", "--replicas", "2", "--preset", "dual-fast-dllm"]) == 0
    assert seen["app_options"]["preset"] is presets.BUILT_IN["dual-fast-dllm"]


def test_cli_refuses_bad_flags(capsys):
    from blockbatch.cli import main

    for args, message in (
        (["--port", "70000"], "--port: must be in [0, 65535]"),
        (["--preset", "nope"], "error: --preset: unknown preset 'nope': the presets are"),
        (["--max-queue", "-1"], "--max-queue: must be >= 0"),
        (["--max-length", "100000"], "--max-length 100000: must be in [2, 512]"),
        # a KV pool no machine holds: one error line before anything starts (was a traceback)
        (["--max-batch", "1000000"], "error: --max-batch 1000000 / --max-length 512"),
        (["--kv-budget-bytes", "10"], "holds no KV row"),
        (["--kv-page-len", "-3"], "--kv-page-len -3: kv_page_len must be an integer in [-1, 512], got -3"),
        (["--kv-page-len", "600"], "--kv-page-len 600: kv_page_len must be an integer in [-1, 512]"),
        (["--max-body-bytes", "10"], "--max-body-bytes 10: must be at least 1024"),
        (["--allowed-hosts", "http://x/"], "--allowed-hosts: 'http://x/' is not a host name"),
        (["--api-key", "ключ"], "which an HTTP header cannot carry"),
    ):
        try:
            status = main(["serve", *args])
        except SystemExit as e:  # argparse
            status = e.code
        err = capsys.readouterr().err
        assert status == 2 and message in err, (args, err)
        assert len(err.strip().splitlines()) == 1, err
