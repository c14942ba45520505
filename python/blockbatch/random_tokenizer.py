"""A byte-level BPE tokenizer for random checkpoints (``blockbatch make-random --tokenizer bpe``), with
a chat template in the markup of LLaDA2's (Ling 2.0's): ``<role>HUMAN</role>...<|role_end|>`` turns,
the tools listed in the system turn and tool calls written as ``<tool_call>{"name": ..., "arguments":
{...}}</tool_call>``.

The toys' tokenizers are word- or character-level: they cannot spell JSON, so structured output and
tool calls cannot be tried on them. This one can spell any text: its base alphabet is the 256 bytes
(a ByteLevel pre-tokenizer and decoder, as GPT-2's and Qwen's), its merges are trained by the
``tokenizers`` library on a text generated here (JSON objects, English-like words, numbers), so a
few hundred to a few thousand ids make a realistic segmentation: common keys and words are one
token, anything else falls back to shorter pieces and, at worst, bytes.

Its last ids are the special tokens, the last two EOS then the mask, which is where a random config
puts them (``config.with_default_ids``): a tokenizer of ``vocab_size`` ids fits a random config of
the same ``vocab_size`` unchanged."""

from __future__ import annotations

import json
import random

EOS_TOKEN = "<|endoftext|>"
MASK_TOKEN = "<|mask|>"
ROLE_END = "<|role_end|>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
# Turn markers and EOS / mask: special (never typed by a prompt, dropped from decoded text).
SPECIAL_TOKENS = ("<role>", "</role>", ROLE_END, EOS_TOKEN, MASK_TOKEN)
# The tool-call markup: one token each, but not special, so a decoded reply keeps them and the
# server can find the calls in it (as Qwen's and Ling's <tool_call> tokens are added, not special).
MARKUP_TOKENS = (TOOL_CALL_OPEN, TOOL_CALL_CLOSE, "<tool_response>", "</tool_response>")
# Ids past the trained merges: the markup first, then the special tokens ending with EOS, mask.
RESERVED = len(MARKUP_TOKENS) + len(SPECIAL_TOKENS)
BYTES = 256
MIN_VOCAB = BYTES + RESERVED + 1
MAX_VOCAB = 65536

# The chat template (written for this tokenizer, in the markup of LLaDA2 / Ling 2.0): a system turn
# with the tools (one JSON object a line between <tools> and </tools>) and how to call them, then
# the HUMAN / ASSISTANT / OBSERVATION turns, an assistant's earlier calls written as it would write
# them. ``arguments`` is written as given when it is a string (OpenAI's messages carry it as JSON
# text), as JSON otherwise.
CHAT_TEMPLATE = (
    "{{- '<role>SYSTEM</role>' }}"
    "{%- if messages and messages[0].role == 'system' %}{{- messages[0].content + '\\n' }}{%- endif %}"
    "{%- if tools %}"
    "{{- '# Tools\\n\\nYou may call the functions below. The functions, one JSON object a line:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    '{{- \'\\n</tools>\\n\\nTo call one, write <tool_call>\\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\\n</tool_call>\\n' }}"
    "{%- endif %}"
    "{{- 'detailed thinking off<|role_end|>' }}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}{{- '<role>HUMAN</role>' + message.content + '<|role_end|>' }}"
    "{%- elif message.role == 'system' %}"
    "{%- if not loop.first %}{{- '<role>SYSTEM</role>' + message.content + '<|role_end|>' }}{%- endif %}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<role>ASSISTANT</role>' + (message.content or '') }}"
    "{%- for call in (message.tool_calls or []) %}"
    "{%- set f = call.function if call.function is defined else call %}"
    "{{- '\\n<tool_call>\\n{\"name\": ' + (f.name | tojson) + ', \"arguments\": ' }}"
    "{%- if f.arguments is string %}{{- f.arguments }}{%- else %}{{- f.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|role_end|>' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<role>OBSERVATION</role>\\n<tool_response>\\n' + message.content + '\\n</tool_response><|role_end|>' }}"
    "{%- else %}{{- raise_exception('unknown role ' + message.role) }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<role>ASSISTANT</role>' }}{%- endif %}"
)

