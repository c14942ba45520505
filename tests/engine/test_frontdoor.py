"""The front door never crashes, hangs or allocates by a bad value (issue 17, items 5, 7-10).

Config values are checked against the weight files and sane limits before anything sized by
them is allocated (Python loader, C++ ModelConfig::validate / Model constructor, C++ io reader);
every CLI user error is one line ``error: ...`` with exit status 2; loader messages name the
file and the key; characters outside the vocabulary, dict prompts and ignored flags are refused;
``import blockbatch`` registers the ops. Anything that could crash or hang runs in a subprocess
with a timeout.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import time

import pytest
import torch

import blockbatch
from blockbatch.config import MAX_LAYERS, MAX_SEQUENCE_LENGTH
from blockbatch.errors import CheckpointError
from blockbatch.loading import load_checkpoint, read_safetensors_header, save_checkpoint
from blockbatch.random_checkpoint import random_config, random_weights
from blockbatch.toy import tokenizer as toy_tok
from helpers.processes import interrupt_once_printed

PY = sys.executable
ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "PYTHONPATH": os.pathsep.join(
        [os.path.dirname(os.path.dirname(blockbatch.__file__)), os.environ.get("PYTHONPATH", "")]
    ),
}
BIN = os.path.join(os.path.dirname(blockbatch.__file__), "bin", "bb_forward")


def _rewrite(path, **changes):
    cfg_path = os.path.join(path, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg.update(changes)
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    return cfg_path


def _write_text(path, name, text: str | bytes):
    p = os.path.join(path, name)
    if os.path.lexists(p):
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p)
        else:
            os.remove(p)
    with open(p, "wb") as f:
        f.write(text.encode() if isinstance(text, str) else text)
    return p


@pytest.fixture
def ckpt(tmp_path):
    """A small checkpoint with the toy tokenizer (2 layers, d 64)."""
    config = random_config(
        vocab_size=toy_tok.VOCAB_SIZE,
        mask_token_id=toy_tok.MASK_ID,
        eos_token_id=toy_tok.EOS_ID,
        pad_token_id=toy_tok.PAD_ID,
        d_model=64,
        n_layers=2,
    )
    path = tmp_path / "ckpt"
    save_checkpoint(path, config, random_weights(config, seed=1, logit_scale=3.0), tokenizer=toy_tok.build_tokenizer())
    return str(path)


def run_py(code: str, timeout: float = 120):
    return subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=timeout, env=ENV)


def cli(*args, timeout: float = 300):
    return subprocess.run(
        [PY, "-m", "blockbatch.cli", *map(str, args)], capture_output=True, text=True, timeout=timeout, env=ENV
    )


def assert_one_line_error(res, pattern: str, status: int = 2):
    import re

    assert res.returncode == status, (res.returncode, res.stderr)
    assert "Traceback" not in res.stderr, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert re.search(pattern, lines[0]), lines[0]


# --------------------------------------------------------------------------- item 5: config sizes


def test_n_layers_is_checked_against_the_weight_file_before_listing_tensors(ckpt):
    """A 500-byte config with n_layers = 60000 (under the limit) fails on the tensor count, in
    well under a second, instead of building 540000 expected names (or, uncapped, 10^9)."""
    cfg_path = _rewrite(ckpt, n_layers=60000)
    t0 = time.perf_counter()
    with pytest.raises(
        CheckpointError,
        match=rf"{cfg_path}: key 'n_layers' = 60000 needs 540003 tensors but "
        rf".*model.safetensors holds 21",
    ):
        load_checkpoint(ckpt)
    assert time.perf_counter() - t0 < 5


@pytest.mark.parametrize(
    "key,value,pattern",
    [
        ("n_layers", 10**8, rf"key 'n_layers' = 100000000 is larger than the supported maximum {MAX_LAYERS}"),
        (
            "max_sequence_length",
            10**12,
            rf"key 'max_sequence_length' = 1000000000000 is larger than the supported maximum {MAX_SEQUENCE_LENGTH}",
        ),
        (
            "max_sequence_length",
            2**20,
            r"key 'max_sequence_length' = 1048576 times head_dim = 512 is more than the "
            r"268435456 entries the RoPE table may hold",
        ),
        ("d_model", 2**30, r"key 'd_model' = 1073741824 is larger than the supported maximum 16777216"),
    ],
)
def test_config_sizes_are_bounded(ckpt, key, value, pattern):
    changes = {key: value}
    if pattern.find("head_dim = 512") >= 0:
        changes.update(d_model=2048, n_heads=4, n_kv_heads=4)
    cfg_path = _rewrite(ckpt, **changes)
    with pytest.raises(CheckpointError, match=rf"{cfg_path}: {pattern}"):
        load_checkpoint(ckpt)


def test_huge_config_values_do_not_allocate_in_a_subprocess(ckpt):
    """The issue's repro end to end, memory-capped: 1e8 layers and a 1e12-long RoPE table."""
    cases = [
        ({"n_layers": 10**8}, "config.json: key 'n_layers' = 100000000 is larger than the supported maximum"),
        ({"max_sequence_length": 10**12}, "config.json: key 'max_sequence_length' = 1000000000000 is larger"),
        ({"n_layers": 60000}, "config.json: key 'n_layers' = 60000 needs 540003 tensors"),
    ]
    for changes, message in cases:
        _rewrite(ckpt, **{"n_layers": 2, "max_sequence_length": 512, **changes})
        code = (
            "import resource, sys\n"
            "from blockbatch.cli import main\n"
            f"rc = main(['forward', '--model', {ckpt!r}])\n"
            "peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024\n"
            "print('peak_mb', peak)\nsys.exit(rc)\n"
        )
        res = run_py(code, timeout=60)
        assert res.returncode == 2 and message in res.stderr, res.stderr
        peak = float(res.stdout.split("peak_mb")[1])
        assert peak < 2000, f"{changes}: peak RSS {peak:.0f} MB"


