"""Checkpoint folders: round trips, sharding, and every malformed input named in its error."""

import json
import os
import struct

import pytest
import torch

from blockbatch import CheckpointError, load_checkpoint
from blockbatch.families.llada import PREFIX
from blockbatch.loading import expected_weight_shapes, read_safetensors_header, save_checkpoint
from blockbatch.random_checkpoint import random_config, random_weights


def test_round_trip_single_file(make_ckpt):
    path, config = make_ckpt(seed=3, n_heads=4, n_kv_heads=2, d_model=64)
    ckpt = load_checkpoint(path)
    assert ckpt.config == config
    expected = random_weights(config, seed=3)
    assert set(ckpt.weights) == set(expected)
    for name, t in expected.items():
        assert torch.equal(ckpt.weights[name], t), name


def test_round_trip_sharded(make_ckpt):
    path, config = make_ckpt(seed=1, max_shard_bytes=40_000)
    files = sorted(os.listdir(path))
    assert "model.safetensors.index.json" in files
    assert len([f for f in files if f.endswith(".safetensors")]) > 2
    ckpt = load_checkpoint(path)
    for name, t in random_weights(config, seed=1).items():
        assert torch.equal(ckpt.weights[name], t), name


def test_weight_tying_has_no_lm_head(make_ckpt):
    path, config = make_ckpt(weight_tying=True)
    ckpt = load_checkpoint(path)
    assert PREFIX + "ff_out.weight" not in ckpt.weights
    assert PREFIX + "ff_out.weight" not in expected_weight_shapes(config)


def test_dtype_conversion_and_bf16_storage(make_ckpt):
    path, _ = make_ckpt(dtype=torch.bfloat16)
    assert load_checkpoint(path).dtype == torch.bfloat16
    assert load_checkpoint(path, dtype=torch.float32).dtype == torch.float32
    with pytest.raises(CheckpointError, match="dtype must be"):
        load_checkpoint(path, dtype=torch.int32)


# ----------------------------------------------------------------------------- bad input


def _rewrite_config(path, **changes):
    cfg_path = os.path.join(path, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    for k, v in changes.items():
        if v is None:
            cfg.pop(k)
        else:
            cfg[k] = v
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)


def test_missing_folder_and_files(tmp_path, make_ckpt):
    with pytest.raises(CheckpointError, match="not a checkpoint folder"):
        load_checkpoint(tmp_path / "nope")
    path, _ = make_ckpt()
    os.remove(os.path.join(path, "model.safetensors"))
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_checkpoint(path)
    path, _ = make_ckpt()
    os.remove(os.path.join(path, "config.json"))
    with pytest.raises(CheckpointError, match="config.json not found"):
        load_checkpoint(path)


def test_unknown_model_type(make_ckpt):
    path, _ = make_ckpt()
    _rewrite_config(path, model_type="gpt2")
    with pytest.raises(CheckpointError, match=r"config.json: key 'model_type' is 'gpt2'"):
        load_checkpoint(path)


def test_missing_config_key(make_ckpt):
    path, _ = make_ckpt()
    _rewrite_config(path, rope_theta=None)
    with pytest.raises(CheckpointError, match=r"config.json: required key 'rope_theta' is missing"):
        load_checkpoint(path)


def test_invalid_config_json(make_ckpt):
    path, _ = make_ckpt()
    with open(os.path.join(path, "config.json"), "w") as f:
        f.write("{not json")
    with pytest.raises(CheckpointError, match="config.json: not valid JSON"):
        load_checkpoint(path)


@pytest.mark.parametrize("key,value", [("mask_token_id", 97), ("mask_token_id", -1), ("eos_token_id", 1000)])
def test_special_id_outside_vocabulary(make_ckpt, key, value):
    path, _ = make_ckpt()
    _rewrite_config(path, **{key: value})
    with pytest.raises(CheckpointError, match=rf"key '{key}' = {value} is outside the vocabulary \[0, 97\)"):
        load_checkpoint(path)


def test_inconsistent_heads(make_ckpt):
    path, _ = make_ckpt()
    _rewrite_config(path, n_kv_heads=3)
    with pytest.raises(CheckpointError, match="key 'n_kv_heads' = 3 must divide n_heads"):
        load_checkpoint(path)


