"""Paged KV (ALGORITHMS.md section 12): a forward over a page store read through a page table
equals the same forward over the dense buffer holding the same K/V, bit for bit (float32 and
bfloat16, CPU), in every KV mode and family; the writes land in the table's pages; rows may
share pages; kv_copy_rows_ copies through the table; bad tables are refused naming the entry."""

import pytest
import torch

from blockbatch.native import NativeModel
from blockbatch.random_checkpoint import random_config, random_weights

from helpers.pages import from_pages, to_pages

ops = torch.ops.blockbatch

FAMILIES = {
    "llada": dict(d_model=64, n_heads=4, n_kv_heads=4, mlp_hidden_size=96, n_layers=2),
    "dream": dict(d_model=64, n_heads=4, n_kv_heads=2, mlp_hidden_size=96, n_layers=2),
    "llada2": dict(),
    "sdar": dict(),
}


def _model(family, dtype=torch.float32, seed=0):
    config = random_config(family, vocab_size=97, **FAMILIES[family])
    return config, NativeModel(config, random_weights(config, seed, dtype, logit_scale=3.0))


def _forward(model, tokens, positions, cu, kv, mode, kv_rows=None, prefix_lens=None, kv_lens=None, kv_pages=None):
    return ops.forward(model.obj, tokens, positions, cu, kv, kv_rows, prefix_lens, mode, None, kv_lens, kv_pages)


def _case(config, rows, L, g):
    lengths = torch.randint(1, 9, (rows,), generator=g)
    tokens = torch.randint(0, config.vocab_size, (int(lengths.sum()),), generator=g)
    positions = torch.cat([torch.randperm(L, generator=g)[: int(n)] for n in lengths])
    cu = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    return tokens, positions, cu


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("page_len", [1, 4, 16, 64])
def test_paged_forward_equals_dense(family, dtype, page_len):
    config, model = _model(family, dtype)
    g = torch.Generator().manual_seed(page_len)
    R, L = 3, 37  # a canvas that is not a whole number of pages
    # Fill the rows with a full forward over whole canvases (dense), then page them.
    canvases = torch.randint(0, config.vocab_size, (R * L,), generator=g)
    full_pos = torch.arange(L).repeat(R)
    full_cu = torch.arange(R + 1) * L
    dense = model.new_kv(R, L)
    _forward(model, canvases, full_pos, full_cu, dense, "full")
    store, table = to_pages(dense, page_len, g)
    assert torch.equal(from_pages(store, table, L), dense)

    tokens, positions, cu = _case(config, R, L, g)
    kv_rows = torch.tensor([2, 0, 1])
    kv_lens = torch.tensor([L, L - 5, L - 11])
    prefix_lens = torch.tensor([L - 1, 9, 0])
    for mode, extra in [
        ("dual", dict(kv_rows=kv_rows, kv_lens=kv_lens)),
        ("prefix", dict(kv_rows=kv_rows, prefix_lens=prefix_lens)),
        ("full", dict(kv_rows=kv_rows)),
    ]:
        d = dense.clone()
        s = store.clone()
        want = _forward(model, tokens, positions, cu, d, mode, **extra)
        got = _forward(model, tokens, positions, cu, s, mode, kv_pages=table, **extra)
        assert torch.equal(got, want), f"{family} {mode}: logits differ"
        assert torch.equal(from_pages(s, table, L), d), f"{family} {mode}: the pages hold other K/V"
        untouched = torch.ones(s.shape[0], dtype=torch.bool)
        untouched[table.flatten()] = False
        assert torch.equal(s[untouched], store[untouched]), "a page outside the table was written"


def test_rows_sharing_pages_read_the_same_keys():
    """Two table rows naming the same pages attend to the same K/V: their logits equal those of
    two dense rows holding copies."""
    config, model = _model("llada")
    g = torch.Generator().manual_seed(1)
    L, P = 40, 8
    dense = model.new_kv(1, L)
    canvas = torch.randint(0, config.vocab_size, (L,), generator=g)
    _forward(model, canvas, torch.arange(L), torch.tensor([0, L]), dense, "full")
    store, table = to_pages(dense, P, g)
    shared = table.expand(2, -1).contiguous()  # both rows on row 0's pages
    tokens, positions, cu = _case(config, 2, L, g)
    want = _forward(
        model,
        tokens,
        positions,
        cu,
        dense.expand(2, -1, -1, -1, -1, -1).contiguous(),
        "prefix",
        prefix_lens=torch.tensor([L, 17]),
    )
    got = _forward(model, tokens, positions, cu, store, "prefix", prefix_lens=torch.tensor([L, 17]), kv_pages=shared)
    assert torch.equal(got, want)


