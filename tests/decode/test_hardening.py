"""Bad input never crashes, hangs or writes out of bounds (issue 17): the ops, the decode loops,
the options. Every case that once crashed or hung runs in a subprocess with a timeout, so a
regression fails one test instead of killing the run; the sanitizer CI step runs this file
under ASan/UBSan, which also catches out-of-bounds writes that happen not to crash."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import blockbatch.native  # noqa: F401  (registers the ops)
from blockbatch.engine import Engine
from blockbatch.options import DecodeOptions
from helpers.random_branch_state import coordinate_args, random_branch_state
from helpers.processes import interrupt_once_printed

ops = torch.ops.blockbatch
PROMPT = "72-2=__-3=__-3=__...............?"


def run_isolated(code: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `code` in a fresh Python; a crash or hang there fails the caller's assertions only."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout, env=full_env
    )


def assert_ok(proc: subprocess.CompletedProcess, *expected: str) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-3000:]}"
    for line in expected:
        assert line in proc.stdout, f"{line!r} not in:\n{proc.stdout}\nstderr:\n{proc.stderr[-3000:]}"


def _checkpoint(tmp_path_factory, name: str, **kwargs) -> str:
    from blockbatch.random_checkpoint import make_random_checkpoint

    path = tmp_path_factory.mktemp(name) / "ckpt"
    make_random_checkpoint(path, **kwargs)
    return str(path)


@pytest.fixture(scope="module")
def nan_checkpoint(tmp_path_factory):
    """A tiny random model whose float16 logits overflow to inf/NaN (logit scale 1e5)."""
    return _checkpoint(
        tmp_path_factory,
        "nan",
        logit_scale=1e5,
        n_layers=1,
        d_model=64,
        n_heads=2,
        n_kv_heads=2,
        mlp_hidden_size=128,
        vocab_size=64,
        embedding_size=64,
    )


# ------------------------------------------------------------- 1. non-finite logits end a decode


@pytest.mark.parametrize(
    "options",
    [
        "policy='vanilla', gen_length=32, block_length=32",
        "policy='prefix', gen_length=32, block_length=16",
        "policy='dual', gen_length=32, block_length=8",
        "policy='dual', gen_length=32, block_length=8, threshold=None, steps=32",  # fixed schedule
        "policy='dual', gen_length=32, block_length=8, factor=1.0",
        "policy='dual', gen_length=32, block_length=8, temperature=0.7",
        "policy='blockbatch', gen_length=32, block_sizes=(4, 8, 16, 32)",
        "policy='blockbatch', gen_length=32, block_sizes=(4, 8, 16, 32), temperature=0.7",
    ],
)
def test_nonfinite_logits_fail_with_a_clear_error(nan_checkpoint, options):
    proc = run_isolated(
        f"""
        import torch
        from blockbatch.engine import Engine
        from blockbatch.options import DecodeOptions
        e = Engine.from_pretrained({nan_checkpoint!r}, dtype=torch.float16)
        try:
            e.generate([1, 2, 3], DecodeOptions({options}))
        except RuntimeError as err:
            print("ERROR", err)
        """,
        timeout=120,
    )
    assert_ok(proc, "ERROR blockbatch: decode step 0 (")
    assert "committed no token" in proc.stdout and "not finite" in proc.stdout
    assert "float32 or bfloat16" in proc.stdout


def test_nonfinite_logits_name_the_block(nan_checkpoint):
    """The message names the step, the block and its positions (prompt of 3: block 0 = [3, 11))."""
    e = Engine.from_pretrained(nan_checkpoint, dtype=torch.float16)
    with pytest.raises(RuntimeError, match=r"decode step 0 \(block 0, positions \[3, 11\)\) committed no token"):
        e.generate([1, 2, 3], DecodeOptions(policy="dual", gen_length=32, block_length=8))
    with pytest.raises(RuntimeError, match=r"decode step 0 \(init forward \[3, 7\)\) committed no token"):
        e.generate([1, 2, 3], DecodeOptions(policy="blockbatch", gen_length=32, block_sizes=(4, 8)))
    # the same model in float32 decodes: the check does not fire on finite logits
    ok = Engine.from_pretrained(nan_checkpoint, dtype=torch.float32)
    [g] = ok.generate([1, 2, 3], DecodeOptions(policy="dual", gen_length=32, block_length=8))
    assert ok.config.mask_token_id not in g.raw_ids


# ------------------------------------------------------------------- SIGINT and the deadline


@pytest.fixture(scope="module")
def slow_checkpoint(tmp_path_factory):
    """Big enough that a 1000-token vanilla decode takes far longer than the test waits."""
    return _checkpoint(
        tmp_path_factory,
        "slow",
        n_layers=4,
        d_model=256,
        n_heads=4,
        n_kv_heads=4,
        mlp_hidden_size=512,
        vocab_size=256,
        embedding_size=256,
        max_sequence_length=1024,
    )


def test_sigint_stops_a_decode_within_a_step_and_the_engine_stays_usable(slow_checkpoint):
    """Ctrl-C as a terminal sends it: SIGINT from outside while the op runs; KeyboardInterrupt in
    Python within a step, and the same Engine decodes afterwards."""
    code = textwrap.dedent(f"""
        import time
        from blockbatch.engine import Engine
        from blockbatch.options import DecodeOptions
        e = Engine.from_pretrained({slow_checkpoint!r})
        for opts in (DecodeOptions(policy="vanilla", gen_length=1000, block_length=1000, threshold=None, steps=1000),
                     DecodeOptions(policy="blockbatch", gen_length=1000, block_sizes=(4, 8), refresh_tokens=4)):
            print("STARTED", flush=True)
            t0 = time.perf_counter()
            try:
                e.generate([1, 2, 3], opts)
                print("NOT INTERRUPTED", opts.policy, flush=True)
            except KeyboardInterrupt:
                print(f"INTERRUPTED {{opts.policy}} {{time.perf_counter() - t0:.2f}}", flush=True)
        [g] = e.generate([1, 2, 3], DecodeOptions(policy="dual", gen_length=16, block_length=16))
        print("USABLE", len(g.raw_ids), flush=True)
        """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line.strip())
            if line.startswith("STARTED"):
                time.sleep(1.5)  # inside the decode: model loading is done before STARTED
                proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "\n".join(lines)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out}\n{proc.stderr.read()[-3000:]}"
    for expected in ("INTERRUPTED vanilla", "INTERRUPTED blockbatch", "USABLE 16"):
        assert expected in out, out
    for line in lines:
        if line.startswith("INTERRUPTED"):
            assert float(line.split()[-1]) < 10, line  # within a step of the signal, not at the end


def test_cli_generate_ctrl_c_exits_130_within_a_step(slow_checkpoint):
    """Ctrl-C during one long `blockbatch generate`: the native decode stops at its next forward,
    the CLI prints `interrupted` and exits with status 130, no traceback."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-u",
            "-m",
            "blockbatch.cli",
            "generate",
            "--model",
            slow_checkpoint,
            "--policy",
            "vanilla",
            "--gen-length",
            "1000",
            "--block-length",
            "1000",
            "--threshold",
            "none",
            "--steps",
            "1000",
            "--ids",
            "1,2,3",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(6)  # loaded and decoding (the whole decode takes minutes)
        assert proc.poll() is None, proc.communicate()
        sent = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        elapsed = time.perf_counter() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "interrupted", err
    assert elapsed < 10, elapsed


