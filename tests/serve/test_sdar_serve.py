"""``blockbatch serve`` on an SDAR checkpoint (random weights in the SDAR layout, the toy's tokenizer): the
real server in a subprocess, driven by the real ``openai`` client. A request that names no policy decodes
with the family's defaults (block, dynamic 0.85, blocks of 4); a request's ``unmasking`` is taken; streamed
text equals the whole answer, which equals the engine's in this process, NFE (the authors' count) too; a
policy the family does not define is a 400 naming it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from blockbatch import Engine
from blockbatch.random_checkpoint import make_random_checkpoint
from blockbatch.toy import checkpoint_path
from blockbatch.toy import tokenizer as toy_tok
from helpers.serve import ServeProcess, assert_block_completions_equal_the_engine, assert_refuses_policy_dual

PROMPT = "72-2=__-3=__-3=__...............?"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("models") / "sdar-toy"
    make_random_checkpoint(
        folder,
        family="sdar",
        seed=2,
        logit_scale=4.0,
        vocab_size=toy_tok.VOCAB_SIZE,
        mask_token_id=toy_tok.MASK_ID,
        eos_token_id=toy_tok.EOS_ID,
        d_model=64,
        n_layers=3,
    )
    shutil.copy(Path(checkpoint_path()) / "tokenizer.json", folder / "tokenizer.json")
    return folder


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    s = ServeProcess(["--model", str(model), "--max-batch", "4"], tmp_path_factory.mktemp("logs") / "server.log")
    yield s
    assert s.stop() == 0, s.log()


@pytest.fixture(scope="module")
def engine(model):
    return Engine.from_pretrained(str(model))


@pytest.mark.parametrize(
    "blockbatch",
    [{}, {"block_length": 8, "unmasking": "static", "steps": 4}, {"unmasking": "entropy_bounded"}],
    ids=str,
)
def test_sdar_completions_equal_the_engine(server, engine, blockbatch):
    assert_block_completions_equal_the_engine(server, engine, "sdar-toy", PROMPT, blockbatch)


def test_sdar_refuses_a_policy_it_does_not_define(server):
    assert_refuses_policy_dual(server, "sdar-toy", PROMPT, "sdar")
