"""The bb_forward C++ binary: strict C++ checkpoint reader + native forward, outside Python."""

import json
import os
import re
import struct
import subprocess

import pytest
import torch

import blockbatch
from blockbatch.families.llada import PREFIX
from blockbatch.loading import save_checkpoint
from blockbatch.native import NativeModel
from blockbatch.random_checkpoint import random_config, random_weights
from helpers.bb_forward import assert_forward_matches

BIN = os.path.join(os.path.dirname(blockbatch.__file__), "bin", "bb_forward")


def run(*args):
    return subprocess.run(
        [BIN, *map(str, args)], capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )


def test_help_documents_options():
    res = run("--help")
    assert res.returncode == 0
    for flag in ("--model", "--dtype", "--mode", "--lengths", "--canvas", "--iters"):
        assert flag in res.stdout


def test_missing_model_argument_is_usage_error():
    res = run()
    assert res.returncode == 2 and "--model DIR is required" in res.stderr


@pytest.mark.parametrize("shards", [None, 30_000])
@pytest.mark.parametrize("mode", ["dual", "prefix", "full"])
def test_forward_matches_python(tmp_path, shards, mode):
    config = random_config(n_heads=4, n_kv_heads=2, d_model=64)
    weights = random_weights(config, seed=5, logit_scale=2.0)
    save_checkpoint(tmp_path, config, weights, max_shard_bytes=shards)
    lengths, L = [3, 5, 8], 20
    res = run(
        "--model", tmp_path, "--mode", mode, "--lengths", ",".join(map(str, lengths)), "--canvas", L, "--iters", 1
    )
    assert res.returncode == 0, res.stderr
    assert_forward_matches(res.stdout, NativeModel(config, weights), config.vocab_size, mode, lengths, L)


def _broken(tmp_path, mutate_weights=None, mutate_file=None, mutate_config=None):
    config = random_config()
    weights = random_weights(config)
    if mutate_weights:
        mutate_weights(weights)
    save_checkpoint(tmp_path, config, weights)
    if mutate_config:
        p = os.path.join(tmp_path, "config.json")
        with open(p) as f:
            cfg = json.load(f)
        mutate_config(cfg)
        with open(p, "w") as f:
            json.dump(cfg, f)
    if mutate_file:
        mutate_file(os.path.join(tmp_path, "model.safetensors"))
    return run("--model", tmp_path)


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 64)


def _lie(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    b, e = header[PREFIX + "ln_f.weight"]["data_offsets"]
    header[PREFIX + "ln_f.weight"]["data_offsets"] = [b, e - 4]
    raw = json.dumps(header).encode().ljust(n)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + data[8 + n :])


@pytest.mark.parametrize(
    "case,kwargs,pattern",
    [
        (
            "truncated",
            dict(mutate_file=_truncate),
            r"model.safetensors: tensor '.*': data_offsets end \d+ is past the data section .*truncated",
        ),
        ("header-lies", dict(mutate_file=_lie), r"tensor 'model.transformer.ln_f.weight': data_offsets span 252 bytes"),
        (
            "missing",
            dict(mutate_weights=lambda w: w.pop(PREFIX + "blocks.0.ff_out.weight")),
            r"tensor 'model.transformer.blocks.0.ff_out.weight' is missing",
        ),
        (
            "extra",
            dict(mutate_weights=lambda w: w.__setitem__("lm_head.bias", torch.zeros(3))),
            r"unexpected tensor 'lm_head.bias'",
        ),
        (
            "dtype",
            dict(mutate_weights=lambda w: w.__setitem__(PREFIX + "ln_f.weight", torch.ones(64, dtype=torch.int32))),
            r"tensor 'model.transformer.ln_f.weight' has dtype I32; weights must be F32, BF16 or F16",
        ),
        (
            "shape",
            dict(mutate_weights=lambda w: w.__setitem__(PREFIX + "ln_f.weight", torch.ones(65))),
            r"tensor 'model.transformer.ln_f.weight' has shape \[65\], expected \[64\]",
        ),
        (
            "model_type",
            dict(mutate_config=lambda c: c.__setitem__("model_type", "bert")),
            r"config.json: key 'model_type' must be \"llada\"",
        ),
        (
            "mask-id",
            dict(mutate_config=lambda c: c.__setitem__("mask_token_id", 500)),
            r"config.json: .*'mask_token_id' = 500 is outside the vocabulary \[0, 97\)",
        ),
    ],
)
def test_bad_checkpoints_are_refused(tmp_path, case, kwargs, pattern):
    res = _broken(tmp_path, **kwargs)
    assert res.returncode == 1
    assert re.search(pattern, res.stderr), res.stderr


