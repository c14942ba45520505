"""The C++ checkpoint reader (csrc/io/checkpoint.cpp, used by the bb_* binaries) on every family's
checkpoints (``blockbatch.families.REGISTRY``).

Hugging Face folders as each family publishes them (its ``model_type``, key names, special ids,
optional parts) are read through ``bb_forward``, whose first line says what the reader made of
``config.json``: every field must equal the Python loader's, and the forward must equal the one built
from the Python loader's weights. A broken folder is refused with the message the Python loader gives
(naming the key, or the tensor and the file). The generic tests run on every registered family; what
only some families have (the keys they refuse, their optional parts, their defaults) are per-family
rows in tests/helpers/families.py.
"""

import json
import os
import re
import subprocess

import pytest
import torch

import blockbatch
from blockbatch import Engine, families, toy
from blockbatch.errors import CheckpointError
from blockbatch.loading import INDEX_NAME, WEIGHTS_NAME, save_checkpoint
from blockbatch.native import NativeModel
from blockbatch.random_checkpoint import make_random_checkpoint
from blockbatch.toy import task as toy_task
from helpers import families as data
from helpers.bb_forward import assert_forward_matches

BIN_DIR = os.path.join(os.path.dirname(blockbatch.__file__), "bin")
ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "LD_LIBRARY_PATH": os.pathsep.join(
        p for p in (os.environ.get("LD_LIBRARY_PATH"), os.path.join(os.path.dirname(torch.__file__), "lib")) if p
    ),
}
FAMILIES = data.names()
NULL = data.NULL


