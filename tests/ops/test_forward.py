"""Native packed forward vs the pure-PyTorch reference (float32, CPU), all three KV modes."""

import pytest
import torch

from blockbatch.native import NativeModel
from blockbatch.reference.model import ReferenceModel
from blockbatch.random_checkpoint import random_config, random_weights

from helpers.rows import TOL, assert_rows_close

SHAPES = {
    "mha-hd32": dict(d_model=64, n_heads=2, n_kv_heads=2, mlp_hidden_size=96, n_layers=2),
    "gqa-hd32": dict(d_model=128, n_heads=4, n_kv_heads=2, mlp_hidden_size=160, n_layers=2),
    "mha-hd64": dict(d_model=128, n_heads=2, n_kv_heads=2, mlp_hidden_size=256, n_layers=3),
    "gqa-hd64": dict(d_model=256, n_heads=4, n_kv_heads=1, mlp_hidden_size=320, n_layers=2),
    "gqa-hd128": dict(d_model=256, n_heads=2, n_kv_heads=1, mlp_hidden_size=384, n_layers=2),
    "mha-hd128-tied": dict(d_model=256, n_heads=2, n_kv_heads=2, mlp_hidden_size=200, n_layers=2, weight_tying=True),
}
ROW_LENGTHS = [[7], [1, 13], [5, 3, 11], [4, 8, 16, 2], [9, 1, 6, 15, 3], [4, 8, 16, 32, 5, 17]]


def _models(shape, seed=0, vocab=101):
    config = random_config(vocab_size=vocab, **SHAPES[shape])
    weights = random_weights(config, seed=seed, logit_scale=3.0)
    return config, ReferenceModel(config, weights), NativeModel(config, weights)


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("lengths", ROW_LENGTHS, ids=lambda l: "rows" + "-".join(map(str, l)))
def test_full_mode_matches_reference(shape, lengths):
    config, ref, nat = _models(shape)
    g = torch.Generator().manual_seed(len(lengths))
    ids = [torch.randint(0, config.vocab_size, (n,), generator=g) for n in lengths]
    pos = [torch.arange(n) + 3 * r for r, n in enumerate(lengths)]  # any absolute positions
    assert_rows_close(ref.forward(ids, pos), nat.forward(ids, pos))


def _filled_buffers(config, ref, nat, rows, L, g):
    canvases = [torch.randint(0, config.vocab_size, (L,), generator=g) for _ in range(rows)]
    kv_ref, kv_nat = ref.new_kv(rows, L), nat.new_kv(rows, L)
    positions = [torch.arange(L)] * rows
    assert_rows_close(
        ref.forward(canvases, positions, kv_ref, "full"), nat.forward(canvases, positions, kv_nat, "full")
    )
    torch.testing.assert_close(kv_nat, kv_ref, atol=TOL, rtol=TOL)
    return canvases, kv_ref, kv_nat


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("lengths", ROW_LENGTHS[1:], ids=lambda l: "rows" + "-".join(map(str, l)))
def test_dual_mode_matches_reference(shape, lengths):
    config, ref, nat = _models(shape)
    g = torch.Generator().manual_seed(7)
    L = 61  # odd canvas
    rows = len(lengths)
    canvases, kv_ref, kv_nat = _filled_buffers(config, ref, nat, rows, L, g)
    kv_rows = list(reversed(range(rows)))  # query row r uses KV row rows-1-r
    ids, pos = [], []
    for r, n in enumerate(lengths):
        s = int(torch.randint(0, L - n + 1, (1,), generator=g))
        window = canvases[kv_rows[r]][s : s + n].clone()
        window[::2] = config.mask_token_id  # fresh tokens differ from what the cache saw
        ids.append(window)
        pos.append(torch.arange(s, s + n))
    assert_rows_close(
        ref.forward(ids, pos, kv_ref, "dual", kv_rows=kv_rows), nat.forward(ids, pos, kv_nat, "dual", kv_rows=kv_rows)
    )
    torch.testing.assert_close(kv_nat, kv_ref, atol=TOL, rtol=TOL)  # fresh K/V written into their slots


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("lengths", ROW_LENGTHS[1:], ids=lambda l: "rows" + "-".join(map(str, l)))
def test_prefix_mode_matches_reference(shape, lengths):
    config, ref, nat = _models(shape)
    g = torch.Generator().manual_seed(11)
    L = 53
    rows = len(lengths)
    canvases, kv_ref, kv_nat = _filled_buffers(config, ref, nat, rows, L, g)
    before = kv_nat.clone()
    ids, pos, prefix = [], [], []
    for r, n in enumerate(lengths):
        s = L - n  # queries are the suffix [s, L)
        ids.append(torch.full((n,), config.mask_token_id))
        pos.append(torch.arange(s, L))
        prefix.append(s)
    assert_rows_close(
        ref.forward(ids, pos, kv_ref, "prefix", prefix_lens=prefix),
        nat.forward(ids, pos, kv_nat, "prefix", prefix_lens=prefix),
    )
    assert torch.equal(kv_nat, before), "prefix mode must not write the KV buffer"