def test_cpp_model_constructor_checks_config_before_allocating():
    """torch.classes.blockbatch.Model(...) directly: the C++ ModelConfig::validate bounds, the
    tensor-count check, and mask == eos (which C++ used to accept)."""
    from blockbatch import toy

    base = toy.load()
    ints, floats = base.config.int_fields(), base.config.float_fields()
    weights = dict(base.weights)

    def make(**changes):
        i, f = dict(ints), dict(floats)
        for k, v in changes.items():
            (f if k in f else i)[k] = v
        return torch.classes.blockbatch.Model(i, f, weights, "")

    with pytest.raises(ValueError, match=r"config: key 'eos_token_id' = 20 equals mask_token_id"):
        make(eos_token_id=20)
    with pytest.raises(ValueError, match=r"config: key 'rms_norm_eps' must be a positive finite number, got inf"):
        make(rms_norm_eps=float("inf"))
    with pytest.raises(ValueError, match=r"config: key 'rope_theta' must be a positive finite number, got nan"):
        make(rope_theta=float("nan"))
    with pytest.raises(
        ValueError,
        match=r"config: key 'max_sequence_length' = 1000000000000 is larger than the "
        r"supported maximum 1048576",
    ):
        make(max_sequence_length=10**12)
    with pytest.raises(ValueError, match=r"config: key 'n_layers' = 100000000 is larger than the supported maximum"):
        make(n_layers=10**8)
    with pytest.raises(
        RuntimeError,
        match=r"weights: config key 'n_layers' = 1000 needs 9003 tensors but the dict "
        r"holds 39",
    ):
        make(n_layers=1000)
    with pytest.raises(ValueError, match=r"config: key 'weight_tying' must be 0 or 1, got 7"):
        make(weight_tying=7)
    make()  # the toy config itself still builds


