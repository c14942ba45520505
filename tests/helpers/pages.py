"""Dense KV buffers as page stores and back (paged KV tests: tests/ops/test_paged_kv.py, the emulator)."""

import torch


def to_pages(kv, page_len, g, spare=3):
    """The dense buffer [R, layers, 2, kvh, L, hd] as a page store in a shuffled order (plus
    `spare` pages of noise nobody reads) and its table [R, ceil(L / page_len)]."""
    R, layers, _, kvh, L, hd = kv.shape
    per_row = -(-L // page_len)
    padded = torch.zeros(R, layers, 2, kvh, per_row * page_len, hd, dtype=kv.dtype)
    padded[..., :L, :] = kv
    # [R, per_row, layers, 2, kvh, page_len, hd]
    chunks = padded.view(R, layers, 2, kvh, per_row, page_len, hd).permute(0, 4, 1, 2, 3, 5, 6)
    n = R * per_row + spare
    order = torch.randperm(n, generator=g)
    store = torch.randn(n, layers, 2, kvh, page_len, hd, generator=g).to(kv.dtype)
    table = order[: R * per_row].view(R, per_row).contiguous()
    store[table.flatten()] = chunks.reshape(R * per_row, layers, 2, kvh, page_len, hd)
    return store, table


def from_pages(store, table, L):
    """The dense [R, layers, 2, kvh, L, hd] the table's rows hold."""
    R, per_row = table.shape
    _, layers, _, kvh, page_len, hd = store.shape
    rows = store[table.flatten()].view(R, per_row, layers, 2, kvh, page_len, hd).permute(0, 2, 3, 4, 1, 5, 6)
    return rows.reshape(R, layers, 2, kvh, per_row * page_len, hd)[..., :L, :]