def _save_weights(path, config, weights):
    save_checkpoint(path, config, weights)


def test_missing_tensor(tmp_path):
    config = random_config()
    weights = random_weights(config)
    del weights[PREFIX + "blocks.1.up_proj.weight"]
    _save_weights(tmp_path, config, weights)
    with pytest.raises(CheckpointError, match=r"tensor 'model.transformer.blocks.1.up_proj.weight' is missing"):
        load_checkpoint(tmp_path)


def test_extra_tensor(tmp_path):
    config = random_config()
    weights = random_weights(config)
    weights[PREFIX + "blocks.0.q_norm.weight"] = torch.ones(4)
    _save_weights(tmp_path, config, weights)
    with pytest.raises(
        CheckpointError, match=r"model.safetensors: unexpected tensor 'model.transformer.blocks.0.q_norm"
    ):
        load_checkpoint(tmp_path)


def test_misshaped_tensor(tmp_path):
    config = random_config()
    weights = random_weights(config)
    weights[PREFIX + "blocks.0.k_proj.weight"] = torch.zeros(32, 64)
    _save_weights(tmp_path, config, weights)
    with pytest.raises(
        CheckpointError,
        match=r"tensor 'model.transformer.blocks.0.k_proj.weight' has shape \[32, 64\], "
        r"expected \[64, 64\]",
    ):
        load_checkpoint(tmp_path)


def test_wrong_dtype(tmp_path):
    config = random_config()
    weights = random_weights(config)
    weights[PREFIX + "ln_f.weight"] = torch.ones(64, dtype=torch.int64)
    _save_weights(tmp_path, config, weights)
    with pytest.raises(CheckpointError, match=r"tensor 'model.transformer.ln_f.weight' has dtype I64"):
        load_checkpoint(tmp_path)


def test_mixed_dtypes_need_explicit_dtype(tmp_path):
    config = random_config()
    weights = random_weights(config)
    weights[PREFIX + "ln_f.weight"] = weights[PREFIX + "ln_f.weight"].bfloat16()
    _save_weights(tmp_path, config, weights)
    with pytest.raises(CheckpointError, match="mix dtypes"):
        load_checkpoint(tmp_path)
    assert load_checkpoint(tmp_path, dtype=torch.float32).dtype == torch.float32


def test_truncated_safetensors(make_ckpt):
    path, _ = make_ckpt()
    f = os.path.join(path, "model.safetensors")
    size = os.path.getsize(f)
    with open(f, "r+b") as fh:
        fh.truncate(size - 100)
    with pytest.raises(
        CheckpointError,
        match=r"model.safetensors: tensor '.*': data_offsets end \d+ is past the data "
        r"section .* truncated",
    ):
        load_checkpoint(path)
    with open(f, "r+b") as fh:
        fh.truncate(5)
    with pytest.raises(CheckpointError, match="too short for a safetensors header"):
        load_checkpoint(path)


def _patch_header(path, mutate):
    with open(path, "rb") as fh:
        data = fh.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    mutate(header)
    raw = json.dumps(header).encode()
    raw += b" " * (n - len(raw)) if len(raw) <= n else b""
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw + data[8 + n :])


def test_header_offsets_that_lie(make_ckpt):
    path, _ = make_ckpt()
    f = os.path.join(path, "model.safetensors")
    name = PREFIX + "ln_f.weight"

    def shift(header):
        b, e = header[name]["data_offsets"]
        header[name]["data_offsets"] = [b + 4, e + 4]

    _patch_header(f, shift)
    with pytest.raises(CheckpointError, match=r"model.safetensors: tensor '.*'"):
        load_checkpoint(path)

    path, _ = make_ckpt()
    f = os.path.join(path, "model.safetensors")

    def lie_about_size(header):
        b, e = header[name]["data_offsets"]
        header[name]["data_offsets"] = [b, e - 4]

    _patch_header(f, lie_about_size)
    with pytest.raises(
        CheckpointError, match=rf"tensor '{name}': data_offsets .* span 252 bytes but F32\[64\] needs 256"
    ):
        load_checkpoint(path)