def _bb_forward(path, timeout=60):
    return subprocess.run(
        [BIN, "--model", str(path), "--iters", "1"], capture_output=True, text=True, timeout=timeout, env=ENV
    )


@pytest.mark.skipif(not os.path.exists(BIN), reason="bb_forward not built")
@pytest.mark.parametrize(
    "changes,pattern",
    [
        ({"n_layers": 1000}, r"config.json: key 'n_layers' = 1000 needs 9003 tensors but the weight files hold 21"),
        ({"n_layers": 10**8}, r"config.json: key 'n_layers' = 100000000 is larger than the supported maximum 65536"),
        ({"max_sequence_length": 10**12}, r"config.json: key 'max_sequence_length' = 1000000000000 is larger"),
        (
            {"eos_token_id": toy_tok.MASK_ID},
            rf"config.json: key 'eos_token_id' = {toy_tok.MASK_ID} equals mask_token_id",
        ),
        ({"weight_tying": "false"}, r"config.json: key 'weight_tying' must be true or false"),
        ({"rope_theta": "abc"}, r"config.json: key 'rope_theta' must be a number"),
    ],
)
def test_cpp_reader_checks_config(ckpt, changes, pattern):
    import re

    _rewrite(ckpt, **changes)
    res = _bb_forward(ckpt)
    assert res.returncode == 1 and re.search(pattern, res.stderr), res.stderr


