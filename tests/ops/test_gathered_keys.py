"""Gathered key sets (ALGORITHMS.md section 3, model/attention.h): a row's cached keys given as a
list of positions of its KV row (CSR: key_offsets [rows + 1] into key_index) instead of the
range [0, cache_lens[r]). A list of the whole range equals the contiguous path bit for bit (op and
forward, dense and paged, float32 and bfloat16); a proper subset equals the contiguous kernel over a
KV row holding only those keys, and a float64 reference; bad lists are refused naming the argument."""

import pytest
import torch

from blockbatch.native import NativeModel
from blockbatch.random_checkpoint import random_config, random_weights

from helpers.pages import to_pages

ops = torch.ops.blockbatch

LENGTHS = [1, 7, 33, 20]  # query rows: one token, a few, more than a tile, ...
L = 70


def _lists(per_row):
    """CSR of a list of position lists: (key_index, key_offsets)."""
    offsets = torch.tensor([0] + [len(p) for p in per_row]).cumsum(0)
    index = torch.tensor([i for p in per_row for i in p], dtype=torch.long)
    return index, offsets


def _whole(lens):
    return _lists([list(range(n)) for n in lens])


def _case(dtype, heads=4, kv_heads=2, hd=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = sum(LENGTHS)
    q, k, v = (torch.randn(T, h, hd, generator=g).to(dtype) for h in (heads, kv_heads, kv_heads))
    cu = torch.tensor([0] + LENGTHS).cumsum(0)
    kv = torch.randn(4, 2, 2, kv_heads, L, hd, generator=g).to(dtype)
    rows = torch.tensor([2, 0, 3, 1])
    return g, q, k, v, cu, kv, rows


# Per mode: attend_fresh and the rows' ranges (prefix: an empty one; dual: whole and partial rows).
MODES = {"dual": (False, [L, 5, 64, 70]), "prefix": (True, [0, 5, 64, 70])}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("page_len", [None, 16, 5])
def test_whole_range_list_equals_contiguous(dtype, mode, page_len):
    g, q, k, v, cu, kv, rows = _case(dtype)
    fresh, lens = MODES[mode]
    cache = torch.tensor(lens)
    table = None
    if page_len:
        kv, table = to_pages(kv, page_len, g)
    want = ops.packed_attention(q, k, v, cu, kv, rows, cache, 1, fresh, table)
    got = ops.packed_attention(q, k, v, cu, kv, rows, cache, 1, fresh, table, *_whole(lens))
    assert torch.equal(got, want)


def _reference(q, k, v, cu, kv, rows, per_row, layer, fresh):
    """float64 attention: row r's queries over kv[rows[r], layer] at its listed positions, then
    (fresh) its own k, v."""
    heads, kv_heads = q.shape[1], k.shape[1]
    out = torch.empty(q.shape[0], heads, q.shape[2], dtype=torch.float64)
    for r, pos in enumerate(per_row):
        b, e = int(cu[r]), int(cu[r + 1])
        keys = kv[int(rows[r]), layer, 0][:, pos].double()  # [kv_heads, n, hd]
        vals = kv[int(rows[r]), layer, 1][:, pos].double()
        if fresh:
            keys = torch.cat([keys, k[b:e].double().transpose(0, 1)], 1)
            vals = torch.cat([vals, v[b:e].double().transpose(0, 1)], 1)
        keys = keys.repeat_interleave(heads // kv_heads, 0)
        vals = vals.repeat_interleave(heads // kv_heads, 0)
        s = torch.einsum("thd,hnd->htn", q[b:e].double(), keys) / q.shape[2] ** 0.5
        out[b:e] = torch.einsum("htn,hnd->thd", s.softmax(-1), vals)
    return out.reshape(q.shape[0], -1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("page_len", [None, 5])
def test_subset_list_equals_contiguous_over_the_gathered_keys(dtype, mode, page_len):
    g, q, k, v, cu, kv, rows = _case(dtype, seed=1)
    fresh, lens = MODES[mode]
    # Windows, strided picks and scattered keys; prefix mode's first row keeps its empty list.
    per_row = []
    for r, n in enumerate(lens):
        keep = torch.randperm(n, generator=g)[: max(n // 3, 1 if n and (r or not fresh) else 0)]
        per_row.append(sorted(keep.tolist()))
    per_row[2] = list(range(10, 30)) + list(range(40, 64, 3))  # runs and gaps across pages
    compact = torch.zeros_like(kv)
    for r, pos in enumerate(per_row):
        compact[int(rows[r]), ..., : len(pos), :] = kv[int(rows[r])][..., pos, :]
    want = ops.packed_attention(q, k, v, cu, compact, rows, torch.tensor([len(p) for p in per_row]), 1, fresh)
    src, table = (kv, None) if page_len is None else to_pages(kv, page_len, g)
    got = ops.packed_attention(q, k, v, cu, src, rows, torch.tensor(lens), 1, fresh, table, *_lists(per_row))
    assert torch.equal(got, want)
    ref = _reference(q, k, v, cu, kv, rows, per_row, 1, fresh)
    own = ops.packed_attention(
        q.float(), k.float(), v.float(), cu, compact.float(), rows, torch.tensor([len(p) for p in per_row]), 1, fresh
    )
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    assert (got.double() - ref).abs().max().item() <= tol
    assert (own.double() - ref).abs().max().item() <= 1e-5


def _bad_call(q, k, v, cu, kv, rows, cache, index, offsets, table=None, fresh=False):
    return ops.packed_attention(q, k, v, cu, kv, rows, cache, 1, fresh, table, index, offsets)


@pytest.mark.parametrize(
    "index,offsets,match",
    [
        ([0, 2, 1], [0, 1, 1, 3, 3], r"key_index\[2\] = 1 \(row 2\) must be above key_index\[1\] = 2"),
        ([0, 3, 3], [0, 1, 1, 3, 3], r"key_index\[2\] = 3 \(row 2\) must be above"),
        ([0, 70], [0, 1, 1, 1, 2], r"key_index\[1\] = 70 \(row 3\) is outside the row's length \[0, 70\)"),
        ([0, 6], [0, 1, 2, 2, 2], r"key_index\[1\] = 6 \(row 1\) is outside the row's length \[0, 5\)"),
        ([-1], [0, 1, 1, 1, 1], r"key_index\[0\] = -1 \(row 0\) is outside"),
        ([0, 1], [0, 2, 1, 2, 2], r"key_offsets must be non-decreasing: key_offsets\[2\] = 1"),
        ([0, 1], [1, 1, 1, 1, 2], r"key_offsets\[0\] = 1 must be 0"),
        ([0, 1], [0, 1, 1, 1, 1], r"key_offsets\[4\] = 1 must equal key_index's size 2"),
        ([0, 1], [0, 1, 2], r"key_offsets must have 5 entries \(rows \+ 1\)"),
    ],
)
def test_bad_key_lists_are_refused_naming_the_argument(index, offsets, match):
    _, q, k, v, cu, kv, rows = _case(torch.float32)
    cache = torch.tensor([L, 5, 64, 70])
    with pytest.raises((IndexError, RuntimeError), match=match):
        _bad_call(q, k, v, cu, kv, rows, cache, torch.tensor(index, dtype=torch.long), torch.tensor(offsets))


def test_key_list_arguments_are_refused_by_kind():
    g, q, k, v, cu, kv, rows = _case(torch.float32)
    cache = torch.tensor([L, 5, 64, 70])
    index, offsets = _whole(cache.tolist())
    with pytest.raises(RuntimeError, match=r"key_index needs key_offsets"):
        _bad_call(q, k, v, cu, kv, rows, cache, index, None)
    with pytest.raises(RuntimeError, match=r"key_offsets needs key_index"):
        _bad_call(q, k, v, cu, kv, rows, cache, None, offsets)
    with pytest.raises(RuntimeError, match=r"key_index must be int64"):
        _bad_call(q, k, v, cu, kv, rows, cache, index.int(), offsets)
    with pytest.raises(RuntimeError, match=r"key_offsets must have 1 dimension"):
        _bad_call(q, k, v, cu, kv, rows, cache, index, offsets[None])
    with pytest.raises(RuntimeError, match=r"key_index needs kv"):
        ops.packed_attention(q, k, v, cu, None, None, None, 0, True, None, index, offsets)
    # Paged: a listed position on no page is refused, one the table has is read.
    store, table = to_pages(kv, 16, g)
    hole = table.clone()
    hole[rows[1], 0] = -1
    with pytest.raises(IndexError, match=r"key_index\[70\] = 0 \(row 1\) reads KV row 0, which has no page there"):
        _bad_call(q, k, v, cu, store, rows, cache, index, offsets, hole)
    ok_index, ok_offsets = _lists([list(range(70)), [], list(range(64)), list(range(70))])
    _bad_call(q, k, v, cu, store, rows, cache, ok_index, ok_offsets, hole, fresh=True)
    # A dual row with an empty list has no key to attend.
    with pytest.raises(RuntimeError, match=r"row 1 has queries but no keys"):
        _bad_call(q, k, v, cu, kv, rows, cache, ok_index, ok_offsets)


def test_gathered_keys_pass_opcheck():
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    g, q, k, v, cu, kv, rows = _case(torch.float32)
    store, table = to_pages(kv, 16, g)
    index, offsets = _lists([[0, 3, 9], [1, 2], list(range(20, 40)), [69]])
    cache = torch.tensor([L, 5, 64, 70])
    for src, tab in ((kv, None), (store, table)):
        for fresh in (False, True):
            args = (q, k, v, cu, src, rows, cache, 1, fresh, tab, index, offsets)
            torch.library.opcheck(ops.packed_attention, args, test_utils=utils)


# ---------------------------------------------------------------------------------------------
# The forward: ForwardBatch's key lists reach every body's attend()

FAMILIES = {
    "llada": dict(d_model=64, n_heads=4, n_kv_heads=4, mlp_hidden_size=96, n_layers=2),
    "dream": dict(d_model=64, n_heads=4, n_kv_heads=2, mlp_hidden_size=96, n_layers=2),
    "llada2": dict(),
    "sdar": dict(),
}


def _forward(model, tokens, positions, cu, kv, mode, **kw):
    return ops.forward(
        model.obj,
        tokens,
        positions,
        cu,
        kv,
        kw.get("kv_rows"),
        kw.get("prefix_lens"),
        mode,
        None,
        kw.get("kv_lens"),
        kw.get("kv_pages"),
        kw.get("key_index"),
        kw.get("key_offsets"),
    )


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("page_len", [None, 4])
def test_forward_with_whole_range_lists_equals_contiguous(family, dtype, page_len):
    config = random_config(family, vocab_size=97, **FAMILIES[family])
    model = NativeModel(config, random_weights(config, 0, dtype, logit_scale=3.0))
    g = torch.Generator().manual_seed(7)
    R, Lc = 3, 37
    canvases = torch.randint(0, config.vocab_size, (R * Lc,), generator=g)
    kv = model.new_kv(R, Lc)
    _forward(model, canvases, torch.arange(Lc).repeat(R), torch.arange(R + 1) * Lc, kv, "full")
    table = None
    if page_len:
        kv, table = to_pages(kv, page_len, g)
    lengths = [1, 6, 3]
    tokens = torch.randint(0, config.vocab_size, (sum(lengths),), generator=g)
    positions = torch.cat([torch.randperm(Lc, generator=g)[:n] for n in lengths])
    cu = torch.tensor([0] + lengths).cumsum(0)
    kv_rows = torch.tensor([2, 0, 1])
    for mode, lens, extra in (
        ("dual", [Lc, Lc - 5, Lc - 11], {"kv_lens": torch.tensor([Lc, Lc - 5, Lc - 11])}),
        ("prefix", [Lc - 1, 9, 0], {"prefix_lens": torch.tensor([Lc - 1, 9, 0])}),
    ):
        index, offsets = _whole(lens)
        runs = []
        for lists in ({}, {"key_index": index, "key_offsets": offsets}):
            k = kv.clone()  # dual writes the fresh K/V
            runs.append(
                (_forward(model, tokens, positions, cu, k, mode, kv_rows=kv_rows, kv_pages=table, **extra, **lists), k)
            )
        assert torch.equal(runs[0][0], runs[1][0]), mode
        assert torch.equal(runs[0][1], runs[1][1]), mode
    index, offsets = _whole([1, 1, 1])
    with pytest.raises(RuntimeError, match=r"key_index needs mode 'dual' or 'prefix'"):
        _forward(
            model,
            tokens,
            positions,
            cu,
            kv.clone(),
            "full",
            kv_rows=kv_rows,
            kv_pages=table,
            key_index=index,
            key_offsets=offsets,
        )
