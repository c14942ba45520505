"""The C++ checkpoint reader (csrc/io/checkpoint.cpp, used by the bb_* binaries) on LLaDA2 checkpoints.

Hugging Face LLaDA2 folders (``model_type: "llada2_moe"``: Qwen2-style keys plus ``head_dim``,
``partial_rotary_factor``, ``use_qk_norm`` and the mixture-of-experts keys, each with the default
of families/llada2.py ``read_config`` when absent) are read through ``bb_forward``, whose first line
says what the reader made of ``config.json``: every field must equal the Python loader's, and the
forward must equal the one built from the Python loader's weights. ``bb_bench_decode`` decodes the
shipped trained toy with the family's defaults (policy 'block', threshold 0.95) to the tokens and
forwards of blockbatch's Engine. A broken folder is refused naming the key, or the tensor and file.
"""

import json
import os
import re
import subprocess

import pytest
import torch

import blockbatch
from blockbatch import Engine, toy
from blockbatch.errors import CheckpointError
from blockbatch.families import llada2 as fam
from blockbatch.loading import INDEX_NAME, WEIGHTS_NAME, save_checkpoint
from blockbatch.native import NativeModel
from blockbatch.random_checkpoint import make_random_checkpoint
from blockbatch.toy import task as toy_task
from helpers.bb_forward import assert_forward_matches

BIN_DIR = os.path.join(os.path.dirname(blockbatch.__file__), "bin")
ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "LD_LIBRARY_PATH": os.pathsep.join(
        p for p in (os.environ.get("LD_LIBRARY_PATH"), os.path.join(os.path.dirname(torch.__file__), "lib")) if p
    ),
}
INT_FIELDS = (
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
    "head_size",
    "rope_dims",
    "num_experts",
    "experts_per_token",
    "expert_groups",
    "expert_groups_kept",
    "moe_hidden_size",
    "shared_experts",
    "first_dense_layers",
)
BOOL_FIELDS = ("weight_tying", "attention_bias", "qk_norm", "attn_out_bias")
FLOAT_FIELDS = ("rope_theta", "rms_norm_eps", "routed_scaling")
TOY = toy.checkpoint_path("llada2")


