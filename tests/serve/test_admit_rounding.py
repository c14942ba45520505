"""A request's length is what admission says it is: prompt + gen_length, for policy ``block``
rounded up to whole blocks (``torch.ops.blockbatch.admit``, the C++ ``admit`` that decode, the
scheduler and decode_batch use). Python's length checks (Engine.generate / stream, the server's
413) ask it instead of adding prompt and gen_length; before, they ignored the rounding, so a
block request whose whole blocks pass max_sequence_length got past them and failed later with
another error (the server: a 400 guessed from the text instead of its 413)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import torch

from blockbatch import DecodeOptions, Engine
from helpers.llada2 import toy_tokenizer_checkpoint
from helpers.serve import ServeProcess

PROMPT = [1] * 10
# block_length 48 does not divide the toy's max_sequence_length (4096): 10 + 4085 = 4095
# positions fit, its 86 whole blocks (4128 positions) do not.
ROUNDED = {"policy": "block", "block_length": 48, "gen_length": 4085}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return toy_tokenizer_checkpoint(tmp_path_factory.mktemp("models") / "llada2-toy")


@pytest.fixture(scope="module")
def engine(model):
    return Engine.from_pretrained(str(model))


def test_admit_op_rounds_block_canvases_to_whole_blocks(engine):
    limit = engine.config.max_sequence_length
    assert limit == 4096  # the case below is built on it
    assert engine.canvas_length(10, DecodeOptions(**ROUNDED)) == 4128
    assert engine.canvas_length(10, DecodeOptions(**{**ROUNDED, "block_length": 32})) == 4096
    canvas, rows = torch.ops.blockbatch.admit(engine.model.obj, 10, DecodeOptions(**ROUNDED).native)
    assert (canvas, rows) == (4128, 1)
    # A gen_length past int64 when added to the prompt saturates instead of wrapping.
    assert engine.canvas_length(10, DecodeOptions(policy="block", gen_length=2**63 - 8)) == 2**63 - 1


def test_block_canvas_past_the_model_is_refused_alike_by_engine_scheduler_and_server(engine, model, tmp_path):
    o = DecodeOptions(**ROUNDED)
    # Engine.generate: refused before any decode, naming the rounded length.
    with pytest.raises(ValueError) as generate:
        engine.generate([PROMPT], o)
    assert str(generate.value) == (
        "prompts[0]: its prompt (10 tokens) plus gen_length (4085) needs 4128 positions (rounded up to "
        "whole blocks of block_length) but the model's max_sequence_length is 4096 (shorten the prompt or gen_length)"
    )
    # Engine.stream: that error as the request's item.
    [item] = list(engine.stream([PROMPT], o))
    assert item.generation is None and str(item.error) == str(generate.value)
    # The scheduler (C++ admit): refused at submit, naming the same lengths.
    with engine.scheduler(max_batch=1, adaptive=False) as s, pytest.raises(ValueError) as submitted:
        s.submit(torch.tensor(PROMPT), o)
    assert "= 4128 exceeds max_sequence_length = 4096" in str(submitted.value)
    # The server: a 413 context_length_exceeded naming the rounded length, before the scheduler.
    server = ServeProcess(["--model", str(model), "--max-batch", "1"], tmp_path / "server.log")
    try:
        r = httpx.post(
            f"{server.url}/v1/completions",
            json={"model": "llada2-toy", "prompt": PROMPT, "blockbatch": ROUNDED},
            timeout=60,
        )
    finally:
        assert server.stop() == 0, server.log()
    assert r.status_code == 413, r.text
    error = r.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "prompt"
    assert "needs 4128 positions (rounded up to whole blocks of block_length)" in error["message"]
    assert "max length 4096" in error["message"]