_WORDS = (
    "the of and to in is that for it as with was on be by at this from are or an not have which one all "
    "their there been has more when will would who so if out no up about what can its some time only into "
    "them two other then first new may any these could over such where after most also did many through "
    "weather city name value type string number object array true false null location unit celsius "
    "fahrenheit query result status error message id items count price date time user assistant tool "
    "function arguments description properties required enum search order total answer data list key"
).split()
_KEYS = (
    "name arguments location unit query id type value count items price date status result city "
    "description properties required text score tags enabled limit offset url title"
).split()


def _json_value(rng: random.Random, depth: int):
    kind = rng.randrange(7 if depth < 3 else 4)
    if kind == 0:
        return rng.randrange(-1000, 100000)
    if kind == 1:
        return round(rng.uniform(-100, 1000), rng.randrange(1, 4))
    if kind == 2:
        return " ".join(rng.choice(_WORDS) for _ in range(rng.randrange(1, 5)))
    if kind == 3:
        return rng.choice((True, False, None))
    if kind in (4, 5):
        return {rng.choice(_KEYS): _json_value(rng, depth + 1) for _ in range(rng.randrange(1, 5))}
    return [_json_value(rng, depth + 1) for _ in range(rng.randrange(0, 4))]


def training_text(lines: int = 4000, seed: int = 0) -> list[str]:
    """The text the merges are trained on: JSON objects (compact and spaced), tool calls in the
    template's markup, sentences and numbers; the same for the same ``lines`` and ``seed``."""
    rng = random.Random(seed)
    out = []
    for i in range(lines):
        kind = i % 4
        if kind == 0:
            value = {rng.choice(_KEYS): _json_value(rng, 1) for _ in range(rng.randrange(1, 6))}
            out.append(json.dumps(value, separators=(",", ":") if rng.random() < 0.5 else None))
        elif kind == 1:
            args = {rng.choice(_KEYS): _json_value(rng, 2) for _ in range(rng.randrange(1, 4))}
            out.append(json.dumps({"name": "get_" + rng.choice(_WORDS), "arguments": args}))
        elif kind == 2:
            words = [rng.choice(_WORDS) for _ in range(rng.randrange(4, 16))]
            out.append(" ".join(words).capitalize() + rng.choice(".?!"))
        else:
            out.append(" ".join(str(rng.randrange(10 ** rng.randrange(1, 7))) for _ in range(rng.randrange(1, 6))))
    return out


def build_bpe_tokenizer(vocab_size: int = 1024, lines: int | None = None, seed: int = 0):
    """A byte-level BPE ``tokenizers.Tokenizer`` of exactly ``vocab_size`` ids: the 256 bytes, merges
    trained on ``training_text`` (``lines``: by default enough for the merges asked), then the
    markup and the special tokens, EOS at ``vocab_size - 2`` and the mask at ``vocab_size - 1``.

    ValueError naming ``vocab_size`` when it is outside [MIN_VOCAB, MAX_VOCAB], or when the
    training text has too few distinct pairs to make that many merges."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    if not isinstance(vocab_size, int) or not MIN_VOCAB <= vocab_size <= MAX_VOCAB:
        raise ValueError(
            f"vocab_size must be in [{MIN_VOCAB}, {MAX_VOCAB}] for a byte-level BPE tokenizer (the 256 bytes, "
            f"{RESERVED} markup and special tokens and at least one merge), got {vocab_size}"
        )
    trained = vocab_size - RESERVED
    if lines is None:
        lines = max(2000, 8 * (trained - BYTES))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=trained,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(training_text(lines, seed), trainer=trainer)
    if tok.get_vocab_size() != trained:
        raise ValueError(
            f"vocab_size {vocab_size}: the training text makes only {tok.get_vocab_size() - BYTES} merges, "
            f"{trained - BYTES} are needed: ask for a smaller vocab_size or pass more lines"
        )
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    assert tok.token_to_id(EOS_TOKEN) == vocab_size - 2 and tok.token_to_id(MASK_TOKEN) == vocab_size - 1
    return tok