@pytest.mark.skipif(not os.path.exists(BIN), reason="bb_forward not built")
def test_cpp_reader_files(ckpt, tmp_path):
    cfg = os.path.join(ckpt, "config.json")
    text = open(cfg).read()
    _write_text(ckpt, "config.json", text.replace("1e-05", "1e999"))  # inf after strtod
    res = _bb_forward(ckpt)
    assert res.returncode == 1 and "config.json: key 'rms_norm_eps' must be a positive finite number" in res.stderr
    _write_text(ckpt, "config.json", text.encode() + b"\xff")
    res = _bb_forward(ckpt)
    assert (
        res.returncode == 1
        and "config.json: not valid JSON (invalid JSON at byte" in res.stderr
        and "not UTF-8" in res.stderr
    ), res.stderr
    _write_text(ckpt, "config.json", text)
    weights = os.path.join(ckpt, "model.safetensors")
    good = open(weights, "rb").read()
    os.remove(weights)
    os.mkdir(weights)
    res = _bb_forward(ckpt)
    assert res.returncode == 1 and "model.safetensors: safetensors file is a directory, not a file" in res.stderr
    os.rmdir(weights)
    os.symlink("model.safetensors", weights)
    res = _bb_forward(ckpt)
    assert res.returncode == 1 and "model.safetensors: safetensors file is a symbolic link loop" in res.stderr
    os.remove(weights)
    os.mkfifo(weights)  # would block open() forever
    res = _bb_forward(ckpt, timeout=30)
    assert res.returncode == 1 and "is not a regular file" in res.stderr, res.stderr
    os.remove(weights)
    # A shape whose byte count wraps around 2^64 must not pass as a 0-byte tensor.
    header = json.dumps({"x": {"dtype": "F32", "shape": [2**32, 2**32], "data_offsets": [0, 0]}}).encode()
    with open(weights, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
    res = _bb_forward(ckpt)
    assert res.returncode == 1 and "has more elements than any file can hold" in res.stderr, res.stderr
    with pytest.raises(CheckpointError, match=r"data_offsets \[0, 0\] span 0 bytes but F32\[4294967296, 4294967296\]"):
        read_safetensors_header(weights)
    with open(weights, "wb") as f:
        f.write(good)
    assert _bb_forward(ckpt).returncode == 0


# --------------------------------------------------------------------------- item 8: loader messages


@pytest.mark.parametrize(
    "key,value,pattern",
    [
        ("weight_tying", "false", r"key 'weight_tying' must be true or false \(a JSON boolean\), got 'false'"),
        ("weight_tying", 0, r"key 'weight_tying' must be true or false \(a JSON boolean\), got 0"),
        ("rope_theta", "abc", r"key 'rope_theta' must be a number, got 'abc'"),
        ("rope_theta", True, r"key 'rope_theta' must be a number, got True"),
        ("rms_norm_eps", float("inf"), r"key 'rms_norm_eps' must be a finite number, got inf"),
        ("rms_norm_eps", float("nan"), r"key 'rms_norm_eps' must be a finite number, got nan"),
        ("rope_theta", float("-inf"), r"key 'rope_theta' must be a finite number, got -inf"),
        ("n_layers", 2.0, r"key 'n_layers' must be an integer, got 2.0"),
        ("d_model", "64", r"key 'd_model' must be an integer, got '64'"),
        ("mask_token_id", None, r"required key 'mask_token_id' is missing"),
        ("eos_token_id", ["x"], r"key 'eos_token_id' must be an integer or a non-empty list of integers, got \['x'\]"),
        ("pad_token_id", True, r"key 'pad_token_id' must be an integer, got True"),
        ("model_type", ["llada"], r"key 'model_type' is \['llada'\]; supported: llada"),
        ("mask_token_id", toy_tok.EOS_ID, rf"key 'eos_token_id' = {toy_tok.EOS_ID} equals mask_token_id"),
    ],
)
def test_config_types_are_strict_and_messages_name_file_and_key(ckpt, key, value, pattern):
    cfg_path = _rewrite(ckpt, **{key: value})  # json.dump writes NaN / Infinity literals
    with pytest.raises(CheckpointError, match=rf"^{cfg_path}: {pattern}"):
        load_checkpoint(ckpt)


def test_json_number_literals_out_of_range(ckpt):
    cfg = os.path.join(ckpt, "config.json")
    text = open(cfg).read()
    _write_text(ckpt, "config.json", text.replace('"rope_theta": 10000.0', '"rope_theta": 1e999'))
    with pytest.raises(CheckpointError, match=rf"{cfg}: key 'rope_theta' must be a finite number, got inf"):
        load_checkpoint(ckpt)
    _write_text(ckpt, "config.json", text.replace('"rope_theta": 10000.0', '"rope_theta": 1' + "0" * 400))
    with pytest.raises(CheckpointError, match=rf"{cfg}: key .rope_theta. must be a finite number, got 1000"):
        load_checkpoint(ckpt)
    _write_text(ckpt, "config.json", text.replace('"d_model": 64', '"d_model": ' + "7" * 5000))
    with pytest.raises(CheckpointError, match=rf"{cfg}: not valid JSON \(Exceeds the limit"):
        load_checkpoint(ckpt)
    _write_text(ckpt, "config.json", text.replace('"d_model": 64,', '"d_model": 64, "d_model": 32,'))
    with pytest.raises(CheckpointError, match=rf"{cfg}: key 'd_model' appears twice"):
        load_checkpoint(ckpt)
    _write_text(ckpt, "config.json", "[" * 100000 + "]" * 100000)
    with pytest.raises(CheckpointError, match=rf"{cfg}: not valid JSON \(nested too deeply\)"):
        load_checkpoint(ckpt)


@pytest.mark.parametrize(
    "name", ["config.json", "model.safetensors.index.json", "tokenizer_config.json", "tokenizer.json"]
)
def test_non_utf8_json_names_the_file(ckpt, name):
    p = _write_text(ckpt, name, b'{"a": "\xff\xfe"}')
    with pytest.raises(CheckpointError, match=rf"^{p}: not UTF-8 text \(byte 0xff at offset 7\)"):
        load_checkpoint(ckpt)


@pytest.mark.parametrize(
    "name,what",
    [
        ("config.json", "config.json"),
        ("model.safetensors", "safetensors file"),
        ("tokenizer_config.json", "tokenizer_config.json"),
        ("tokenizer.json", "tokenizer.json"),
    ],
)
def test_symlink_loops_directories_and_fifos_are_named(ckpt, name, what):
    p = os.path.join(ckpt, name)
    if os.path.exists(p):
        os.remove(p)
    os.symlink(name, p)
    with pytest.raises(CheckpointError, match=rf"^{p}: {what} is a symbolic link loop"):
        load_checkpoint(ckpt)
    os.remove(p)
    os.symlink("nowhere", p)
    with pytest.raises(CheckpointError, match=rf"^{p}: {what} is a symbolic link to a missing file \(nowhere\)"):
        load_checkpoint(ckpt)
    os.remove(p)
    os.mkdir(p)
    with pytest.raises(CheckpointError, match=rf"^{p}: {what} is a directory, not a file"):
        load_checkpoint(ckpt)
    os.rmdir(p)


def test_fifo_weight_file_does_not_hang(ckpt):
    p = os.path.join(ckpt, "model.safetensors")
    os.remove(p)
    os.mkfifo(p)
    res = run_py(f"from blockbatch.loading import load_checkpoint\nload_checkpoint({ckpt!r})", timeout=60)
    assert res.returncode == 1 and f"{p}: safetensors file is not a regular file (a FIFO" in res.stderr


def test_index_shard_names_are_file_names(ckpt):
    for shard in ("..", ".", "", "a/b", "x\\y"):
        p = _write_text(ckpt, "model.safetensors.index.json", json.dumps({"weight_map": {"w": shard}}))
        with pytest.raises(CheckpointError, match=rf"^{p}: tensor 'w' maps to .*, not a file name in the folder"):
            load_checkpoint(ckpt)


def test_chat_template_syntax_error_is_reported_at_load(ckpt):
    p = _write_text(ckpt, "tokenizer_config.json", json.dumps({"chat_template": "{% for m in messages %}{{ m }"}))
    with pytest.raises(CheckpointError, match=rf"^{p}: key 'chat_template' has a Jinja syntax error at line 1"):
        load_checkpoint(ckpt)
    _write_text(ckpt, "tokenizer_config.json", json.dumps({"chat_template": 5}))
    with pytest.raises(CheckpointError, match=r"key 'chat_template' must be a string, got int"):
        load_checkpoint(ckpt)
    # Templates run sandboxed: no way from a downloaded file to Python internals.
    _write_text(
        ckpt, "tokenizer_config.json", json.dumps({"chat_template": "{{ ''.__class__.__mro__[1].__subclasses__() }}"})
    )
    from blockbatch.engine import Engine

    engine = Engine.from_pretrained(ckpt)
    with pytest.raises(ValueError, match=r"chat template .* failed to render: SecurityError"):
        engine.encode("1+1=")


def test_published_template_features_compile_and_render(ckpt):
    """What Hugging Face's template environment offers and published templates (Qwen2.5 / Dream,
    Llama) use: {% break %} / {% continue %}, tojson as plain json.dumps, strftime_now."""
    template = (
        "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
        "{{ m['content'] | tojson }}|{% endfor %}{{ strftime_now('%Y') | length }}"
    )
    _write_text(ckpt, "tokenizer_config.json", json.dumps({"chat_template": template}))
    from blockbatch.engine import Engine

    codec = Engine.from_pretrained(ckpt).codec
    rendered = codec.render_chat(
        [{"role": "user", "content": "1<2"}, {"role": "user", "content": "b"}, {"role": "user", "content": "never"}]
    )
    assert rendered == '"1<2"|"b"|4'


# --------------------------------------------------------------------------- item 9: silent nonsense


def test_characters_outside_the_vocabulary_are_refused(ckpt):
    from blockbatch.engine import Engine

    engine = Engine.from_pretrained(ckpt)
    with pytest.raises(
        ValueError,
        match=r"^prompt: text holds characters outside the tokenizer's vocabulary: "
        r"' ' at position 2, 'é' at position 5 \(the tokenizer would turn them "
        r"into <\|unk\|>",
    ):
        engine.generate("12 +3é=")
    with pytest.raises(ValueError, match=r"^prompts\[1\]: text holds .*'x' at position 0"):
        engine.generate(["1+1=", "x"])
    ids = engine.encode("12 +3=", allow_unknown=True)
    assert toy_tok.VOCAB.index("<|unk|>") in ids.tolist()
    # A special token's text is plain text (never the token: no prompt can forge EOS or a turn): on
    # the toy its characters are outside the vocabulary; a trusted rendered text may still match it.
    with pytest.raises(ValueError, match=r"'<' at position 0"):
        engine.encode("<|unk|>")
    assert engine.codec.encode("<|unk|>", chat=False, special_tokens=True) == [toy_tok.VOCAB.index("<|unk|>")]


@pytest.mark.parametrize(
    "prompts,error,pattern",
    [
        (
            {"a": 1},
            TypeError,
            r"prompts must be a str, a list of token ids, an int64 tensor or a list of those, got dict",
        ),
        ({1, 2}, TypeError, r"prompts must be .* got set"),
        (b"123", TypeError, r"prompts must be .* got bytes"),
        (
            [[1, 2], {"x": 1}],
            TypeError,
            r"prompts\[1\] must be a str, a list of token ids or a 1-D int64 tensor, got dict",
        ),
        ([1.5, 2.0], TypeError, r"prompts\[0\] must be a str, .* got float"),
        ([[1, True]], TypeError, r"prompt\[1\] must be an integer token id, got bool True"),
        ([], ValueError, r"prompts is empty"),
        (torch.zeros(2, 2, 2, dtype=torch.long), ValueError, r"1-D or 2-D"),
    ],
)
def test_engine_prompt_types(ckpt, prompts, error, pattern):
    from blockbatch.engine import Engine

    engine = Engine.from_pretrained(ckpt)
    with pytest.raises(error, match=pattern):
        engine.generate(prompts)


def test_cli_steps_without_fixed_schedule_is_an_error(ckpt):
    res = cli(
        "generate",
        "--model",
        ckpt,
        "--policy",
        "vanilla",
        "--gen-length",
        16,
        "--block-length",
        8,
        "--steps",
        8,
        "1+1=",
    )
    assert_one_line_error(
        res,
        r"^error: --steps 8 is used only by the fixed schedule, but --threshold 0.9 commits "
        r"by confidence and would ignore it: pass --threshold none with --steps 8$",
    )
    res = cli(
        "generate",
        "--model",
        ckpt,
        "--policy",
        "vanilla",
        "--gen-length",
        16,
        "--block-length",
        8,
        "--threshold",
        "none",
        "--steps",
        8,
        "1+1=",
    )
    assert res.returncode == 0, res.stderr


def test_cli_unknown_characters(ckpt):
    res = cli("generate", "--model", ckpt, "--gen-length", 16, "--block-length", 8, "1 +1=")
    assert_one_line_error(
        res,
        r"^error: prompt: text holds characters outside the tokenizer's vocabulary: ' ' at "
        r"position 1 .*; pass --allow-unknown to decode it anyway$",
    )
    res = cli("generate", "--model", ckpt, "--gen-length", 16, "--block-length", 8, "--allow-unknown", "1 +1=")
    assert res.returncode == 0, res.stderr
    res = cli("forward", "--model", ckpt, "--text", "1 +1=")
    assert_one_line_error(res, r"^error: --text: text holds characters outside .* ' ' at position 1")


def test_cli_forward_warns_on_non_finite_logits(tmp_path):
    from blockbatch.random_checkpoint import make_random_checkpoint

    path = tmp_path / "hot"
    make_random_checkpoint(path, logit_scale=1e6, d_model=64, n_layers=1)  # LM head beyond float16's range
    res = cli("forward", "--model", path, "--dtype", "float16")
    assert res.returncode == 0, res.stderr
    assert "warning: the logits are not finite" in res.stderr and "--dtype float32 or --dtype bfloat16" in res.stderr
    res = cli("forward", "--model", path, "--dtype", "float32")
    assert res.returncode == 0 and "warning" not in res.stderr, res.stderr


# --------------------------------------------------------------------------- item 7: CLI tracebacks


@pytest.mark.slow
def test_cli_bench_user_errors(ckpt, tmp_path):
    res = cli("bench", "--model", ckpt, "--n", 0)
    assert_one_line_error(res, r"^error: blockbatch bench: argument --n: must be a positive integer \(>= 1\), got 0")
    missing = tmp_path / "missing.jsonl"
    res = cli("bench", "--model", ckpt, "--tasks", missing, "--out", tmp_path / "o")
    assert_one_line_error(res, rf"^error: {missing}: task file not found$")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    res = cli("bench", "--model", ckpt, "--tasks", empty, "--out", tmp_path / "o")
    assert_one_line_error(res, rf"^error: --tasks {empty}: the file holds no tasks$")
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"prompt": "1+1=", "answer": "2"}\n{"prompt": 5, "answer": "2"}\n')
    res = cli("bench", "--model", ckpt, "--tasks", bad, "--out", tmp_path / "o")
    assert_one_line_error(res, rf"^error: {bad}:2: \"prompt\" must be a non-empty string, got int$")
    res = cli("bench", "--model", ckpt, "--tasks", bad, "--policies", "dual:sync=maybe")
    assert_one_line_error(res, r"option sync='maybe' is not a valid value for sync")
    res = cli("bench", "--model", ckpt, "--tasks", tmp_path, "--out", tmp_path / "o")
    assert_one_line_error(res, rf"^error: {tmp_path}: task file is a directory, not a file$")


