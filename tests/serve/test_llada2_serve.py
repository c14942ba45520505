"""``blockbatch serve`` on a LLaDA2 checkpoint (random weights in the LLaDA2 layout, the toy's
tokenizer): the real server in a subprocess on a loopback port, driven by the real ``openai``
client. A request that names no policy decodes with the family's ``block`` policy; streamed text
equals the whole answer (with token editing too: a block's tokens are streamed once final); the
answer equals the engine's in this process; a policy the family does not define is a 400 naming
the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from blockbatch import Engine
from helpers.llada2 import toy_tokenizer_checkpoint
from helpers.serve import ServeProcess, assert_block_completions_equal_the_engine, assert_refuses_policy_dual

PROMPT = "72-2=__-3=__-3=__...............?"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return toy_tokenizer_checkpoint(tmp_path_factory.mktemp("models") / "llada2-toy")


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    s = ServeProcess(["--model", str(model), "--max-batch", "4"], tmp_path_factory.mktemp("logs") / "server.log")
    yield s
    assert s.stop() == 0, s.log()


@pytest.fixture(scope="module")
def engine(model):
    return Engine.from_pretrained(str(model))


@pytest.mark.parametrize(
    "blockbatch", [{}, {"block_length": 16, "steps": 4}, {"threshold": 0.7, "edit_threshold": 0.5}], ids=str
)
def test_llada2_completions_equal_the_engine(server, engine, blockbatch):
    assert_block_completions_equal_the_engine(server, engine, "llada2-toy", PROMPT, blockbatch)


def test_llada2_refuses_a_policy_it_does_not_define(server):
    assert_refuses_policy_dual(server, "llada2-toy", PROMPT, "llada2")
