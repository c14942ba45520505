"""The C++ checkpoint reader (csrc/io/checkpoint.cpp, used by the bb_* binaries) on Dream checkpoints.

Hugging Face Dream folders as published (``model_type: "Dream"``, Qwen2 key names, special ids
also in ``generation_config.json``, q/k/v biases) are read through ``bb_forward``, whose first line
says what the reader made of ``config.json``; its forward must equal the one built from the Python
loader's weights, and a broken folder must be refused with the message the Python loader gives
(naming the key, or the tensor and the file).
"""

import json
import os
import re
import subprocess

import pytest
import torch

import blockbatch
from blockbatch.random_checkpoint import make_random_checkpoint, random_config, random_weights
from blockbatch.errors import CheckpointError
from blockbatch.loading import INDEX_NAME, WEIGHTS_NAME, save_checkpoint
from blockbatch.native import NativeModel
from helpers.bb_forward import assert_forward_matches

BIN_DIR = os.path.join(os.path.dirname(blockbatch.__file__), "bin")
ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "LD_LIBRARY_PATH": os.pathsep.join(
        p for p in (os.environ.get("LD_LIBRARY_PATH"), os.path.join(os.path.dirname(torch.__file__), "lib")) if p
    ),
}
CONFIG_FIELDS = (
    "d_model",
    "n_layers",
    "n_heads",
    "n_kv_heads",
    "mlp_hidden_size",
    "vocab_size",
    "embedding_size",
    "mask_token_id",
    "eos_token_id",
    "max_sequence_length",
)