def test_header_length_lies(make_ckpt):
    path, _ = make_ckpt()
    f = os.path.join(path, "model.safetensors")
    with open(f, "r+b") as fh:
        fh.write(struct.pack("<Q", 10**12))
    with pytest.raises(CheckpointError, match="header length 1000000000000 does not fit"):
        read_safetensors_header(f)


def test_header_not_json(make_ckpt):
    path, _ = make_ckpt()
    f = os.path.join(path, "model.safetensors")
    with open(f, "r+b") as fh:
        fh.seek(8)
        fh.write(b"!!")
    with pytest.raises(CheckpointError, match="header is not valid JSON"):
        load_checkpoint(path)


def test_sharded_index_problems(make_ckpt):
    path, _ = make_ckpt(max_shard_bytes=40_000)
    index = os.path.join(path, "model.safetensors.index.json")
    with open(index) as f:
        data = json.load(f)
    first = sorted(set(data["weight_map"].values()))[0]
    os.remove(os.path.join(path, first))
    with pytest.raises(CheckpointError, match=rf"lives in missing shard {first}"):
        load_checkpoint(path)

    path, _ = make_ckpt(max_shard_bytes=40_000)
    index = os.path.join(path, "model.safetensors.index.json")
    with open(index) as f:
        data = json.load(f)
    name = PREFIX + "wte.weight"
    other = [s for s in sorted(set(data["weight_map"].values())) if s != data["weight_map"][name]][0]
    data["weight_map"][name] = other
    with open(index, "w") as f:
        json.dump(data, f)
    with pytest.raises(CheckpointError, match=rf"{other}: tensor '{name}' is listed in the index but absent"):
        load_checkpoint(path)


def test_bad_tokenizer_file(make_ckpt):
    path, _ = make_ckpt()
    with open(os.path.join(path, "tokenizer.json"), "w") as f:
        f.write("{}")
    with pytest.raises(CheckpointError, match="tokenizer.json: cannot parse tokenizer"):
        load_checkpoint(path)


# --------------------------------------------------------------------------- cheap bounds first


def _toy_copy(tmp_path, family="llada2"):
    import shutil

    from blockbatch import toy

    dst = tmp_path / f"toy-{family}"
    shutil.copytree(toy.checkpoint_path(family), dst)
    return dst


def _edit_config(folder, **changes):
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        raw = json.load(f)
    raw.update(changes)
    with open(path, "w") as f:
        json.dump(raw, f)


@pytest.mark.parametrize(
    "changes",
    [
        dict(num_experts=65536, n_group=1, topk_group=1),
        dict(num_experts=65536, num_hidden_layers=4096),
        dict(num_hidden_layers=65536),
    ],
    ids=["experts", "experts-and-layers", "layers"],
)
def test_loader_bounds_the_tensor_count_by_the_files_before_listing(tmp_path, changes):
    """A 700-byte config.json implying far more tensors than the files hold is refused at the count
    (computed, not listed), before any list of names or shapes is built: in well under a second."""
    import time

    folder = _toy_copy(tmp_path)
    _edit_config(folder, **changes)
    start = time.perf_counter()
    with pytest.raises(
        CheckpointError, match=r"config.json: keys? 'num_hidden_layers' = \d+.* need.* tensors but .* holds"
    ):
        load_checkpoint(folder)
    assert time.perf_counter() - start < 1.0


def test_missing_tensor_of_a_sharded_folder_is_not_listed_by_the_index(tmp_path):
    """Sharded: the index decides what exists, so the message says the index leaves the tensor out."""
    from blockbatch.loading import INDEX_NAME

    config = random_config()
    weights = random_weights(config)
    del weights[PREFIX + "blocks.1.up_proj.weight"]
    save_checkpoint(tmp_path, config, weights, max_shard_bytes=20_000)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(tmp_path)
    assert str(e.value) == (
        f"{tmp_path / INDEX_NAME}: the index ({INDEX_NAME}) does not list tensor '{PREFIX}blocks.1.up_proj.weight'"
    )


# --------------------------------------------------------------------------- finite weights

