"""The LLaDA2 toy trainer's batched forward is the reference's, and its loss trains only what the
block decoder will ask of the model (one block per row, the earlier blocks clean)."""

from __future__ import annotations

import torch

from blockbatch.families import llada2 as fam
from blockbatch.reference import llada2 as ref
from blockbatch.toy import tokenizer as toy_tok
import train_toy_llada2 as trainer


def test_batched_training_forward_equals_the_reference():
    tc = trainer.TrainConfig(d_model=64, n_layers=3, head_size=16, rope_dims=8, moe_hidden_size=32)
    config = trainer.model_config(tc)
    weights = {k: v.detach() for k, v in trainer.init_weights(config, seed=3).items()}
    weights = {
        k: v + 0.05 * torch.randn(v.shape, generator=torch.Generator().manual_seed(1)) for k, v in weights.items()
    }
    cfg = fam.reference_config(config)
    model = ref.LLaDA2Reference(cfg, weights)
    ids = torch.randint(0, toy_tok.VOCAB_SIZE, (3, 70), generator=torch.Generator().manual_seed(2))
    batched = trainer.forward_batch(cfg, weights, ids, 32)
    for row in range(3):
        assert (batched[row] - model.forward(ids[row], 32)).abs().max() < 1e-4


def test_the_loss_masks_one_block_per_row_and_trains():
    tc = trainer.TrainConfig(d_model=32, n_layers=2, head_size=8, rope_dims=4, moe_hidden_size=16, mlp_hidden_size=64)
    config = trainer.model_config(tc)
    weights = trainer.init_weights(config, seed=0)
    cfg = fam.reference_config(config)
    ids = torch.randint(0, toy_tok.VOCAB_SIZE - 2, (4, 80), generator=torch.Generator().manual_seed(0))
    resp = torch.zeros_like(ids, dtype=torch.bool)
    resp[:, 20:] = True
    loss = trainer.block_diffusion_loss(cfg, weights, ids, resp, 32, torch.Generator().manual_seed(0), 1e-3)
    loss.backward()
    assert torch.isfinite(loss) and loss > 0
    assert all(w.grad is not None for n, w in weights.items() if ".experts." not in n and "gate" not in n)


def test_the_sdar_toy_trainer_forward_equals_the_reference():
    """--family sdar: the same trainer, SDAR's layout and forward (reference/sdar.py's, batched)."""
    from blockbatch.families import sdar as sdar_fam
    from blockbatch.reference import sdar as sdar_ref

    tc = trainer.train_config("sdar", d_model=64, n_layers=2, head_size=16, mlp_hidden_size=96)
    config = trainer.model_config(tc)
    assert config.family == "sdar" and tc.block_lengths == (4, 8, 16)
    weights = {k: v.detach() for k, v in trainer.init_weights(config, seed=3).items()}
    weights = {
        k: v + 0.05 * torch.randn(v.shape, generator=torch.Generator().manual_seed(1)) for k, v in weights.items()
    }
    cfg = sdar_fam.reference_config(config)
    model = sdar_ref.SDARReference(cfg, weights)
    ids = torch.randint(0, toy_tok.VOCAB_SIZE, (3, 40), generator=torch.Generator().manual_seed(2))
    batched = trainer.forward_batch(cfg, weights, ids, 8)
    for row in range(3):
        assert (batched[row] - model.forward(ids[row], 8)).abs().max() < 1e-4
    resp = torch.zeros_like(ids, dtype=torch.bool)
    resp[:, 10:] = True
    loss = trainer.block_diffusion_loss(cfg, weights, ids, resp, 4, torch.Generator().manual_seed(0), 1e-3)
    assert torch.isfinite(loss) and loss > 0


def test_the_t2t_objective_trains_the_unmasked_positions_too():
    """--edit's token-to-token terms: off (edit_prob = stale_prob = 0) it is LLaDA2.0's loss draw for draw; on,
    the loss also reaches unmasked positions, so a model that copies every visible token is not free."""
    tc = trainer.TrainConfig(d_model=32, n_layers=2, head_size=8, rope_dims=4, moe_hidden_size=16, mlp_hidden_size=64)
    config = trainer.model_config(tc)
    weights = {k: v.detach() for k, v in trainer.init_weights(config, seed=0).items()}
    cfg = fam.reference_config(config)
    ids = torch.randint(2, toy_tok.EOS_ID, (4, 96), generator=torch.Generator().manual_seed(0))
    resp = torch.zeros_like(ids, dtype=torch.bool)
    resp[:, 20:] = True

    def loss(edit_prob: float, stale_prob: float) -> torch.Tensor:
        g = torch.Generator().manual_seed(5)
        return trainer.block_diffusion_loss(cfg, weights, ids, resp, 32, g, 1e-3, edit_prob, stale_prob)

    plain = trainer.block_diffusion_loss(cfg, weights, ids, resp, 32, torch.Generator().manual_seed(5), 1e-3)
    assert torch.equal(loss(0.0, 0.0), plain)
    t2t = loss(0.3, 1.0)
    assert torch.isfinite(t2t) and not torch.equal(t2t, plain)
    assert all(int(t) not in (toy_tok.PAD_ID, toy_tok.MASK_ID) for t in trainer.WRONG_TOKENS)
