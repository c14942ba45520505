"""Every CUDA kernel runs on the CPU CUDA emulator (tests/emu/cuda_emu/) against the CPU ops.

The kernel sources of csrc/kernels/cuda/ are compiled by the host compiler with the emulator in
front: every GPU thread is a fiber, barriers and warp collectives are scheduled in a seeded
shuffled order, mma.sync / ldmatrix use the PTX fragment layouts, cp.async lands only at its
wait. So the kernels' indexing, tails, fragment mappings, barriers and reductions are checked
here on every CI run, not only when a GPU is lent. The emulator's own checks are tested on
kernels with known faults (tests/emu/cuda_emu/selftest.cu); its fragment layouts are the ones under
which the tensor-core attention kernel, verified on an H200, computes attention here.
Needs the CUDA toolkit's headers (not a GPU); skipped cleanly without them. BBEMU_SEED=N runs
everything under other thread orders (seeds 1-7 pass).
"""

import ctypes
import ctypes.util
import functools
import hashlib
import json
import os
from pathlib import Path

import pytest
import torch

import blockbatch.native  # noqa: F401
from helpers.random_branch_state import FIELD, coordinate_args, random_branch_state
from helpers.op_cases import absorb_case, commit_case, rope_kv_case, rope_table
from emu.cuda_emu.build import build

ops = torch.ops.blockbatch
CODE = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}

# argument kinds: i int, u unsigned, l int64, z size_t, f float, d double, p pointer (tensor or None)
_KINDS = {
    "i": ctypes.c_int,
    "u": ctypes.c_uint,
    "l": ctypes.c_int64,
    "z": ctypes.c_size_t,
    "f": ctypes.c_float,
    "d": ctypes.c_double,
    "p": ctypes.c_void_p,
}
_SIGNATURES = {
    "bbemu_rope_kv_write": "i plp ppl ppl p lllll l ppll i",
    "bbemu_attention": "ii pppp ll pl p lllll l pp i lll ip",
    "bbemu_attention_splits": "llllll",
    "bbemu_rms_norm": "i pl ppp ll f",
    "bbemu_silu_mul": "i pp ll",
    "bbemu_confidence": "i p lll pp",
    "bbemu_sparse_probs": "i p ll dl pp",
    "bbemu_rope_inplace": "i pllll ppl",
    "bbemu_kv_write": "i p lllll l ppl ppp ll",
    "bbemu_commit": "pl ppp p lll i dd p",
    "bbemu_bb_absorb": "i ppppp llllll pl pppp pll di",
    "bbemu_bb_coordinate": "ppppp lllll pp d ii ll i",
    "bbemu_kv_copy_rows": "pplll",
    "bbemu_set_kv_pages": "pll",
    "bbemu_set_key_lists": "pp",
    "bbemu_moe_experts": "i ppppp ppp lllll",
    "bbemu_selftest_neighbour": "pii",
    "bbemu_selftest_copy": "ppii",
    "bbemu_selftest_warp": "pi",
    "bbemu_selftest_launch": "uuzi",
}


class Emulator:
    def __init__(self, lib):
        self.lib = lib
        for name, sig in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes = [_KINDS[c] for c in sig.replace(" ", "")]
            fn.restype = ctypes.c_int
        lib.bbemu_last_error.restype = ctypes.c_char_p
        lib.bbemu_set_seed.argtypes = [ctypes.c_uint64]

    def seed(self, s):
        self.lib.bbemu_set_seed(s)

    def error(self):
        return self.lib.bbemu_last_error().decode()

    def __call__(self, name, *args):
        """The launcher's cudaError_t (0: success)."""
        conv = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args]
        return getattr(self.lib, name)(*conv)

    def ok(self, name, *args):
        rc = self(name, *args)
        assert rc == 0, f"{name}: cudaError {rc}: {self.error()}"


@pytest.fixture(scope="module")
def emu():
    try:
        path = build()
    except RuntimeError as e:
        if str(e).startswith(("no C++ compiler", "no CUDA toolkit headers")):
            pytest.skip(str(e))
        raise
    e = Emulator(ctypes.CDLL(str(path)))
    e.seed(int(os.environ.get("BBEMU_SEED", "1")))  # another seed: other thread orders (a race hunt)
    return e


def _rel_err(a, b):
    return (a.double() - b.double()).abs().max().item()


# ---------------------------------------------------------------------------------------------
# The emulator's checks, on kernels with known faults


def test_emulator_catches_a_missing_barrier(emu):
    n, want = 96, (torch.arange(96) + 1) % 96
    out = torch.empty(n)
    for seed in (1, 2, 3):
        emu.seed(seed)
        emu.ok("bbemu_selftest_neighbour", out, n, 1)
        assert torch.equal(out, want.float())
    wrong = 0
    for seed in (1, 2, 3):
        emu.seed(seed)
        emu.ok("bbemu_selftest_neighbour", out, n, 0)
        wrong += int(not torch.equal(out, want.float()))
    assert wrong == 3  # a thread that runs before its neighbour reads unwritten (NaN) shared memory