def bb_forward(path, *args):
    return subprocess.run(
        [os.path.join(BIN_DIR, "bb_forward"), "--model", str(path), "--iters", "1", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )


def bb_bench_decode(path, prompts, *args):
    return subprocess.run(
        [os.path.join(BIN_DIR, "bb_bench_decode"), "--model", str(path), "--prompts", str(prompts), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
    )


def read_config_line(stdout):
    """The ``model family=... key=value ...`` line the bb_* binaries print after loading, as a dict."""
    line = re.search(r"^model (.*)$", stdout, re.M)
    assert line, stdout
    return dict(item.split("=", 1) for item in line[1].split())


def assert_config_read(seen, config):
    """Every ModelConfig field the C++ reader printed equals ``config``'s (the Python loader's)."""
    assert seen["family"] == "llada2"
    for key in INT_FIELDS:
        assert int(seen[key]) == getattr(config, key), key
    for key in BOOL_FIELDS:
        assert int(seen[key]) == int(getattr(config, key)), key
    for key in FLOAT_FIELDS:
        assert float(seen[key]) == getattr(config, key), key


def edit_json(path, **changes):
    """Set (or, with value None, delete) keys of a JSON file; a value ``NULL`` writes JSON null."""
    with open(path) as f:
        data = json.load(f)
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = None if value is NULL else value
    with open(path, "w") as f:
        json.dump(data, f)


NULL = object()


def _small(**overrides):
    """A two-layer LLaDA2 shape: a dense layer, then 8 experts in 4 groups (top-2 of 2 kept groups)
    plus a shared expert; RoPE on half of each 16-dim head, QK-norm, GQA 4 / 2."""
    return {**dict(n_layers=2, num_experts=8, expert_groups=4, expert_groups_kept=2, first_dense_layers=1), **overrides}


# --------------------------------------------------------------------------- reading


@pytest.mark.parametrize("shards", [None, 30_000], ids=["single", "sharded"])
@pytest.mark.parametrize("mode", ["dual", "prefix", "full"])
def test_llada2_forward_matches_python_loader(tmp_path, shards, mode):
    config = make_random_checkpoint(
        tmp_path, seed=5, logit_scale=2.0, max_shard_bytes=shards, family="llada2", **_small()
    )
    assert (
        config.qk_norm and config.rope_dim == config.head_dim // 2 and config.moe_layer(1) and not config.moe_layer(0)
    )
    with open(tmp_path / "config.json") as f:
        raw = json.load(f)
    assert raw["model_type"] == "llada2_moe" and raw["architectures"] == ["LLaDA2MoeModelLM"]  # the published layout
    if shards:
        with open(tmp_path / INDEX_NAME) as f:
            assert len(set(json.load(f)["weight_map"].values())) > 3
        assert not os.path.exists(tmp_path / WEIGHTS_NAME)
    lengths, L = [3, 5, 8], 20
    res = bb_forward(tmp_path, "--mode", mode, "--lengths", ",".join(map(str, lengths)), "--canvas", L)
    assert res.returncode == 0, res.stderr
    ckpt = blockbatch.load_checkpoint(tmp_path)  # the Python loader path
    assert ckpt.config == config
    assert_config_read(read_config_line(res.stdout), ckpt.config)
    assert_forward_matches(res.stdout, NativeModel(ckpt.config, ckpt.weights), config.vocab_size, mode, lengths, L)


# config.json edits (and the random shape they are made on), each read by both loaders to the same config.
CONFIG_VARIANTS = {
    # every key whose default families/llada2.py read_config supplies, left out (rms_norm_eps, the
    # RoPE base, the maximum length and the MoE scaling then take the authors' defaults)
    "defaults": (
        _small(),
        dict(
            head_dim=None,
            partial_rotary_factor=None,
            rope_theta=None,
            rms_norm_eps=None,
            tie_word_embeddings=None,
            use_qkv_bias=None,
            use_qk_norm=None,
            max_position_embeddings=None,
            num_experts_per_tok=None,
            routed_scaling_factor=None,
            hidden_act=None,
            score_function=None,
            norm_topk_prob=None,
            pad_token_id=None,
        ),
    ),
    "null-is-default": (
        _small(),
        dict(
            rope_theta=NULL, use_qk_norm=NULL, num_experts_per_tok=NULL, routed_scaling_factor=NULL, pad_token_id=NULL
        ),
    ),
    "dense": (dict(n_layers=2, num_experts=0), dict(num_experts=NULL)),
    # every layer a mixture: intermediate_size is not needed then (it reads moe_intermediate_size)
    "all-moe": (_small(first_dense_layers=0), dict(intermediate_size=None)),
    "biases-tied-full-rotary": (
        _small(weight_tying=True, attention_bias=True, attn_out_bias=True, rope_dims=16, shared_experts=0),
        dict(eos_token_id=[95, 3], pad_token_id=[0], use_bias=None),  # use_bias: true unless told
    ),
}


@pytest.mark.parametrize("variant", list(CONFIG_VARIANTS))
def test_config_keys_read_as_python_reads_them(tmp_path, variant):
    shape, changes = CONFIG_VARIANTS[variant]
    make_random_checkpoint(tmp_path, seed=7, logit_scale=2.0, family="llada2", **shape)
    edit_json(tmp_path / "config.json", **changes)
    ckpt = blockbatch.load_checkpoint(tmp_path)
    if variant == "defaults":
        c = ckpt.config
        assert (c.rms_norm_eps, c.max_sequence_length, c.rope_theta, c.routed_scaling) == (1e-5, 32768, 10000.0, 2.5)
        assert c.qk_norm and c.rope_dim == c.head_dim // 2 == 8
    lengths, L = [4, 6], 16
    res = bb_forward(tmp_path, "--mode", "dual", "--lengths", "4,6", "--canvas", L)
    assert res.returncode == 0, res.stderr
    assert_config_read(read_config_line(res.stdout), ckpt.config)
    assert_forward_matches(
        res.stdout, NativeModel(ckpt.config, ckpt.weights), ckpt.config.vocab_size, "dual", lengths, L
    )


def test_reads_the_trained_toy():
    res = bb_forward(TOY, "--mode", "dual", "--lengths", "5,12,32", "--canvas", 64)
    assert res.returncode == 0, res.stderr
    ckpt = blockbatch.load_checkpoint(TOY)
    assert ckpt.config.family == "llada2" and ckpt.config.num_experts == 8
    assert_config_read(read_config_line(res.stdout), ckpt.config)
    model = NativeModel(ckpt.config, ckpt.weights)
    assert_forward_matches(res.stdout, model, ckpt.config.vocab_size, "dual", [5, 12, 32], 64)


@pytest.fixture(scope="module")
def toy_engine():
    return Engine.from_pretrained(TOY)


def _toy_prompts(engine, n=6):
    return [engine.encode(p.prompt, chat=False).tolist() for p in toy_task.make_problems(n, seed=1000, split="test")]


@pytest.mark.parametrize(
    "flags,overrides",
    [
        ([], {}),  # the family's defaults: policy block, threshold 0.95
        (["--block-length", "16", "--threshold", "0.8"], dict(block_length=16, threshold=0.8)),
        (["--policy", "block", "--threshold", "none", "--steps", "4"], dict(threshold=None, steps=4)),
    ],
    ids=["family-defaults", "block16-t0.8", "fixed-steps"],
)
def test_bench_decode_decodes_the_toy_as_the_engine_does(tmp_path, toy_engine, flags, overrides):
    """bb_bench_decode reads the toy with the C++ reader and decodes it natively: the generated ids
    equal blockbatch's Engine on the same prompts and options (--verify), and so does the mean NFE."""
    options = toy_engine.default_options(gen_length=64, **overrides)
    assert options.policy == "block"
    prompts = _toy_prompts(toy_engine)
    outs = toy_engine.generate(prompts, options)
    if not flags:
        # These prompts tell the family's threshold from the options table's 0.9 (one decodes in fewer
        # forwards), so the NFE check below sees the binary's threshold default, not only its policy.
        looser = toy_engine.generate(prompts, toy_engine.default_options(gen_length=64, threshold=0.9))
        assert [o.stats["nfe"] for o in looser] != [o.stats["nfe"] for o in outs]
    lines = [{"prompt_ids": p, "expected_ids": o.raw_ids} for p, o in zip(prompts, outs)]
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    res = bb_bench_decode(TOY, path, "--gen-length", 64, "--verify", *flags)
    assert res.returncode == 0, res.stdout + res.stderr
    assert_config_read(read_config_line(res.stdout), toy_engine.config)
    result = re.search(r"^result policy=(\S+) dtype=float32 prompts=6 gen_length=64 nfe_mean=(\S+) ", res.stdout, re.M)
    assert result, res.stdout
    assert result[1] == "block"
    assert float(result[2]) == pytest.approx(sum(o.stats["nfe"] for o in outs) / len(outs), abs=0.005)
    assert "Disposition: Passed" in res.stdout
    # A wrong expectation is caught.
    lines[2]["expected_ids"][-1] = (lines[2]["expected_ids"][-1] + 1) % toy_engine.config.vocab_size
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    res = bb_bench_decode(TOY, path, "--gen-length", 64, "--verify", *flags)
    assert res.returncode == 3 and "Disposition: Failed (1 of 6 prompts differ)" in res.stdout


def test_bench_decode_defaults_are_the_familys():
    """The binary's LLaDA2 defaults (bb_bench_decode.cpp apply_family_defaults) are the Python
    family's (families/llada2.py DEFAULT_OPTIONS), as its --help says."""
    assert fam.DEFAULT_OPTIONS == {"policy": "block", "threshold": 0.95}
    res = subprocess.run(
        [os.path.join(BIN_DIR, "bb_bench_decode"), "--help"], capture_output=True, text=True, timeout=60, env=ENV
    )
    assert res.returncode == 0 and re.search(r"on LLaDA2 checkpoints.*\n?.*block with threshold 0\.95", res.stdout)


def test_bench_decode_refuses_other_policies_on_llada2(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt_ids": [1, 2, 3]}\n')
    res = bb_bench_decode(TOY, prompts, "--policy", "blockbatch", "--gen-length", 16)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "policy 'blockbatch' is not defined on llada2 checkpoints" in res.stderr
    assert "model family=" not in res.stdout  # refused before the weights are loaded
    # and the block decoder on a bidirectional (LLaDA) checkpoint
    make_random_checkpoint(tmp_path / "llada", seed=1)
    res = bb_bench_decode(tmp_path / "llada", prompts, "--policy", "block", "--gen-length", 16)
    assert res.returncode == 2 and "policy 'block' is the decoder of block-causal checkpoints" in res.stderr
    # an option the block policy reads (LLaDA2.1's editing) is taken without --policy on LLaDA2
    res = bb_bench_decode(TOY, prompts, "--gen-length", 16, "--edit-threshold", 0.5)
    assert res.returncode == 0, res.stderr
    assert re.search(r"^result policy=block ", res.stdout, re.M)


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
        (dict(moe_intermediate_size=None), "required key 'moe_intermediate_size' is missing (num_experts is set)"),
        (dict(intermediate_size=None), "required key 'intermediate_size' is missing (dense MLP layers)"),
        (dict(num_hidden_layers=None), "required key 'num_hidden_layers' is missing"),
        (dict(num_attention_heads=0), "key 'num_attention_heads' must be a positive integer, got 0"),
        (dict(num_key_value_heads=3), "key 'num_key_value_heads' = 3 must divide num_attention_heads = 4"),
        (dict(mask_token_id=500), "key 'mask_token_id' = 500 is outside the vocabulary [0, 97)"),
        (
            dict(mask_token_id=None),
            "key 'mask_token_id' = 156895 is outside the vocabulary [0, 97) (the authors' default)",
        ),
        (dict(pad_token_id=97), "key 'pad_token_id' = 97 is outside the vocabulary [0, 97)"),
        (dict(partial_rotary_factor=1.5), "key 'partial_rotary_factor' must be a number in (0, 1], got 1.5"),
        (dict(partial_rotary_factor=NULL), "key 'partial_rotary_factor' must be a number in (0, 1], got"),
        (dict(score_function="softmax"), "key 'score_function' is 'softmax'; LLaDA2 checkpoints use 'sigmoid'"),
        (dict(hidden_act="gelu"), "key 'hidden_act' is 'gelu'; LLaDA2 checkpoints use 'silu'"),
        (dict(norm_topk_prob=False), "key 'norm_topk_prob' must be true"),
        (dict(n_group=3), "key 'n_group' = 3 must divide num_experts = 8 into groups of at least 2"),
        (dict(topk_group=5), "key 'topk_group' = 5 must be in [1, n_group = 4]"),
        (dict(num_experts_per_tok=5), "key 'num_experts_per_tok' = 5 must be in [1, 4]"),
        (
            dict(partial_rotary_factor=0.1),
            "key 'partial_rotary_factor' gives head_dim * partial_rotary_factor = 1 rotary dims (head_dim = 16); "
            "they must be even and in (0, head_dim]",
        ),
        (dict(routed_scaling_factor=0), "key 'routed_scaling_factor' must be a positive finite number, got 0"),
    ],
)
def test_bad_llada2_config_names_the_key_as_python_does(tmp_path, changes, message):
    make_random_checkpoint(tmp_path, family="llada2", **_small())
    edit_json(tmp_path / "config.json", **changes)
    where = os.path.join(str(tmp_path), "config.json")
    cpp = _cpp_error(tmp_path)
    assert cpp.startswith(where + ": " + message), cpp
    assert _python_error(tmp_path).startswith(where + ": " + message)


@pytest.mark.parametrize(
    "changes,pattern",
    [
        (
            dict(model_type="llada2"),
            r"config.json: key 'model_type' must be \"llada\", \"Dream\", \"llada2_moe\" or \"sdar\"",
        ),
        (dict(hidden_size=0), r"config.json: key 'hidden_size' must be a positive integer, got 0"),
        (dict(num_hidden_layers=10**8), r"config.json: key 'num_hidden_layers' = 100000000 is larger than"),
        (dict(num_hidden_layers=1000), r"config.json: key 'num_hidden_layers' = 1000 needs \d+ tensors but the weight"),
        (dict(num_experts=4096), r"config.json: keys 'num_hidden_layers' = 2 and 'num_experts' = 4096 need 12\d+ tens"),
        (dict(use_qk_norm="true"), r"config.json: key 'use_qk_norm' must be true or false"),
        (dict(vocab_size=97.0), r"config.json: key 'vocab_size' must be an integer"),
    ],
)
def test_bad_llada2_config_names_the_key_the_file_holds(tmp_path, changes, pattern):
    """Checks of the shared validator speak of the config.json key (hidden_size, not d_model)."""
    make_random_checkpoint(tmp_path, family="llada2", **_small())
    edit_json(tmp_path / "config.json", **changes)
    assert re.search(pattern, _cpp_error(tmp_path))
    _python_error(tmp_path)  # the Python loader refuses it too


def test_missing_num_experts_takes_the_default_and_names_the_tensor(tmp_path):
    """num_experts absent means the authors' 16 experts: the router of the 8-expert weights has the
    wrong shape, named with its file by both loaders."""
    make_random_checkpoint(tmp_path, family="llada2", **_small())
    edit_json(tmp_path / "config.json", num_experts=None)
    message = "tensor 'model.layers.1.mlp.gate.weight' has shape [8, 64], expected [16, 64]"
    file = os.path.join(str(tmp_path), WEIGHTS_NAME)
    assert _cpp_error(tmp_path) == f"{file}: {message}"
    assert _python_error(tmp_path) == f"{file}: {message}"


@pytest.mark.parametrize("shards", [None, 30_000], ids=["single", "sharded"])
def test_bad_expert_tensors_name_the_tensor_and_file(tmp_path, shards):
    from blockbatch.families.llada2 import random_config, random_weights

    config = random_config(**_small())
    name = "model.layers.1.mlp.experts.5.up_proj.weight"

    weights = random_weights(config)
    weights[name] = torch.zeros(config.moe_hidden_size + 1, config.d_model)
    save_checkpoint(tmp_path / "shape", config, weights, max_shard_bytes=shards)
    cpp = _cpp_error(tmp_path / "shape")
    assert re.fullmatch(
        rf"{re.escape(str(tmp_path / 'shape'))}/model\S*\.safetensors: tensor '{name}' has shape "
        r"\[33, 64\], expected \[32, 64\]",
        cpp,
    ), cpp
    assert _python_error(tmp_path / "shape") == cpp  # the same file: the shard that holds it

    weights = random_weights(config)
    del weights["model.layers.1.mlp.experts.5.down_proj.weight"]
    save_checkpoint(tmp_path / "missing", config, weights, max_shard_bytes=shards)
    listing = os.path.join(str(tmp_path / "missing"), INDEX_NAME if shards else WEIGHTS_NAME)
    absent = (
        f"the index ({INDEX_NAME}) does not list tensor 'model.layers.1.mlp.experts.5.down_proj.weight'"
        if shards
        else "tensor 'model.layers.1.mlp.experts.5.down_proj.weight' is missing"
    )
    expected = f"{listing}: {absent} (the layers from first_k_dense_replace on are mixtures of experts)"
    assert _cpp_error(tmp_path / "missing") == expected
    assert _python_error(tmp_path / "missing") == expected

    weights = random_weights(config)
    weights["model.layers.0.mlp.experts.0.up_proj.weight"] = torch.zeros(config.moe_hidden_size, config.d_model)
    save_checkpoint(tmp_path / "extra", config, weights, max_shard_bytes=shards)
    cpp = _cpp_error(tmp_path / "extra")
    assert re.fullmatch(
        rf"{re.escape(str(tmp_path / 'extra'))}/model\S*\.safetensors: unexpected tensor "
        r"'model.layers.0.mlp.experts.0.up_proj.weight' \(not part of a LLaDA2 model with this config\)",
        cpp,
    ), cpp
    assert _python_error(tmp_path / "extra") == cpp


# --------------------------------------------------------------------------- "unset" is not 0

# config.json changes the reference refuses (reference/llada2.py cfg_ok: rope_dim = int(head_dim *
# partial_rotary_factor) even and in (0, head_dim]) that once loaded as "RoPE on the whole head", with the
# message each front door must give. The _small() shape has head_dim 16.
ROTARY_REFUSED = "key 'partial_rotary_factor' gives head_dim * partial_rotary_factor = {} rotary dims (head_dim = {}); "
ROTARY_RULE = "they must be even and in (0, head_dim]"
ZERO_AS_UNSET = {
    "factor-0.01": (dict(partial_rotary_factor=0.01), ROTARY_REFUSED.format(0, 16) + ROTARY_RULE),
    "factor-0.03": (dict(partial_rotary_factor=0.03), ROTARY_REFUSED.format(0, 16) + ROTARY_RULE),
    "factor-1e-300": (dict(partial_rotary_factor=1e-300), ROTARY_REFUSED.format(0, 16) + ROTARY_RULE),
    "odd-rope-dims": (dict(partial_rotary_factor=0.5625), ROTARY_REFUSED.format(9, 16) + ROTARY_RULE),
    "head-dim-0": (dict(head_dim=0), "key 'head_dim' = 0 must be in [1, "),
    "head-dim-0-factor-1": (dict(head_dim=0, partial_rotary_factor=1.0), "key 'head_dim' = 0 must be in [1, "),
    "head-dim-2-factor-0.5": (dict(head_dim=2), ROTARY_REFUSED.format(1, 2) + ROTARY_RULE),
}


def _handle_error(changes):
    """The Python -> C++ handle (torch.classes.blockbatch.Model, what NativeModel builds) given the fields the
    change implies, Python's own checks bypassed: C++ must refuse them by itself."""
    config = fam.random_config(**_small())
    head = changes.get("head_dim", config.head_dim)
    ints = config.int_fields() | {"head_size": head, "rope_dims": int(head * changes.get("partial_rotary_factor", 0.5))}
    with pytest.raises(ValueError) as e:
        torch.classes.blockbatch.Model(ints, config.float_fields(), fam.random_weights(config), "")
    return str(e.value).splitlines()[0]


@pytest.mark.parametrize("door", ["python", "cpp", "handle"])
@pytest.mark.parametrize("case", list(ZERO_AS_UNSET))
def test_zero_rotary_or_head_dim_is_refused_not_read_as_unset(tmp_path, door, case):
    """A 0 (given, or derived as int(head_dim * factor)) is a value the reference refuses, never "the whole
    head": every front door refuses it with the reference's rule and the key the file holds."""
    changes, message = ZERO_AS_UNSET[case]
    if door == "handle":
        assert message in _handle_error(changes)
        return
    make_random_checkpoint(tmp_path, family="llada2", **_small())
    edit_json(tmp_path / "config.json", **changes)
    where = os.path.join(str(tmp_path), "config.json")
    error = _cpp_error(tmp_path) if door == "cpp" else _python_error(tmp_path)
    assert error.startswith(f"{where}: {message}"), error


@pytest.mark.parametrize("factor,rope", [(1.0, 16), (0.25, 4), (0.125, 2), (0.5, 8)])
def test_every_rotary_width_the_reference_allows_still_loads(tmp_path, factor, rope):
    """Clean cases stay clean: each even width in (0, head_dim] loads in both loaders, read the same."""
    make_random_checkpoint(tmp_path, family="llada2", **_small())
    edit_json(tmp_path / "config.json", partial_rotary_factor=factor)
    config = blockbatch.load_checkpoint(tmp_path).config
    assert config.rope_dim == rope
    res = bb_forward(tmp_path)
    assert res.returncode == 0, res.stderr
    assert int(read_config_line(res.stdout)["rope_dims"]) == rope


@pytest.mark.parametrize("door", ["python", "cpp"])
def test_zero_experts_is_refused_not_read_as_dense(tmp_path, door):
    """num_experts 0 is not null (dense): it is refused by both loaders, naming the key."""
    make_random_checkpoint(tmp_path, family="llada2", **_small())
    edit_json(tmp_path / "config.json", num_experts=0)
    error = _cpp_error(tmp_path) if door == "cpp" else _python_error(tmp_path)
    where = os.path.join(str(tmp_path), "config.json")
    assert error == f"{where}: key 'num_experts' = 0 must be in [1, 65536] (or null: every layer dense)", error


@pytest.mark.parametrize("door", ["python", "cpp"])
def test_derived_head_dim_0_names_the_heads(tmp_path, door):
    """head_dim absent and hidden_size // num_attention_heads == 0: refused naming the keys that made it."""
    make_random_checkpoint(tmp_path, family="llada2", **_small())
    edit_json(tmp_path / "config.json", head_dim=None, num_attention_heads=128, num_key_value_heads=128)
    error = _cpp_error(tmp_path) if door == "cpp" else _python_error(tmp_path)
    assert "key 'num_attention_heads' = 128 is more than hidden_size = 64" in error, error


# --------------------------------------------------------------------------- the user's key names

USER_KEYS = {
    "layers-0": (dict(num_hidden_layers=0), "key 'num_hidden_layers' must be a positive integer, got 0"),
    "positions-huge": (dict(max_position_embeddings=2**21), "key 'max_position_embeddings' = 2097152 is larger"),
    "head-dim-odd": (dict(head_dim=33), "key 'head_dim' = 33 is odd"),
    "kv-heads-0": (dict(num_key_value_heads=0), "key 'num_key_value_heads' = 0 must divide num_attention_heads"),
    "intermediate-0": (dict(intermediate_size=0), "key 'intermediate_size' must be a positive integer, got 0"),
    "experts-past-int64": (dict(num_experts=2**70), "key 'num_experts' = 1180591620717411303424 does not fit in 64"),
    "head-dim-past-int64": (dict(head_dim=2**64), "key 'head_dim' = 18446744073709551616 does not fit in 64 bits"),
    "groups-past-int64": (dict(n_group=-(2**70)), "key 'n_group' = -1180591620717411303424 does not fit in 64 bits"),
}


@pytest.mark.parametrize("door", ["python", "cpp"])
@pytest.mark.parametrize("case", list(USER_KEYS))
def test_llada2_errors_name_the_users_key_not_a_field(tmp_path, door, case):
    """Errors speak of the key config.json holds (num_hidden_layers, not n_layers), integers past int64
    included (not a TorchScript schema message)."""
    changes, message = USER_KEYS[case]
    make_random_checkpoint(tmp_path, family="llada2", **_small())
    edit_json(tmp_path / "config.json", **changes)
    where = os.path.join(str(tmp_path), "config.json")
    error = _cpp_error(tmp_path) if door == "cpp" else _python_error(tmp_path)
    if door == "cpp" and "past-int64" in case:  # the C++ parser holds such a number as a double
        message = message.split(" = ")[0] + " = "
    assert error.startswith(f"{where}: {message}"), error
    assert "does not fit in 64 bits" in error or "past-int64" not in case


# --------------------------------------------------------------------------- finite weights


@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_cpp_reader_refuses_non_finite_weights_naming_tensor_and_file(tmp_path, bad):
    """The bb_* binaries' reader checks the weights finite as the Python loader does (one NaN router row
    made every answer pad tokens); BLOCKBATCH_CHECK_FINITE=0 skips the check."""
    config = fam.random_config(**_small())
    weights = fam.random_weights(config)
    name = "model.layers.1.mlp.gate.weight"
    weights[name][1, 3] = bad
    save_checkpoint(tmp_path, config, weights)
    what = "NaN" if bad != bad else "Inf"
    error = _cpp_error(tmp_path)
    assert error.startswith(f"{tmp_path / WEIGHTS_NAME}: tensor '{name}' holds a non-finite value ({what})"), error
    assert f"{tmp_path / WEIGHTS_NAME}: tensor '{name}' holds a non-finite value ({what})" in _python_error(tmp_path)
    skipped = subprocess.run(
        [os.path.join(BIN_DIR, "bb_forward"), "--model", str(tmp_path), "--iters", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**ENV, "BLOCKBATCH_CHECK_FINITE": "0"},
    )
    assert skipped.returncode == 0, skipped.stderr
