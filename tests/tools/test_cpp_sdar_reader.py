"""The bb_* binaries on SDAR checkpoints (csrc/io/checkpoint.cpp reads them by the family's row): bb_forward
reads an SDAR folder (single file and sharded) to the Python loader's config and forward; bb_bench_decode
decodes it with the family's defaults (policy block, dynamic at 0.85, blocks of 4) and with every unmasking
rule to blockbatch's Engine tokens and NFE (the authors' count), and refuses the other policies."""

from __future__ import annotations

import json
import re

import pytest

import blockbatch
from blockbatch import Engine
from blockbatch.families import sdar as fam
from blockbatch.native import NativeModel
from blockbatch.random_checkpoint import make_random_checkpoint
from helpers.bb_forward import assert_forward_matches

from test_cpp_reader import assert_config_read, bb_bench_decode, bb_forward, read_config_line

SHAPE = dict(n_layers=2, vocab_size=64, d_model=32, n_heads=4, n_kv_heads=2, head_size=16)


@pytest.mark.parametrize("shards", [None, 10_000], ids=["single", "sharded"])
def test_sdar_forward_matches_python_loader(tmp_path, shards):
    config = make_random_checkpoint(
        tmp_path, seed=5, logit_scale=2.0, max_shard_bytes=shards, family="sdar", **SHAPE
    )  # fmt: skip
    lengths, L = [3, 5, 8], 20
    res = bb_forward(tmp_path, "--mode", "dual", "--lengths", ",".join(map(str, lengths)), "--canvas", L)
    assert res.returncode == 0, res.stdout + res.stderr
    ckpt = blockbatch.load_checkpoint(tmp_path)  # the Python loader path
    assert ckpt.config == config
    assert_config_read(read_config_line(res.stdout), config)
    assert_forward_matches(res.stdout, NativeModel(ckpt.config, ckpt.weights), config.vocab_size, "dual", lengths, L)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("sdar")
    make_random_checkpoint(path, seed=3, logit_scale=5.0, family="sdar", **SHAPE)
    return path


@pytest.mark.parametrize(
    "flags,overrides",
    [
        ([], {}),  # the family's defaults: block, dynamic 0.85, blocks of 4
        (["--unmasking", "static", "--steps", "2"], dict(unmasking="static", steps=2)),
        (["--unmasking", "sequential", "--block-length", "8"], dict(unmasking="sequential", block_length=8)),
        (["--unmasking", "entropy_bounded", "--entropy-bound", "1.5"], dict(unmasking="entropy_bounded",
                                                                           entropy_bound=1.5)),
    ],
)  # fmt: skip
def test_bench_decode_equals_the_engine(folder, tmp_path, flags, overrides):
    engine = Engine.from_pretrained(str(folder))
    options = engine.default_options(gen_length=24, **overrides)
    prompts = [[1 + (i * 7 + j) % 50 for j in range(3 + 2 * i)] for i in range(5)]
    outs = engine.generate(prompts, options)
    lines = [{"prompt_ids": p, "expected_ids": o.raw_ids} for p, o in zip(prompts, outs)]
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    res = bb_bench_decode(folder, path, "--gen-length", 24, "--verify", *flags)
    assert res.returncode == 0, res.stdout + res.stderr
    assert_config_read(read_config_line(res.stdout), engine.config)
    result = re.search(r"^result policy=block dtype=float32 prompts=5 gen_length=24 nfe_mean=(\S+) ", res.stdout, re.M)
    assert result, res.stdout
    assert float(result[1]) == pytest.approx(sum(o.stats["nfe"] for o in outs) / len(outs), abs=0.005)
    assert "Disposition: Passed" in res.stdout


def test_bench_decode_refuses_other_policies_on_sdar(folder, tmp_path):
    assert fam.DEFAULT_OPTIONS == {"policy": "block", "threshold": 0.85, "block_length": 4}
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt_ids": [1, 2, 3]}\n')
    res = bb_bench_decode(folder, prompts, "--policy", "dual", "--gen-length", 16)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "policy 'dual' is not defined on sdar checkpoints (block-causal" in res.stderr
    res = bb_bench_decode(folder, prompts, "--gen-length", 16, "--edit-threshold", 0.5)
    assert res.returncode == 2 and "token editing is not defined on sdar" in res.stderr
