"""Random checkpoints with a byte-level BPE tokenizer (``blockbatch make-random --tokenizer bpe``):
the tokenizer spells any text (JSON included, which the toys' vocabularies cannot), its special ids
are where a random config puts them, and the checkpoint loads and decodes through Engine."""

from __future__ import annotations

import json

import pytest

from blockbatch import DecodeOptions, Engine
from blockbatch import cli as bb_cli
from blockbatch.loading import load_checkpoint
from blockbatch.random_tokenizer import (
    EOS_TOKEN,
    MASK_TOKEN,
    MIN_VOCAB,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    build_bpe_tokenizer,
)
from helpers.bpe import make_bpe_checkpoint

TEXTS = [
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
    '{"a":[1,2.5e-3,-7,true,false,null],"b":{"c":"\\u00e9\\n\\t\\"q\\""}}',
    "héllo wörld 中文 🙂 \x00\x01\x7f tabs\tand\nnewlines",
    "   leading and trailing spaces   ",
    "".join(chr(c) for c in range(32, 127)),
]


@pytest.fixture(scope="module")
def tok():
    return build_bpe_tokenizer(512)


@pytest.mark.parametrize("text", TEXTS)
def test_bpe_tokenizer_spells_any_text_and_decodes_it_back(tok, text):
    ids = tok.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert all(0 <= i < 512 - 9 for i in ids)  # no markup or special id made from plain text


def test_bpe_tokenizer_ids_and_merges(tok):
    assert tok.get_vocab_size() == 512
    assert tok.token_to_id(EOS_TOKEN) == 510 and tok.token_to_id(MASK_TOKEN) == 511
    # trained merges: JSON punctuation and common keys are whole tokens, so JSON is shorter than its bytes
    text = TEXTS[0]
    assert len(tok.encode(text).ids) < len(text.encode()) / 2
    # the tool-call markup is one token each and survives decoding (added, not special)
    ids = tok.encode(TOOL_CALL_OPEN + "{}" + TOOL_CALL_CLOSE).ids
    assert ids[0] == tok.token_to_id(TOOL_CALL_OPEN) and ids[-1] == tok.token_to_id(TOOL_CALL_CLOSE)
    assert tok.decode(ids, skip_special_tokens=True) == TOOL_CALL_OPEN + "{}" + TOOL_CALL_CLOSE
    assert build_bpe_tokenizer(512).to_str() == tok.to_str()  # the same for the same arguments


@pytest.mark.parametrize("vocab", [MIN_VOCAB - 1, 10**6])
def test_bpe_tokenizer_refuses_a_vocab_it_cannot_fill(vocab):
    with pytest.raises(ValueError, match="vocab_size must be in"):
        build_bpe_tokenizer(vocab)


def test_make_random_tokenizer_bpe_writes_tokenizer_and_template(tmp_path, capsys):
    out = tmp_path / "bpe"
    assert bb_cli.main(["make-random", str(out), "--tokenizer", "bpe", "--layers", "1", "--d-model", "32"]) == 0
    assert "byte-level BPE tokenizer" in capsys.readouterr().out
    ck = load_checkpoint(str(out))
    assert ck.config.vocab_size == ck.tokenizer.get_vocab_size() == 1024  # the bpe default
    assert ck.tokenizer.token_to_id(EOS_TOKEN) == ck.config.eos_token_id == 1022
    assert ck.tokenizer.token_to_id(MASK_TOKEN) == ck.config.mask_token_id == 1023
    assert "tools" in json.loads((out / "tokenizer_config.json").read_text())["chat_template"]


def test_make_random_tokenizer_bpe_refuses_a_small_vocab(tmp_path, capsys):
    assert bb_cli.main(["make-random", str(tmp_path / "x"), "--tokenizer", "bpe", "--vocab", "64"]) == 2
    assert "--tokenizer bpe" in capsys.readouterr().err


def test_make_random_help_documents_tokenizer(capsys):
    with pytest.raises(SystemExit):
        bb_cli.main(["make-random", "--help"])
    assert "--tokenizer {none,bpe}" in capsys.readouterr().out


@pytest.mark.parametrize("family, policy", [("llada", "vanilla"), ("llada2", "block")])
def test_bpe_checkpoint_loads_and_decodes_through_engine(tmp_path, family, policy):
    engine = Engine.from_pretrained(str(make_bpe_checkpoint(tmp_path / family, family)))
    codec = engine.codec
    ids = engine.encode('Answer with {"x": 1}')  # through the chat template
    rendered = codec.tokenizer.decode(ids.tolist(), skip_special_tokens=False)
    assert rendered.startswith("<role>SYSTEM</role>") and rendered.endswith("<role>ASSISTANT</role>")
    assert '<role>HUMAN</role>Answer with {"x": 1}<|role_end|>' in rendered
    g = engine.generate(ids, DecodeOptions(policy=policy, gen_length=32, block_length=32))[0]
    assert len(g.ids) <= 32 and engine.config.mask_token_id not in g.ids
    assert g.text == codec.decode(codec.trim(g.ids))


def test_bpe_checkpoint_serves_json_text_through_the_server(tmp_path):
    """The LLaDA2 BPE checkpoint behind the real server: a message holding JSON is encoded (the toys'
    vocabularies refuse it as unknown characters) and the reply is the engine's for the same ids."""
    from openai import OpenAI

    from helpers.serve import ServeProcess

    messages = [{"role": "user", "content": 'Echo {"key": [1, 2.5, "é"]}'}]
    with pytest.raises(ValueError, match="outside the tokenizer's vocabulary"):
        Engine.from_pretrained().encode(messages[0]["content"], chat=False)  # the toy cannot spell it
    folder = make_bpe_checkpoint(tmp_path / "bpe-llada2", "llada2")
    engine = Engine.from_pretrained(str(folder))
    ids = engine.encode_chat(messages)
    [g] = engine.generate(ids, DecodeOptions(policy="block", gen_length=32, block_length=32))
    server = ServeProcess(["--model", str(folder)], tmp_path / "serve.log")
    try:
        client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        done = client.chat.completions.create(
            model="bpe-llada2", messages=messages, max_tokens=32, extra_body={"blockbatch": {"block_length": 32}}
        )
        assert done.usage.prompt_tokens == ids.numel()
        assert done.choices[0].message.content == g.text and done.model_extra["nfe"] == g.stats["nfe"]
    finally:
        assert server.stop() == 0, server.log()