def test_emulator_catches_a_missing_cp_async_wait(emu):
    n = 64
    src = torch.randn(4 * n)
    out = torch.empty(4 * n)
    emu.ok("bbemu_selftest_copy", src, out, n, 1)
    assert torch.equal(out, src.view(n, 4).roll(-1, 0).flatten())
    emu.ok("bbemu_selftest_copy", src, out, n, 0)
    assert out.isnan().any()  # copies land at the wait, which never comes before the reads


def test_emulator_catches_divergent_warp_collectives(emu):
    out = torch.empty(32)
    emu.ok("bbemu_selftest_warp", out, 0)
    assert torch.equal(out, (torch.arange(32) ^ 1).float())
    assert emu("bbemu_selftest_warp", out, 1) != 0
    err = emu.error()  # whichever lane looks first reports it
    assert "of warp 0 is in" in err and "shfl_xor" in err and "syncwarp" in err, err
    assert emu("bbemu_selftest_warp", out, 2) != 0
    assert emu.error().startswith("deadlock: block (0, 0, 0) thread") and "warp collective" in emu.error()


def test_emulator_checks_launch_limits(emu):
    emu.ok("bbemu_selftest_launch", 4, 1, 48 * 1024, 0)
    assert emu("bbemu_selftest_launch", 4, 1, 64 * 1024, 0) != 0
    assert "65536 bytes of dynamic shared memory (limit 49152" in emu.error()
    emu.ok("bbemu_selftest_launch", 4, 1, 64 * 1024, 64 * 1024)
    emu.ok("bbemu_selftest_launch", 8, 8, 0, 0)
    assert emu("bbemu_selftest_launch", 4, 3, 0, 0) != 0 and "cluster (3, 1, 1) for grid (4, 1, 1)" in emu.error()
    assert emu("bbemu_selftest_launch", 16, 16, 0, 0) != 0 and "cluster (16, 1, 1)" in emu.error()


# ---------------------------------------------------------------------------------------------
# RoPE + KV write, attention, the small kernels: the same comparisons as tests/cuda/test_cuda.py


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hd", [16, 128, 12])
def test_rope_kv_write_emulated(emu, dtype, hd):
    """Both rope_kv_write kernels (16-byte accesses where hd allows, element pairs) == the CPU op
    (float32: bit for bit; bf16 within one bf16 step of the values' scale) and == each other."""
    table = rope_table(32, hd, 1e4)
    qkv_ref, q, k, v, kv_ref, (pos, cu, rows) = rope_kv_case("cpu", dtype, hd=hd)
    ops.rope_kv_write_(q, k, v, pos, table, kv_ref, cu, rows, 1)
    results = []
    for vectorized in (1, 0):
        qkv, q, k, v, kv, _ = rope_kv_case("cpu", dtype, hd=hd)
        L, layers = kv.shape[4], kv.shape[1]
        emu.ok(
            "bbemu_rope_kv_write",
            CODE[dtype],
            q,
            q.stride(0),
            q.shape[1],
            k,
            v,
            k.stride(0),
            pos,
            table,
            table.shape[0],
            kv,
            layers,
            kv.shape[3],
            L,
            hd,
            kv.shape[0],
            1,
            cu,
            rows,
            len(rows),
            q.shape[0],
            vectorized,
        )
        results.append((qkv, kv))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
    tol = 0 if dtype == torch.float32 else 1e-2
    for a, b in zip(results[0], (qkv_ref, kv_ref)):
        assert _rel_err(a, b) <= tol * b.float().abs().max().item()


def _attention(
    emu, kernel, q, k, v, cu, kv, rows, cache, layer, fresh, splits, max_keys, sentinel=7.0, length=None, buffers=None
):
    """The kernel's output (NaN to start with: every element must be written) in a buffer with a
    guard row, and the split workspace sized as csrc/ops/cuda/attention.cpp sizes it, plus a guard: neither guard
    may change. length / buffers: the geometry's positions per KV row and KV rows (default: kv's;
    a page store read through bbemu_set_kv_pages: the table's)."""
    T, heads, hd = q.shape
    out = torch.full((T + 1, heads * hd), float("nan"), dtype=q.dtype)
    out[T] = sentinel
    used = splits if splits else emu("bbemu_attention_splits", heads, k.shape[1], hd, len(rows), T, max_keys)
    part = torch.full(((used if kernel else 1) * T * heads * (hd + 2) + 64,), sentinel)
    emu.ok(
        "bbemu_attention",
        CODE[q.dtype],
        kernel,
        q,
        k,
        v,
        out,
        q.stride(0),
        k.stride(0),
        cu,
        len(rows),
        kv,
        kv.shape[1],
        kv.shape[3],
        kv.shape[4] if length is None else length,
        hd,
        kv.shape[0] if buffers is None else buffers,
        layer,
        rows,
        cache,
        int(fresh),
        heads,
        T,
        max_keys,
        splits,
        part,
    )
    assert (out[T] == sentinel).all() and (part[-64:] == sentinel).all(), "a write outside the output / workspace"
    return out[:T]


