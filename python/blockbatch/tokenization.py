"""Text <-> ids with the checkpoint's own tokenizer (``tokenizers``) and chat template."""

from __future__ import annotations

from typing import Sequence

from .config import ModelConfig
from .errors import UnknownCharactersError

# End-of-turn markers of common chat formats; any present in the vocabulary also ends a reply.
END_OF_TURN_TOKENS = ("<|eot_id|>", "<|im_end|>", "<|end_of_turn|>")
_MAX_REPORTED = 8  # unknown characters listed in one error message


def chat_environment():
    """The Jinja environment chat templates run in: sandboxed (a template comes from a file in a
    downloaded folder and must not reach Python internals) and immutable, as Hugging Face's."""
    import datetime
    import json

    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise ValueError(f"the chat template refused the conversation: {message}")

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # Hugging Face's tojson: plain json.dumps (jinja2's own escapes <, >, & and ' for HTML)
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    # {% break %} / {% continue %} and the helpers published templates (Qwen2.5 / Dream, Llama) use
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env


def check_text(text: str, what: str) -> None:
    """ValueError naming ``what`` and the position when ``text`` is not valid Unicode text (a lone
    surrogate such as JSON's ``"\\ud800"``, which no tokenizer can encode)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"{what} holds a lone surrogate ({text[e.start]!r}) at character {e.start}: not valid Unicode text"
        ) from None


def unknown_token_id(tokenizer) -> int | None:
    """The id the tokenizer's model emits for text outside its vocabulary (None when it has none,
    as byte-level BPE)."""
    unk = getattr(tokenizer.model, "unk_token", None)
    return tokenizer.token_to_id(unk) if isinstance(unk, str) else None


class TextCodec:
    """Encodes prompts (optionally through the chat template) and decodes generations."""

    def __init__(self, tokenizer, config: ModelConfig, chat_template: str | None = None):
        self.tokenizer = tokenizer
        self.config = config
        self.chat_template = chat_template
        self.unk_id = unknown_token_id(tokenizer)
        self.stop_ids = {config.eos_token_id}
        for token in END_OF_TURN_TOKENS:
            token_id = tokenizer.token_to_id(token)
            if token_id is not None:
                self.stop_ids.add(token_id)
        # The texts of the special tokens (EOS, mask, turn markers, ...): typed in a prompt they are
        # plain text, never the token (see encode).
        self.special_texts = tuple(
            sorted(
                {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special and t.content},
                key=len,
                reverse=True,
            )
        )
        self._renders_tools: bool | None = None  # renders_tools, probed on first use
        self._plain: object | None = None  # the tokenizer with special-token matching off, made on first use
        # Every token covers at least one character of the text it encodes, so a text of more than
        # max_length * max_token_chars characters cannot fit max_length tokens (a cheap precheck).
        self.max_token_chars = max((len(t) for t in tokenizer.get_vocab()), default=1) or 1

    def encode(
        self,
        text: str,
        chat: bool | None = None,
        add_special_tokens: bool = True,
        allow_unknown: bool = False,
        special_tokens: bool = False,
    ) -> list[int]:
        """Token ids of ``text``; wrapped in the chat template when ``chat`` (default: if one exists).

        ``add_special_tokens=False`` encodes text that is already rendered (e.g. by lm-eval's
        --apply_chat_template) without the tokenizer's BOS / post-processor tokens.

        The text is plain text: a special token's text typed in it (``<|endoftext|>``, a turn
        marker) is encoded as the characters it is made of, never as that token, so a prompt cannot
        end the generation or forge a chat turn. ``special_tokens=True`` matches them (for text a
        trusted template rendered, as lm-eval's --apply_chat_template does).

        Raises ``ValueError`` naming the characters and their positions when the text holds
        characters outside the vocabulary (the tokenizer would turn them into its unknown token
        and the model would decode nonsense); ``allow_unknown=True`` keeps the unknown tokens.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        check_text(text, "the text")
        use_chat = self.chat_template is not None if chat is None else chat
        if use_chat:
            return self.encode_chat([{"role": "user", "content": text}], allow_unknown, names=["text"])
        tokenizer = self.tokenizer if special_tokens or not self._holds_special(text) else self.plain_tokenizer
        encoding = tokenizer.encode(text, add_special_tokens=add_special_tokens)
        if not allow_unknown and self.unk_id is not None and self.unk_id in encoding.ids:
            self._report_unknown(text, encoding, "text")
        return encoding.ids

    def _holds_special(self, text: str) -> bool:
        return any(s in text for s in self.special_texts)

    @property
    def plain_tokenizer(self):
        """A copy of the tokenizer that encodes special tokens' texts as plain text."""
        if self._plain is None:
            from tokenizers import Tokenizer

            plain = Tokenizer.from_str(self.tokenizer.to_str())
            plain.encode_special_tokens = True
            self._plain = plain
        return self._plain

    def encode_chat(
        self,
        messages: Sequence[dict],
        allow_unknown: bool = False,
        names: Sequence[str] | None = None,
        tools: Sequence[dict] | None = None,
    ) -> list[int]:
        """Token ids of a conversation (``[{"role": ..., "content": "..."}, ...]``) rendered by the
        chat template with the generation prompt (the assistant's turn) appended; ``tools`` (OpenAI's
        ``[{"type": "function", "function": {...}}]``) are given to the template as ``tools``, as
        Hugging Face's apply_chat_template does (a template that does not read them leaves them out:
        ``renders_tools``).

        Characters outside the vocabulary raise ``ValueError`` naming the message they are in
        (``names[i]``, default ``messages[i].content``) and their positions, as ``encode`` does.

        The contents are plain text (see ``encode``): the template's own special tokens are
        tokens, a special token's text inside a message is its characters. When no content holds
        such a text the rendered conversation is tokenized whole; otherwise the template is
        rendered with a placeholder per content, and the template's pieces and the contents are
        tokenized separately (``_encode_pieces``).
        """
        what = [names[i] if names is not None else f"messages[{i}].content" for i in range(len(messages))]
        for i, message in enumerate(messages):
            if isinstance(message.get("content"), str):
                check_text(message["content"], what[i])
        if any(isinstance(m.get("content"), str) and self._holds_special(m["content"]) for m in messages):
            ids = self._encode_pieces(messages, what, tools)
        else:
            ids = self.tokenizer.encode(
                self.render_chat(messages, add_generation_prompt=True, tools=tools), add_special_tokens=False
            ).ids
        if not allow_unknown and self.unk_id is not None and self.unk_id in ids:
            for i, message in enumerate(messages):  # name positions in the caller's text first
                content = message.get("content")
                if isinstance(content, str):
                    self._check_known(content, add_special_tokens=False, what=what[i])
            self._check_known(
                self.render_chat(messages, add_generation_prompt=True, tools=tools),
                add_special_tokens=False,
                what="the chat template's output",
            )
        return ids

    def _encode_pieces(
        self, messages: Sequence[dict], what: Sequence[str], tools: Sequence[dict] | None = None
    ) -> list[int]:
        """The conversation's ids with every content encoded as plain text: the template rendered
        with a unique placeholder for each content, split at the placeholders, its pieces encoded
        with special tokens and the contents without. A template that does not keep a
        placeholder as it is (it rewrites the content) refuses the conversation (ValueError)."""
        import re
        import uuid

        tag = uuid.uuid4().hex
        marks = {}
        placed = []
        for i, m in enumerate(messages):
            if isinstance(m.get("content"), str):
                mark = f"\ue000{tag}{i}\ue001"
                marks[mark] = i
                placed.append({**m, "content": mark})
            else:
                placed.append(m)
        rendered = self.render_chat(placed, add_generation_prompt=True, tools=tools)
        pieces = re.split("(" + "|".join(re.escape(k) for k in marks) + ")", rendered)
        seen = [marks[p] for p in pieces if p in marks]
        if sorted(seen) != sorted(marks.values()):
            missing = next(i for i in marks.values() if seen.count(i) != 1)
            raise ValueError(
                f"{what[missing]} holds a special token's text ({self._first_special(messages)!r}), "
                "which this chat template cannot keep as plain text (it rewrites message contents): "
                "remove it from the message"
            )
        ids: list[int] = []
        for piece in pieces:
            if piece in marks:
                ids += self.plain_tokenizer.encode(messages[marks[piece]]["content"], add_special_tokens=False).ids
            elif piece:
                ids += self.tokenizer.encode(piece, add_special_tokens=False).ids
        return ids

    def _first_special(self, messages: Sequence[dict]) -> str:
        return next(
            s for m in messages if isinstance(m.get("content"), str) for s in self.special_texts if s in m["content"]
        )

    def _check_known(self, text: str, add_special_tokens: bool, what: str = "text") -> None:
        tokenizer = (
            self.plain_tokenizer
            if self._holds_special(text) and what != "the chat template's output"
            else self.tokenizer
        )
        encoding = tokenizer.encode(text, add_special_tokens=add_special_tokens)
        if self.unk_id is not None and self.unk_id in encoding.ids:
            self._report_unknown(text, encoding, what)

    def _report_unknown(self, text: str, encoding, what: str) -> None:
        spans = [encoding.offsets[i] for i, t in enumerate(encoding.ids) if t == self.unk_id]
        # The unknown token itself written in the text is not an unknown character.
        unk_text = self.tokenizer.id_to_token(self.unk_id)
        spans = [(a, b) for a, b in spans if text[a:b] != unk_text]
        if not spans:
            return
        shown = ", ".join(f"{text[a:b]!r} at position {a}" for a, b in spans[:_MAX_REPORTED])
        more = f" and {len(spans) - _MAX_REPORTED} more" if len(spans) > _MAX_REPORTED else ""
        raise UnknownCharactersError(
            f"{what} holds characters outside the tokenizer's vocabulary: {shown}{more} (the tokenizer would turn "
            f"them into {unk_text or 'its unknown token'}, which the model cannot decode from)"
        )

    @property
    def renders_tools(self) -> bool:
        """Whether the chat template puts the ``tools`` it is given into the prompt (LLaDA2's and
        Dream's do, LLaDA's has no tools): probed once by rendering a made-up tool."""
        if self._renders_tools is None:
            from .tools import template_renders_tools

            self._renders_tools = self.chat_template is not None and template_renders_tools(
                lambda messages, tools: self.render_chat(messages, tools=tools)
            )
        return self._renders_tools

    def render_chat(
        self, messages: Sequence[dict], add_generation_prompt: bool = True, tools: Sequence[dict] | None = None
    ) -> str:
        """The chat template applied to ``messages`` (``[{"role": ..., "content": ...}, ...]``), as
        text; ``tools``, when given, are the template's ``tools`` variable."""
        if self.chat_template is None:
            raise ValueError("chat=True but the checkpoint has no chat template (tokenizer_config.json)")
        try:
            import jinja2
        except ImportError:
            raise ImportError(
                "the checkpoint has a chat template: rendering it needs jinja2 "
                "(pip install jinja2), or pass chat=False / --no-chat"
            ) from None
        try:
            template = chat_environment().from_string(self.chat_template)
            extra = {} if tools is None else {"tools": list(tools)}
            return template.render(
                **extra,
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                bos_token=self._token_text("bos"),
                eos_token=self._token_text("eos"),
            )
        except jinja2.TemplateSyntaxError as e:
            raise ValueError(
                f"chat template (tokenizer_config.json key 'chat_template'): Jinja syntax error at "
                f"line {e.lineno}: {e.message}"
            ) from None
        except (jinja2.TemplateError, RecursionError) as e:
            raise ValueError(
                f"chat template (tokenizer_config.json key 'chat_template') failed to render: {type(e).__name__}: {e}"
            ) from None

    def _token_text(self, kind: str) -> str:
        if kind == "eos":
            return self.tokenizer.id_to_token(self.config.eos_token_id) or ""
        for candidate in ("<|startoftext|>", "<s>", "<|begin_of_text|>", "<bos>"):
            if self.tokenizer.token_to_id(candidate) is not None:
                return candidate
        return ""

    def trim(self, ids: Sequence[int]) -> list[int]:
        """Generated ids up to (not including) the first EOS / end-of-turn token."""
        out = []
        for i in ids:
            if i in self.stop_ids:
                break
            out.append(int(i))
        return out

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)
