"""The shipped toy model and its task: generator, checker, tokenizer, checkpoint, trainer."""

from __future__ import annotations

import json
import os

import pytest
import torch

from blockbatch.loading import load_checkpoint
from blockbatch.reference.model import ReferenceModel
from blockbatch.toy import checkpoint_path
from blockbatch.toy import evaluate as toy_eval
from blockbatch.toy import task
from blockbatch.toy import tokenizer as toy_tok
import train_toy as toy_train

CKPT = checkpoint_path()


# --------------------------------------------------------------------------- task


def test_generator_is_seeded_and_valid():
    a = task.make_problems(300, seed=3, split="train")
    b = task.make_problems(300, seed=3, split="train")
    c = task.make_problems(300, seed=4, split="train")
    assert a == b
    assert a != c
    assert len({p.prompt for p in a}) == 300  # unique prompts
    for p in a:
        assert task.MIN_OPS <= len(p.ops) <= task.MAX_OPS
        assert all(1 <= abs(d) <= task.MAX_DIGIT for d in p.ops)
        assert all(task.MIN_VALUE <= v <= task.MAX_VALUE for v in [p.start] + p.values)
        assert len(p.prompt) == task.PROMPT_CHARS
        assert len(p.response) <= task.MAX_RESPONSE_CHARS
    assert {len(p.ops) for p in a} == set(range(task.MIN_OPS, task.MAX_OPS + 1))


def test_splits_are_disjoint():
    train = task.make_problems(2000, seed=0, split="train")
    test = task.make_problems(500, seed=0, split="test")
    # same seed for both splits still gives disjoint sets: membership is a property of the prompt
    assert not {p.prompt for p in train} & {p.prompt for p in test}
    assert all(task.split_of(p) == "train" for p in train)
    assert all(task.split_of(p) == "test" for p in test)
    with pytest.raises(ValueError):
        task.make_problems(1, split="validation")


def test_worked_example():
    p = task.Problem(37, (2, -3, 1))
    assert p.prompt == "37+2=__-3=__+1=__" + "." * 15 + "?"
    assert len(p.prompt) == task.PROMPT_CHARS
    assert p.response == "37+2=39-3=36+1=37;37"
    assert p.answer == 37 and p.values == [39, 36, 37]
    kinds = task.response_kinds(p)
    assert "".join(c for c, k in zip(p.response, kinds) if k == "total_digit") == "393637"
    assert "".join(c for c, k in zip(p.response, kinds) if k == "copied_digit") == "37231"
    assert "".join(c for c, k in zip(p.response, kinds) if k == "format") == "+=-=+=;"
    assert "".join(c for c, k in zip(p.response, kinds) if k == "answer_digit") == "37"


def test_checker_accepts_correct_and_rejects_wrong():
    for p in task.make_problems(50, seed=1, split="test"):
        assert task.check_answer(p, p.response)
        assert task.check_trace(p, p.response)
        head = p.response[: p.response.index(";")]
        assert not task.check_answer(p, f"{head};{p.answer + 1}")
        assert not task.check_answer(p, f"{head};{p.answer}5")  # extra digit
        assert not task.check_answer(p, head)  # no answer
        assert not task.check_answer(p, p.response + " 12")  # rambles on after the answer
        assert not task.check_answer(p, p.response[:-1] + "?")  # a leftover mask
        # a wrong step with the right answer passes the answer check but not the trace check
        first = p.response[5:7]  # the first running total
        wrong_step = p.response[:5] + ("11" if first != "11" else "12") + p.response[7:]
        assert task.check_answer(p, wrong_step) and not task.check_trace(p, wrong_step)


# --------------------------------------------------------------------------- tokenizer


def test_tokenizer_round_trips():
    tok = toy_tok.build_tokenizer()
    for p in task.make_problems(50, seed=2, split="test"):
        for text in (p.prompt, p.response):
            ids = toy_tok.encode(tok, text)
            assert len(ids) == len(text)  # one token per character
            assert tok.decode(ids) == text
        ids = toy_tok.encode(tok, p.response) + [toy_tok.EOS_ID] * 5
        assert toy_tok.decode_response(tok, ids) == p.response
    assert toy_tok.encode(tok, "<|mdm_mask|>1<|endoftext|>") == [toy_tok.MASK_ID, tok.token_to_id("1"), toy_tok.EOS_ID]
    assert tok.get_vocab_size() == toy_tok.VOCAB_SIZE


