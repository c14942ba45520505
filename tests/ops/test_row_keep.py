"""Row pruning between layers (ForwardBatch::row_keep, DUET's query sparsity, ALGORITHMS.md 18.2), through
``torch.ops.blockbatch.forward``'s ``row_keep_layer`` / ``row_keep``: keeping every token is the plain forward
bit for bit; a pruning leaves the shallow layers' K/V as the plain forward writes them, leaves a dropped
token's deeper slots as they were, gives it zero logits, and gives the kept tokens the plain forward's logits
when the dropped tokens' slots already hold what they would write; bad arguments are refused."""

import pytest
import torch

from blockbatch.native import NativeModel
from blockbatch.random_checkpoint import random_config, random_weights

FAMILIES = ("llada2", "sdar", "llada")
LAYER = 1  # prune after layer 1 of 4


def _setup(family):
    config = random_config(family, vocab_size=97, n_layers=4)
    model = NativeModel(config, random_weights(config, 0, torch.float32, logit_scale=3.0))
    g = torch.Generator().manual_seed(11)
    R, Lc = 2, 24
    kv = model.new_kv(R, Lc)
    canvases = torch.randint(0, config.vocab_size, (R * Lc,), generator=g)
    torch.ops.blockbatch.forward(model.obj, canvases, torch.arange(Lc).repeat(R), torch.arange(R + 1) * Lc, kv)
    # two query rows (KV rows 1 and 0) of 8 and 5 tokens, dual mode over their rows' first 20 / 24 keys
    positions = torch.cat([torch.arange(12, 20), torch.arange(19, 24)])
    tokens = torch.randint(0, config.vocab_size, (13,), generator=g)
    args = dict(cu=torch.tensor([0, 8, 13]), rows=torch.tensor([1, 0]), lens=torch.tensor([20, 24]))
    return model, kv, tokens, positions, args


def _forward(model, kv, tokens, positions, a, keep=None, layer=LAYER):
    extra = (None, None, None, layer, keep) if keep is not None else ()
    return torch.ops.blockbatch.forward(
        model.obj, tokens, positions, a["cu"], kv, a["rows"], None, "dual", None, a["lens"], *extra
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_keeping_every_row_is_the_plain_forward(family):
    model, kv, tokens, positions, a = _setup(family)
    k1, k2 = kv.clone(), kv.clone()
    want = _forward(model, k1, tokens, positions, a)
    got = _forward(model, k2, tokens, positions, a, keep=torch.arange(13))
    assert torch.equal(got, want) and torch.equal(k1, k2)


@pytest.mark.parametrize("family", FAMILIES)
def test_pruned_rows_keep_their_deeper_kv_and_get_zero_logits(family):
    model, kv, tokens, positions, a = _setup(family)
    keep = torch.tensor([0, 3, 4, 7, 9, 12])  # both query rows keep some tokens, row 0 its first and last
    dropped = torch.tensor([i for i in range(13) if i not in keep.tolist()])
    kv_rows = torch.tensor([1] * 8 + [0] * 5)
    before = kv.clone()
    plain_kv = kv.clone()
    plain = _forward(model, plain_kv, tokens, positions, a)
    pruned_kv = kv.clone()
    pruned = _forward(model, pruned_kv, tokens, positions, a, keep=keep)
    # layers <= LAYER: every token's K/V as the plain forward writes them
    assert torch.equal(pruned_kv[:, : LAYER + 1], plain_kv[:, : LAYER + 1])
    # deeper: a dropped token's slots untouched, a kept token's written (they differ from before)
    deep = pruned_kv[:, LAYER + 1 :]
    for i in dropped.tolist():
        r, p = int(kv_rows[i]), int(positions[i])
        assert torch.equal(deep[r, :, :, :, p], before[r, LAYER + 1 :, :, :, p])
    for i in keep.tolist():
        r, p = int(kv_rows[i]), int(positions[i])
        assert not torch.equal(deep[r, :, :, :, p], before[r, LAYER + 1 :, :, :, p])
    assert torch.count_nonzero(pruned[dropped]) == 0
    assert torch.count_nonzero(pruned[keep]) > 0
    # with the dropped tokens' deeper slots holding what they would write, the kept tokens' logits are the
    # plain forward's (the same keys and values; only the GEMM shapes differ)
    again = _forward(model, plain_kv.clone(), tokens, positions, a, keep=keep)
    replain = _forward(model, plain_kv.clone(), tokens, positions, a)
    torch.testing.assert_close(again[keep], replain[keep], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(replain, plain, rtol=1e-4, atol=1e-4)


def test_bad_row_keep_is_refused():
    model, kv, tokens, positions, a = _setup("llada2")
    with pytest.raises(RuntimeError, match=r"row_keep_layer must be in \[0, n_layers - 1\)"):
        _forward(model, kv.clone(), tokens, positions, a, keep=torch.arange(3), layer=3)
    with pytest.raises(RuntimeError, match=r"row_keep must return int64 token indices"):
        _forward(model, kv.clone(), tokens, positions, a, keep=torch.arange(3, dtype=torch.int32))