# The flash kernels' outputs in test_attention_emulated, bit for bit, as recorded from the kernel
# before flash_attention.cu was split into flash_common.cuh and variant files (a change of
# operation order in any reduction changes some bits). BBEMU_RECORD_BITS=1 rewrites the record,
# after a deliberate change of numerics only.
FLASH_BITS = Path(__file__).parent / "cuda_emu" / "flash_attention_bits.json"


def _digest(*tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def _exp2f_digest():
    """exp2f (the kernels' only libm call: the emulator runs the host's) over 2^16 arguments in
    [-40, 0): a host whose exp2f rounds differently cannot reproduce the recorded bits."""
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    libm.exp2f.argtypes, libm.exp2f.restype = [ctypes.c_float], ctypes.c_float
    x = torch.arange(1 << 16, dtype=torch.float32) * (-40.0 / (1 << 16))
    return _digest(torch.tensor([libm.exp2f(v) for v in x.tolist()], dtype=torch.float32))


def _check_flash_bits(key, inputs, outputs):
    """outputs {case: tensor} == the record for `key` bit for bit (skipped where the inputs or the
    host's exp2f differ from the recording's: the record cannot apply there)."""
    record = json.loads(FLASH_BITS.read_text()) if FLASH_BITS.exists() else {}
    got = {
        "inputs": _digest(*inputs),
        "exp2f": _exp2f_digest(),
        "outputs": {case: _digest(out) for case, out in outputs.items()},
    }
    if os.environ.get("BBEMU_RECORD_BITS") == "1":
        record[key] = got
        FLASH_BITS.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        return
    want = record[key]
    if (got["inputs"], got["exp2f"]) != (want["inputs"], want["exp2f"]):
        pytest.skip(f"{key}: inputs or the host's exp2f differ from the recording's; the bit record does not apply")
    changed = sorted(c for c in want["outputs"] if got["outputs"].get(c) != want["outputs"][c])
    assert not changed and got["outputs"].keys() == want["outputs"].keys(), f"{key}: bits changed in {changed}"


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads,kv_heads,hd", [(4, 2, 64), (2, 1, 128)])
def test_attention_emulated(emu, dtype, heads, kv_heads, hd):
    """The reference kernel and the tensor-core kernels (staged; pipelined with 2 and 3 cp.async
    stages; one, three and nine key splits, and the automatic count) against float32 attention on
    the same rounded inputs: within 2x the CPU op's own error at this dtype; staged and pipelined
    kernels equal bit for bit. Every flash output equals the recorded bits (FLASH_BITS)."""
    g = torch.Generator().manual_seed(heads * hd)
    lengths, L = [1, 7, 64, 65], 140
    T = sum(lengths)
    q, k, v = (torch.randn(T, h, hd, generator=g).to(dtype) for h in (heads, kv_heads, kv_heads))
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)))
    rows = torch.tensor([2, 0, 3, 1])
    inputs, outputs = [q, k, v], {}
    for cache, fresh in ((torch.full((4,), L), False), (torch.tensor([0, 5, 64, 140]), True)):
        # Layer 1's slots past each row's cache length and all of layer 0 are NaN: no kernel (nor
        # the CPU op) may read them, or the outputs turn NaN.
        kv = torch.full((len(lengths), 2, 2, kv_heads, L, hd), float("nan"), dtype=dtype)
        for r, n in zip(rows.tolist(), cache.tolist()):
            kv[r, 1, :, :, :n] = torch.randn(2, kv_heads, n, hd, generator=g).to(dtype)
        inputs.append(kv)
        exact = ops.packed_attention(q.float(), k.float(), v.float(), cu, kv.float(), rows, cache, 1, fresh)
        cpu_err = _rel_err(ops.packed_attention(q, k, v, cu, kv, rows, cache, 1, fresh), exact)
        assert cpu_err > 0
        max_keys = L + max(lengths)
        ref = _attention(emu, 0, q, k, v, cu, kv, rows, cache, 1, fresh, 1, max_keys)
        assert _rel_err(ref, exact) <= 2 * cpu_err
        for splits in (1, 3, 9, 0):
            staged, pipelined, pipelined3 = (
                _attention(emu, kernel, q, k, v, cu, kv, rows, cache, 1, fresh, splits, max_keys)
                for kernel in (1, 2, 3)
            )
            assert not pipelined3.isnan().any()
            err = _rel_err(pipelined3, exact)
            assert err <= 2 * cpu_err, f"cache={cache.tolist()} splits={splits}: {err:.3g} vs {cpu_err:.3g}"
            assert torch.equal(staged, pipelined), f"cache={cache.tolist()} splits={splits}"
            assert torch.equal(staged, pipelined3), f"cache={cache.tolist()} splits={splits}"
            for kernel, out in enumerate((staged, pipelined, pipelined3), 1):
                outputs[f"fresh={int(fresh)} splits={splits} variant={kernel}"] = out
    _check_flash_bits(f"{str(dtype).split('.')[1]} heads={heads}/{kv_heads} hd={hd}", inputs, outputs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim", [256, 4096, 100])  # 16-byte chunks (1 or 2 per thread) / scalar kernels
def test_norm_and_activation_emulated(emu, dtype, dim):
    """RMSNorm, the fused residual add + RMSNorm (x updated too) and SwiGLU == the CPU ops
    (float32 within 1e-4; bf16 within 2e-2)."""
    g = torch.Generator().manual_seed(dim)
    rows = 5
    x = torch.randn(rows, dim + 8, generator=g).to(dtype)[:, :dim]  # row stride != dim
    w = (1 + 0.1 * torch.randn(dim, generator=g)).to(dtype)
    delta = torch.randn(rows, dim, generator=g).to(dtype)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    out = torch.empty(rows, dim, dtype=dtype)
    emu.ok("bbemu_rms_norm", CODE[dtype], x, x.stride(0), None, w, out, rows, dim, 1e-5)
    torch.testing.assert_close(out.float(), ops.rms_norm(x, w, 1e-5).float(), atol=tol, rtol=tol)
    xc = x.contiguous()
    x_ref = xc.clone()
    expected = ops.add_rms_norm_(x_ref, delta, w, 1e-5)
    emu.ok("bbemu_rms_norm", CODE[dtype], xc, dim, delta, w, out, rows, dim, 1e-5)
    assert torch.equal(xc, x_ref)
    torch.testing.assert_close(out.float(), expected.float(), atol=tol, rtol=tol)
    m = dim // 2 + 3
    gu = torch.randn(rows, 2 * m, generator=g).to(dtype)
    act = torch.empty(rows, m, dtype=dtype)
    emu.ok("bbemu_silu_mul", CODE[dtype], gu, act, rows, m)
    torch.testing.assert_close(act.float(), ops.silu_mul(gu).float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [5000, 4999])  # rows read in 16-byte chunks / element by element
def test_confidence_and_sparse_probs_emulated(emu, dtype, vocab):
    g = torch.Generator().manual_seed(vocab)
    rows = 4
    logits = (4 * torch.randn(rows, vocab, generator=g)).to(dtype)
    logits[3, 10] = logits[3, 2000] = logits[3].max() + 1  # a tie: the lower id wins
    argmax, conf = torch.empty(rows, dtype=torch.long), torch.empty(rows, dtype=torch.float64)
    emu.ok("bbemu_confidence", CODE[dtype], logits, rows, vocab, 7, argmax, conf)
    a_cpu, c_cpu = ops.confidence(logits, 7)
    assert torch.equal(argmax, a_cpu) and argmax[3].item() == 10
    torch.testing.assert_close(conf, c_cpu, atol=1e-9, rtol=1e-7)
    max_k = 11
    ids, probs = torch.empty(rows, max_k, dtype=torch.long), torch.empty(rows, max_k, dtype=torch.float64)
    emu.ok("bbemu_sparse_probs", CODE[dtype], logits, rows, vocab, 0.1, max_k, ids, probs)
    ids_c, p_c = ops.sparse_probs(logits, 0.1, max_k)
    for r in range(rows):  # same (token, prob) set per row; the GPU order is unspecified
        ours = sorted((int(i), float(p)) for i, p in zip(ids[r], probs[r]) if i >= 0)
        theirs = sorted((int(i), float(p)) for i, p in zip(ids_c[r], p_c[r]) if i >= 0)
        assert [i for i, _ in ours] == [i for i, _ in theirs]
        torch.testing.assert_close(
            torch.tensor([p for _, p in ours], dtype=torch.float64),
            torch.tensor([p for _, p in theirs], dtype=torch.float64),
            atol=1e-9,
            rtol=1e-7,
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_separate_rope_and_kv_write_emulated(emu, dtype):
    """rope_ and kv_write_ (the unfused kernels) == the CPU ops, bit for bit."""
    hd = 16
    table = rope_table(32, hd, 1e4)
    qkv_ref, q_ref, k_ref, v_ref, kv_ref, (pos, cu, rows) = rope_kv_case("cpu", dtype, hd=hd)
    qkv, q, k, v, kv, _ = rope_kv_case("cpu", dtype, hd=hd)
    ops.rope_(q_ref, pos, table)
    ops.kv_write_(kv_ref, k_ref, v_ref, pos, cu, rows, 1)
    T = q.shape[0]
    emu.ok("bbemu_rope_inplace", CODE[dtype], q, T, q.stride(0), q.shape[1], hd, pos, table, table.shape[0])
    emu.ok(
        "bbemu_kv_write",
        CODE[dtype],
        kv,
        kv.shape[1],
        kv.shape[3],
        kv.shape[4],
        hd,
        kv.shape[0],
        1,
        k,
        v,
        k.stride(0),
        pos,
        cu,
        rows,
        len(rows),
        T,
    )
    assert torch.equal(qkv, qkv_ref) and torch.equal(kv, kv_ref)


@pytest.mark.parametrize("rule", ["threshold", "fixed", "factor"])
def test_commit_emulated(emu, rule):
    g = torch.Generator().manual_seed(1)
    for n in (1, 33, 300, 4096):
        canvas, window, token, conf, k = commit_case(g, n)
        cpu, emulated, counts = canvas.clone(), canvas.clone(), torch.empty(3, dtype=torch.long)
        expected = ops.commit_(cpu, window, token, conf, k, 9, 0, rule, 0.8, 1.0)
        emu.ok(
            "bbemu_commit",
            emulated,
            emulated.shape[0],
            window,
            token,
            conf,
            k,
            n,
            9,
            0,
            ["threshold", "fixed", "factor"].index(rule),
            0.8,
            1.0,
            counts,
        )
        assert torch.equal(emulated, cpu) and counts.tolist() == expected.tolist(), f"n={n}"


def _view_args(s):
    B, L = s["canvas"].shape
    return (
        s["canvas"],
        s["state"],
        s["eos_prob"],
        s["map_ids"],
        s["map_probs"],
        B,
        L,
        s["prompt_len"],
        s["map_ids"].shape[2],
        s["mask_id"],
    )


def test_coordinate_and_kv_copy_rows_emulated(emu):
    """bb_coordinate_ (one thread block) == the CPU loops on random mid-decode states, every output;
    then kv_copy_rows_ (16-byte and byte copies)."""
    for seed in range(8):
        for kwargs in ({}, {"merge_gate": 0.7, "sync_gap": 4}, {"periodic_refresh": False}):
            cpu = random_branch_state(seed, gen_length=256 if seed % 4 == 0 else 64)
            emulated = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in cpu.items()}
            args = coordinate_args(cpu, **kwargs)
            ops.bb_coordinate_(*args)
            merge_gate, merge, sync, sync_gap, refresh_tokens, periodic_refresh = args[9:]
            emu.ok(
                "bbemu_bb_coordinate",
                *_view_args(emulated),
                emulated["flags"],
                emulated["sync_src"],
                merge_gate,
                int(merge),
                int(sync),
                sync_gap,
                refresh_tokens,
                int(periodic_refresh),
            )
            for k in ("canvas", "state", "flags", "sync_src"):
                assert torch.equal(emulated[k], cpu[k]), f"seed {seed} {kwargs}: {k}"
            for width in (64, 67):  # rows of 16-byte words / of bytes
                kv = torch.randn(4, 2, 3, width, 8)
                expected = kv.clone()
                ops.kv_copy_rows_(expected, cpu["sync_src"])
                emu.ok("bbemu_kv_copy_rows", kv, emulated["sync_src"], kv.shape[0], kv[0].numel() * 4, 1)
                assert torch.equal(kv, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_absorb_emulated(emu, dtype):
    """bb_absorb_ (one block per span) == the CPU loops: map rows, commits, counters, EOS readiness."""
    eos = 7
    for seed in range(6):
        case = absorb_case(seed, dtype, eos)
        if case is None:
            continue
        cpu, spans, logits, token, conf, ids, probs = case
        emulated = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in cpu.items()}
        spans_t = torch.tensor(spans)
        ops.bb_absorb_(
            cpu["canvas"],
            cpu["state"],
            cpu["eos_prob"],
            cpu["map_ids"],
            cpu["map_probs"],
            spans_t,
            token,
            conf,
            ids,
            probs,
            logits,
            cpu["prompt_len"],
            cpu["mask_id"],
            eos,
            0.8,
            True,
        )
        view = list(_view_args(emulated)) + [eos]
        emu.ok(
            "bbemu_bb_absorb",
            CODE[dtype],
            *view,
            spans_t,
            len(spans),
            token,
            conf,
            ids,
            probs,
            logits,
            logits.shape[0],
            300,
            0.8,
            1,
        )
        for k in ("canvas", "state", "map_ids", "map_probs"):
            assert torch.equal(emulated[k], cpu[k]), f"seed {seed}: {k}"
        assert torch.allclose(emulated["eos_prob"], cpu["eos_prob"], rtol=1e-12, atol=0)


# ---------------------------------------------------------------------------------------------
# Guards: device index values the host does not check (that would cost a sync) never make a
# kernel write outside its tensors. Each tensor sits inside a larger NaN / sentinel buffer.


def test_kv_writes_skip_slots_outside_the_buffer_emulated(emu):
    hd, dtype = 16, torch.float32
    table = rope_table(32, hd, 1e4)
    _, q, k, v, kv, (pos, cu, rows) = rope_kv_case("cpu", dtype, hd=hd)
    guard = torch.full((2 * kv.numel(),), float("nan"), dtype=dtype)
    inside = guard[: kv.numel()].view(kv.shape)
    inside.copy_(kv)
    bad_pos, bad_rows = pos.clone(), rows.clone()
    bad_pos[0], bad_pos[-1] = kv.shape[4] + 5, -3  # past the buffer's length, negative
    bad_rows[0] = kv.shape[0]  # a KV row past the buffer
    for vectorized in (1, 0):
        emu.ok(
            "bbemu_rope_kv_write",
            CODE[dtype],
            q,
            q.stride(0),
            q.shape[1],
            k,
            v,
            k.stride(0),
            bad_pos,
            table,
            table.shape[0],
            inside,
            kv.shape[1],
            kv.shape[3],
            kv.shape[4],
            hd,
            kv.shape[0],
            1,
            cu,
            bad_rows,
            len(rows),
            q.shape[0],
            vectorized,
        )
        emu.ok(
            "bbemu_kv_write",
            CODE[dtype],
            inside,
            kv.shape[1],
            kv.shape[3],
            kv.shape[4],
            hd,
            kv.shape[0],
            1,
            k,
            v,
            k.stride(0),
            bad_pos,
            cu,
            bad_rows,
            len(rows),
            q.shape[0],
        )
        emu.ok(
            "bbemu_rope_inplace",
            CODE[dtype],
            q,
            q.shape[0],
            q.stride(0),
            q.shape[1],
            hd,
            bad_pos,
            table,
            table.shape[0],
        )
    assert torch.isnan(guard[kv.numel() :]).all(), "a write past the KV buffer"


def test_commit_skips_window_positions_outside_the_canvas_emulated(emu):
    g = torch.Generator().manual_seed(3)
    canvas, window, token, conf, k = commit_case(g, 40)
    L = canvas.shape[0]
    window[0], window[5], window[7] = L, -1, L + 10**6
    buf = torch.full((2 * L,), -77, dtype=torch.long)
    buf[:L] = canvas
    counts = torch.empty(3, dtype=torch.long)
    emu.ok("bbemu_commit", buf, L, window, token, conf, k, 40, 9, 0, 0, 0.8, 1.0, counts)
    assert (buf[L:] == -77).all(), "a write past the canvas"
    keep = torch.ones(40, dtype=torch.bool)
    keep[[0, 5, 7]] = False
    expected = canvas.clone()
    ops.commit_(expected, window[keep], token[keep], conf[keep], k, 9, 0, "threshold", 0.8, 1.0)
    assert torch.equal(buf[:L], expected)  # the other positions commit as the CPU op does


def test_absorb_and_coordinate_skip_bad_state_rows_emulated(emu):
    """A window past the canvas (which the CPU op rejects) changes nothing on the device."""
    s = random_branch_state(3)
    b = int((s["state"][:, FIELD["done"]] == 0).nonzero()[0])
    L = s["canvas"].shape[1]
    s["state"][b, FIELD["start"]], s["state"][b, FIELD["end"]] = L - 2, L + 1000
    before = {k: v.clone() for k, v in s.items() if torch.is_tensor(v)}
    logits = torch.randn(1002, 300)
    token, conf = ops.confidence(logits, s["mask_id"])
    ids, probs = ops.sparse_probs(logits, 0.1, 3)
    spans = torch.tensor([[b, 0, L - 2, 2, 0]])
    emu.ok(
        "bbemu_bb_absorb",
        CODE[torch.float32],
        *_view_args(s),
        7,
        spans,
        1,
        token,
        conf,
        ids,
        probs,
        logits,
        logits.shape[0],
        300,
        0.8,
        1,
    )
    for k in before:
        assert torch.equal(before[k], s[k]), f"absorb changed {k}"
    emu.ok("bbemu_bb_coordinate", *_view_args(s), s["flags"], s["sync_src"], 0.5, 1, 1, 8, 32, 1)
    for k in ("canvas", "state", "eos_prob", "map_ids", "map_probs"):
        assert torch.equal(before[k], s[k]), f"coordinate changed {k}"
    assert s["flags"].tolist() == [0, 0] and (s["sync_src"] == -1).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "tokens,slots,experts,d,m",
    [
        (5, 2, 8, 64, 40),  # 16-byte reads; m spans two 32-row slices
        (3, 3, 4, 36, 20),  # d, m not multiples of 8: element reads
        (520, 2, 2, 16, 8),  # 1040 pairs: the expert lists take two 1024-entry rounds
    ],
)
def test_moe_experts_emulated(emu, dtype, tokens, slots, experts, d, m):
    """The fused MoE kernels == the grouped CPU op (float32 within 1e-4; bf16 within 2e-2), with a
    pair pointing outside the experts contributing nothing (the CPU op refuses it)."""
    g = torch.Generator().manual_seed(tokens * 31 + d)
    x = torch.randn(tokens, d, generator=g).to(dtype)
    gate_up = (torch.randn(experts, 2 * m, d, generator=g) / d**0.5).to(dtype)
    down = (torch.randn(experts, d, m, generator=g) / m**0.5).to(dtype)
    chosen = torch.stack([torch.randperm(experts, generator=g)[:slots] for _ in range(tokens)])
    weights = torch.rand(tokens, slots, generator=g)
    expected = ops.moe_experts(x, chosen, weights, gate_up, down)
    hidden = torch.full((tokens * slots, m), float("nan")).to(dtype)
    expert_out = torch.full((tokens * slots, d), float("nan")).to(dtype)
    out = torch.full((tokens, d), float("nan")).to(dtype)

    def run(chosen: torch.Tensor) -> None:  # the kernel into `out` (its scratch buffers NaN-filled)
        emu.ok(
            "bbemu_moe_experts",
            CODE[dtype],
            x,
            chosen,
            weights,
            gate_up,
            down,
            hidden,
            expert_out,
            out,
            tokens,
            slots,
            experts,
            d,
            m,
        )

    run(chosen)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), expected.float(), atol=tol, rtol=tol)
    # Token 0's first slot names no expert: its output is the other slots' sum alone.
    bad = chosen.clone()
    bad[0, 0] = experts
    kept = weights.clone()
    kept[0, 0] = 0.0
    run(bad)
    torch.testing.assert_close(out.float(), ops.moe_experts(x, chosen, kept, gate_up, down).float(), atol=tol, rtol=tol)