def test_cli_generate_jsonl_ctrl_c_keeps_the_lines_written(slow_checkpoint, tmp_path):
    """Ctrl-C during `generate --input F --output O`: status 130, and O (an older file there
    before) holds exactly the result lines written before the signal, no temporary left."""
    src, out = tmp_path / "req.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(f'{{"id": {i}, "ids": [1, 2, {3 + i}]}}\n' for i in range(200)), encoding="utf-8")
    out.write_text("old\n", encoding="utf-8")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-u",
            "-m",
            "blockbatch.cli",
            "generate",
            "--model",
            slow_checkpoint,
            "--input",
            src,
            "--output",
            out,
            "--max-batch",
            "1",
            "--policy",
            "vanilla",
            "--gen-length",
            "64",
            "--block-length",
            "64",
            "--threshold",
            "none",
            "--steps",
            "64",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen, err = interrupt_once_printed(proc, "2 done")
    assert proc.returncode == 130, seen + err
    assert "Traceback" not in err and "interrupted:" in err, err
    written = int(err.split("interrupted: ")[1].split()[0])
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert 2 <= len(rows) == written < 200 and all("ids" in r for r in rows), (written, rows[:3])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl", "req.jsonl"]


@pytest.mark.parametrize("timeout_s", [1e10, 1e300, sys.float_info.max])
def test_a_timeout_past_the_clock_is_no_deadline(timeout_s):
    """timeout_s so large that its deadline does not fit the clock (int64 nanoseconds) once
    overflowed into a deadline already passed; now it is none: every path decodes as without."""
    e = Engine.from_pretrained()
    opts = [
        DecodeOptions(policy="dual", gen_length=32, block_length=8),
        DecodeOptions(policy="blockbatch", gen_length=32, block_sizes=(8, 16)),
    ]
    alone = [e.generate(PROMPT, o)[0] for o in opts]
    long = [o.replace(timeout_s=timeout_s) for o in opts]
    for o, a in zip(long, alone):
        [g] = e.generate(PROMPT, o)
        assert g.raw_ids == a.raw_ids and g.stats["nfe"] == a.stats["nfe"]
    batched = e.generate([PROMPT, PROMPT], long, max_batch=2)
    assert [g.raw_ids for g in batched] == [a.raw_ids for a in alone]
    items = sorted(e.stream([PROMPT, PROMPT], long, max_batch=2), key=lambda item: item.index)
    assert [item.generation.raw_ids for item in items] == [a.raw_ids for a in alone]