@pytest.mark.parametrize(
    "damage,pattern",
    [
        ("config_loop", r"config.json: config.json is a symbolic link loop"),
        ("config_dir", r"config.json: config.json is a directory, not a file"),
        ("weights_dir", r"model.safetensors: safetensors file is a directory, not a file"),
        ("weights_loop", r"model.safetensors: safetensors file is a symbolic link loop"),
        ("template", r"tokenizer_config.json: key 'chat_template' has a Jinja syntax error at line 1: "),
        ("tying", r"config.json: key 'weight_tying' must be true or false"),
    ],
)
def test_cli_checkpoint_errors_are_one_line(ckpt, damage, pattern):
    if damage.startswith(("config", "weights")):
        name = "config.json" if damage.startswith("config") else "model.safetensors"
        p = os.path.join(ckpt, name)
        os.remove(p)
        if damage.endswith("loop"):
            os.symlink(name, p)
        else:
            os.mkdir(p)
    elif damage == "template":
        _write_text(ckpt, "tokenizer_config.json", json.dumps({"chat_template": "{% if messages %}{{ x }"}))
    else:
        _rewrite(ckpt, weight_tying="false")
    for args in (["generate", "--model", ckpt, "1+1="], ["forward", "--model", ckpt]):
        assert_one_line_error(cli(*args), pattern)


