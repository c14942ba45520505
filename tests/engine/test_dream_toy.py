"""The shipped Dream-architecture toy (toy/checkpoint_dream): layout, shift, decoding, trainer."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn.functional as F

from blockbatch import toy
from blockbatch.loading import load_checkpoint
from blockbatch.reference import dream as dream_ref
from blockbatch.reference.model import ReferenceModel
from blockbatch.toy import evaluate as toy_eval
from blockbatch.toy import task
from blockbatch.toy import tokenizer as toy_tok
import train_toy as toy_train

CKPT = toy.dream_checkpoint_path()


@pytest.fixture(scope="module")
def dream_toy():
    ck = load_checkpoint(CKPT)
    return ck, ReferenceModel.from_checkpoint(ck, dtype=torch.float32)


def test_paths_and_loader_name_the_family():
    assert toy.checkpoint_path("dream") == CKPT == toy.CHECKPOINT_DIRS["dream"]
    assert toy.checkpoint_path() == toy.checkpoint_path("llada") == toy.CHECKPOINT_DIR
    assert toy.load(family="dream").config.family == "dream"
    with pytest.raises(ValueError, match="family must be one of llada, dream"):
        toy.checkpoint_path("Dream")


def test_dream_toy_is_in_the_dream_layout(dream_toy):
    ck, _ = dream_toy
    files = set(os.listdir(CKPT))
    assert {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        toy_train.CURVE_NAME,
    } <= files
    assert sum(os.path.getsize(os.path.join(CKPT, f)) for f in files) <= 10 * 1024 * 1024
    with open(os.path.join(CKPT, "config.json")) as f:
        raw = json.load(f)
    assert raw["model_type"] == "Dream" and raw["architectures"] == ["DreamModel"]
    cfg = ck.config
    assert cfg.family == "dream" and cfg.shifted_logits and cfg.attention_bias and not cfg.weight_tying
    assert cfg.n_kv_heads < cfg.n_heads and cfg.n_heads % cfg.n_kv_heads == 0  # GQA
    for i in range(cfg.n_layers):
        for p in "qkv":
            bias = ck.weights[f"model.layers.{i}.self_attn.{p}_proj.bias"]
            assert bias.abs().max() > 0  # trained, not the zero init
    assert "lm_head.weight" in ck.weights
    assert all(w.dtype == torch.float32 and bool(torch.isfinite(w).all()) for w in ck.weights.values())
    # same tokenizer and special ids as the LLaDA toy; <|endoftext|> doubles as BOS (Dream's convention)
    tok = ck.tokenizer
    assert tok.get_vocab() == toy_tok.build_tokenizer().get_vocab() and tok.get_vocab_size() == cfg.vocab_size
    assert (cfg.mask_token_id, cfg.eos_token_id, cfg.pad_token_id, cfg.bos_token_id) == (
        toy_tok.MASK_ID,
        toy_tok.EOS_ID,
        toy_tok.PAD_ID,
        toy_tok.EOS_ID,
    )
    with open(os.path.join(CKPT, "generation_config.json")) as f:
        gen = json.load(f)
    assert gen["mask_token_id"] == cfg.mask_token_id and gen["eos_token_id"] == cfg.eos_token_id
    with open(os.path.join(CKPT, toy_train.CURVE_NAME)) as f:
        curve = json.load(f)
    assert curve["train_config"]["family"] == "dream"
    assert curve["n_parameters"] == sum(w.numel() for w in ck.weights.values())
    evals = [r for r in curve["curve"] if "heldout_acc" in r]
    assert evals and evals[-1]["heldout_acc"] >= 0.9


def test_dream_toy_reads_position_p_from_output_p_minus_1(dream_toy):
    """The model was trained shifted: the output at p - 1 predicts the masked token at p far better
    than the output at p itself (the LLaDA reading)."""
    _, model = dream_toy
    tok = toy_tok.build_tokenizer()
    ids, resp = toy_train.make_batch(tok, task.make_problems(16, seed=11, split="test"), 64)
    masked = resp & (torch.rand(ids.shape, generator=torch.Generator().manual_seed(0)) < 0.5)
    with torch.no_grad():
        logits = model.forward_batch(torch.where(masked, torch.full_like(ids, toy_tok.MASK_ID), ids))

    def masked_ce(lg):
        return float(F.cross_entropy(lg[masked], ids[masked]))

    shifted, unshifted = masked_ce(toy_train.shift_batch(logits)), masked_ce(logits)
    assert shifted < 0.1 and unshifted > 1.0, (shifted, unshifted)


def test_dream_toy_solves_held_out_problems_with_the_dual_cache(dream_toy):
    ck, model = dream_toy
    problems = task.make_problems(16, seed=99, split="test")
    dec = toy_eval.reference_decoder(model, "dual", gen_length=64, block_length=32, threshold=0.9)
    res = toy_eval.evaluate(dec, problems, ck.tokenizer, name="dual")
    assert res.accuracy >= 14 / 16, res.outputs
    assert 2 < res.mean_nfe < 40  # several tokens per forward, but not everything at once
    # the same decode as calling the Dream reference directly
    prompt = toy_tok.encode(ck.tokenizer, problems[0].prompt)
    direct = dream_ref.dream_cached(model, prompt, 64, 32, 0.9, dual=True)
    assert toy_tok.decode_response(ck.tokenizer, direct.generated) == res.outputs[0]


def test_evaluate_runs_every_dream_policy(tmp_path, capsys):
    out = tmp_path / "eval.json"
    assert toy_eval.main(["--family", "dream", "--n", "6", "--threads", "1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["family"] == "dream" and report["checkpoint"] == CKPT
    assert list(report["results"]) == ["vanilla", "prefix", "dual", "blockbatch"]
    for name, r in report["results"].items():
        assert r["n"] == 6 and r["mean_nfe"] is not None
        # measured: 6/6 for prefix, dual and blockbatch; 3/6 for vanilla, whose last step commits the
        # last two masks together (on this task the final total's units digit and the answer's)
        assert r["accuracy"] >= (2 / 6 if name == "vanilla" else 5 / 6), (name, r)
    assert report["results"]["vanilla"]["mean_nfe"] == 64  # Dream's sampler: steps = gen_length forwards
    assert report["dream_steps"] == 64 and report["dream_alg"] == "entropy"
    printed = capsys.readouterr().out
    assert "(dream)" in printed and "Dream reference decoders" in printed and "blockbatch" in printed


def test_evaluate_refuses_a_policy_of_the_other_family():
    with pytest.raises(SystemExit):
        toy_eval.main(["--family", "llada", "--policies", "blockbatch", "--n", "1"])
    assert toy_eval.policies_for(load_checkpoint(CKPT).config.family) == ("vanilla", "prefix", "dual", "blockbatch")
    assert toy_eval.policies_for("llada") == ("vanilla", "prefix", "dual")


# --------------------------------------------------------------------------- trainer


def _tiny_dream(**kw):
    return toy_train.train_config(
        "dream",
        d_model=32,
        n_layers=1,
        n_heads=4,
        mlp_hidden_size=64,
        steps=kw.pop("steps", 40),
        tokens_per_step=600,
        lr=1e-2,
        warmup=5,
        canvas_lengths=(64,),
        canvas_weights=(1.0,),
        eval_every=0,
        log_every=10,
        threads=1,
        **kw,
    )


def test_family_defaults():
    tc = toy_train.train_config("dream")
    assert (tc.family, tc.n_kv_heads, tc.rope_theta) == ("dream", 2, 1e6)
    cfg = toy_train.model_config(tc)
    assert cfg.family == "dream" and cfg.attention_bias and cfg.n_kv_heads == 2
    assert toy_train.train_config() == toy_train.TrainConfig()  # the LLaDA recipe is untouched
    assert toy_train.model_config(toy_train.TrainConfig()).family == "llada"
    with pytest.raises(ValueError, match="family"):
        toy_train.train_config("qwen")


def test_tiny_dream_training_reduces_loss_is_deterministic_and_saves_dream_layout(tmp_path):
    threads = torch.get_num_threads()
    try:
        tc = _tiny_dream()
        config = toy_train.model_config(tc)
        initial = toy_train.init_weights(config, tc.seed)
        run1 = toy_train.train(tc, out=str(tmp_path / "ck"), quiet=True)
        run2 = toy_train.train(tc, quiet=True)
    finally:
        torch.set_num_threads(threads)
    assert all(float(initial[n].detach().abs().max()) == 0 for n in initial if n.endswith(".bias"))
    tok = toy_tok.build_tokenizer()
    ids, resp = toy_train.make_batch(tok, task.make_problems(32, seed=7, split="test"), 64)

    def held_out(weights):
        model = ReferenceModel(config, {k: v.detach() for k, v in weights.items()})
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            return sum(float(toy_train.diffusion_loss(model, ids, resp, g)) for _ in range(4)) / 4

    before, after = held_out(initial), held_out(run1["weights"])
    assert after < 0.7 * before, (before, after)
    assert [r["loss"] for r in run1["curve"]] == [r["loss"] for r in run2["curve"]]
    assert all(torch.equal(run1["weights"][k], run2["weights"][k]) for k in run1["weights"])
    ck = load_checkpoint(tmp_path / "ck")
    assert ck.config.family == "dream" and os.path.exists(tmp_path / "ck" / "generation_config.json")
    assert all(torch.equal(ck.weights[k], run1["weights"][k].detach()) for k in ck.weights)


def test_dream_loss_reads_the_previous_output():
    """diffusion_loss on a Dream model scores masked position p with the logits of p - 1."""
    tc = _tiny_dream()
    config = toy_train.model_config(tc)
    weights = {k: v.detach() for k, v in toy_train.init_weights(config, 3).items()}
    seen = {}

    class Spy(ReferenceModel):
        def forward_batch(self, x):
            seen["x"] = x
            seen["logits"] = super().forward_batch(x)
            return seen["logits"]

    tok = toy_tok.build_tokenizer()
    ids, resp = toy_train.make_batch(tok, task.make_problems(4, seed=0, split="train"), 64)
    g = torch.Generator().manual_seed(5)
    loss = toy_train.diffusion_loss(Spy(config, weights), ids, resp, g)
    # recompute by hand with the same draws
    g = torch.Generator().manual_seed(5)
    B, eps = ids.shape[0], 1e-3
    u = torch.rand((), generator=g)
    t = ((u + torch.arange(B) / B) % 1.0) * (1 - eps) + eps
    masked = (torch.rand(ids.shape, generator=g) < t[:, None]) & resp
    assert torch.equal(seen["x"] == toy_tok.MASK_ID, masked)
    lg = seen["logits"]
    total = torch.zeros(B)
    for b, p in masked.nonzero().tolist():
        total[b] += F.cross_entropy(lg[b, p - 1][None], ids[b, p][None])
    expected = (total / t / resp.sum(1)).mean()
    assert torch.allclose(loss, expected, rtol=1e-5), (loss, expected)


@pytest.mark.parametrize("policy", ["prefix", "dual", "blockbatch"])
def test_native_engine_on_the_dream_toy(policy):
    """Engine.generate (native) on held-out problems: the reference decoder's tokens and NFE, and
    the answers right (dual / prefix measured 0.98, BlockBatch 0.925 on 200 problems)."""
    from blockbatch import DecodeOptions, Engine
    from blockbatch.bench import reference_decode

    engine = Engine.from_pretrained(CKPT)
    ref = ReferenceModel.from_checkpoint(engine.checkpoint)
    options = DecodeOptions(policy=policy, gen_length=64, block_length=32)
    right = 0
    problems = task.make_problems(12, 0, "test")
    for p in problems:
        ids = torch.tensor(engine.codec.encode(p.prompt, chat=False))
        [g] = engine.generate([ids], options)
        assert reference_decode(ref, ids, options).tolist() == ids.tolist() + g.raw_ids
        right += task.check_answer(p, g.text)
    assert right >= 10, f"{policy}: {right}/12 right"