def test_timeout_ends_a_decode_with_timeout_error(slow_checkpoint):
    e = Engine.from_pretrained(slow_checkpoint)
    t0 = time.perf_counter()
    with pytest.raises(TimeoutError, match=r"decode deadline exceeded: timeout_s = 0.3 passed after \d+ forwards"):
        e.generate(
            [1, 2, 3],
            DecodeOptions(
                policy="vanilla", gen_length=1000, block_length=1000, threshold=None, steps=1000, timeout_s=0.3
            ),
        )
    assert time.perf_counter() - t0 < 30
    # a generous deadline changes nothing
    a = e.generate([1, 2, 3], DecodeOptions(policy="dual", gen_length=16, block_length=8))[0]
    b = e.generate([1, 2, 3], DecodeOptions(policy="dual", gen_length=16, block_length=8, timeout_s=600))[0]
    assert a.raw_ids == b.raw_ids and a.stats["nfe"] == b.stats["nfe"]


def test_decode_op_cancel_flag():
    e = Engine.from_pretrained()
    ids = e.encode(PROMPT)
    flag = torch.ones(1, dtype=torch.long)
    with pytest.raises(RuntimeError, match="decode cancelled after 0 forwards"):
        ops.decode(e.model.obj, ids, policy="blockbatch", cancel=flag)
    with pytest.raises(ValueError, match="cancel must be a one- or two-element int64 CPU tensor"):
        ops.decode(e.model.obj, ids, cancel=torch.zeros(3, dtype=torch.long))
    # a second element receives the stop reason (1: cancelled; 2 would be the deadline)
    flag = torch.tensor([1, 0])
    with pytest.raises(RuntimeError, match="decode cancelled"):
        ops.decode(e.model.obj, ids, cancel=flag)
    assert flag[1] == 1
    slow = DecodeOptions(policy="blockbatch", gen_length=64, timeout_s=1e-9)
    flag = torch.zeros(2, dtype=torch.long)
    with pytest.raises(RuntimeError, match="deadline exceeded"):
        ops.decode.typed(e.model.obj, ids, slow.native, flag)
    assert flag[1] == 2
    with pytest.raises(TypeError, match="cancel must be int64"):
        ops.decode(e.model.obj, ids, cancel=torch.zeros(1))
    tokens, *_ = ops.decode(e.model.obj, ids, policy="blockbatch", cancel=torch.zeros(1, dtype=torch.long))
    assert e.config.mask_token_id not in tokens.tolist()[: ids.numel() + 20]