def test_kv_copy_rows_through_pages():
    g = torch.Generator().manual_seed(2)
    dense = torch.randn(4, 2, 2, 2, 20, 8, generator=g)
    store, table = to_pages(dense, 6, g)
    table[3, 1] = table[0, 1]  # row 3 shares row 0's second page: a copy from 0 leaves it as it is
    shared_page = store[table[0, 1]].clone()
    src = torch.tensor([-1, 2, -1, 0])
    ops.kv_copy_rows_(store, src, table)
    want = from_pages(*to_pages(dense, 6, torch.Generator().manual_seed(0)), 20)
    want[1] = dense[2]
    want[3] = dense[0]
    want[0] = dense[0]
    assert torch.equal(from_pages(store, table, 20)[[0, 1, 3]], want[[0, 1, 3]])
    assert torch.equal(store[table[0, 1]], shared_page)


def test_bad_page_tables_are_refused():
    config, model = _model("llada")
    L, P = 16, 4
    store = torch.zeros(5, config.n_layers, 2, config.n_kv_heads, P, config.head_dim)
    table = torch.tensor([[0, 1, 2, 3]])
    tokens, positions, cu = torch.tensor([1, 2]), torch.tensor([0, 5]), torch.tensor([0, 2])
    bad = table.clone()
    bad[0, 2] = 5  # past the store
    with pytest.raises(Exception, match=r"kv_pages"):
        _forward(model, tokens, positions, cu, store, "dual", kv_pages=bad)
    hole = table.clone()
    hole[0, 3] = -1  # no page: a dual row attends to all L keys, so reading it is refused
    with pytest.raises(IndexError, match=r"no page"):
        _forward(model, tokens, positions, cu, store, "dual", kv_pages=hole)
    # ... but a prefix row that reads only the pages it has is fine, and a write there is dropped
    _forward(model, tokens, positions, cu, store, "prefix", prefix_lens=torch.tensor([8]), kv_pages=hole)
    with pytest.raises(Exception, match=r"kv_pages must be an int64"):
        _forward(model, tokens, positions, cu, store, "dual", kv_pages=table.float())
    with pytest.raises(Exception, match=r"kv_pages needs"):
        _forward(model, tokens, positions, cu, None, "full", kv_pages=table)
    with pytest.raises(Exception, match=r"kv_pages\[0, 1\] = 9"):
        ops.packed_attention(
            torch.zeros(2, config.n_heads, config.head_dim),
            torch.zeros(2, config.n_kv_heads, config.head_dim),
            torch.zeros(2, config.n_kv_heads, config.head_dim),
            cu,
            store,
            torch.tensor([0]),
            torch.tensor([L]),
            0,
            True,
            torch.tensor([[0, 9, 2, 3]]),
        )


def test_writes_to_no_page_are_dropped():
    """A write table entry -1 (share_prompt_kv: a shared page written through another row) drops
    the writes of that page's slots and only those; the store is otherwise as the dense write."""
    g = torch.Generator().manual_seed(4)
    dense = torch.randn(2, 2, 2, 2, 12, 8, generator=g)
    store, table = to_pages(dense, 4, g)
    writes = table.clone()
    writes[1, 0] = -1  # row 1 does not write its first page
    k, v = torch.randn(6, 2, 8, generator=g), torch.randn(6, 2, 8, generator=g)
    pos, cu, rows = torch.tensor([0, 5, 1, 2, 9, 11]), torch.tensor([0, 2, 6]), torch.tensor([0, 1])
    want = dense.clone()
    ops.kv_write_(want, k, v, pos, cu, rows, 1)
    want[1, :, :, :, 1:3] = dense[1, :, :, :, 1:3]  # row 1's slots 1 and 2 are on the page not written
    before = store.clone()
    ops.kv_write_(store, k, v, pos, cu, rows, 1, writes)
    assert torch.equal(from_pages(store, table, 12), want)
    outside = torch.ones(store.shape[0], dtype=torch.bool)
    outside[table.flatten()] = False
    assert torch.equal(store[outside], before[outside])


def test_paged_ops_pass_opcheck():
    # The utilities tests/ops/test_ops.py runs on every op (aot_dispatch_dynamic left out there too).
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    g = torch.Generator().manual_seed(3)
    dense = torch.randn(2, 2, 2, 2, 12, 8, generator=g)
    store, table = to_pages(dense, 4, g)
    q = torch.randn(5, 4, 8, generator=g)
    k = torch.randn(5, 2, 8, generator=g)
    v = torch.randn(5, 2, 8, generator=g)
    cu = torch.tensor([0, 2, 5])
    rows = torch.tensor([1, 0])
    torch.library.opcheck(
        ops.packed_attention, (q, k, v, cu, store, rows, torch.tensor([12, 7]), 1, True, table), test_utils=utils
    )
    torch.library.opcheck(
        ops.kv_write_, (store, k, v, torch.tensor([0, 11, 3, 4, 8]), cu, rows, 1, table), test_utils=utils
    )
    torch.library.opcheck(ops.kv_copy_rows_, (store, torch.tensor([-1, 0]), table), test_utils=utils)
