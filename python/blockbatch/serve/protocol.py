"""The OpenAI wire format of ``/v1/completions`` and ``/v1/chat/completions``: a request body read
and checked field by field (errors are 400s naming the field as the client sent it), the decode
options it makes and the prompt's token ids (the response bodies: ``responses``).

The requests are read field by field rather than through a pydantic request model on purpose:
every refusal is an OpenAI-shaped 400 naming the field as the client sent it (``max_tokens``,
``messages[2].content``, ``blockbatch.block_sizes``), with the nearest known name for a typo, and
a decode option's range error is the C++ validator's own message; a model's validation error says
neither."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any

import torch

from .. import contract, policies, presets
from .guard import APIError
from ..options import MAX_N, DecodeOptions, seed_for_choice

GEN_LENGTH_UNIT = 32  # max_tokens rounds up to a multiple of this for blockbatch without block_sizes


# OpenAI parameters this server does not implement: refused (400 naming the field) unless they
# hold the value that means "off" (null, or the listed value).
_UNSUPPORTED = {
    "echo": (None, False),
    "suffix": (None, ""),
    "best_of": (None, 1),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "logit_bias": (None,),
    "functions": (None,),
    "function_call": (None, "none"),
    "response_format": (None,),
    "prediction": (None,),
    "audio": (None,),
    "modalities": (None,),
}


# ------------------------------------------------------------------------------------ parameters


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def type_name(v: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(v), "a number"
    )


def bad(param: str, message: str) -> APIError:
    return APIError(400, f"{param}: {message}", param=param)


@dataclasses.dataclass
class Params:
    """A generation request's parameters, checked."""

    max_tokens: int | None
    stop: list[str]
    stream: bool
    options: DecodeOptions
    sources: dict[str, str]  # decode option -> the request field it came from (for error messages)
    limit_name: str  # max_tokens or max_completion_tokens
    preset: str | None = None  # the name of the preset under the request's options (its own or the server's)
    n: int = 1  # choices: n decodes, choice i with seed + i (choice_options)
    tools: list[dict] | None = None  # chat: the tools the template renders (None: none, or tool_choice "none")
    logprobs: int | None = None  # top alternatives per token when the response carries logprobs (None: off)

    def choice_options(self) -> list[DecodeOptions]:
        """The decode options of each of the n choices: choice i decodes with seed + i (so with
        temperature 0 they are equal); a 400 naming the seed's field when seed + n - 1 is too large."""
        try:
            return [seed_for_choice(self.options, i, self.n) for i in range(self.n)]
        except ValueError as e:
            param = self.sources.get("seed", "seed")
            raise APIError(400, f"{param}{str(e).removeprefix('seed')}", param=param) from None


def option_param(error: BaseException, sources: dict[str, str]) -> str | None:
    """The request field a refusal (``RequestError``, ``contract.OptionTypeError``) names: its
    option as the client sent it (``temperature``, ``max_tokens`` or ``blockbatch.<name>``), or
    None when it names no option (the prompt, say). Read from the error's ``param``, never its text."""
    name = getattr(error, "param", None)
    if name not in contract.BY_NAME:
        return None
    return sources.get(name, f"blockbatch.{name}")


# The request fields each route knows. Any other top-level field is refused (400 naming it, with
# the nearest known name): a typo such as "max_token" must not silently decode the whole canvas.
# The OpenAI fields below that change nothing here are accepted and ignored.
_COMMON_FIELDS = {
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "n",
    "stream",
    "stream_options",
    "stop",
    "seed",
    "user",
    "logprobs",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "blockbatch",
    "metadata",
    "store",
    "service_tier",
}
_FIELDS = {
    False: _COMMON_FIELDS | {"prompt", "echo", "suffix", "best_of"},
    True: _COMMON_FIELDS
    | {
        "messages",
        "max_completion_tokens",
        "top_logprobs",
        "tools",
        "tool_choice",
        "functions",
        "function_call",
        "response_format",
        "prediction",
        "audio",
        "modalities",
        "parallel_tool_calls",
    },
}
MAX_TOKENS_LIMIT = 1 << 31  # max_tokens above this is refused before any arithmetic on it
MAX_JSON_DEPTH = 32  # nesting levels of a request body (the deepest valid request has 5)