def test_decode_from_a_worker_thread_needs_no_signal_handling():
    """Off the main thread the op runs directly (no extra thread) and gives the same answer."""
    import threading

    e = Engine.from_pretrained()
    opts = DecodeOptions(policy="blockbatch", gen_length=64, block_sizes=(4, 8, 16))
    [main] = e.generate(PROMPT, opts)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("g", e.generate(PROMPT, opts)[0]))
    t.start()
    t.join(120)
    assert out["g"].raw_ids == main.raw_ids and out["g"].stats["nfe"] == main.stats["nfe"]


# ------------------------------------------------- 2, 3. the bookkeeping ops check their inputs


def test_absorb_rejects_window_past_canvas_and_writes_nothing():
    proc = run_isolated("""
        import torch
        import blockbatch.native
        from helpers.random_branch_state import FIELD, random_branch_state
        ops = torch.ops.blockbatch
        s = random_branch_state(3)
        b = int((s["state"][:, FIELD["done"]] == 0).nonzero()[0])
        L = s["canvas"].shape[1]
        s["state"][b, FIELD["start"]] = L - 2
        s["state"][b, FIELD["end"]] = L + 1000          # window end far past the canvas
        n = 1002
        logits = torch.randn(n, 10)
        token, conf = ops.confidence(logits, 9)
        ids, probs = ops.sparse_probs(logits, 0.1, 3)
        before = {k: v.clone() for k, v in s.items() if torch.is_tensor(v)}
        spans = torch.tensor([[b, 0, L - 2, 2, 0]])
        try:
            ops.bb_absorb_(s["canvas"], s["state"], s["eos_prob"], s["map_ids"], s["map_probs"], spans, token, conf,
                           ids, probs, logits, 3, 9, 7, 0.9, True)
            print("ACCEPTED")
        except ValueError as e:
            print("ERROR", e)
        print("UNCHANGED", all(torch.equal(before[k], s[k]) for k in before))
        """)
    assert_ok(proc, "ERROR state[", "must lie inside the generation", "UNCHANGED True")


def test_absorb_rejects_eos_id_outside_the_vocabulary():
    proc = run_isolated("""
        import torch
        import blockbatch.native
        from helpers.random_branch_state import FIELD, random_branch_state, window_spans
        ops = torch.ops.blockbatch
        s = random_branch_state(5)
        spans, rows = window_spans(s["state"])
        logits = torch.randn(rows, 10)
        token, conf = ops.confidence(logits, 9)
        ids, probs = ops.sparse_probs(logits, 0.1, 3)
        for eos in (10, 10**12, -5):
            try:
                ops.bb_absorb_(s["canvas"], s["state"], s["eos_prob"], s["map_ids"], s["map_probs"],
                               torch.tensor(spans), token, conf, ids, probs, logits, 3, 9, eos, 0.9, True)
                print("ACCEPTED", eos)
            except ValueError as e:
                print("ERROR", e)
        """)
    assert_ok(
        proc,
        "ERROR eos_id = 10 is outside the logits' vocabulary [0, 10)",
        "ERROR eos_id = 1000000000000 is outside",
        "ERROR eos_id = -5 is outside",
    )
    assert "ACCEPTED" not in proc.stdout


@pytest.mark.parametrize(
    "field,value,pattern",
    [
        ("end", 10**9, r"state\[\d+\]: window \[\d+, 1000000000\) must lie inside the generation"),
        ("start", -7, r"state\[\d+\]: window \[-7, \d+\) must lie inside the generation"),
        ("start", 1, r"state\[\d+\]: window \[1, \d+\) must lie inside the generation \[prompt_len = 3"),
        ("block", 0, r"state\[\d+\]: block size must be > 0 and divide the generation length 64, got 0"),
        ("block", -4, r"state\[\d+\]: block size must be > 0 and divide the generation length 64, got -4"),
        ("block", 33, r"state\[\d+\]: block size must be > 0 and divide the generation length 64, got 33"),
    ],
)
def test_coordinate_rejects_windows_outside_the_canvas(field, value, pattern):
    proc = run_isolated(f"""
        import torch
        import blockbatch.native
        from helpers.random_branch_state import FIELD, coordinate_args, random_branch_state
        s = random_branch_state(2)
        b = int((s["state"][:, FIELD["done"]] == 0).nonzero()[0])
        s["state"][b, FIELD[{field!r}]] = {value}
        before = {{k: v.clone() for k, v in s.items() if torch.is_tensor(v)}}
        try:
            torch.ops.blockbatch.bb_coordinate_(*coordinate_args(s))
            print("ACCEPTED")
        except ValueError as e:
            print("ERROR", e)
        print("UNCHANGED", all(torch.equal(before[k], s[k]) for k in before))
        """)
    assert_ok(proc, "ERROR", "UNCHANGED True")
    import re

    assert re.search(pattern, proc.stdout), proc.stdout