def test_tokenizer_special_tokens_match_config():
    ck = load_checkpoint(CKPT)
    cfg, tok = ck.config, ck.tokenizer
    assert tok is not None
    assert tok.token_to_id(toy_tok.MASK_TOKEN) == cfg.mask_token_id
    assert tok.token_to_id(toy_tok.EOS_TOKEN) == cfg.eos_token_id
    assert tok.token_to_id(toy_tok.PAD_TOKEN) == cfg.pad_token_id
    assert len({cfg.mask_token_id, cfg.eos_token_id, cfg.pad_token_id}) == 3
    assert tok.get_vocab() == toy_tok.build_tokenizer().get_vocab()
    assert tok.get_vocab_size() == cfg.vocab_size
    # the shipped tokenizer.json decodes without specials and keeps them out of the text
    assert tok.decode([cfg.mask_token_id, tok.token_to_id("7"), cfg.eos_token_id]) == "7"


# --------------------------------------------------------------------------- checkpoint


def test_shipped_checkpoint_loads_and_is_small():
    ck = load_checkpoint(CKPT)
    total = sum(os.path.getsize(os.path.join(CKPT, f)) for f in os.listdir(CKPT))
    assert total <= 10 * 1024 * 1024
    for name in ("config.json", "model.safetensors", "tokenizer.json", toy_train.CURVE_NAME):
        assert os.path.exists(os.path.join(CKPT, name)), name
    cfg = ck.config
    assert cfg.max_sequence_length >= 512
    assert task.PROMPT_CHARS < 40 and task.MAX_RESPONSE_CHARS < 64
    assert all(w.dtype == torch.float32 and bool(torch.isfinite(w).all()) for w in ck.weights.values())
    n_params = sum(w.numel() for w in ck.weights.values())
    assert 0.5e6 <= n_params <= 2.5e6
    with open(os.path.join(CKPT, toy_train.CURVE_NAME)) as f:
        curve = json.load(f)
    assert curve["n_parameters"] == n_params
    evals = [r for r in curve["curve"] if "heldout_acc" in r]
    assert evals and evals[-1]["heldout_acc"] >= 0.9
    assert curve["curve"][-1]["loss"] < curve["curve"][0]["loss"]


def test_shipped_checkpoint_solves_held_out_problems():
    ck = load_checkpoint(CKPT)
    model = ReferenceModel.from_checkpoint(ck)
    problems = task.make_problems(12, seed=99, split="test")
    dec = toy_eval.reference_decoder(model, "dual", gen_length=64, block_length=32, threshold=0.9)
    res = toy_eval.evaluate(dec, problems, ck.tokenizer, name="dual")
    assert res.accuracy >= 10 / 12, res.outputs
    # threshold decoding commits several tokens per step, but not everything at once
    assert 2 < res.mean_nfe < 40


# --------------------------------------------------------------------------- evaluate API


def test_evaluate_accepts_any_decoder():
    tok = toy_tok.build_tokenizer()
    problems = task.make_problems(20, seed=5, split="test")
    answers = {tuple(toy_tok.encode(tok, p.prompt)): p for p in problems}

    def oracle(prompt_ids):
        p = answers[tuple(prompt_ids.tolist())]
        return toy_tok.encode(tok, p.response) + [toy_tok.EOS_ID] * 3, 7

    def off_by_one(prompt_ids):
        p = answers[tuple(prompt_ids.tolist())]
        head = p.response[: p.response.index(";")]
        return torch.tensor(toy_tok.encode(tok, f"{head};{p.answer + 1}") + [toy_tok.EOS_ID])

    good = toy_eval.evaluate(oracle, problems, tok)
    assert good.accuracy == 1.0 and good.trace_accuracy == 1.0 and good.mean_nfe == 7
    bad = toy_eval.evaluate(off_by_one, problems, tok)
    assert bad.accuracy == 0.0 and bad.mean_nfe is None
    batched = toy_eval.evaluate_batched(lambda prompts: [oracle(p) for p in prompts], problems, tok, batch_size=6)
    assert batched.accuracy == 1.0 and batched.outputs == good.outputs


# --------------------------------------------------------------------------- trainer


