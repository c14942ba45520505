"""Batch invariance of the native forward on the CPU: a row's result does not depend on the rows
packed with it (the property csrc/decode/batching.h builds on; docs/ALGORITHMS.md 9)."""

import pytest
import torch

import blockbatch.native  # noqa: F401
from blockbatch.native import NativeModel
from blockbatch.random_checkpoint import random_config, random_weights

ops = torch.ops.blockbatch


@pytest.mark.parametrize("K,N", [(64, 97), (128, 384), (384, 128), (256, 1536)])
def test_linear_rows_do_not_depend_on_the_pack(K, N):
    g = torch.Generator().manual_seed(K + N)
    w = torch.randn(N, K, generator=g)
    row = torch.randn(1, K, generator=g)
    alone = ops.linear(row, w)
    for m in (2, 3, 7, 15, 16, 17, 64, 300):
        for at in {0, m // 2, m - 1}:
            x = torch.randn(m, K, generator=g)
            x[at] = row[0]
            assert torch.equal(ops.linear(x, w)[at], alone[0]), (m, at)


def test_forward_rows_do_not_depend_on_the_pack():
    """One request's dual-cache query rows, alone and packed with other requests' rows of the same
    KV buffer (1..3 other rows, before and after it, of 1..40 tokens): the same logits, bit for bit."""
    config = random_config(d_model=64, n_layers=2, vocab_size=97, max_sequence_length=256)
    model = NativeModel(config, random_weights(config, seed=2, logit_scale=4.0))
    g = torch.Generator().manual_seed(0)
    L = 96
    kv = model.new_kv(4, L)
    canvases = [torch.randint(0, 90, (L,), generator=g) for _ in range(4)]
    for r, c in enumerate(canvases):
        model.forward([c], [torch.arange(L)], kv, "full", kv_rows=[r])
    mine = (canvases[3][20:28], torch.arange(20, 28))
    alone = model.forward([mine[0]], [mine[1]], kv, "dual", kv_rows=[3])[0]
    for others in ([(0, 0, 1)], [(0, 5, 40), (2, 50, 51)], [(1, 10, 30), (0, 0, 16), (2, 60, 96)]):
        rows = [(canvases[r][a:b], torch.arange(a, b), r) for r, a, b in others]
        for place in range(len(rows) + 1):
            packed = rows[:place] + [(mine[0], mine[1], 3)] + rows[place:]
            out = model.forward(
                [p[0] for p in packed], [p[1] for p in packed], kv, "dual", kv_rows=[p[2] for p in packed]
            )
            assert torch.equal(out[place], alone), (others, place)