@pytest.mark.slow
def test_cli_make_random_refuses_to_overwrite(tmp_path):
    target = tmp_path / "file"
    target.write_text("precious")
    assert_one_line_error(cli("make-random", target), rf"^error: {target}: exists and is not a directory")
    assert target.read_text() == "precious"
    folder = tmp_path / "ck"
    assert cli("make-random", folder, "--d-model", 32, "--layers", 1, "--vocab", 32).returncode == 0
    res = cli("make-random", folder, "--d-model", 32, "--layers", 1, "--vocab", 32)
    assert_one_line_error(res, rf"^error: {folder}: already holds config.json, model.safetensors; pass --force")
    assert cli("make-random", folder, "--force", "--d-model", 32, "--layers", 1, "--vocab", 32).returncode == 0
    assert_one_line_error(
        cli("make-random", tmp_path / "z", "--layers", 0),
        r"^error: config: key 'n_layers' must be a positive integer, got 0$",
    )
    assert_one_line_error(
        cli("make-random", tmp_path / "z", "--d-model", 2**20, "--vocab", 2**20),
        r"too large to build in this machine's",
    )


@pytest.mark.slow
def test_cli_argument_errors_are_one_line(ckpt):
    assert_one_line_error(
        cli("generate", "--model", ckpt, "--gen-length", "x", "1+1="),
        r"^error: blockbatch generate: argument --gen-length: expected an integer, got 'x'",
    )
    assert_one_line_error(
        cli("generate", "--model", ckpt, "--ids", "1,x", "1+1="),
        r"^error: PROMPT 1: entry 1 \('x'\) of '1,x' is not an integer token id",
    )
    assert_one_line_error(
        cli("forward", "--model", ckpt, "--ids", "1,,2"),
        r"^error: --ids: entry 1 \(''\) of '1,,2' is not an integer token id",
    )
    assert_one_line_error(cli("nosuchcommand"), r"^error: blockbatch: argument COMMAND: invalid choice")