@pytest.fixture
def paged(emu):
    """Sets the emulator's page table for the KV kernels; unset again after the test."""

    def use(table, page_len, store_pages):
        emu("bbemu_set_kv_pages", table, page_len, store_pages)

    yield use
    emu("bbemu_set_kv_pages", None, 0, 0)


@pytest.mark.parametrize("dtype,kernels", [(torch.float32, (0,)), (torch.bfloat16, (0, 1, 2, 3))])
@pytest.mark.parametrize("page_len", [16, 5])
def test_paged_kv_kernels_emulated(emu, paged, dtype, kernels, page_len):
    """Every KV kernel through a page table (shuffled pages, a canvas not a whole number of pages)
    == the same kernel on the dense buffer holding the same K/V, bit for bit: the attention
    kernels (reference and the three tensor-core variants, split and not), rope_kv_write (both
    forms), kv_write and kv_copy_rows; the pages outside the table are left as they were."""
    from helpers.pages import from_pages, to_pages

    heads, kv_heads, hd = 4, 2, 64
    g = torch.Generator().manual_seed(page_len)
    lengths, L = [1, 7, 33, 20], 70
    T = sum(lengths)
    q, k, v = (torch.randn(T, h, hd, generator=g).to(dtype) for h in (heads, kv_heads, kv_heads))
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)))
    rows = torch.tensor([2, 0, 3, 1])
    dense = torch.randn(4, 2, 2, kv_heads, L, hd, generator=g).to(dtype)
    store, table = to_pages(dense, page_len, g)
    Lp = table.shape[1] * page_len  # the table's positions per row
    for cache, fresh in ((torch.full((4,), L), False), (torch.tensor([0, 5, 64, 70]), True)):
        max_keys = L + max(lengths)
        for kernel in kernels:
            for splits in (1, 3) if kernel else (1,):
                want = _attention(emu, kernel, q, k, v, cu, dense, rows, cache, 1, fresh, splits, max_keys)
                paged(table, page_len, store.shape[0])
                got = _attention(
                    emu,
                    kernel,
                    q,
                    k,
                    v,
                    cu,
                    store,
                    rows,
                    cache,
                    1,
                    fresh,
                    splits,
                    max_keys + Lp - L,
                    length=Lp,
                    buffers=len(table),
                )
                paged(None, 0, 0)
                assert torch.equal(got, want), f"kernel {kernel} splits {splits} cache {cache.tolist()}"

    # Writes: rope_kv_write (vectorised and not) and kv_write, paged vs dense.
    table_rope = rope_table(L, hd, 1e4)
    pos = torch.cat([torch.randperm(L, generator=g)[:n] for n in lengths])  # one token per slot
    for name in ("rope_kv_write/1", "rope_kv_write/0", "kv_write"):
        d, s = dense.clone(), store.clone()
        results = []
        for kv, length, buffers in ((d, L, d.shape[0]), (s, Lp, len(table))):
            qq, kk = q.clone(), k.clone()
            if kv is s:
                paged(table, page_len, s.shape[0])
            if name.startswith("rope"):
                emu.ok(
                    "bbemu_rope_kv_write",
                    CODE[dtype],
                    qq,
                    qq.stride(0),
                    heads,
                    kk,
                    v,
                    kk.stride(0),
                    pos,
                    table_rope,
                    L,
                    kv,
                    2,
                    kv_heads,
                    length,
                    hd,
                    buffers,
                    1,
                    cu,
                    rows,
                    len(rows),
                    T,
                    int(name[-1]),
                )
            else:
                emu.ok(
                    "bbemu_kv_write",
                    CODE[dtype],
                    kv,
                    2,
                    kv_heads,
                    length,
                    hd,
                    buffers,
                    1,
                    kk,
                    v,
                    kk.stride(0),
                    pos,
                    cu,
                    rows,
                    len(rows),
                    T,
                )
            paged(None, 0, 0)
            results.append((qq, kk))
        assert torch.equal(from_pages(s, table, L), d), name
        assert all(torch.equal(a, b) for a, b in zip(*results)), name
        outside = torch.ones(s.shape[0], dtype=torch.bool)
        outside[table.flatten()] = False
        assert torch.equal(s[outside], store[outside]), name

    # kv_copy_rows through the table == the CPU op.
    src = torch.tensor([-1, 3, 0, -1])  # no chains: a source is never also copied into
    want = store.clone()
    ops.kv_copy_rows_(want, src, table)
    got = store.clone()
    paged(table, page_len, got.shape[0])
    emu.ok("bbemu_kv_copy_rows", got, src, len(table), got[0].numel() * got.element_size(), table.shape[1])
    paged(None, 0, 0)
    assert torch.equal(got, want)