def test_kv_copy_rows_checks_every_source_before_copying():
    kv = torch.randn(3, 2, 4)
    before = kv.clone()
    with pytest.raises(ValueError, match=r"src\[2\] = 3 must be -1 \(keep\) or a row in \[0, 3\)"):
        ops.kv_copy_rows_(kv, torch.tensor([1, 0, 3]))
    assert torch.equal(kv, before)  # row 0 was not copied before row 2 failed


def test_valid_bookkeeping_is_unchanged_by_the_guards():
    """The guards accept every state the decode loop produces (the parity tests decode through
    them); and a random plausible state coordinates without error."""
    for seed in range(10):
        s = random_branch_state(seed)
        ops.bb_coordinate_(*coordinate_args(s))
        assert int(s["flags"][0]) in (0, 1)


# ------------------------------------------------------------ 4. forward reads through strides


@pytest.fixture(scope="module")
def model():
    from blockbatch.native import NativeModel
    from blockbatch.random_checkpoint import random_config, random_weights

    config = random_config()
    return NativeModel(config, random_weights(config))


def test_forward_reads_strided_index_tensors(model):
    base_tokens = torch.arange(20) % model.config.vocab_size
    tokens = base_tokens[::2]  # a valid view: stride 2
    positions = torch.arange(20)[::2]
    cu = torch.tensor([0, 4, 10])
    got = ops.forward(model.obj, tokens, positions, cu)
    want = ops.forward(model.obj, tokens.contiguous(), positions.contiguous(), cu)
    assert torch.equal(got, want)


def test_forward_expanded_index_tensor_reads_in_bounds(model):
    """An expand()ed tensor (stride 0) holds the value it shows: 6 copies of position 5."""
    proc = run_isolated("""
        import torch
        from blockbatch.native import NativeModel
        from blockbatch.random_checkpoint import random_config, random_weights
        config = random_config()
        m = NativeModel(config, random_weights(config))
        tokens = torch.tensor([3]).expand(6)
        bad = torch.tensor([10**9]).expand(6)
        pos = torch.tensor([5]).expand(6)
        cu = torch.tensor([0, 6])
        out = torch.ops.blockbatch.forward(m.obj, tokens, pos, cu)
        ref = torch.ops.blockbatch.forward(m.obj, tokens.contiguous(), pos.contiguous(), cu)
        print("EQUAL", torch.equal(out, ref))
        try:
            torch.ops.blockbatch.forward(m.obj, tokens, bad, cu)
        except Exception as e:
            print("ERROR", type(e).__name__, e)
        """)
    assert_ok(proc, "EQUAL True", "ERROR RuntimeError positions[0] = 1000000000 is outside [0, ")


# ----------------------------------------------------------- 6. options that allocate or overflow


