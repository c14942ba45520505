"""``blockbatch make-random``: both families, the Dream-7B preset and its memory check.

The preset is never written here (about 15 GB): its memory check runs in-process with the
machine's memory replaced, and the "it fits" path with the writer replaced by a recorder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import blockbatch
from blockbatch import cli as bb_cli
from blockbatch import random_checkpoint
from blockbatch.families.dream import DREAM_7B
from blockbatch.loading import load_checkpoint

ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "PYTHONPATH": os.pathsep.join(
        [os.path.dirname(os.path.dirname(blockbatch.__file__)), os.environ.get("PYTHONPATH", "")]
    ),
}
GiB = 2**30


def run_cli(*args, timeout: float = 300):
    return subprocess.run(
        [sys.executable, "-m", "blockbatch.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
    )


def error_line(capsys, *args) -> str:
    """Run the CLI in-process; it must fail with one ``error: ...`` line and status 2."""
    assert bb_cli.main([str(a) for a in args]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_make_random_dream_writes_a_loadable_small_checkpoint(tmp_path):
    out = tmp_path / "dream"
    res = run_cli(
        "make-random", out, "--family", "dream", "--layers", 1, "--d-model", 64, "--vocab", 64, "--dtype", "bfloat16"
    )
    assert res.returncode == 0, res.stderr
    assert "random Dream checkpoint" in res.stdout and "d_model=64" in res.stdout and "heads=4/2" in res.stdout
    assert {"config.json", "generation_config.json", "model.safetensors"} <= set(os.listdir(out))
    with open(out / "config.json") as f:
        raw = json.load(f)
    assert raw["model_type"] == "Dream" and raw["architectures"] == ["DreamModel"]
    ck = load_checkpoint(out)
    cfg = ck.config
    assert cfg.family == "dream" and cfg.attention_bias and not cfg.weight_tying
    assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.vocab_size) == (64, 1, 4, 2, 64)
    assert ck.dtype.is_floating_point and str(ck.dtype) == "torch.bfloat16"
    assert "model.layers.0.self_attn.q_proj.bias" in ck.weights and "lm_head.weight" in ck.weights


def test_make_random_llada_is_still_the_default(tmp_path, capsys):
    out = tmp_path / "llada"
    assert bb_cli.main(["make-random", str(out), "--layers", "1", "--d-model", "32", "--vocab", "32"]) == 0
    assert "random LLaDA checkpoint" in capsys.readouterr().out
    cfg = load_checkpoint(out).config
    assert cfg.family == "llada" and cfg.n_kv_heads == cfg.n_heads == 4
    assert not os.path.exists(out / "generation_config.json")


@pytest.mark.parametrize("dtype,gib", [("bfloat16", 14.2), ("float32", 28.4)])
def test_dream_7b_preset_too_large_names_the_flags(tmp_path, capsys, monkeypatch, dtype, gib):
    monkeypatch.setattr(bb_cli.make_random, "_physical_memory", lambda: 24 * GiB)
    line = error_line(capsys, "make-random", tmp_path / "d7", "--preset", "dream-7b", "--dtype", dtype)
    assert f"dream-7b (7.62B parameters) in {dtype} is {gib} GiB" in line, line
    assert "too large to build in this machine's 24.0 GiB of memory" in line and "drop --preset dream-7b" in line
    assert "--d-model / --layers / --mlp / --vocab" in line
    assert ("--dtype bfloat16" in line) == (dtype == "float32"), line
    assert not os.path.exists(tmp_path / "d7")  # refused before anything is written


def test_dream_7b_preset_builds_the_published_shape_when_it_fits(tmp_path, capsys, monkeypatch):
    """With twice the checkpoint in memory the preset goes ahead: the writer gets Dream-7B's shape,
    the dtype and 5 GB shards (recorded here instead of writing 15 GB)."""
    calls = []

    def record(path, **kwargs):
        calls.append((path, kwargs))
        assert kwargs["family"] == "dream"
        return random_checkpoint.random_config("dream", **{k: v for k, v in kwargs.items() if k in DREAM_7B})

    monkeypatch.setattr(bb_cli.make_random, "_physical_memory", lambda: 64 * GiB)
    monkeypatch.setattr(random_checkpoint, "make_random_checkpoint", record)
    out = tmp_path / "d7"
    assert bb_cli.main(["make-random", str(out), "--preset", "dream-7b", "--dtype", "bfloat16"]) == 0
    [(path, kwargs)] = calls
    assert path == str(out)
    assert {k: kwargs[k] for k in DREAM_7B} == DREAM_7B
    assert str(kwargs["dtype"]) == "torch.bfloat16" and kwargs["max_shard_bytes"] == 5 * 10**9
    printed = capsys.readouterr().out
    assert "random Dream checkpoint (preset dream-7b)" in printed and "d_model=3584" in printed
    assert "heads=28/4" in printed and "vocab=152064" in printed


def test_make_random_flag_conflicts_are_one_line(tmp_path, capsys):
    line = error_line(capsys, "make-random", tmp_path / "x", "--preset", "dream-7b", "--layers", "3")
    assert "--preset dream-7b fixes the shape; drop --layers" in line
    line = error_line(capsys, "make-random", tmp_path / "x", "--preset", "dream-7b", "--family", "llada")
    assert "--preset dream-7b is a dream shape, but --family is llada" in line
    line = error_line(capsys, "make-random", tmp_path / "x", "--family", "dream", "--kv-heads", "3")
    assert "num_key_value_heads" in line and "must divide" in line
    assert not os.path.exists(tmp_path / "x")


def test_make_random_help_teaches_the_families():
    res = run_cli("make-random", "--help", timeout=120)
    assert res.returncode == 0, res.stderr
    for text in (
        "--family {llada,dream,llada2,sdar}",
        "--preset {dream-7b,llada2-mini,sdar-1.7b,sdar-8b}",
        "--dtype bfloat16",
        "generation_config.json",
        "half of",
        "Dream-v0-7B",
    ):
        assert text in " ".join(res.stdout.split()) or text in res.stdout, text


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_make_random_refuses_non_finite_float_flags(tmp_path, capsys, value):
    """--logit-scale nan once wrote a NaN LM head with exit 0: refused before anything is written."""
    line = error_line(capsys, "make-random", tmp_path / "out", f"--logit-scale={value}")
    assert line == f"error: --logit-scale must be a finite number, got {float(value)}"
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="logit_scale must be a finite number"):
        random_checkpoint.random_weights(random_checkpoint.random_config(), logit_scale=float(value))


@pytest.mark.parametrize(
    "flags",
    [("--experts", 65536, "--layers", 100), ("--experts", 65536, "--layers", 10000)],
    ids=["experts-layers", "more-layers"],
)
def test_make_random_bounds_the_tensor_count_before_listing(tmp_path, capsys, flags):
    """Sizes are bounded before anything is listed or allocated (this shape took 53 s and 4 GB to refuse)."""
    import time

    start = time.perf_counter()
    line = error_line(capsys, "make-random", tmp_path / "out", "--family", "llada2", *flags)
    assert time.perf_counter() - start < 1.0
    assert line.startswith("error: this shape has ") and "tensors, more than the 1048576 make-random writes" in line
    assert "--layers / --experts" in line
    assert not (tmp_path / "out").exists()


def test_make_random_nan_free_by_default_loads_with_the_finite_check(tmp_path):
    res = run_cli("make-random", tmp_path / "ok", "--family", "llada2", "--logit-scale", "3.5")
    assert res.returncode == 0, res.stderr
    load_checkpoint(tmp_path / "ok", check_finite=True)


@pytest.mark.parametrize(
    "flags,message",
    [
        (("--heads", 0), "error: config: key 'num_attention_heads' must be a positive integer, got 0"),
        (("--heads", 8, "--d-model", 4), "error: config: key 'num_attention_heads' = 8 is more than hidden_size = 4"),
    ],
    ids=["heads-0", "head-size-0"],
)
def test_make_random_llada2_head_size_0_is_a_named_error_not_a_crash(tmp_path, capsys, flags, message):
    line = error_line(capsys, "make-random", tmp_path / "out", "--family", "llada2", *flags)
    assert line.startswith(message), line


@pytest.mark.parametrize("family", ["llada", "dream", "llada2", "llada2 editing"])
def test_make_random_never_replaces_a_shipped_toy_checkpoint(tmp_path, capsys, family):
    """Class: a command writing over what the package itself reads. The toy checkpoints are the
    default model of every command: make-random refuses their folders even with --force (also
    through a symbolic link), and leaves every file as it was."""
    import hashlib

    from blockbatch.toy import SHIPPED_CHECKPOINT_DIRS

    toy = SHIPPED_CHECKPOINT_DIRS[family]
    before = {n: hashlib.sha256(open(os.path.join(toy, n), "rb").read()).hexdigest() for n in os.listdir(toy)}
    link = tmp_path / "link"
    link.symlink_to(toy)
    for target in (toy, link):
        line = error_line(capsys, "make-random", target, "--force")
        assert "toy checkpoint shipped in the package" in line and str(target) in line
    after = {n: hashlib.sha256(open(os.path.join(toy, n), "rb").read()).hexdigest() for n in os.listdir(toy)}
    assert after == before