def test_cli_ctrl_c_is_one_line_and_status_130(tmp_path):
    """SIGINT while the bench runs: ``interrupted`` on stderr, status 130, no traceback."""
    proc = subprocess.Popen(
        [PY, "-m", "blockbatch.cli", "bench", "--n", "200", "--policies", "vanilla", "--out", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
        text=True,
    )
    _, err = interrupt_once_printed(proc, "[1/200]", wait_s=120)  # the progress line: decoding has begun
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.strip().splitlines()[-1].endswith("interrupted")


# --------------------------------------------------------------------------- item 10: import blockbatch


def test_import_blockbatch_registers_the_ops_and_exports():
    res = run_py(
        "import torch, blockbatch\n"
        "torch.ops.blockbatch.decode; torch.ops.blockbatch.forward; torch.classes.blockbatch.Model\n"
        "from blockbatch.engine import Engine\nfrom blockbatch.options import DecodeOptions\n"
        "from blockbatch.native import NativeModel\n"
        "assert blockbatch.Engine is Engine and blockbatch.DecodeOptions is DecodeOptions\n"
        "assert blockbatch.NativeModel is NativeModel\n"
        "assert {'Engine', 'DecodeOptions', 'NativeModel'} <= set(blockbatch.__all__) & set(dir(blockbatch))\n"
        "print('ok')"
    )
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def test_import_without_the_extension(tmp_path):
    src = os.path.dirname(blockbatch.__file__)
    shutil.copytree(
        src, tmp_path / "blockbatch", ignore=shutil.ignore_patterns("_C*.so", "bin", "__pycache__", "checkpoint")
    )
    code = (
        "import blockbatch, torch\n"
        "assert blockbatch.__file__.startswith(%r)\n"
        "blockbatch.ModelConfig, blockbatch.load_checkpoint, blockbatch.DecodeOptions\n"
        "try:\n    blockbatch.DecodeOptions(policy='dual')\nexcept ImportError as e:\n    print('options:', e)\n"
        "try:\n    blockbatch.Engine\nexcept ImportError as e:\n    print('engine:', e)\n"
        "try:\n    blockbatch.NativeModel\nexcept ImportError as e:\n    print('native:', e)\n"
    ) % str(tmp_path)
    res = subprocess.run(
        [PY, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**ENV, "PYTHONPATH": str(tmp_path)},
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    for kind in ("engine", "native", "options"):  # DecodeOptions' values are checked in C++
        assert (
            f"{kind}: blockbatch's C++ extension was not found in {tmp_path / 'blockbatch'}. Build it with"
            in res.stdout
        ), res.stdout