def _check_fields(body: dict, chat: bool) -> None:
    import difflib

    known = _FIELDS[chat]
    for name in body:
        if name not in known:
            near = difflib.get_close_matches(str(name), sorted(known), n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            shown = name if len(name) <= 60 else name[:60] + "..."
            raise bad(
                shown,
                f"unknown field {shown!r} for {'/v1/chat/completions' if chat else '/v1/completions'}"
                f'{hint} (decode options go in the "blockbatch" object)',
            )


def _json_depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value (iterative: a deep value cannot overflow the stack)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            if d > MAX_JSON_DEPTH:
                return d
            todo.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def parse_json_body(raw: bytes) -> dict:
    """A request body as a JSON object, or a 400 whose message says what is wrong without echoing
    internals: not UTF-8, not JSON, too deep, an integer too long, not an object."""
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as e:
        raise APIError(400, f"the request body is not valid JSON: {e}") from None
    except UnicodeDecodeError as e:
        raise APIError(400, f"the request body is not valid JSON: not UTF-8 text (byte {e.start})") from None
    except RecursionError:
        raise APIError(
            400, f"the request body is not valid JSON for this server: nested deeper than {MAX_JSON_DEPTH} levels"
        ) from None
    except ValueError as e:  # an integer of more digits than Python converts (sys.int_info)
        raise APIError(
            400,
            f"the request body is not valid JSON for this server: a number is too long "
            f"({str(e).split('(')[0].strip()})",
        ) from None
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type_name(body)}")
    if _json_depth(body) > MAX_JSON_DEPTH:
        raise APIError(400, f"the request body is nested deeper than {MAX_JSON_DEPTH} levels")
    return body


def _check_unsupported(body: dict) -> None:
    for name, off in _UNSUPPORTED.items():
        value = body.get(name)
        if (
            any(value == v and type(value) is type(v) for v in off)
            or value in ({}, [])
            or (name == "response_format" and value == {"type": "text"})
        ):
            continue
        raise bad(name, f"not supported by this server (got {json.dumps(value)[:60]})")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise bad("user", f"must be a string, got {type_name(user)}")