@pytest.fixture
def key_lists(emu):
    """Sets the emulator's gathered key sets for the attention kernels; unset again after the test."""

    def use(index, offsets):
        emu("bbemu_set_key_lists", offsets, index)

    yield use
    emu("bbemu_set_key_lists", None, None)


@pytest.mark.parametrize("dtype,kernels", [(torch.float32, (0,)), (torch.bfloat16, (0, 1, 2, 3))])
@pytest.mark.parametrize("page_len", [None, 16])
def test_gathered_key_kernels_emulated(emu, paged, key_lists, dtype, kernels, page_len):
    """The attention kernels (reference and the three tensor-core variants, split and not) reading
    each row's cached keys through a gathered key set (dense and paged): a list of the whole range
    == the contiguous kernel bit for bit; a proper subset (runs, gaps, an empty list beside fresh
    keys) == the same kernel over a dense buffer holding only those keys, bit for bit."""
    from helpers.pages import to_pages

    heads, kv_heads, hd = 4, 2, 64
    g = torch.Generator().manual_seed(11)
    lengths, L = [1, 7, 33, 20], 70
    T = sum(lengths)
    q, k, v = (torch.randn(T, h, hd, generator=g).to(dtype) for h in (heads, kv_heads, kv_heads))
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)))
    rows = torch.tensor([2, 0, 3, 1])
    dense = torch.randn(4, 2, 2, kv_heads, L, hd, generator=g).to(dtype)
    store, table = to_pages(dense, page_len, g) if page_len else (dense, None)
    Lp = table.shape[1] * page_len if page_len else L
    max_keys = L + max(lengths)

    def csr(per_row):
        offsets = torch.tensor([0] + [len(p) for p in per_row]).cumsum(0)
        return torch.tensor([i for p in per_row for i in p], dtype=torch.long), offsets

    for cache, fresh in ((torch.full((4,), L), False), (torch.tensor([0, 5, 64, 70]), True)):
        subset = [sorted(torch.randperm(n, generator=g)[: n // 3].tolist()) for n in cache.tolist()]
        subset[2] = list(range(10, 30)) + list(range(40, 64, 3))
        if not fresh:
            subset[1] = subset[1] or [3]
        compact = torch.zeros_like(dense)
        for r, pos in enumerate(subset):
            compact[int(rows[r]), ..., : len(pos), :] = dense[int(rows[r])][..., pos, :]
        counts = torch.tensor([len(p) for p in subset])
        whole = csr([list(range(n)) for n in cache.tolist()])
        for kernel in kernels:
            for splits in (1, 3) if kernel else (1,):
                want = _attention(emu, kernel, q, k, v, cu, dense, rows, cache, 1, fresh, splits, max_keys)
                want_subset = _attention(emu, kernel, q, k, v, cu, compact, rows, counts, 1, fresh, splits, max_keys)
                got = {}
                for name, (index, offsets) in (("whole", whole), ("subset", csr(subset))):
                    if page_len:
                        paged(table, page_len, store.shape[0])
                    key_lists(index, offsets)
                    got[name] = _attention(
                        emu,
                        kernel,
                        q,
                        k,
                        v,
                        cu,
                        store,
                        rows,
                        cache,
                        1,
                        fresh,
                        splits,
                        max_keys + Lp - L,
                        length=Lp,
                        buffers=len(rows) if page_len else None,
                    )
                    key_lists(None, None)
                    paged(None, 0, 0)
                where = f"kernel {kernel} splits {splits} cache {cache.tolist()}"
                assert torch.equal(got["whole"], want), where
                assert torch.equal(got["subset"], want_subset), where