def test_logit_index_selects_rows():
    config, _, nat = _models("gqa-hd32")
    from blockbatch.native import pack_rows

    tokens, pos, cu = pack_rows([torch.arange(5), torch.arange(7)], [torch.arange(5), torch.arange(7)])
    full = nat.forward_packed(tokens, pos, cu)
    index = torch.tensor([0, 6, 11])
    torch.testing.assert_close(nat.forward_packed(tokens, pos, cu, logit_index=index), full[index])


def test_bfloat16_close_to_reference_bfloat16():
    config = random_config(**SHAPES["gqa-hd64"])
    weights = random_weights(config, seed=2, logit_scale=3.0)
    ref32 = ReferenceModel(config, weights)
    ref16 = ReferenceModel(config, weights, torch.bfloat16)
    nat16 = NativeModel(config, weights, dtype=torch.bfloat16)
    assert nat16.dtype == torch.bfloat16
    ids = [torch.randint(0, config.vocab_size, (n,)) for n in (9, 4)]
    pos = [torch.arange(9), torch.arange(4)]
    exact = ref32.forward(ids, pos)
    err_ref = max((a - b).abs().max() for a, b in zip(ref16.forward(ids, pos), exact))
    err_nat = max((a - b).abs().max() for a, b in zip(nat16.forward(ids, pos), exact))
    assert err_nat <= 2 * err_ref + 1e-2, (err_nat, err_ref)


# ----------------------------------------------------------------------------- bad input


@pytest.fixture(scope="module")
def small():
    config = random_config()
    return config, NativeModel(config, random_weights(config))


def test_bad_mode(small):
    config, nat = small
    with pytest.raises(RuntimeError, match="mode must be 'full', 'dual' or 'prefix', got 'causal'"):
        nat.forward([torch.arange(3)], [torch.arange(3)], nat.new_kv(1, 8), "causal")


def test_token_outside_vocabulary(small):
    config, nat = small
    with pytest.raises(RuntimeError, match=r"tokens\[1\] = 97 is outside \[0, 97\)"):
        nat.forward([torch.tensor([1, 97])], [torch.arange(2)])


def test_position_outside_buffer(small):
    config, nat = small
    with pytest.raises(RuntimeError, match=r"positions\[0\] = 8 is outside \[0, 8\)"):
        nat.forward([torch.tensor([1])], [torch.tensor([8])], nat.new_kv(1, 8), "dual")


def test_kv_buffer_shape_and_dtype(small):
    config, nat = small
    with pytest.raises(RuntimeError, match=r"kv must be \[rows, 2, 2, 2, L, 32\]"):
        nat.forward([torch.arange(2)], [torch.arange(2)], torch.zeros(1, 3, 2, 2, 8, 32), "dual")
    with pytest.raises(RuntimeError, match="kv dtype BFloat16 differs from the model dtype Float"):
        nat.forward([torch.arange(2)], [torch.arange(2)], nat.new_kv(1, 8).bfloat16(), "dual")
    with pytest.raises(RuntimeError, match="need a kv buffer"):
        nat.forward([torch.arange(2)], [torch.arange(2)], None, "dual")


def test_kv_rows_and_prefix_lens_checked(small):
    config, nat = small
    kv = nat.new_kv(2, 8)
    with pytest.raises(RuntimeError, match=r"kv_rows\[0\] = 5 is outside \[0, 2\)"):
        nat.forward([torch.arange(2)], [torch.arange(2)], kv, "dual", kv_rows=[5])
    with pytest.raises(RuntimeError, match="prefix_lens is required"):
        nat.forward([torch.arange(2)], [torch.arange(2)], kv, "prefix")
    with pytest.raises(RuntimeError, match=r"prefix_lens\[0\] = 9 is outside \[0, 9\)"):
        nat.forward([torch.arange(2)], [torch.arange(2)], kv, "prefix", prefix_lens=[9])


def test_model_construction_errors():
    config = random_config()
    weights = random_weights(config)
    bad = dict(weights)
    bad.pop("model.transformer.blocks.0.q_proj.weight")
    with pytest.raises(RuntimeError, match="tensor 'model.transformer.blocks.0.q_proj.weight' is missing"):
        NativeModel(config, bad)
    bad = dict(weights)
    bad["model.transformer.ln_f.weight"] = torch.ones(3)
    with pytest.raises(RuntimeError, match=r"tensor 'model.transformer.ln_f.weight' has shape \[3\], expected \[64\]"):
        NativeModel(config, bad)
    with pytest.raises(ValueError, match="dtype must be one of"):
        NativeModel(config, weights, dtype=torch.float64)


def test_threads_do_not_change_results():
    config, _, nat = _models("gqa-hd64")
    ids = [torch.randint(0, config.vocab_size, (n,)) for n in (33, 17, 8)]
    pos = [torch.arange(n) for n in (33, 17, 8)]
    kv1, kv2 = nat.new_kv(3, 40), nat.new_kv(3, 40)
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = nat.forward(ids, pos, kv1, "full")
        torch.set_num_threads(2)
        two = nat.forward(ids, pos, kv2, "full")
    finally:
        torch.set_num_threads(previous)
    for a, b in zip(one, two):
        assert torch.equal(a, b)
    assert torch.equal(kv1, kv2)