def bb_forward(path, *args, env=None):
    return subprocess.run(
        [os.path.join(BIN_DIR, "bb_forward"), "--model", str(path), "--iters", "1", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env or ENV,
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
    """Every ModelConfig field the C++ reader printed equals ``config``'s (the Python loader's), and it
    printed every field the family has (helpers/families.py)."""
    assert seen["family"] == config.family
    expected = set(data.BASE_PRINTED) | set(data.PRINTED.get(config.family, ()))
    assert expected <= set(seen), sorted(expected - set(seen))
    for key, text in seen.items():
        if key == "family":
            continue
        want = getattr(config, key)
        if want is None:  # unset in Python (e.g. rope_dims: full rotary), 0 in the C++ config
            want = 0
        if isinstance(want, bool):
            assert int(text) == int(want), key
        elif isinstance(want, int):
            assert int(text) == want, key
        else:
            assert float(text) == want, key
    for key, text in data.PRINTED_VALUES.get(config.family, {}).items():
        assert seen[key] == text, key


def edit_json(path, **changes):
    """Set (or, with value None, delete) keys of a JSON file; a value ``NULL`` writes JSON null."""
    with open(path) as f:
        loaded = json.load(f)
    for key, value in changes.items():
        if value is None:
            loaded.pop(key, None)
        else:
            loaded[key] = None if value is NULL else value
    with open(path, "w") as f:
        json.dump(loaded, f)


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


# --------------------------------------------------------------------------- reading (every family)


@pytest.mark.parametrize("shards", [None, 30_000], ids=["single", "sharded"])
@pytest.mark.parametrize("mode", ["dual", "prefix", "full"])
@pytest.mark.parametrize("family", FAMILIES)
def test_forward_matches_python_loader(tmp_path, family, shards, mode):
    config = make_random_checkpoint(
        tmp_path, seed=5, logit_scale=2.0, max_shard_bytes=shards, family=family, **data.reader_shape(family)
    )
    assert data.READER_SHAPE_HAS.get(family, lambda c: True)(config)  # the shape holds the family's parts
    with open(tmp_path / "config.json") as f:
        raw = json.load(f)
    assert raw["model_type"] == families.get(family).MODEL_TYPE
    if family in data.ARCHITECTURES:  # the published layout
        assert raw["architectures"] == data.ARCHITECTURES[family]
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


@pytest.mark.parametrize("family", FAMILIES)
def test_reads_tied_single_kv_head_checkpoints(tmp_path, family):
    """Tied embeddings and one KV head (multi-query attention), three layers: read as Python reads them."""
    config = make_random_checkpoint(
        tmp_path, seed=1, family=family, **data.reader_shape(family, weight_tying=True, n_kv_heads=1, n_layers=3)
    )
    res = bb_forward(tmp_path, "--lengths", "3,5", "--canvas", 16)
    assert res.returncode == 0, res.stderr
    assert_config_read(read_config_line(res.stdout), config)
    assert config == blockbatch.load_checkpoint(tmp_path).config  # the Python loader reads the same


SPECIAL_IDS_ELSEWHERE = [
    f
    for f in FAMILIES
    if (families.get(f).generation_config(families.get(f).random_config()) or {}).get("mask_token_id")
]


@pytest.mark.parametrize("family", SPECIAL_IDS_ELSEWHERE)
def test_special_ids_from_generation_config(tmp_path, family):
    """Where a family keeps its special ids in generation_config.json too (Dream), ids missing from
    config.json come from there (config.json wins); eos may be a list."""
    config = make_random_checkpoint(tmp_path, seed=2, family=family, **data.reader_shape(family))
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


@pytest.mark.parametrize("family", SPECIAL_IDS_ELSEWHERE)
def test_missing_mask_id_names_both_files(tmp_path, family):
    make_random_checkpoint(tmp_path, family=family, **data.reader_shape(family))
    edit_json(tmp_path / "config.json", mask_token_id=None)
    edit_json(tmp_path / "generation_config.json", mask_token_id=None)
    message = (
        os.path.join(str(tmp_path), "config.json") + ": required key 'mask_token_id' is missing "
        "(from config.json and generation_config.json)"
    )
    assert _cpp_error(tmp_path) == message == _python_error(tmp_path)
    edit_json(tmp_path / "generation_config.json", mask_token_id=500)  # read from there, and checked
    assert "key 'mask_token_id' = 500 is outside the vocabulary [0, 97)" in _cpp_error(tmp_path)


VARIANTS = [(f, name) for f, table in data.CONFIG_VARIANTS.items() if f in FAMILIES for name in table]


@pytest.mark.parametrize("family,variant", VARIANTS, ids=[f"{f}-{v}" for f, v in VARIANTS])
def test_config_keys_read_as_python_reads_them(tmp_path, family, variant):
    shape, changes, check = data.CONFIG_VARIANTS[family][variant]
    make_random_checkpoint(tmp_path, seed=7, logit_scale=2.0, family=family, **shape)
    edit_json(tmp_path / "config.json", **changes)
    ckpt = blockbatch.load_checkpoint(tmp_path)
    if check is not None:
        assert check(ckpt.config), ckpt.config
    lengths, L = [4, 6], 16
    res = bb_forward(tmp_path, "--mode", "dual", "--lengths", "4,6", "--canvas", L)
    assert res.returncode == 0, res.stderr
    assert_config_read(read_config_line(res.stdout), ckpt.config)
    assert_forward_matches(
        res.stdout, NativeModel(ckpt.config, ckpt.weights), ckpt.config.vocab_size, "dual", lengths, L
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_reads_the_shipped_toy(family):
    path = toy.checkpoint_path(family)
    res = bb_forward(path, "--mode", "dual", "--lengths", "5,12,32", "--canvas", 64)
    assert res.returncode == 0, res.stderr
    ckpt = blockbatch.load_checkpoint(path)
    assert ckpt.config.family == family
    assert {k: getattr(ckpt.config, k) for k in data.TOY_FACTS.get(family, {})} == data.TOY_FACTS.get(family, {})
    assert_config_read(read_config_line(res.stdout), ckpt.config)
    model = NativeModel(ckpt.config, ckpt.weights)
    assert_forward_matches(res.stdout, model, ckpt.config.vocab_size, "dual", [5, 12, 32], 64)


def test_help_names_the_families():
    names = [families.get(f).DISPLAY_NAME for f in FAMILIES]
    listed = ", ".join(names[:-1]) + " or " + names[-1]
    for name in ("bb_forward", "bb_bench_decode"):
        res = subprocess.run(
            [os.path.join(BIN_DIR, name), "--help"], capture_output=True, text=True, timeout=60, env=ENV
        )
        assert res.returncode == 0 and listed in res.stdout, name


# --------------------------------------------------------------------------- bb_bench_decode


@pytest.mark.parametrize("family", FAMILIES)
def test_bench_decode_loads_every_family(tmp_path, family):
    """bb_bench_decode reads the folder and decodes it with a policy of the family's."""
    make_random_checkpoint(tmp_path / "ckpt", seed=3, family=family, **data.reader_shape(family))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt_ids": [1, 2, 3]}\n')
    res = bb_bench_decode(tmp_path / "ckpt", prompts, "--gen-length", 16, "--block-length", 8)
    assert res.returncode == 0, res.stdout + res.stderr
    assert read_config_line(res.stdout)["family"] == family
    result = re.search(r"^result policy=(\S+) ", res.stdout, re.M)
    assert result and result[1] in families.get(family).POLICIES, res.stdout


def _toy_prompts(engine, n=6):
    return [engine.encode(p.prompt, chat=False).tolist() for p in toy_task.make_problems(n, seed=1000, split="test")]


@pytest.fixture(scope="module")
def toy_engines():
    return {}


def _toy_engine(engines, family):
    if family not in engines:
        engines[family] = Engine.from_pretrained(toy.checkpoint_path(family))
    return engines[family]


BENCH_DECODE = data.rows(data.BENCH_DECODE_TOY)


@pytest.mark.parametrize("family,flags,overrides,policy", BENCH_DECODE, ids=data.ids(BENCH_DECODE))
def test_bench_decode_decodes_the_toy_as_the_engine_does(tmp_path, toy_engines, family, flags, overrides, policy):
    """bb_bench_decode reads the toy with the C++ reader and decodes it natively: the generated ids
    equal blockbatch's Engine on the same prompts and options (--verify), and so does the mean NFE."""
    engine = _toy_engine(toy_engines, family)
    options = engine.default_options(gen_length=64, **overrides)
    assert options.policy == policy
    prompts = _toy_prompts(engine)
    outs = engine.generate(prompts, options)
    table_threshold = blockbatch.DecodeOptions().threshold
    if not flags and families.get(family).DEFAULT_OPTIONS.get("threshold", table_threshold) != table_threshold:
        # These prompts tell the family's threshold from the options table's (one decodes in fewer
        # forwards), so the NFE check below sees the binary's threshold default, not only its policy.
        looser = engine.generate(prompts, engine.default_options(gen_length=64, threshold=table_threshold))
        assert [o.stats["nfe"] for o in looser] != [o.stats["nfe"] for o in outs]
    lines = [{"prompt_ids": p, "expected_ids": o.raw_ids} for p, o in zip(prompts, outs)]
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    res = bb_bench_decode(toy.checkpoint_path(family), path, "--gen-length", 64, "--verify", *flags)
    assert res.returncode == 0, res.stdout + res.stderr
    assert_config_read(read_config_line(res.stdout), engine.config)
    result = re.search(r"^result policy=(\S+) dtype=float32 prompts=6 gen_length=64 nfe_mean=(\S+) ", res.stdout, re.M)
    assert result, res.stdout
    assert result[1] == options.policy
    assert float(result[2]) == pytest.approx(sum(o.stats["nfe"] for o in outs) / len(outs), abs=0.005)
    assert "Disposition: Passed" in res.stdout
    # A wrong expectation is caught.
    lines[2]["expected_ids"][-1] = (lines[2]["expected_ids"][-1] + 1) % engine.config.vocab_size
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    res = bb_bench_decode(toy.checkpoint_path(family), path, "--gen-length", 64, "--verify", *flags)
    assert res.returncode == 3 and "Disposition: Failed (1 of 6 prompts differ)" in res.stdout


HELP_DEFAULTS = data.rows(data.BENCH_DECODE_HELP)


@pytest.mark.parametrize("family,defaults,pattern", HELP_DEFAULTS, ids=data.ids(HELP_DEFAULTS))
def test_bench_decode_defaults_are_the_familys(family, defaults, pattern):
    """The binary's family defaults (the C++ family table's default_options) are the Python family's
    (families/<family>.py DEFAULT_OPTIONS), as its --help says."""
    assert families.get(family).DEFAULT_OPTIONS == defaults
    res = subprocess.run(
        [os.path.join(BIN_DIR, "bb_bench_decode"), "--help"], capture_output=True, text=True, timeout=60, env=ENV
    )
    assert res.returncode == 0 and re.search(pattern, res.stdout)


REFUSED = [(p, f) for f in FAMILIES for p in data.all_policies() if p not in families.get(f).POLICIES]


@pytest.mark.parametrize("policy,family", REFUSED, ids=[f"{p}-on-{f}" for p, f in REFUSED])
def test_bench_decode_refuses_policies_the_family_does_not_decode(tmp_path, policy, family):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt_ids": [1, 2, 3]}\n')
    make_random_checkpoint(tmp_path / "ckpt", seed=1, family=family, **data.reader_shape(family))
    res = bb_bench_decode(tmp_path / "ckpt", prompts, "--policy", policy, "--gen-length", 32)
    assert res.returncode == 2, res.stdout + res.stderr
    assert re.search(data.policy_refusal(policy, family), res.stderr), res.stderr
    assert "model family=" not in res.stdout  # refused before the weights are loaded


ACCEPTED_FLAGS = data.rows(data.BENCH_DECODE_FLAGS_WITHOUT_POLICY)


@pytest.mark.parametrize("family,flags,policy", ACCEPTED_FLAGS, ids=data.ids(ACCEPTED_FLAGS))
def test_bench_decode_takes_the_default_policys_options(tmp_path, family, flags, policy):
    """An option the family's default policy reads (LLaDA2.1's editing) is taken without --policy."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt_ids": [1, 2, 3]}\n')
    res = bb_bench_decode(toy.checkpoint_path(family), prompts, "--gen-length", 16, *flags)
    assert res.returncode == 0, res.stderr
    assert re.search(rf"^result policy={policy} ", res.stdout, re.M)


# --------------------------------------------------------------------------- refusing

SAME = data.rows(data.SAME_MESSAGE)


@pytest.mark.parametrize("family,changes,message", SAME, ids=data.ids(SAME))
def test_bad_config_same_message_as_python(tmp_path, family, changes, message):
    make_random_checkpoint(tmp_path, family=family, **data.reader_shape(family))
    edit_json(tmp_path / "config.json", **changes)
    where = os.path.join(str(tmp_path), "config.json")
    cpp = _cpp_error(tmp_path)
    assert cpp.startswith(where + ": " + message), cpp
    assert _python_error(tmp_path).startswith(where + ": " + message)


KEYS = data.rows(data.KEY_PATTERN)


@pytest.mark.parametrize("family,changes,pattern,python", KEYS, ids=data.ids(KEYS))
def test_bad_config_names_the_key_the_file_holds(tmp_path, family, changes, pattern, python):
    """Checks of the shared validator speak of the config.json key (hidden_size, not d_model)."""
    make_random_checkpoint(tmp_path, family=family, **data.reader_shape(family))
    edit_json(tmp_path / "config.json", **changes)
    assert re.search(pattern, _cpp_error(tmp_path))
    if python:
        _python_error(tmp_path)  # the Python loader refuses it too


MISSING = data.rows(data.MISSING_TENSOR)


@pytest.mark.parametrize("shards", [None, 30_000], ids=["single", "sharded"])
@pytest.mark.parametrize("family,name,hint", MISSING, ids=data.ids(MISSING))
def test_missing_tensor_names_the_tensor_and_file(tmp_path, family, name, hint, shards):
    fam = families.get(family)
    config = fam.random_config(**data.reader_shape(family))
    weights = fam.random_weights(config)
    del weights[name]
    save_checkpoint(tmp_path, config, weights, max_shard_bytes=shards)
    listing = os.path.join(str(tmp_path), INDEX_NAME if shards else WEIGHTS_NAME)
    # sharded, the index decides what exists: it is the index that leaves the tensor out
    absent = f"the index ({INDEX_NAME}) does not list tensor '{name}'" if shards else f"tensor '{name}' is missing"
    expected = f"{listing}: {absent}{hint}"
    assert _cpp_error(tmp_path) == expected
    assert _python_error(tmp_path) == expected


SHAPES = data.rows(data.BAD_SHAPE)


@pytest.mark.parametrize("shards", [None, 30_000], ids=["single", "sharded"])
@pytest.mark.parametrize("family,name,shape,message", SHAPES, ids=data.ids(SHAPES))
def test_bad_tensor_shape_names_the_tensor_and_file(tmp_path, family, name, shape, message, shards):
    fam = families.get(family)
    config = fam.random_config(**data.reader_shape(family))
    weights = fam.random_weights(config)
    weights[name] = torch.zeros(shape(config))
    save_checkpoint(tmp_path, config, weights, max_shard_bytes=shards)
    cpp = _cpp_error(tmp_path)
    assert re.fullmatch(
        rf"{re.escape(str(tmp_path))}/model\S*\.safetensors: tensor '{re.escape(name)}' {re.escape(message)}", cpp
    ), cpp
    assert _python_error(tmp_path) == cpp  # the same file: the shard that holds it


EXTRA = data.rows(data.EXTRA_TENSOR)


@pytest.mark.parametrize("shards", [None, 30_000], ids=["single", "sharded"])
@pytest.mark.parametrize("family,name,shape", EXTRA, ids=data.ids(EXTRA))
def test_unexpected_tensor_names_the_tensor_and_file(tmp_path, family, name, shape, shards):
    fam = families.get(family)
    config = fam.random_config(**data.reader_shape(family))
    weights = fam.random_weights(config)
    weights[name] = torch.zeros(shape(config))
    save_checkpoint(tmp_path, config, weights, max_shard_bytes=shards)
    cpp = _cpp_error(tmp_path)
    assert re.fullmatch(
        rf"{re.escape(str(tmp_path))}/model\S*\.safetensors: unexpected tensor '{re.escape(name)}' \(not part of a "
        rf"{re.escape(fam.DISPLAY_NAME)} model with this config\)",
        cpp,
    ), cpp
    assert _python_error(tmp_path) == cpp


FOREIGN = data.rows(data.FOREIGN_NAMES)


@pytest.mark.parametrize("family,other,missing", FOREIGN, ids=data.ids(FOREIGN))
def test_another_familys_tensor_names_are_refused(tmp_path, family, other, missing):
    """A folder holding another family's weight names under this family's config.json (as many
    tensors): the names this family's reader asks for are what is missing."""
    config = families.get(family).random_config(**data.reader_shape(family))
    o = families.get(other)
    save_checkpoint(tmp_path, config, o.random_weights(o.random_config(**data.reader_shape(other))))
    assert f"tensor '{missing}' is missing" in _cpp_error(tmp_path)


@pytest.mark.parametrize("family", FAMILIES)
def test_pad_id_checked_as_python_does(tmp_path, family):
    """The pad id check config.py makes for every family; a list only where the family allows one."""
    make_random_checkpoint(tmp_path, family=family, **data.reader_shape(family))
    edit_json(tmp_path / "config.json", pad_token_id=500)
    message = os.path.join(str(tmp_path), "config.json") + ": key 'pad_token_id' = 500 is outside the vocabulary"
    assert _cpp_error(tmp_path).startswith(message) and _python_error(tmp_path).startswith(message)
    if family in data.PAD_ID_INTEGER_ONLY:
        edit_json(tmp_path / "config.json", pad_token_id=[1])  # a list only where the family allows one
        assert _cpp_error(tmp_path).endswith("config.json: key 'pad_token_id' must be an integer")
        assert "key 'pad_token_id' must be an integer" in _python_error(tmp_path)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("family", FAMILIES)
def test_cpp_reader_refuses_non_finite_weights_naming_tensor_and_file(tmp_path, family, bad):
    """The bb_* binaries' reader checks the weights finite as the Python loader does (one NaN router row
    made every answer pad tokens); BLOCKBATCH_CHECK_FINITE=0 skips the check."""
    fam = families.get(family)
    config = fam.random_config(**data.reader_shape(family))
    weights = fam.random_weights(config)
    name = data.NON_FINITE_TENSOR.get(family, next(n for n, t in weights.items() if t.dim() == 2))
    weights[name][1, 3] = bad
    save_checkpoint(tmp_path, config, weights)
    what = "NaN" if bad != bad else "Inf"
    error = _cpp_error(tmp_path)
    assert error.startswith(f"{tmp_path / WEIGHTS_NAME}: tensor '{name}' holds a non-finite value ({what})"), error
    assert f"{tmp_path / WEIGHTS_NAME}: tensor '{name}' holds a non-finite value ({what})" in _python_error(tmp_path)
    skipped = bb_forward(tmp_path, env={**ENV, "BLOCKBATCH_CHECK_FINITE": "0"})
    assert skipped.returncode == 0, skipped.stderr


# --------------------------------------------------------------------------- rules of some families' keys

ZERO = data.rows(data.ZERO_AS_UNSET)


@pytest.mark.parametrize("door", ["python", "cpp", "handle"])
@pytest.mark.parametrize("family,changes,message", ZERO, ids=data.ids(ZERO))
def test_zero_is_refused_not_read_as_unset(tmp_path, door, family, changes, message):
    """A 0 (given, or derived as int(head_dim * factor)) is a value the reference refuses, never "the whole
    head": every front door refuses it with the reference's rule and the key the file holds."""
    if door == "handle":
        assert message in data.handle_error(family, changes)
        return
    make_random_checkpoint(tmp_path, family=family, **data.reader_shape(family))
    edit_json(tmp_path / "config.json", **changes)
    where = os.path.join(str(tmp_path), "config.json")
    error = _cpp_error(tmp_path) if door == "cpp" else _python_error(tmp_path)
    assert error.startswith(f"{where}: {message}"), error


LOADS = data.rows(data.EDITS_THAT_LOAD)


@pytest.mark.parametrize("family,changes,field,value", LOADS, ids=data.ids(LOADS))
def test_edits_the_reference_allows_still_load(tmp_path, family, changes, field, value):
    """Clean cases stay clean (each even rotary width in (0, head_dim]): both loaders read them the same."""
    make_random_checkpoint(tmp_path, family=family, **data.reader_shape(family))
    edit_json(tmp_path / "config.json", **changes)
    config = blockbatch.load_checkpoint(tmp_path).config
    assert getattr(config, field) == value
    res = bb_forward(tmp_path)
    assert res.returncode == 0, res.stderr
    assert_config_read(read_config_line(res.stdout), config)


EXACT = data.rows(data.EXACT_MESSAGE)


@pytest.mark.parametrize("door", ["python", "cpp"])
@pytest.mark.parametrize("family,changes,message,exact", EXACT, ids=data.ids(EXACT))
def test_refused_with_the_exact_message(tmp_path, door, family, changes, message, exact):
    """Edits both loaders refuse with exactly this message ({where}: config.json; {file}: the weights
    file): 0 experts is not null (dense), a derived head_dim of 0 names the keys that made it, a
    missing key's default that does not fit the weights names the tensor."""
    make_random_checkpoint(tmp_path, family=family, **data.reader_shape(family))
    edit_json(tmp_path / "config.json", **changes)
    error = _cpp_error(tmp_path) if door == "cpp" else _python_error(tmp_path)
    where, file = os.path.join(str(tmp_path), "config.json"), os.path.join(str(tmp_path), WEIGHTS_NAME)
    message = message.format(where=where, file=file)
    assert error == message if exact else message in error, error


USER = data.rows(data.USER_KEYS)


@pytest.mark.parametrize("door", ["python", "cpp"])
@pytest.mark.parametrize("family,changes,message", USER, ids=data.ids(USER))
def test_errors_name_the_users_key_not_a_field(tmp_path, door, family, changes, message):
    """Errors speak of the key config.json holds (num_hidden_layers, not n_layers), integers past int64
    included (not a TorchScript schema message)."""
    make_random_checkpoint(tmp_path, family=family, **data.reader_shape(family))
    edit_json(tmp_path / "config.json", **changes)
    where = os.path.join(str(tmp_path), "config.json")
    error = _cpp_error(tmp_path) if door == "cpp" else _python_error(tmp_path)
    past_int64 = "does not fit in 64" in message
    if door == "cpp" and past_int64:  # the C++ parser holds such a number as a double
        message = message.split(" = ")[0] + " = "
    assert error.startswith(f"{where}: {message}"), error
    assert "does not fit in 64 bits" in error or not past_int64
