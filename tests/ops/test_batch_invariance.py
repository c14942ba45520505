"""Batch invariance of the native forward on the CPU: a row's result does not depend on the rows
packed with it (the property the batching scheduler, csrc/decode/batch/, builds on; docs/ALGORITHMS.md
9), on every family's body (families.REGISTRY; each family's shape: tests/helpers/families.py). The
decodes built on it: tests/decode/test_batching.py (every family x each policy it decodes)."""

import pytest
import torch

import blockbatch.native  # noqa: F401
from blockbatch.native import NativeModel
from blockbatch.random_checkpoint import random_config, random_weights
from helpers import families as data

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


def _model(family):
    config = random_config(family, **data.invariance_shape(family))
    return config, NativeModel(config, random_weights(config, seed=2, logit_scale=4.0))


@pytest.mark.parametrize("mode", ["dual", "prefix"])
@pytest.mark.parametrize("family", data.names())
def test_forward_rows_do_not_depend_on_the_pack(family, mode):
    """One request's cached query rows (dual: against its whole KV row; prefix: against its cached
    prefix), alone and packed with other requests' rows of the same KV buffer (1..3 other rows, before
    and after it, of 1..40 tokens): the same logits, bit for bit."""
    config, model = _model(family)
    g = torch.Generator().manual_seed(0)
    L = 96
    kv = model.new_kv(4, L)
    canvases = [torch.randint(0, config.vocab_size - 7, (L,), generator=g) for _ in range(4)]
    for r, c in enumerate(canvases):
        model.forward([c], [torch.arange(L)], kv, "full", kv_rows=[r])

    def prefix(a):  # the prefix mode's cached positions: those before the row
        return [a] if mode == "prefix" else None

    mine = (canvases[3][20:28], torch.arange(20, 28))
    alone = model.forward([mine[0]], [mine[1]], kv, mode, kv_rows=[3], prefix_lens=prefix(20))[0]
    for others in ([(0, 0, 1)], [(0, 5, 40), (2, 50, 51)], [(1, 10, 30), (0, 0, 16), (2, 60, 96)]):
        rows = [(canvases[r][a:b], torch.arange(a, b), r, a) for r, a, b in others]
        for place in range(len(rows) + 1):
            packed = rows[:place] + [(mine[0], mine[1], 3, 20)] + rows[place:]
            out = model.forward(
                [p[0] for p in packed],
                [p[1] for p in packed],
                kv,
                mode,
                kv_rows=[p[2] for p in packed],
                prefix_lens=[p[3] for p in packed] if mode == "prefix" else None,
            )
            assert torch.equal(out[place], alone), (others, place)


@pytest.mark.parametrize("family", data.names())
def test_full_rows_do_not_depend_on_their_neighbours(family):
    """A token's logits are the same whichever other tokens share its forward (and so its GEMMs,
    its experts' where the family has a mixture of experts): no KV buffer, rows alone and packed."""
    config, model = _model(family)
    V = config.vocab_size - 4
    ids = torch.randint(0, V, (40,), generator=torch.Generator().manual_seed(2))
    alone = torch.ops.blockbatch.forward(model.obj, ids[:8], torch.arange(8), torch.tensor([0, 8]))
    other = torch.randint(0, V, (32,), generator=torch.Generator().manual_seed(3))
    packed = torch.ops.blockbatch.forward(
        model.obj,
        torch.cat([other, ids[:8]]),
        torch.cat([torch.arange(32), torch.arange(8)]),
        torch.tensor([0, 32, 40]),
    )
    assert torch.equal(packed[32:], alone)