@pytest.mark.parametrize(
    "kwargs,error,pattern",
    [
        (dict(policy="blockbatch", prob_floor=1e-6), ValueError, r"prob_floor must be in \[0.01, 1\)"),
        (dict(policy="blockbatch", prob_floor=1e-30), ValueError, r"prob_floor must be in \[0.01, 1\)"),
        (dict(threshold=None, steps=200_000_000), ValueError, r"steps must be None or an integer in \[0, gen_length"),
        (dict(seed=2**63), ValueError, r"seed must be in \[0, 2\^63 - 1\], got 9223372036854775808"),
        (dict(seed=-1), ValueError, r"seed must be"),
        (dict(policy="blockbatch", sync_gap=2**63), ValueError, r"sync_gap must be in \[0, 2\^30\]"),
        (dict(policy="blockbatch", refresh_tokens=2**40), ValueError, r"refresh_tokens must be in \[0, 2\^30\], got "),
        (dict(temperature=float("inf")), ValueError, r"temperature must be >= 0 and finite"),
        (dict(temperature=float("nan")), ValueError, r"temperature must be >= 0 and finite"),
        (dict(factor=float("inf")), ValueError, r"factor must be > 0 and finite"),
        (dict(timeout_s=-1.0), ValueError, r"timeout_s must be >= 0 and finite"),
        (dict(timeout_s=float("inf")), ValueError, r"timeout_s must be >= 0 and finite"),
        (dict(gen_length="128"), TypeError, r"gen_length must be an integer, got str '128'"),
        (dict(threshold="0.9"), TypeError, r"threshold must be a number or None, got str"),
        (dict(merge="yes"), TypeError, r"merge must be a bool, got str"),
        (dict(block_sizes=(4, 8.0)), TypeError, r"block_sizes must be a list or tuple of integers"),
        (dict(seed=True), TypeError, r"seed must be an integer, got bool"),
    ],
)
def test_decode_options_bound_every_field(kwargs, error, pattern):
    with pytest.raises(error, match=pattern) as info:
        DecodeOptions(**kwargs)
    assert any(str(info.value).startswith(f"{name} ") for name in kwargs), info.value  # names the field


@pytest.mark.parametrize(
    "kwargs,pattern",
    [
        (dict(policy="blockbatch", prob_floor=1e-6), r"prob_floor must be in \[0.01, 1\), got 1e-06"),
        (dict(policy="blockbatch", prob_floor=1e-30), r"prob_floor must be in \[0.01, 1\), got 1e-30"),
        (dict(threshold=None, steps=200_000_000), r"steps must be None or an integer in \[0, gen_length = 128\]"),
        (dict(gen_length=2**63 - 1), r"gen_length 9223372036854775807 exceeds max_sequence_length"),
        (dict(gen_length=2**62), r"gen_length 4611686018427387904 = 4611686018427387937 exceeds max_sequence_length"),
        (dict(seed=-3), r"seed must be in \[0, 2\^63 - 1\], got -3"),
        (dict(temperature=float("inf")), r"temperature must be >= 0 and finite, got inf"),
        (dict(timeout_s=float("nan")), r"timeout_s must be >= 0 and finite"),
        (dict(policy="blockbatch", sync_gap=2**40), r"sync_gap must be in \[0, 2\^30\], got 1099511627776"),
        (dict(factor=float("inf")), r"factor must be > 0 and finite, got inf"),
    ],
)
def test_decode_op_bounds_every_option(kwargs, pattern):
    """The op checks what DecodeOptions checks, before allocating anything sized by it."""
    e = Engine.from_pretrained()
    with pytest.raises(ValueError, match=pattern):
        ops.decode(e.model.obj, e.encode(PROMPT), **kwargs)


def test_sparse_probs_bounds_max_k():
    """max_k sizes the output: a huge one would allocate (and pad) gigabytes."""
    logits = torch.randn(4, 50)
    with pytest.raises(RuntimeError, match=r"max_k must be in \[1, 1024\], got 1000000000"):
        ops.sparse_probs(logits, 0.1, 10**9)
    with pytest.raises(RuntimeError, match=r"max_k must be in \[1, 1024\], got 0"):
        ops.sparse_probs(logits, 0.1, 0)
    ids, _ = ops.sparse_probs(logits, 0.1, 1024)  # the bound itself is fine
    assert ids.shape == (4, 1024)


def test_decode_after_fork_in_the_child():
    """The main thread's decodes run on one long-lived worker thread; a forked child (which has
    no such thread) starts its own instead of waiting forever on the parent's."""
    proc = run_isolated(
        """
        import os
        from blockbatch import Engine, DecodeOptions
        e = Engine.from_pretrained()
        opts = DecodeOptions(policy="dual", gen_length=32, block_length=16)
        [a] = e.generate([5, 6, 7], opts)
        pid = os.fork()
        if pid == 0:
            [b] = e.generate([5, 6, 7], opts)
            os._exit(0 if b.raw_ids == a.raw_ids else 3)
        _, status = os.waitpid(pid, 0)
        print("CHILD", os.waitstatus_to_exitcode(status))
        """,
        timeout=120,
    )
    assert_ok(proc, "CHILD 0")