BENCH = os.path.join(os.path.dirname(blockbatch.__file__), "bin", "bb_bench_decode")


@pytest.mark.parametrize(
    "policy,extra",
    [
        ("blockbatch", ["--block-sizes", "4,16,64"]),
        ("dual", ["--block-length", "16"]),
        ("vanilla", ["--block-length", "16", "--threshold", "none", "--steps", "64"]),
    ],
)
def test_bench_decode_verifies_against_python(tmp_path, policy, extra):
    from blockbatch.decoding import run_decode
    from blockbatch.options import DecodeOptions

    config = random_config(vocab_size=50)
    weights = random_weights(config, seed=9, logit_scale=6.0)
    save_checkpoint(tmp_path / "ckpt", config, weights)
    model = NativeModel(config, weights)
    kw = dict(policy=policy, gen_length=64)
    if policy == "blockbatch":
        kw.update(block_sizes=(4, 16, 64))
    if policy == "dual":
        kw.update(block_length=16)
    if policy == "vanilla":
        kw.update(block_length=16, threshold=None, steps=64)
    options = DecodeOptions(**kw)
    lines = []
    for seed in range(3):
        prompt = torch.randint(0, 45, (4 + seed,), generator=torch.Generator().manual_seed(seed))
        out = run_decode(model.obj, prompt, options)
        lines.append({"prompt_ids": prompt.tolist(), "expected_ids": out.tokens[len(prompt) :].tolist()})
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    res = subprocess.run(
        [
            BENCH,
            "--model",
            str(tmp_path / "ckpt"),
            "--prompts",
            str(prompts),
            "--policy",
            policy,
            "--gen-length",
            "64",
            "--verify",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert re.search(
        rf"^result policy={policy} dtype=float32 prompts=3 gen_length=64 nfe_mean=\S+ "
        r"ms_per_sample_median=\S+ tokens_per_s=\S+",
        res.stdout,
        re.M,
    )
    assert "Disposition: Passed" in res.stdout
    # A wrong expectation is caught.
    lines[1]["expected_ids"][0] = (lines[1]["expected_ids"][0] + 1) % 45
    prompts.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    res = subprocess.run(
        [
            BENCH,
            "--model",
            str(tmp_path / "ckpt"),
            "--prompts",
            str(prompts),
            "--policy",
            policy,
            "--gen-length",
            "64",
            "--verify",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 3 and "Disposition: Failed (1 of 3 prompts differ)" in res.stdout


def test_bench_decode_bad_inputs(tmp_path):
    config = random_config()
    save_checkpoint(tmp_path, config, random_weights(config))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": [1, 2]}\n')
    res = subprocess.run([BENCH, "--model", str(tmp_path), "--prompts", str(bad)], capture_output=True, text=True)
    assert res.returncode == 1 and 'bad.jsonl:1: needs a "prompt_ids" list' in res.stderr
    good = tmp_path / "good.jsonl"
    good.write_text('{"prompt_ids": [1, 2]}\n')
    res = subprocess.run(
        [BENCH, "--model", str(tmp_path), "--prompts", str(good), "--block-sizes", "4,48"],
        capture_output=True,
        text=True,
    )
    # an option error is a usage error (2), found before the model is loaded
    assert (
        res.returncode == 2
        and "block size 48 in block_sizes must be a positive divisor of gen_length = 128" in res.stderr
    )
    res = subprocess.run(
        [BENCH, "--model", str(tmp_path), "--prompts", str(good), "--policy", "fast"], capture_output=True, text=True
    )
    assert res.returncode == 2 and "policy must be one of" in res.stderr
    res = subprocess.run([BENCH, "--help"], capture_output=True, text=True)
    assert res.returncode == 0 and "--verify" in res.stdout