def bb_forward(path, *args):
    return subprocess.run(
        [os.path.join(BIN_DIR, "bb_forward"), "--model", str(path), "--iters", "1", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )


def read_config_line(stdout):
    """The ``model family=... key=value ...`` line the bb_* binaries print after loading, as a dict."""
    line = re.search(r"^model (.*)$", stdout, re.M)
    assert line, stdout
    return dict(item.split("=", 1) for item in line[1].split())


def assert_config_read(seen, config):
    assert seen["family"] == "dream" and seen["attention_bias"] == "1"
    for key in CONFIG_FIELDS:
        assert int(seen[key]) == getattr(config, key), key
    assert int(seen["weight_tying"]) == int(config.weight_tying)
    assert float(seen["rope_theta"]) == config.rope_theta and float(seen["rms_norm_eps"]) == config.rms_norm_eps


def edit_json(path, **changes):
    """Set (or, with value None, delete) keys of a JSON file."""
    with open(path) as f:
        data = json.load(f)
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    with open(path, "w") as f:
        json.dump(data, f)


# --------------------------------------------------------------------------- reading


@pytest.mark.parametrize(
    "overrides", [dict(), dict(weight_tying=True, n_kv_heads=1, n_layers=3)], ids=["gqa", "tied-mqa"]
)
def test_reads_a_dream_checkpoint(tmp_path, overrides):
    config = make_random_checkpoint(tmp_path, seed=1, **overrides, family="dream")
    with open(tmp_path / "config.json") as f:
        raw = json.load(f)
    assert raw["model_type"] == "Dream" and raw["architectures"] == ["DreamModel"]  # the published layout
    res = bb_forward(tmp_path, "--lengths", "3,5", "--canvas", 16)
    assert res.returncode == 0, res.stderr
    assert_config_read(read_config_line(res.stdout), config)
    assert config == blockbatch.load_checkpoint(tmp_path).config  # the Python loader reads the same


def test_special_ids_from_generation_config(tmp_path):
    """Ids missing from config.json come from generation_config.json (config.json wins); eos may be a list."""
    config = make_random_checkpoint(tmp_path, seed=2, family="dream")
    edit_json(tmp_path / "config.json", mask_token_id=None, eos_token_id=None, pad_token_id=None, bos_token_id=None)
    edit_json(tmp_path / "generation_config.json", eos_token_id=[config.eos_token_id, 3])
    res = bb_forward(tmp_path, "--lengths", "2", "--canvas", 8)
    assert res.returncode == 0, res.stderr
    assert_config_read(read_config_line(res.stdout), config)
    # config.json wins over generation_config.json
    edit_json(tmp_path / "config.json", eos_token_id=7)
    res = bb_forward(tmp_path, "--lengths", "2", "--canvas", 8)
    assert res.returncode == 0, res.stderr
    assert int(read_config_line(res.stdout)["eos_token_id"]) == 7
    assert blockbatch.load_checkpoint(tmp_path).config.eos_token_id == 7


@pytest.mark.parametrize("shards", [None, 30_000], ids=["single", "sharded"])
@pytest.mark.parametrize("mode", ["dual", "prefix", "full"])
def test_dream_forward_matches_python_loader(tmp_path, shards, mode):
    config = make_random_checkpoint(tmp_path, seed=5, logit_scale=2.0, max_shard_bytes=shards, family="dream")
    if shards:
        with open(tmp_path / INDEX_NAME) as f:
            assert len(set(json.load(f)["weight_map"].values())) > 3
        assert not os.path.exists(tmp_path / WEIGHTS_NAME)
    lengths, L = [3, 5, 8], 20
    res = bb_forward(tmp_path, "--mode", mode, "--lengths", ",".join(map(str, lengths)), "--canvas", L)
    assert res.returncode == 0, res.stderr
    assert_config_read(read_config_line(res.stdout), config)
    ckpt = blockbatch.load_checkpoint(tmp_path)  # the Python loader path
    assert_forward_matches(res.stdout, NativeModel(ckpt.config, ckpt.weights), config.vocab_size, mode, lengths, L)


def test_bench_decode_loads_a_dream_checkpoint(tmp_path):
    """bb_bench_decode reads the folder; whether it then decodes is the native decode loop's business."""
    make_random_checkpoint(tmp_path / "ckpt", seed=3, family="dream")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt_ids": [1, 2, 3]}\n')
    res = subprocess.run(
        [
            os.path.join(BIN_DIR, "bb_bench_decode"),
            "--model",
            str(tmp_path / "ckpt"),
            "--prompts",
            str(prompts),
            "--gen-length",
            "8",
            "--block-sizes",
            "4,8",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )
    assert read_config_line(res.stdout)["family"] == "dream", res.stdout + res.stderr
    # Until the native decode loop runs Dream it refuses the model by name, after the reader read it.
    assert res.returncode == 0 or "native decode loop does not run the dream family" in res.stderr, res.stderr


def test_help_names_the_families():
    for name in ("bb_forward", "bb_bench_decode"):
        res = subprocess.run(
            [os.path.join(BIN_DIR, name), "--help"], capture_output=True, text=True, timeout=60, env=ENV
        )
        assert res.returncode == 0 and "LLaDA, Dream or LLaDA2" in res.stdout, name


# --------------------------------------------------------------------------- refusing


def _python_error(path):
    with pytest.raises(CheckpointError) as e:
        blockbatch.load_checkpoint(path)
    return str(e.value)


def _cpp_error(path):
    res = bb_forward(path)
    assert res.returncode == 1, res.stdout
    lines = [l for l in res.stderr.splitlines() if l.startswith("error: ")]
    assert len(lines) == 1, res.stderr
    return lines[0][len("error: ") :]


@pytest.mark.parametrize(
    "changes,message",
    [
        (
            dict(num_key_value_heads=3),
            "key 'num_key_value_heads' = 3 must divide num_attention_heads = 4 (grouped-query attention)",
        ),
        (dict(mask_token_id=500), "key 'mask_token_id' = 500 is outside the vocabulary [0, 97)"),
        (dict(mask_token_id=-1), "key 'mask_token_id' = -1 is outside the vocabulary [0, 97)"),
        (dict(hidden_size=66), "key 'hidden_size' = 66 is not a multiple of num_attention_heads = 4"),
        (dict(pad_token_id=97), "key 'pad_token_id' = 97 is outside the vocabulary [0, 97)"),
        (dict(eos_token_id=[]), "key 'eos_token_id' must be an integer or a non-empty list of integers"),
        (dict(num_attention_heads=None), "required key 'num_attention_heads' is missing"),
    ],
)
def test_bad_dream_config_same_message_as_python(tmp_path, changes, message):
    make_random_checkpoint(tmp_path, family="dream")
    edit_json(tmp_path / "config.json", **changes)
    where = os.path.join(str(tmp_path), "config.json")
    cpp = _cpp_error(tmp_path)
    assert cpp.startswith(where + ": " + message), cpp
    assert _python_error(tmp_path).startswith(where + ": " + message)


def test_llada_pad_id_checked_as_python_does(tmp_path):
    """The pad id check config.py makes for both families (the reader ignored LLaDA's pad id before)."""
    from blockbatch.random_checkpoint import make_random_checkpoint

    make_random_checkpoint(tmp_path)
    edit_json(tmp_path / "config.json", pad_token_id=500)
    message = os.path.join(str(tmp_path), "config.json") + ": key 'pad_token_id' = 500 is outside the vocabulary"
    assert _cpp_error(tmp_path).startswith(message) and _python_error(tmp_path).startswith(message)
    edit_json(tmp_path / "config.json", pad_token_id=[1])  # a list only where Dream allows one
    assert _cpp_error(tmp_path).endswith("config.json: key 'pad_token_id' must be an integer")
    assert "key 'pad_token_id' must be an integer" in _python_error(tmp_path)


def test_missing_mask_id_names_both_files(tmp_path):
    make_random_checkpoint(tmp_path, family="dream")
    edit_json(tmp_path / "config.json", mask_token_id=None)
    edit_json(tmp_path / "generation_config.json", mask_token_id=None)
    message = (
        os.path.join(str(tmp_path), "config.json") + ": required key 'mask_token_id' is missing "
        "(from config.json and generation_config.json)"
    )
    assert _cpp_error(tmp_path) == message == _python_error(tmp_path)
    edit_json(tmp_path / "generation_config.json", mask_token_id=500)  # read from there, and checked
    assert "key 'mask_token_id' = 500 is outside the vocabulary [0, 97)" in _cpp_error(tmp_path)


@pytest.mark.parametrize(
    "changes,pattern",
    [
        (
            dict(num_hidden_layers=10**8),
            r"config.json: key 'num_hidden_layers' = 100000000 is larger than the supported "
            r"maximum 65536",
        ),
        (
            dict(num_hidden_layers=1000),
            r"config.json: key 'num_hidden_layers' = 1000 needs 12003 tensors but the weight "
            r"files hold 27",
        ),
        (dict(max_position_embeddings=10**12), r"config.json: key 'max_position_embeddings' = 1000000000000 is larger"),
        (dict(intermediate_size=0), r"config.json: key 'intermediate_size' must be a positive integer, got 0"),
        (dict(tie_word_embeddings="false"), r"config.json: key 'tie_word_embeddings' must be true or false"),
        (dict(eos_token_id=96), r"config.json: key 'eos_token_id' = 96 equals mask_token_id"),
        (
            dict(model_type="dream"),
            r"config.json: key 'model_type' must be \"llada\", \"Dream\", \"llada2_moe\" or \"sdar\"",
        ),
    ],
)
def test_bad_dream_config_names_the_qwen2_key(tmp_path, changes, pattern):
    make_random_checkpoint(tmp_path, family="dream")
    edit_json(tmp_path / "config.json", **changes)
    assert re.search(pattern, _cpp_error(tmp_path))


@pytest.mark.parametrize("shards", [None, 30_000], ids=["single", "sharded"])
def test_missing_bias_names_the_tensor_and_file(tmp_path, shards):
    config = random_config("dream")
    weights = random_weights(config)
    del weights["model.layers.1.self_attn.k_proj.bias"]
    save_checkpoint(tmp_path, config, weights, max_shard_bytes=shards)
    listing = os.path.join(str(tmp_path), INDEX_NAME if shards else WEIGHTS_NAME)
    name = "model.layers.1.self_attn.k_proj.bias"
    # sharded, the index decides what exists: it is the index that leaves the tensor out
    absent = f"the index ({INDEX_NAME}) does not list tensor '{name}'" if shards else f"tensor '{name}' is missing"
    expected = f"{listing}: {absent} (Dream's q/k/v projections carry biases)"
    assert _cpp_error(tmp_path) == expected
    assert _python_error(tmp_path) == expected


def test_bad_dream_tensors(tmp_path):
    config = random_config("dream")
    weights = random_weights(config)
    weights["model.layers.0.self_attn.o_proj.bias"] = torch.zeros(config.d_model)  # Qwen2's o_proj has none
    save_checkpoint(tmp_path / "extra", config, weights)
    assert re.search(
        r"model.safetensors: unexpected tensor 'model.layers.0.self_attn.o_proj.bias' \(not part of a "
        r"Dream model with this config\)",
        _cpp_error(tmp_path / "extra"),
    )
    weights = random_weights(config)
    weights["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(config.d_model + 1)
    save_checkpoint(tmp_path / "shape", config, weights)
    assert re.search(
        r"model.safetensors: tensor 'model.layers.0.self_attn.q_proj.bias' has shape \[65\], "
        r"expected \[64\]",
        _cpp_error(tmp_path / "shape"),
    )
    # LLaDA names in a Dream folder: the Dream names are what is asked for.
    llada = random_config()
    save_checkpoint(tmp_path / "mixed", config, random_weights(llada))
    assert "tensor 'model.embed_tokens.weight' is missing" in _cpp_error(tmp_path / "mixed")