def _tiny_config(**kw):
    return toy_train.TrainConfig(
        d_model=32,
        n_layers=1,
        n_heads=2,
        n_kv_heads=2,
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


def _held_out_loss(weights, tc):
    config = toy_train.model_config(tc)
    model = ReferenceModel(config, {k: v.detach() for k, v in weights.items()})
    tok = toy_tok.build_tokenizer()
    ids, resp = toy_train.make_batch(tok, task.make_problems(32, seed=7, split="test"), 64)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        return sum(float(toy_train.diffusion_loss(model, ids, resp, g)) for _ in range(4)) / 4


def test_tiny_training_reduces_loss_and_is_deterministic():
    threads = torch.get_num_threads()
    try:
        tc = _tiny_config()
        initial = toy_train.init_weights(toy_train.model_config(tc), tc.seed)
        run1 = toy_train.train(tc, quiet=True)
        run2 = toy_train.train(tc, quiet=True)
    finally:
        torch.set_num_threads(threads)
    before, after = _held_out_loss(initial, tc), _held_out_loss(run1["weights"], tc)
    assert after < 0.7 * before, (before, after)
    assert [r["loss"] for r in run1["curve"]] == [r["loss"] for r in run2["curve"]]
    assert all(torch.equal(run1["weights"][k], run2["weights"][k]) for k in run1["weights"])


def test_batches_follow_llada_sft_layout():
    tok = toy_tok.build_tokenizer()
    problems = task.make_problems(4, seed=0, split="train")
    ids, resp = toy_train.make_batch(tok, problems, 64)
    assert ids.shape == (4, task.PROMPT_CHARS + 64)
    for b, p in enumerate(problems):
        lp, lr = len(p.prompt), len(p.response)
        assert not resp[b, :lp].any() and resp[b, lp:].all()
        assert toy_tok.decode_response(tok, ids[b, lp:]) == p.response
        assert (ids[b, lp + lr :] == toy_tok.EOS_ID).all()  # answer padded with EOS
    # the prompt is never masked, whatever t is drawn
    cfg = toy_train.model_config(_tiny_config())
    seen = {}

    class Spy(ReferenceModel):
        def forward_batch(self, x):
            seen["x"] = x
            return super().forward_batch(x)

    model = Spy(cfg, toy_train.init_weights(cfg, 0))
    for seed in range(5):
        toy_train.diffusion_loss(model, ids, resp, torch.Generator().manual_seed(seed))
        masked = seen["x"] == cfg.mask_token_id
        assert not (masked & ~resp).any()
        assert masked.any()


# --------------------------------------------------------------------------- the parity task


def test_parity_task_is_seeded_split_and_checked_on_the_whole_trace():
    from blockbatch.toy import parity

    a, b = parity.make_problems(200, seed=3, split="train"), parity.make_problems(200, seed=3, split="train")
    assert a == b and len({p.prompt for p in a}) == 200
    test = parity.make_problems(200, seed=3, split="test")
    assert not {p.prompt for p in a} & {p.prompt for p in test}  # the splits never share a prompt
    for p in a + test:
        assert len(p.prompt) == parity.PROMPT_CHARS and parity.MIN_BITS <= len(p.bits) <= parity.MAX_BITS
        trace, last = p.response.split(";")
        running = 0
        for bit, shown in zip(p.bits, trace):
            running ^= bit
            assert int(shown) == running
        assert len(trace) == len(p.bits) and int(last) == sum(p.bits) % 2
    p = parity.Problem((1, 0, 1, 1, 0, 0, 0, 1))
    assert (p.prompt, p.response) == ("10110001........?", "11011110;0")
    assert parity.check_answer(p, " 11011110;0\n") and not parity.check_answer(p, "11011111;0")
    assert set(p.prompt + p.response) <= set(toy_tok.CHARS)  # the toy tokenizer spells it


def test_trainer_trains_the_parity_task(capsys):
    threads = torch.get_num_threads()
    try:
        tc = _tiny_config(task="parity", steps=30)
        initial = toy_train.init_weights(toy_train.model_config(tc), tc.seed)
        run = toy_train.train(tc, quiet=True)
    finally:
        torch.set_num_threads(threads)
    from blockbatch.toy import parity

    config = toy_train.model_config(tc)
    tok = toy_tok.build_tokenizer()
    ids, resp = toy_train.make_batch(tok, parity.make_problems(32, seed=7, split="test"), 64)

    def loss(weights):
        model = ReferenceModel(config, {k: v.detach() for k, v in weights.items()})
        with torch.no_grad():
            return float(toy_train.diffusion_loss(model, ids, resp, torch.Generator().manual_seed(0)))

    assert loss(run["weights"]) < 0.7 * loss(initial)
    assert run["train_config"]["task"] == "parity"
    with pytest.raises(ValueError, match="task must be one of arith, parity, got 'sort'"):
        toy_train.train_config("llada", task="sort")
    with pytest.raises(SystemExit):
        toy_train.main(["--task", "parity"])  # no --out: no shipped parity checkpoint to replace
    assert "--task parity needs --out DIR" in capsys.readouterr().err
