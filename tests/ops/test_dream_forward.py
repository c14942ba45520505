"""The native forward on Dream weights (Qwen2 body: q/k/v biases, GQA) against the float32 reference.

The forward itself is unshifted for both families; Dream's shift belongs to the decoders. The
native decode loop does not run Dream yet and says so.
"""

import pytest
import torch

from blockbatch.random_checkpoint import random_config, random_weights
from blockbatch.native import NativeModel
from blockbatch.reference.model import ReferenceModel

from helpers.rows import TOL, assert_rows_close

SHAPES = {
    "gqa-hd16": dict(d_model=64, n_heads=4, n_kv_heads=2, mlp_hidden_size=128, n_layers=2),
    "gqa-hd32-tied": dict(d_model=128, n_heads=4, n_kv_heads=1, mlp_hidden_size=160, n_layers=3, weight_tying=True),
    "mha-hd64": dict(d_model=128, n_heads=2, n_kv_heads=2, mlp_hidden_size=96, n_layers=2),
}


def _models(shape, seed=0):
    config = random_config("dream", vocab_size=113, max_sequence_length=512, **SHAPES[shape])
    weights = random_weights(config, seed=seed, logit_scale=3.0, bias_scale=0.5)
    return config, weights, ReferenceModel(config, weights), NativeModel(config, weights)


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("lengths", [[9], [1, 13, 4], [4, 8, 16, 32, 5]], ids=lambda l: "rows" + "-".join(map(str, l)))
def test_dream_full_dual_prefix_match_reference(shape, lengths):
    config, _, ref, nat = _models(shape)
    g = torch.Generator().manual_seed(len(lengths))
    ids = [torch.randint(0, config.vocab_size, (n,), generator=g) for n in lengths]
    pos = [torch.arange(n) + 2 * r for r, n in enumerate(lengths)]
    assert_rows_close(ref.forward(ids, pos), nat.forward(ids, pos))

    L, rows = 47, len(lengths)
    canvases = [torch.randint(0, config.vocab_size, (L,), generator=g) for _ in range(rows)]
    kv_ref, kv_nat = ref.new_kv(rows, L), nat.new_kv(rows, L)
    full = [torch.arange(L)] * rows
    assert_rows_close(ref.forward(canvases, full, kv_ref, "full"), nat.forward(canvases, full, kv_nat, "full"))
    torch.testing.assert_close(kv_nat, kv_ref, atol=TOL, rtol=TOL)  # biased K/V written into their slots
    ids, pos = [], []
    for r, n in enumerate(lengths):
        n = min(n, L)
        s = int(torch.randint(0, L - n + 1, (1,), generator=g))
        window = canvases[r][s : s + n].clone()
        window[::2] = config.mask_token_id
        ids.append(window)
        pos.append(torch.arange(s, s + n))
    assert_rows_close(ref.forward(ids, pos, kv_ref, "dual"), nat.forward(ids, pos, kv_nat, "dual"))
    torch.testing.assert_close(kv_nat, kv_ref, atol=TOL, rtol=TOL)
    prefix = [int(p[0]) for p in pos]
    assert_rows_close(
        ref.forward(ids, pos, kv_ref, "prefix", prefix_lens=prefix),
        nat.forward(ids, pos, kv_nat, "prefix", prefix_lens=prefix),
    )


def test_the_biases_matter():
    """Without its q/k/v biases the forward differs: the native model really adds them."""
    config, weights, _, nat = _models("gqa-hd16")
    zero = {k: (torch.zeros_like(v) if k.endswith(".bias") else v) for k, v in weights.items()}
    ids, pos = [torch.arange(1, 12)], [torch.arange(11)]
    with_bias = nat.forward(ids, pos)[0]
    without = NativeModel(config, zero).forward(ids, pos)[0]
    assert (with_bias - without).abs().max() > 1e-2
    torch.testing.assert_close(without, ReferenceModel(config, zero).forward(ids, pos)[0], atol=TOL, rtol=TOL)


def test_native_weight_checks_name_the_dream_tensor():
    config, weights, _, _ = _models("gqa-hd16")
    missing = {k: v for k, v in weights.items() if k != "model.layers.1.self_attn.v_proj.bias"}
    with pytest.raises(RuntimeError, match=r"weights: tensor 'model.layers.1.self_attn.v_proj.bias' is missing"):
        NativeModel(config, missing)
    llada_name = dict(weights, **{"model.transformer.wte.weight": weights["model.embed_tokens.weight"]})
    with pytest.raises(RuntimeError, match=r"unexpected tensor 'model.transformer.wte.weight' \(not part of a dream "):
        NativeModel(config, llada_name)


def test_native_decode_runs_dream():
    """The op decodes a Dream model (tests/decode/test_dream_native.py holds it to the reference)."""
    _, _, _, nat = _models("gqa-hd16")
    tokens, counters, _, _, _ = torch.ops.blockbatch.decode(
        nat.obj, torch.tensor([3, 4, 5]), gen_length=8, block_length=8
    )
    assert tokens.shape == (11,) and tokens[:3].tolist() == [3, 4, 5]
    assert int(counters[0]) >= 2  # a block-start forward and at least one window forward