def parse_params(body: dict, chat: bool, preset: presets.Preset | None = None, defaults: dict | None = None) -> Params:
    """The sampling parameters of either route and the DecodeOptions they make: the preset's options
    (``blockbatch.preset``, a built-in preset's name, else the server's ``preset``), the
    ``blockbatch`` field's other options on top, then ``temperature`` / ``seed`` / ``top_p``, and
    gen_length from max_tokens unless given (``_gen_length``, from the preset's block sizes too).
    Errors are 400s naming the field as the client sent it."""
    _check_fields(body, chat)
    _check_unsupported(body)
    n = body.get("n")
    n = 1 if n is None else n
    if not (is_int(n) and 1 <= n <= MAX_N):
        raise bad("n", f"must be an integer in [1, {MAX_N}] (choices per request), got {json.dumps(n)[:60]}")
    stream = body.get("stream")
    stream = False if stream is None else stream
    if not isinstance(stream, bool):
        raise bad("stream", f"must be a boolean, got {type_name(stream)}")
    so = body.get("stream_options")
    if so is not None and not (isinstance(so, dict) and set(so) <= {"include_usage", "continuous_usage_stats"}):
        raise bad("stream_options", "must be an object with include_usage (usage is always in the last chunk)")

    limit_name, max_tokens = "max_tokens", body.get("max_tokens")
    if chat and body.get("max_completion_tokens") is not None:
        if max_tokens is not None:
            raise bad("max_completion_tokens", "give max_completion_tokens or max_tokens, not both")
        limit_name, max_tokens = "max_completion_tokens", body["max_completion_tokens"]
    if max_tokens is not None and not (is_int(max_tokens) and max_tokens >= 1):
        raise bad(limit_name, f"must be an integer >= 1, got {json.dumps(max_tokens)[:60]}")
    if max_tokens is not None and max_tokens > MAX_TOKENS_LIMIT:  # no canvas is that long; keep the numbers small
        shown = str(max_tokens) if max_tokens < 10**30 else f"{str(max_tokens)[:12]}... ({len(str(max_tokens))} digits)"
        raise APIError(
            413,
            f"{limit_name} {shown} is more than the longest generation this server decodes "
            f"({MAX_TOKENS_LIMIT} tokens at most, and its max length less the prompt)",
            param=limit_name,
            code="context_length_exceeded",
        )

    stop = body.get("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not (isinstance(stop, list) and all(isinstance(s, str) and s for s in stop)):
        raise bad("stop", "must be a non-empty string or an array of non-empty strings")
    if len(stop) > 16:
        raise bad("stop", f"at most 16 stop strings, got {len(stop)}")

    extra = body.get("blockbatch")
    extra = {} if extra is None else extra
    if not isinstance(extra, dict):
        raise bad(
            "blockbatch", f'must be an object of decode options (e.g. {{"policy": "dual"}}), got {type_name(extra)}'
        )
    extra = dict(extra)
    asked = extra.pop("preset", None)
    if asked is not None:
        preset = _request_preset(asked, preset)
    for name in extra:
        if name not in contract.BY_NAME:
            raise bad(
                f"blockbatch.{name}", f"unknown decode option; the options are preset, {', '.join(contract.NAMES)}"
            )
    values = dict(extra)
    sources = {name: f"blockbatch.{name}" for name in values}
    logprobs = _logprobs(body, chat)
    if logprobs is not None:
        if "logprobs" in extra:
            raise bad("logprobs", "given both as an OpenAI field and as blockbatch.logprobs: give one")
        values["logprobs"] = logprobs
        sources["logprobs"] = "top_logprobs" if chat and body.get("top_logprobs") is not None else "logprobs"
    for name in ("temperature", "seed", "top_p"):
        value = body.get(name)
        if value is None:
            continue
        if name in extra:
            raise bad(name, f"given both as {name} and as blockbatch.{name}: give one")
        if name == "top_p" and value == 1 and is_number(value):
            continue  # OpenAI's "off"
        values[name] = value
        sources[name] = name
    if "gen_length" not in values:
        under = {k: tuple(v) if isinstance(v, list) else v for k, v in preset.options.items()} if preset else {}
        values["gen_length"] = _gen_length({**under, **values}, max_tokens)
        if max_tokens is not None:
            sources["gen_length"] = limit_name
    if preset is not None:
        try:
            values = presets.values(preset, values)  # its block sizes fitted to gen_length
        except ValueError as e:  # none of them divides the request's gen_length
            param = "blockbatch.preset" if asked is not None else sources.get("gen_length", "blockbatch.gen_length")
            raise APIError(400, str(e), param=param) from None
    try:  # the model family's defaults (LLaDA2: policy 'block') under the request's and the preset's
        options = DecodeOptions(**{**(defaults or {}), **values})
    except (TypeError, ValueError) as e:
        raise APIError(400, str(e), param=option_param(e, sources), code=getattr(e, "kind", None)) from None
    tools = _parse_tools(body) if chat else None
    return Params(
        max_tokens, stop, stream, options, sources, limit_name, preset.name if preset else None, n, tools, logprobs
    )


_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
GRAMMAR_NEEDED = "needs grammar-constrained decoding (the output held to a call of the tools), not yet supported"


def _parse_tools(body: dict) -> list[dict] | None:
    """The request's ``tools`` checked (each ``{"type": "function", "function": {"name", "description"?,
    "parameters"?}}``, names unique), or None when it has none or ``tool_choice`` is "none" (the
    template then renders none, so the model cannot call one). ``tool_choice`` "auto" (the default
    with tools) lets the model choose; "required" and a named function are 400s: holding the output
    to a call needs grammar-constrained decoding."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is not None and not isinstance(tools, list):
        raise bad("tools", f"must be an array of function tools, got {type_name(tools)}")
    tools = tools or None
    if choice is not None and choice not in ("none", "auto"):
        if choice == "required" or isinstance(choice, dict):
            shown = "required" if choice == "required" else "a named function"
            raise bad("tool_choice", f'{shown} {GRAMMAR_NEEDED}; use "auto" or "none"')
        raise bad("tool_choice", f'must be "none", "auto", "required" or a function, got {json.dumps(choice)[:60]}')
    if choice == "auto" and tools is None:
        raise bad("tool_choice", '"auto" needs tools: give tools, or leave tool_choice out')
    if tools is None:
        return None
    seen = set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise bad(where, 'must be {"type": "function", "function": {"name": ..., "parameters": {...}}}')
        unknown = set(tool) - {"type", "function"}
        if unknown:
            raise bad(f"{where}.{sorted(unknown)[0]}", "unknown field of a function tool")
        function = tool["function"]
        name = function.get("name")
        if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
            raise bad(f"{where}.function.name", "must be 1 to 64 letters, digits, underscores or dashes")
        if name in seen:
            raise bad(f"{where}.function.name", f"{name!r} names two tools: tool names must be unique")
        seen.add(name)
        for key, value in function.items():
            ok = {
                "name": True,
                "description": isinstance(value, str),
                "parameters": isinstance(value, dict),
                "strict": isinstance(value, bool) or value is None,
            }.get(key)
            if ok is None:
                raise bad(f"{where}.function.{key}", "unknown field (a function has name, description, parameters)")
            if not ok:
                raise bad(f"{where}.function.{key}", f"has the wrong type ({type_name(value)})")
        if function.get("strict"):
            raise bad(f"{where}.function.strict", f"true {GRAMMAR_NEEDED}")
    return None if choice == "none" else tools


MAX_LOGPROBS = 20  # top alternatives per token at most (contract: the logprobs option's range)


def _logprobs(body: dict, chat: bool) -> int | None:
    """The top alternatives a request asks for with its tokens' log-probabilities, or None: completions'
    ``logprobs`` (an integer in [0, 20]); chat's ``logprobs: true`` with ``top_logprobs`` (an integer in
    [0, 20], default 0), ``top_logprobs`` needing ``logprobs: true`` as OpenAI does."""
    value = body.get("logprobs")
    if not chat:
        if value is None:
            return None
        if not (is_int(value) and 0 <= value <= MAX_LOGPROBS):
            raise bad("logprobs", f"must be an integer in [0, {MAX_LOGPROBS}] or null, got {json.dumps(value)[:60]}")
        return value
    if value is not None and not isinstance(value, bool):
        raise bad("logprobs", f"must be a boolean, got {type_name(value)}")
    top = body.get("top_logprobs")
    if top is not None:
        if not (is_int(top) and 0 <= top <= MAX_LOGPROBS):
            raise bad("top_logprobs", f"must be an integer in [0, {MAX_LOGPROBS}], got {json.dumps(top)[:60]}")
        if value is not True:
            raise bad("top_logprobs", "needs logprobs: true")
    return (top or 0) if value else None


def _request_preset(name: Any, default: presets.Preset | None) -> presets.Preset:
    """The preset a request names in ``blockbatch.preset``: a built-in one, or the server's own
    (``--preset``) by its name; a request never makes the server read a file."""
    if default is not None and name == default.name:
        return default
    if isinstance(name, str) and name in presets.BUILT_IN:
        return presets.BUILT_IN[name]
    known = presets.names() + ([default.name] if default is not None and default.name not in presets.BUILT_IN else [])
    shown = json.dumps(name)[:60] if not isinstance(name, str) else repr(name[:60])
    raise bad("blockbatch.preset", f"unknown preset {shown}: the presets are {', '.join(known)}")


def check_preset(preset: str | presets.Preset) -> presets.Preset:
    """A server's default preset (a name, a preset file's path or a Preset), checked the way a
    request would use it; ValueError naming the preset."""
    p = preset if isinstance(preset, presets.Preset) else presets.get(preset)
    try:
        DecodeOptions(**presets.values(p, {"gen_length": _gen_length(dict(p.options), 128)}))
    except (TypeError, ValueError) as e:
        raise ValueError(f"preset {p.name!r} ({p.source}): {e}") from None
    return p


def _gen_length(values: dict, max_tokens: int | None) -> int:
    """gen_length for max_tokens: rounded up to the smallest length the policy decodes (a multiple
    of block_length; of every block size, or of 32 when blockbatch picks its default sizes);
    without max_tokens the DecodeOptions default."""
    if max_tokens is None:
        return contract.DEFAULTS["gen_length"]
    policy = policies.get(values.get("policy", contract.DEFAULTS["policy"]))
    sizes = policy.unit_sizes(values)
    if isinstance(sizes, (list, tuple)) and sizes and all(is_int(b) and b > 0 for b in sizes):
        unit = math.lcm(*sizes)
    else:  # its sizes are the family's (a multiple of 32) or not integers (refused later, naming them)
        unit = GEN_LENGTH_UNIT if policy.MULTI_BRANCH else 1
    return -(-max_tokens // unit) * unit


def precheck_length(engine, body: dict, chat: bool, max_length: int) -> None:
    """413 before any tokenizing for a prompt that cannot fit ``max_length`` positions: more ids,
    or more characters than ``max_length`` tokens of the longest vocabulary entry can hold."""
    limit = max_length * engine.codec.max_token_chars
    if chat:
        messages = body.get("messages")
        chars = (
            sum(_text_chars(m.get("content")) for m in messages if isinstance(m, dict))
            if isinstance(messages, list)
            else 0
        )
        what, param = f"the messages hold {chars} characters", "messages"
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, list) and len(prompt) > max_length:
            raise APIError(
                413,
                f"the prompt has {len(prompt)} token ids, more than this server's max length "
                f"{max_length}: shorten the prompt",
                param="prompt",
                code="context_length_exceeded",
            )
        chars = len(prompt) if isinstance(prompt, str) else 0
        what, param = f"the prompt has {chars} characters", "prompt"
    if chars > limit:
        raise APIError(
            413,
            f"{what}: more than {max_length} tokens of this tokenizer (at most "
            f"{engine.codec.max_token_chars} characters each) can hold, so it cannot fit this "
            f"server's max length {max_length}: shorten it",
            param=param,
            code="context_length_exceeded",
        )


def _text_chars(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(p.get("text", "")) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return 0


def prompt_ids(engine, body: dict) -> torch.Tensor:
    prompt = body.get("prompt")
    if prompt is None:
        raise bad("prompt", "required: a string or an array of token ids")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise bad("prompt", f"one prompt per request, got {len(prompt)} (send them as separate requests)")
    if not isinstance(prompt, (str, list)):
        raise bad("prompt", f"must be a string or an array of token ids, got {type_name(prompt)}")
    if isinstance(prompt, list):
        vocab = engine.config.vocab_size
        for i, t in enumerate(prompt):
            if not is_int(t) or not 0 <= t < vocab:
                raise bad("prompt", f"entry {i} ({json.dumps(t)[:30]}) is not a token id in [0, {vocab})")
    try:
        return engine.encode(prompt, chat=False, name="prompt")
    except (TypeError, ValueError) as e:
        raise APIError(400, str(e), param="prompt") from None


def _check_calls(calls: Any, where: str) -> None:
    """An assistant message's ``tool_calls`` (OpenAI's shape: ``[{"id", "type": "function", "function":
    {"name", "arguments"}}]``, arguments the JSON text of an object), given to the chat template as they are."""
    if not isinstance(calls, list):
        raise bad(where, f"must be an array of tool calls, got {type_name(calls)}")
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise bad(f"{where}[{j}]", 'must be {"id", "type": "function", "function": {"name", "arguments"}}')
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            raise bad(f"{where}[{j}].function.arguments", f"must be a string (JSON text), got {type_name(arguments)}")
        try:
            value = json.loads(arguments)
        except (json.JSONDecodeError, RecursionError):
            value = None
        if not isinstance(value, dict):
            raise bad(f"{where}[{j}].function.arguments", "must be the JSON text of an object (the call's arguments)")


def chat_ids(engine, body: dict, tools: list[dict] | None = None) -> torch.Tensor:
    """The conversation's ids through the chat template, ``tools`` (``Params.tools``) rendered by it:
    a 400 naming ``tools`` when the template renders none or writes calls in a markup this server
    does not read (``blockbatch.tools``)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages", 'required: a non-empty array of {"role", "content"} objects')
    plain = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise bad(f"messages[{i}]", f"must be an object with role and content, got {type_name(m)}")
        role, content = m.get("role"), m.get("content")
        if not isinstance(role, str) or not role:
            raise bad(f"messages[{i}].role", "must be a non-empty string (system, user, assistant, ...)")
        calls = m.get("tool_calls") if role == "assistant" else None
        if calls is not None:
            _check_calls(calls, f"messages[{i}].tool_calls")
            if content is None:
                content = ""  # an assistant turn of calls only
        if isinstance(content, list):  # content parts: text only
            texts = []
            for j, part in enumerate(content):
                if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                    raise bad(f"messages[{i}].content[{j}]", 'only {"type": "text", "text": ...} parts are supported')
                texts.append(part["text"])
            content = "".join(texts)
        if not isinstance(content, str):
            raise bad(f"messages[{i}].content", f"must be a string or an array of text parts, got {type_name(content)}")
        message = {"role": role, "content": content}
        if calls:
            message["tool_calls"] = calls
        if role == "tool" and isinstance(m.get("tool_call_id"), str):
            message["tool_call_id"] = m["tool_call_id"]
        plain.append(message)
    codec = engine.codec
    if codec.chat_template is None:
        raise APIError(
            400,
            "this model has no chat template (tokenizer_config.json key chat_template): use "
            "/v1/completions with a plain prompt",
            param="messages",
            code="no_chat_template",
        )
    if tools:
        from ..tools import template_markup

        if not codec.renders_tools:
            raise APIError(
                400,
                "tools: this model's chat template does not render tools (it never writes the tools it is given into "
                "the prompt), so the model cannot be told of them: send the request without tools",
                param="tools",
                code="tools_not_supported",
            )
        if template_markup(codec.chat_template) is None:
            raise APIError(
                400,
                "tools: this model's chat template renders tools but does not teach the <tool_call>{json}</tool_call> "
                "markup, the only one this server reads calls in: send the request without tools",
                param="tools",
                code="tools_not_supported",
            )
    try:
        ids = codec.encode_chat(plain, tools=tools)
    except (TypeError, ValueError) as e:
        raise APIError(400, str(e), param="messages") from None
    if not ids:
        raise bad("messages", "the chat template rendered the conversation as no tokens")
    return torch.tensor(ids, dtype=torch.long)
