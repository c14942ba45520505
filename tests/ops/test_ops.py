"""Each kernel op against its pure-PyTorch twin, opcheck on every op, fake kernels, compile."""

import pytest
import torch
import torch.nn.functional as F

import blockbatch.native  # noqa: F401  (loads the extension)
from blockbatch.native import NativeModel, pack_rows
from blockbatch.reference import model as ref
from blockbatch.random_checkpoint import random_config, random_weights
from helpers.random_branch_state import FIELD, coordinate_args, random_branch_state, window_spans
from helpers.op_cases import rope_kv_case, rope_table

ops = torch.ops.blockbatch
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _tol(dtype):
    return {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm(dtype):
    x = torch.randn(13, 72).to(dtype)
    w = (1 + 0.1 * torch.randn(72)).to(dtype)
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-5), ref.rms_norm(x, w, 1e-5), atol=_tol(dtype), rtol=_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_is_add_then_rms_norm(dtype):
    """The fused residual add + RMSNorm: x updated in place to x + delta and the norm of it,
    bit for bit what add_ then rms_norm give (the model's float32 path must not move)."""
    x = torch.randn(13, 72).to(dtype)
    delta = torch.randn(13, 72).to(dtype)
    w = (1 + 0.1 * torch.randn(72)).to(dtype)
    expected_x = x.clone().add_(delta)
    expected = ops.rms_norm(expected_x, w, 1e-5)
    out = ops.add_rms_norm_(x, delta, w, 1e-5)
    assert torch.equal(x, expected_x) and torch.equal(out, expected)
    with pytest.raises(RuntimeError, match=r"delta must be shaped like x \[13, 72\], got \[13, 71\]"):
        ops.add_rms_norm_(x, delta[:, :71].contiguous(), w, 1e-5)
    with pytest.raises(RuntimeError, match="x must be contiguous"):
        ops.add_rms_norm_(torch.randn(13, 80).to(dtype)[:, :72], delta, w, 1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul(dtype):
    gu = torch.randn(9, 2 * 40).to(dtype)
    expected = F.silu(gu[:, :40]) * gu[:, 40:]
    torch.testing.assert_close(ops.silu_mul(gu), expected, atol=_tol(dtype), rtol=_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_is_x_times_weight_transposed(dtype):
    """The model's GEMM op: on CPU exactly ATen's x @ weight.T (the float32 reference tests depend
    on those bits), for contiguous and strided x; bad shapes name the argument."""
    x = torch.randn(9, 40).to(dtype)
    w = torch.randn(24, 40).to(dtype)
    assert torch.equal(ops.linear(x, w), x @ w.t())
    strided = torch.randn(9, 48).to(dtype)[:, 4:44]
    assert torch.equal(ops.linear(strided, w), strided @ w.t())
    assert ops.linear(x[:0], w).shape == (0, 24)
    with pytest.raises(
        RuntimeError, match=r"weight must be \[out_features, 40\] \(x has 40 features\), got shape \[24, 41\]"
    ):
        ops.linear(x, torch.randn(24, 41).to(dtype))
    with pytest.raises(RuntimeError, match=r"x must be \[rows, in_features\], got shape \[40\]"):
        ops.linear(x[0], w)
    names = {torch.float32: "Float", torch.bfloat16: "BFloat16", torch.float16: "Half"}
    other = torch.float16 if dtype == torch.float32 else torch.float32
    with pytest.raises(RuntimeError, match=f"weight dtype {names[other]} differs from x dtype {names[dtype]}"):
        ops.linear(x, w.to(other))


@pytest.mark.parametrize("hd", [8, 32, 64, 128])
def test_rope_matches_reference_bitwise(hd):
    x = torch.randn(11, 3, hd)
    positions = torch.randint(0, 500, (11,))
    cos, sin = ref.rope_cos_sin(positions, hd, 5e5)
    expected = ref.apply_rope(x, cos, sin)
    out = x.clone()
    ops.rope_(out, positions, rope_table(512, hd, 5e5))
    assert torch.equal(out, expected)


def test_rope_on_strided_heads_view():
    qkv = torch.randn(5, 3 * 2 * 16)
    q = qkv[:, : 2 * 16].view(5, 2, 16)
    expected = ref.apply_rope(q.clone(), *ref.rope_cos_sin(torch.arange(5), 16, 1e4))
    ops.rope_(q, torch.arange(5), rope_table(8, 16, 1e4))
    assert torch.equal(q, expected)
    assert torch.equal(qkv[:, 32:], qkv[:, 32:])  # the rest untouched (same view)


def test_kv_write_places_slots():
    kv = torch.zeros(3, 2, 2, 2, 10, 4)
    k = torch.randn(5, 2, 4)
    v = torch.randn(5, 2, 4)
    positions = torch.tensor([3, 4, 0, 9, 8])
    cu = torch.tensor([0, 2, 5])
    rows = torch.tensor([2, 0])
    ops.kv_write_(kv, k, v, positions, cu, rows, 1)
    expected = torch.zeros_like(kv)
    for t, (r, p) in enumerate([(2, 3), (2, 4), (0, 0), (0, 9), (0, 8)]):
        expected[r, 1, 0, :, p] = k[t]
        expected[r, 1, 1, :, p] = v[t]
    assert torch.equal(kv, expected)


def test_rope_kv_write_equals_rope_then_kv_write():
    a_qkv, q, k, v, a_kv, (pos, cu, rows) = rope_kv_case()
    table = rope_table(32, 16, 1e4)
    ops.rope_kv_write_(q, k, v, pos, table, a_kv, cu, rows, 1)
    b_qkv, q, k, v, b_kv, _ = rope_kv_case()
    ops.rope_(q, pos, table)
    ops.rope_(k, pos, table)
    ops.kv_write_(b_kv, k, v, pos, cu, rows, 1)
    assert torch.equal(a_qkv, b_qkv) and torch.equal(a_kv, b_kv)
    _, q, k, v, kv, _ = rope_kv_case()
    with pytest.raises(RuntimeError, match="q dtype BFloat16 differs from k dtype Float"):
        ops.rope_kv_write_(q.bfloat16(), k, v, pos, table, kv, cu, rows, 1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,hd", [(2, 2, 32), (4, 2, 64), (4, 1, 128)])
def test_packed_attention_modes(dtype, heads, kv_heads, hd):
    g = torch.Generator().manual_seed(0)
    lengths = [3, 8, 1]
    T, L = sum(lengths), 20
    q = torch.randn(T, heads, hd, generator=g).to(dtype)
    k = torch.randn(T, kv_heads, hd, generator=g).to(dtype)
    v = torch.randn(T, kv_heads, hd, generator=g).to(dtype)
    kv = torch.randn(3, 2, 2, kv_heads, L, hd, generator=g).to(dtype)
    cu = torch.tensor([0, 3, 11, 12])
    rows = torch.tensor([1, 2, 0])
    cache = torch.tensor([5, 0, 20])
    tol = _tol(dtype) * 2
    # full: each row attends to its own fresh keys only
    out = ops.packed_attention(q, k, v, cu, None, None, None, 0, True)
    for r in range(3):
        s, e = cu[r], cu[r + 1]
        torch.testing.assert_close(
            out[s:e].view(-1, heads, hd), ref.attention(q[s:e], k[s:e], v[s:e]), atol=tol, rtol=tol
        )
    # cache prefix + fresh
    out = ops.packed_attention(q, k, v, cu, kv, rows, cache, 1, True)
    for r in range(3):
        s, e = cu[r], cu[r + 1]
        n = int(cache[r])
        keys = torch.cat([kv[rows[r], 1, 0, :, :n].transpose(0, 1), k[s:e]])
        values = torch.cat([kv[rows[r], 1, 1, :, :n].transpose(0, 1), v[s:e]])
        torch.testing.assert_close(
            out[s:e].view(-1, heads, hd), ref.attention(q[s:e], keys, values), atol=tol, rtol=tol
        )
    # cache only
    full = torch.tensor([L, L, L])
    out = ops.packed_attention(q, k, v, cu, kv, rows, full, 0, False)
    for r in range(3):
        s, e = cu[r], cu[r + 1]
        keys = kv[rows[r], 0, 0].transpose(0, 1)
        values = kv[rows[r], 0, 1].transpose(0, 1)
        torch.testing.assert_close(
            out[s:e].view(-1, heads, hd), ref.attention(q[s:e], keys, values), atol=tol, rtol=tol
        )


@pytest.mark.parametrize("dtype", DTYPES)
def test_confidence_matches_softmax(dtype):
    logits = (3 * torch.randn(17, 1000)).to(dtype)
    logits[3, 10] = logits[3, 20] = logits[3].max() + 1  # a tie: lowest id wins
    logits[5, 7] = logits[5].max() + 2  # the excluded id is never proposed
    argmax, conf = ops.confidence(logits, 7)
    x0, expected = ref_propose(logits, 7)
    assert torch.equal(argmax, x0)
    assert argmax[3] == 10 and argmax[5] != 7
    assert conf.dtype == torch.float64
    torch.testing.assert_close(conf, expected, atol=1e-12, rtol=1e-10)
    assert conf[5] < 0.5  # probability over the whole vocabulary, the excluded id included


def ref_propose(logits, mask_id):
    from blockbatch.reference.policies import propose

    return propose(logits.float(), mask_id)


def test_kernel_bad_input_names_argument():
    with pytest.raises(RuntimeError, match="x must be float32, bfloat16 or float16, got Long"):
        ops.rms_norm(torch.ones(2, 3, dtype=torch.long), torch.ones(3, dtype=torch.long), 1e-5)
    with pytest.raises(RuntimeError, match=r"weight must be \[3\]"):
        ops.rms_norm(torch.ones(2, 3), torch.ones(4), 1e-5)
    with pytest.raises(RuntimeError, match=r"gate_up must be \[rows, 2\*m\]"):
        ops.silu_mul(torch.ones(2, 3))
    with pytest.raises(RuntimeError, match=r"positions\[0\] = 9 is outside \[0, 4\)"):
        ops.rope_(torch.ones(1, 1, 8), torch.tensor([9]), torch.zeros(4, 8))
    with pytest.raises(RuntimeError, match="cu_seqlens\\[-1\\] = 3 must equal the token count 2"):
        ops.packed_attention(
            torch.ones(2, 1, 4),
            torch.ones(2, 1, 4),
            torch.ones(2, 1, 4),
            torch.tensor([0, 3]),
            None,
            None,
            None,
            0,
            True,
        )
    with pytest.raises(RuntimeError, match="row 0 has queries but no keys"):
        ops.packed_attention(
            torch.ones(2, 1, 4),
            torch.ones(2, 1, 4),
            torch.ones(2, 1, 4),
            torch.tensor([0, 2]),
            None,
            None,
            None,
            0,
            False,
        )
    with pytest.raises(RuntimeError, match=r"kv_rows\[0\] = 4 is outside \[0, 1\)"):
        ops.kv_write_(
            torch.zeros(1, 1, 2, 1, 4, 4),
            torch.ones(1, 1, 4),
            torch.ones(1, 1, 4),
            torch.tensor([0]),
            torch.tensor([0, 1]),
            torch.tensor([4]),
            0,
        )


# ----------------------------------------------------------------------------- opcheck


def _model():
    config = random_config()
    return config, NativeModel(config, random_weights(config))


def _opcheck_samples():
    config, model = _model()
    tokens, pos, cu = pack_rows([torch.arange(3), torch.arange(5)], [torch.arange(3), torch.arange(2, 7)])
    kv = model.new_kv(2, 8)
    yield "forward_full", ops.forward.default, (model.obj, tokens, pos, cu)
    yield (
        "forward_dual",
        ops.forward.default,
        (model.obj, tokens, pos, cu, kv, torch.tensor([1, 0]), None, "dual", torch.tensor([0, 4])),
    )
    yield "forward_prefix", ops.forward.default, (model.obj, tokens, pos, cu, kv, None, torch.tensor([2, 1]), "prefix")
    yield "rms_norm", ops.rms_norm.default, (torch.randn(4, 8), torch.randn(8), 1e-5)
    yield "add_rms_norm_", ops.add_rms_norm_.default, (torch.randn(4, 8), torch.randn(4, 8), torch.randn(8), 1e-5)
    yield "silu_mul", ops.silu_mul.default, (torch.randn(4, 8),)
    yield "linear", ops.linear.default, (torch.randn(4, 8), torch.randn(6, 8))
    yield (
        "moe_experts",
        ops.moe_experts.default,
        (
            torch.randn(3, 8),
            torch.tensor([[0, 2], [1, 0], [2, 1]]),
            torch.rand(3, 2),
            torch.randn(3, 6, 8),
            torch.randn(3, 8, 3),
        ),
    )
    yield "rope_", ops.rope_.default, (torch.randn(3, 2, 8), torch.tensor([0, 1, 5]), torch.randn(6, 8))
    yield (
        "kv_write_",
        ops.kv_write_.default,
        (
            torch.zeros(2, 1, 2, 1, 6, 4),
            torch.randn(3, 1, 4),
            torch.randn(3, 1, 4),
            torch.tensor([0, 2, 5]),
            torch.tensor([0, 1, 3]),
            torch.tensor([1, 0]),
            0,
        ),
    )
    _, q, k, v, kv_buf, (pos, cu_rows, kv_rows) = rope_kv_case()
    yield (
        "rope_kv_write_",
        ops.rope_kv_write_.default,
        (q, k, v, pos, rope_table(32, 16, 1e4), kv_buf, cu_rows, kv_rows, 0),
    )
    yield (
        "packed_attention",
        ops.packed_attention.default,
        (
            torch.randn(3, 2, 4),
            torch.randn(3, 1, 4),
            torch.randn(3, 1, 4),
            torch.tensor([0, 1, 3]),
            torch.randn(2, 1, 2, 1, 5, 4),
            torch.tensor([1, 0]),
            torch.tensor([2, 5]),
            0,
            True,
        ),
    )
    yield "confidence", ops.confidence.default, (torch.randn(4, 50), 3)
    yield "sparse_probs", ops.sparse_probs.default, (torch.randn(4, 50) * 3, 0.1, 11)
    s = random_branch_state(1)
    yield "bb_coordinate_", ops.bb_coordinate_.default, coordinate_args(s)
    b = int((s["state"][:, FIELD["done"]] == 0).nonzero()[0])
    start, n = int(s["state"][b, FIELD["start"]]), int(s["state"][b, FIELD["block"]])
    logits = torch.randn(n, 10)
    token, conf = ops.confidence(logits, 9)
    ids, probs = ops.sparse_probs(logits, 0.1, 3)
    yield (
        "bb_absorb_",
        ops.bb_absorb_.default,
        (
            s["canvas"],
            s["state"],
            s["eos_prob"],
            s["map_ids"],
            s["map_probs"],
            torch.tensor([[b, 0, start, n, 0]]),
            token,
            conf,
            ids,
            probs,
            logits,
            3,
            9,
            7,
            0.9,
            True,
        ),
    )
    yield "kv_copy_rows_", ops.kv_copy_rows_.default, (torch.randn(3, 2, 4), torch.tensor([-1, 0, 0]))
    yield (
        "commit_",
        ops.commit_.default,
        (
            torch.tensor([5, 9, 9, 1, 9, 9]),
            torch.tensor([1, 2, 3, 4]),
            torch.tensor([7, 3, 2, 0]),
            torch.tensor([0.95, 0.2, 0.99, 0.5], dtype=torch.float64),
            torch.tensor([2]),
            9,
            0,
            "threshold",
            0.9,
            1.0,
        ),
    )


@pytest.mark.parametrize("name,op,args", list(_opcheck_samples()), ids=lambda x: x if isinstance(x, str) else "")
def test_opcheck(name, op, args):
    # aot_dispatch_dynamic is left out, as vLLM does: it does not support TorchBind arguments.
    utils = ["test_schema", "test_autograd_registration", "test_faketensor"]
    if name in ("forward_dual",):
        # torch's SchemaInfo cannot inspect a TorchBind argument once it has to check a
        # mutation ("Cannot inspect value of type Capsule"); test_forward_mutates_only_kv
        # checks the same property by hand.
        utils.remove("test_schema")
    torch.library.opcheck(op, args, test_utils=tuple(utils))


def test_forward_mutates_only_kv():
    """What opcheck's test_schema checks for the mutating forward: only `kv(a!)` changes."""
    _, model = _model()
    tokens, pos, cu = pack_rows([torch.arange(3), torch.arange(5)], [torch.arange(3), torch.arange(2, 7)])
    kv_rows, index = torch.tensor([1, 0]), torch.tensor([0, 4])
    inputs = [tokens, pos, cu, kv_rows, index]
    before = [t.clone() for t in inputs]
    kv = model.new_kv(2, 8)
    out = ops.forward(model.obj, tokens, pos, cu, kv, kv_rows, None, "dual", index)
    assert all(torch.equal(a, b) for a, b in zip(inputs, before))
    assert kv.abs().sum() > 0
    assert out.data_ptr() != kv.data_ptr() and out.shape == (2, 97)


def test_fake_forward_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    config, model = _model()
    with FakeTensorMode():
        tokens = torch.zeros(12, dtype=torch.long)
        pos = torch.zeros(12, dtype=torch.long)
        cu = torch.tensor([0, 5, 12])
        out = ops.forward(model.obj, tokens, pos, cu, None, None, None, "full", torch.zeros(4, dtype=torch.long))
        assert out.shape == (4, config.vocab_size)
        conf = ops.confidence(torch.zeros(7, 33))
        assert conf[0].shape == (7,) and conf[1].dtype == torch.float64


@pytest.mark.skipif(
    tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) < (2, 13),
    reason="torch.compile over a torchbind Model argument needs torch >= 2.13 (2.11's dynamo fails "
    "with AttributeError 'real_obj'; checked on 2.13 and 2.14)",
)
def test_compiled_forward_matches_eager():
    config, model = _model()
    tokens, pos, cu = pack_rows([torch.arange(6)], [torch.arange(6)])

    def step(t, p, c):
        return ops.forward(model.obj, t, p, c).softmax(-1)

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(tokens, pos, cu), step(tokens, pos, cu))


@pytest.mark.parametrize("dtype", DTYPES)
def test_sparse_probs_matches_softmax(dtype):
    logits = (4 * torch.randn(23, 300)).to(dtype)
    logits[0] = 0  # uniform row: nothing above the floor
    logits[1, 5] = 50  # one certain token
    ids, probs = ops.sparse_probs(logits, 0.1, 11)
    p = torch.softmax(logits.double(), -1)
    for r in range(logits.shape[0]):
        expected = {int(t): float(p[r, t]) for t in (p[r] > 0.1).nonzero()[:, 0]}
        got = {int(i): float(q) for i, q in zip(ids[r], probs[r]) if i >= 0}
        assert got.keys() == expected.keys()
        for t in got:
            assert abs(got[t] - expected[t]) < 1e-12
    assert (ids[0] == -1).all() and ids[1, 0] == 5 and (ids[1, 1:] == -1).all()


# ----------------------------------------------------------------------------- commit_


def _host_commit(canvas, window, token, conf, k, mask, eos, rule, tau, factor):
    """ALGORITHMS.md 2 written out in Python: the rules the decode loop applies."""
    x = canvas.tolist()
    cand = [i for i, p in enumerate(window.tolist()) if x[p] == mask]
    order = sorted(cand, key=lambda i: (-float(conf[i]), i))
    if rule == "threshold":
        chosen = {i for i in cand if conf[i] >= tau} | ({order[0]} if order else set())
    elif rule == "fixed":
        chosen = set(order[: int(k[0])])
    else:
        take = len(order)
        for r in range(2, len(order) + 1):
            if not conf[order[r - 1]] >= 1.0 - factor / (r + 1):
                take = len(order) if r == len(order) else r - 1
                break
        chosen = set(order[:take])
    for i in chosen:
        x[window[i]] = int(token[i])
    eos_seen = int(any(x[p] == eos for p in window.tolist()))
    return x, [len(chosen), len(cand) - len(chosen), eos_seen]


@pytest.mark.parametrize("rule", ["threshold", "fixed", "factor"])
def test_commit_matches_the_rules(rule):
    g = torch.Generator().manual_seed(0)
    for trial in range(40):
        n, L = int(torch.randint(1, 40, (1,), generator=g)), 64
        canvas = torch.randint(0, 6, (L,), generator=g)
        canvas[torch.rand(L, generator=g) < 0.6] = 9  # masks
        window = torch.randperm(L, generator=g)[:n]
        token = torch.randint(0, 9, (n,), generator=g)
        conf = torch.rand(n, generator=g, dtype=torch.float64)
        conf[torch.rand(n, generator=g) < 0.2] = 0.5  # ties
        k = torch.randint(0, n + 2, (1,), generator=g)
        want, counts = _host_commit(canvas, window, token, conf, k, 9, 0, rule, 0.8, 1.0)
        got = canvas.clone()
        out = ops.commit_(got, window, token, conf, k, 9, 0, rule, 0.8, 1.0)
        assert got.tolist() == want and out.tolist() == counts, f"trial {trial}"


def test_commit_bad_input_names_argument():
    canvas, w, t, c, k = (
        torch.full((8,), 9),
        torch.tensor([1, 2]),
        torch.tensor([3, 4]),
        torch.rand(2, dtype=torch.float64),
        torch.tensor([1]),
    )
    with pytest.raises(ValueError, match="rule must be one of"):
        ops.commit_(canvas, w, t, c, k, 9, 0, "greedy", 0.9, 1.0)
    with pytest.raises(ValueError, match=r"window\[1\] = 8 is outside the canvas"):
        ops.commit_(canvas, torch.tensor([1, 8]), t, c, k, 9, 0, "threshold", 0.9, 1.0)
    with pytest.raises(TypeError, match="conf must be Double"):
        ops.commit_(canvas, w, t, c.float(), k, 9, 0, "threshold", 0.9, 1.0)
    with pytest.raises(ValueError, match="one entry per window position"):
        ops.commit_(canvas, w, t[:1], c, k, 9, 0, "threshold", 0.9, 1.0)


# ------------------------------------------------------------- BlockBatch bookkeeping ops
# The decode tests check these ops end to end against the Python reference (tokens, winner,
# every counter); here: their contracts on states the decode loop may not reach.


def _fields(state, b):
    """Branch b's row of a state table, by column name."""
    return {name: int(state[b, i]) for name, i in FIELD.items()}


def test_coordinate_keeps_its_invariants():
    """After bb_coordinate_: only masks were filled (or the row is a synced copy of the leader's),
    `merged` counts exactly the filled masks, every live window is the aligned block holding the
    branch's first mask with `masks` = its mask count, done rows hold no mask; and over the seeds
    advances, merges and syncs all fire."""
    fired = {"advance": 0, "merge": 0, "sync": 0}
    for seed in range(80):
        s = random_branch_state(seed)
        before, st0 = s["canvas"].clone(), s["state"].clone()
        ops.bb_coordinate_(*coordinate_args(s))
        canvas, lp, L, mask = s["canvas"], s["prompt_len"], s["canvas"].shape[1], s["mask_id"]
        assert s["flags"][1] == 0  # no branch was EOS-ready
        for b in range(canvas.shape[0]):
            r, r0 = _fields(s["state"], b), _fields(st0, b)
            src = int(s["sync_src"][b])
            if src >= 0:
                assert torch.equal(canvas[b], canvas[src]) and r["decoded"] == int(s["state"][src, FIELD["decoded"]])
                assert r["copied"] - r0["copied"] == int(st0[src, FIELD["decoded"]]) - r0["decoded"] > 8
                fired["sync"] += 1
            else:
                changed = canvas[b] != before[b]
                assert (before[b][changed] == mask).all(), f"seed {seed}: branch {b} overwrote a token"
                assert r["merged"] - r0["merged"] == int(changed.sum())
                fired["merge"] += int(changed.sum())
            gen = canvas[b, lp:]
            if r["done"]:
                assert not (gen == mask).any() and r["start"] == r["end"] == L and r["masks"] == 0
                continue
            first = lp + int((gen == mask).nonzero()[0])
            assert (r["start"] - lp) % r["block"] == 0 and r["end"] == r["start"] + r["block"]
            assert r["start"] <= first < r["end"], f"seed {seed}: branch {b} window misses its first mask"
            assert r["masks"] == int((canvas[b, r["start"] : r["end"]] == mask).sum())
            fired["advance"] += int(r["start"] != r0["start"] and src < 0)
        wanted = any(
            int(s["state"][b, FIELD["needs_refresh"]]) and not int(s["state"][b, FIELD["done"]])
            for b in range(canvas.shape[0])
        )
        assert int(s["flags"][0]) == int(wanted)
    assert all(v > 0 for v in fired.values()), fired


def test_coordinate_changes_nothing_when_a_branch_is_eos_ready():
    s = random_branch_state(3)
    s["state"][1, FIELD["eos_ready"]] = 1
    snapshot = {k: v.clone() for k, v in s.items() if torch.is_tensor(v)}
    ops.bb_coordinate_(*coordinate_args(s))
    assert s["flags"].tolist() == [0, 1] and (s["sync_src"] == -1).all()
    for k in ("canvas", "state", "map_ids", "map_probs"):
        assert torch.equal(s[k], snapshot[k]), k


def test_coordinate_switches():
    """merge=False never fills a mask; sync=False never copies; a larger gap copies less."""
    for seed in range(20):
        s = random_branch_state(seed)
        ops.bb_coordinate_(*coordinate_args(s, merge=False, sync=False))
        assert (s["state"][:, FIELD["merged"]] == random_branch_state(seed)["state"][:, FIELD["merged"]]).all()
        assert (s["sync_src"] == -1).all()
        s = random_branch_state(seed)
        ops.bb_coordinate_(*coordinate_args(s, merge=False, sync_gap=10**6))
        assert (s["sync_src"] == -1).all()


def test_absorb_records_commits_and_marks_eos():
    """bb_absorb_ against the rules written out: the map rows are the step's sparse rows, the
    window commits by threshold (_host_commit), counters grow by the commits, and a complete
    window holding EOS is EOS-ready with the float64 softmax probability of its first EOS."""
    eos, tau = 7, 0.8
    for seed in range(40):
        s = random_branch_state(seed)
        g = torch.Generator().manual_seed(seed)
        spans, rows = window_spans(s["state"])
        live = [sp[0] for sp in spans]
        if not spans:
            continue
        logits = torch.randn(rows, 10, generator=g) * 4
        logits[:, eos] += 3 * (torch.rand(rows, generator=g) < 0.3)  # some EOS proposals
        token, conf = ops.confidence(logits, s["mask_id"])
        ids, probs = ops.sparse_probs(logits, 0.1, 3)
        before = {k: s[k].clone() for k in ("canvas", "state", "map_ids")}
        ops.bb_absorb_(
            s["canvas"],
            s["state"],
            s["eos_prob"],
            s["map_ids"],
            s["map_probs"],
            torch.tensor(spans),
            token,
            conf,
            ids,
            probs,
            logits,
            s["prompt_len"],
            s["mask_id"],
            eos,
            tau,
            True,
        )
        lp = s["prompt_len"]
        for b, row0, start, n, _ in spans:
            window = torch.arange(start, start + n)
            want, (k, left, _) = _host_commit(
                before["canvas"][b],
                window,
                token[row0 : row0 + n],
                conf[row0 : row0 + n],
                None,
                s["mask_id"],
                eos,
                "threshold",
                tau,
                0.0,
            )
            assert s["canvas"][b].tolist() == want, f"seed {seed} branch {b}"
            assert torch.equal(s["map_ids"][b, start - lp : start - lp + n], ids[row0 : row0 + n])
            r, r0 = _fields(s["state"], b), _fields(before["state"], b)
            assert (r["decoded"] - r0["decoded"], r["committed"] - r0["committed"], r["masks"]) == (k, k, left)
            held = [i for i in range(n) if want[start + i] == eos]
            if left == 0 and held:
                p = torch.softmax(logits[row0 + held[0]].double(), -1)[eos].item()
                assert r["eos_ready"] == 1 and abs(s["eos_prob"][b].item() - p) < 1e-12
            else:
                assert r["eos_ready"] == 0
        untouched = [b for b in range(4) if b not in live]
        for b in untouched:
            assert torch.equal(s["canvas"][b], before["canvas"][b])


def test_kv_copy_rows():
    kv = torch.randn(4, 2, 3, 5)
    want = kv.clone()
    want[1], want[3] = kv[2], kv[2]
    ops.kv_copy_rows_(kv, torch.tensor([-1, 2, -1, 2]))
    assert torch.equal(kv, want)
    with pytest.raises(ValueError, match=r"src\[0\] = 4 must be -1 \(keep\) or a row"):
        ops.kv_copy_rows_(kv, torch.tensor([4, -1, -1, -1]))
    with pytest.raises(ValueError, match="src must have size 4"):
        ops.kv_copy_rows_(kv, torch.tensor([-1, -1]))


def test_bookkeeping_bad_input_names_argument():
    s = random_branch_state(0)
    args = list(coordinate_args(s))
    with pytest.raises(ValueError, match=r"state must have size 13 in dimension 1"):
        ops.bb_coordinate_(*(args[:1] + [s["state"][:, :5].contiguous()] + args[2:]))
    with pytest.raises(TypeError, match="map_probs must be Double"):
        ops.bb_coordinate_(*(args[:6] + [s["map_probs"].float()] + args[7:]))
    with pytest.raises(ValueError, match=r"prompt_len must be in \[0, 67\)"):
        ops.bb_coordinate_(*(args[:7] + [70] + args[8:]))
    logits = torch.randn(4, 10)
    token, conf = ops.confidence(logits, 9)
    ids, probs = ops.sparse_probs(logits, 0.1, 3)
    live = int((s["state"][:, FIELD["done"]] == 0).nonzero()[0])
    start = int(s["state"][live, FIELD["start"]])
    with pytest.raises(ValueError, match=rf"spans\[0\] = \(row {live}, .*does not cover branch {live}'s window"):
        ops.bb_absorb_(
            s["canvas"],
            s["state"],
            s["eos_prob"],
            s["map_ids"],
            s["map_probs"],
            torch.tensor([[live, 0, start + 1, 3, 0]]),
            token,
            conf,
            ids,
            probs,
            logits,
            3,
            9,
            7,
            0.9,
            True,
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_moe_experts(dtype):
    """moe_experts == each token's SwiGLU experts weighted and summed (plain PyTorch, per token and
    slot), and a token's output does not depend on the tokens sharing the call (bit for bit)."""
    g = torch.Generator().manual_seed(0)
    T, K, E, d, m = 9, 3, 6, 16, 10
    x = torch.randn(T, d, generator=g).to(dtype)
    gate_up = (torch.randn(E, 2 * m, d, generator=g) / 4).to(dtype)
    down = (torch.randn(E, d, m, generator=g) / 3).to(dtype)
    chosen = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    weights = torch.rand(T, K, generator=g)
    out = ops.moe_experts(x, chosen, weights, gate_up, down)
    expected = torch.zeros(T, d)
    for t in range(T):
        for k in range(K):
            e = int(chosen[t, k])
            gu = x[t : t + 1].float() @ gate_up[e].float().T
            h = torch.nn.functional.silu(gu[:, :m]) * gu[:, m:]
            expected[t] += weights[t, k] * (h @ down[e].float().T)[0]
    tol = 1e-5 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(out.float(), expected, atol=tol, rtol=tol)
    for t in (0, 4, 8):
        assert torch.equal(
            ops.moe_experts(x[t : t + 1], chosen[t : t + 1], weights[t : t + 1], gate_up, down), out[t : t + 1]
        )
    assert ops.moe_experts(x[:0], chosen[:0], weights[:0], gate_up, down).shape == (0, d)


def test_moe_experts_bad_input_names_argument():
    x, chosen, weights = torch.randn(2, 8), torch.tensor([[0], [1]]), torch.ones(2, 1)
    gate_up, down = torch.randn(2, 6, 8), torch.randn(2, 8, 3)
    with pytest.raises(IndexError, match=r"chosen\[1, 0\] = 2 is not an expert of gate_up \(2 experts\)"):
        ops.moe_experts(x, torch.tensor([[0], [2]]), weights, gate_up, down)
    with pytest.raises(RuntimeError, match="weights must be float32, got Double"):
        ops.moe_experts(x, chosen, weights.double(), gate_up, down)
    with pytest.raises(RuntimeError, match=r"down must be a contiguous \[2, 8, 3\]"):
        ops.moe_experts(x, chosen, weights, gate_up, torch.randn(2, 3, 8))
    with pytest.raises(RuntimeError, match="chosen must be int64"):
        ops.moe_experts(x, chosen.int(), weights, gate_up, down)
    with pytest.raises(RuntimeError, match="gate_up dtype BFloat16 differs from x dtype Float"):
        ops.moe_experts(x, chosen, weights, gate_up.bfloat16(), down.bfloat16())