FAMILY_TENSORS = {
    "llada": PREFIX + "ff_out.weight",
    "dream": "lm_head.weight",
    "llada2": "model.layers.1.mlp.gate.weight",  # one router row: every answer pad tokens after 63 forwards
    "sdar": "model.layers.1.self_attn.o_proj.weight",
}


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("family", list(FAMILY_TENSORS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_non_finite_weight_is_refused_naming_tensor_and_file(tmp_path, family, bad, dtype):
    from blockbatch.random_checkpoint import random_config as family_config
    from blockbatch.random_checkpoint import random_weights as family_weights

    config = family_config(family)
    weights = family_weights(config, dtype=dtype)
    name = FAMILY_TENSORS[family]
    weights[name][1, 3] = bad
    save_checkpoint(tmp_path, config, weights)
    what = "NaN" if bad != bad else "Inf"
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(tmp_path)
    assert str(e.value).startswith(
        f"{tmp_path / 'model.safetensors'}: tensor '{name}' holds a non-finite value ({what})"
    ), str(e.value)
    # the opt-out for speed: the same folder loads, the value kept as stored
    loaded = load_checkpoint(tmp_path, check_finite=False)
    assert not torch.isfinite(loaded.weights[name][1, 3])


def test_non_finite_check_covers_every_shard(tmp_path):
    config = random_config()
    weights = random_weights(config)
    weights[PREFIX + "blocks.1.attn_norm.weight"][0] = float("nan")
    save_checkpoint(tmp_path, config, weights, max_shard_bytes=20_000)
    with pytest.raises(CheckpointError, match=r"model-\d+-of-\d+\.safetensors: tensor '.*blocks.1.attn_norm.weight'"):
        load_checkpoint(tmp_path)


def test_check_finite_env_var_opts_out_and_is_checked(tmp_path, monkeypatch):
    config = random_config()
    weights = random_weights(config)
    weights[PREFIX + "wte.weight"][0, 0] = float("nan")
    save_checkpoint(tmp_path, config, weights)
    monkeypatch.setenv("BLOCKBATCH_CHECK_FINITE", "0")
    load_checkpoint(tmp_path)  # skipped on request
    with pytest.raises(CheckpointError, match="holds a non-finite value"):
        load_checkpoint(tmp_path, check_finite=True)  # the keyword wins over the variable
    monkeypatch.setenv("BLOCKBATCH_CHECK_FINITE", "no")
    with pytest.raises(CheckpointError, match=r"BLOCKBATCH_CHECK_FINITE must be '0' or '1', got 'no'"):
        load_checkpoint(tmp_path)


def test_clean_toys_pass_the_finite_check():
    from blockbatch import toy

    for family in ("llada", "dream", "llada2", "sdar"):
        load_checkpoint(toy.checkpoint_path(family), check_finite=True)


# --------------------------------------------------------------------------- the user's key names


@pytest.mark.parametrize(
    "changes,message",
    [
        (dict(num_hidden_layers=0), "key 'num_hidden_layers' must be a positive integer, got 0"),
        (dict(max_position_embeddings=2**21), "key 'max_position_embeddings' = 2097152 is larger"),
        (dict(hidden_size=66, num_attention_heads=6, num_key_value_heads=6), "key 'num_attention_heads' gives an odd"),
        (dict(intermediate_size=-4), "key 'intermediate_size' must be a positive integer, got -4"),
        (dict(num_hidden_layers=2**64), "key 'num_hidden_layers' = 18446744073709551616 does not fit in 64 bits"),
    ],
    ids=["layers-0", "positions-huge", "odd-head-dim", "intermediate-negative", "past-int64"],
)
def test_dream_errors_name_the_users_key_not_a_field(tmp_path, changes, message):
    from blockbatch.random_checkpoint import make_random_checkpoint

    make_random_checkpoint(tmp_path, family="dream")
    _edit_config(tmp_path, **changes)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(tmp_path)
    assert str(e.value).startswith(f"{tmp_path / 'config.json'}: {message}"), str(e.value)


def test_llada_mlp_ratio_giving_width_0_names_mlp_ratio(tmp_path, make_ckpt):
    path, _ = make_ckpt()
    with open(os.path.join(path, "config.json")) as f:
        raw = json.load(f)
    del raw["mlp_hidden_size"]
    raw["mlp_ratio"] = 0.001
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(raw, f)
    with pytest.raises(CheckpointError, match=r"key 'mlp_ratio' \* d_model = 0.001 \* 64 gives an MLP width of 0"):
        load_checkpoint(path)
