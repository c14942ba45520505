"""torch.ops.blockbatch.decode, single-branch policies: token-for-token equal to the reference."""

import pytest
import torch

from blockbatch.native import NativeModel
from blockbatch.decoding import run_decode
from blockbatch.options import DecodeOptions
from blockbatch.reference.model import ReferenceModel
from blockbatch.reference.policies import generate
from blockbatch.random_checkpoint import random_config, random_weights

SHAPES = {
    "mha": dict(d_model=64, n_heads=2, n_kv_heads=2, mlp_hidden_size=128, vocab_size=61),
    "gqa": dict(d_model=96, n_heads=4, n_kv_heads=2, mlp_hidden_size=160, vocab_size=53),
}


@pytest.fixture(scope="module", params=list(SHAPES))
def models(request):
    config = random_config(**SHAPES[request.param])
    weights = random_weights(config, seed=3, logit_scale=7.0)  # peaked: thresholds commit several tokens
    return config, ReferenceModel(config, weights), NativeModel(config, weights)


# (policy, gen_length, block_length, options); prompts of odd lengths are drawn per case.
CASES = [
    ("vanilla", 32, 8, dict(threshold=None, steps=32)),  # LLaDA: one token per step
    ("vanilla", 64, 16, dict(threshold=None, steps=16)),  # four tokens per step
    ("vanilla", 32, 32, dict(threshold=0.9)),
    ("vanilla", 64, 8, dict(factor=1.0)),
    ("prefix", 32, 4, dict(threshold=0.9)),
    ("prefix", 64, 16, dict(threshold=0.5)),
    ("prefix", 64, 32, dict(threshold=None, steps=8)),
    ("prefix", 128, 64, dict(factor=1.0)),
    ("dual", 32, 8, dict(threshold=0.95)),
    ("dual", 64, 4, dict(threshold=0.7)),
    ("dual", 128, 32, dict(threshold=0.9)),
    ("dual", 256, 64, dict(threshold=0.9)),
    ("dual", 64, 16, dict(factor=1.0)),
    ("dual", 64, 64, dict(threshold=None, steps=16)),
    ("dual", 64, 16, dict(threshold=0.8, temperature=0.7, seed=11)),
    ("vanilla", 32, 8, dict(threshold=0.6, temperature=1.0, seed=5)),
    ("prefix", 64, 16, dict(factor=1.0, temperature=0.5, seed=2)),
    ("dual", 64, 8, dict(threshold=0.9, stop_on_eos=True)),
]


@pytest.mark.grid
@pytest.mark.parametrize(
    "policy,gen_length,block_length,extra",
    CASES,
    ids=[f"{p}-G{g}-B{b}-{'-'.join(f'{k}{v}' for k, v in e.items())}" for p, g, b, e in CASES],
)
def test_decode_matches_reference(models, policy, gen_length, block_length, extra):
    config, ref, nat = models
    g = torch.Generator().manual_seed(gen_length + block_length)
    for prompt_len in (1, 7, 13):
        prompt = torch.randint(0, config.vocab_size - 2, (prompt_len,), generator=g)
        options = DecodeOptions(policy=policy, gen_length=gen_length, block_length=block_length, **extra)
        expected = generate(
            ref,
            prompt,
            gen_length,
            block_length,
            policy,
            steps=options.steps,
            threshold=options.threshold,
            factor=options.factor,
            temperature=options.temperature,
            seed=options.seed,
            stop_on_eos=options.eos_exit,
        )
        out = run_decode(nat.obj, prompt, options)
        assert torch.equal(out.tokens, expected.tokens), (prompt_len, out.tokens, expected.tokens)
        s = out.stats
        assert (s["nfe"], s["nfe_full"], s["nfe_block"]) == (expected.nfe, expected.nfe_full, expected.nfe_block)
        assert s["committed_per_step"] == expected.committed_per_step
        if not options.eos_exit:  # (stop_on_eos fills the rest of the canvas with EOS)
            assert sum(s["committed_per_step"]) == gen_length
            assert not (out.tokens == config.mask_token_id).any()


def test_fixed_schedule_counts(models):
    config, _, nat = models
    out = run_decode(
        nat.obj,
        torch.tensor([1, 2, 3]),
        DecodeOptions(policy="vanilla", gen_length=32, block_length=8, threshold=None, steps=8),
    )
    assert out.stats["committed_per_step"] == [4] * 8
    assert out.stats["nfe"] == 8 and out.stats["nfe_full"] == 8


def test_threshold_commits_several_tokens_per_step(models):
    """The testbed is real: a peaked model makes the threshold rule commit > 1 token per forward."""
    config, _, nat = models
    out = run_decode(
        nat.obj, torch.arange(5), DecodeOptions(policy="dual", gen_length=64, block_length=32, threshold=0.5)
    )
    assert out.stats["nfe"] < 64 and max(out.stats["committed_per_step"]) > 1


def test_query_tokens_logged(models):
    config, _, nat = models
    out = run_decode(nat.obj, torch.arange(5), DecodeOptions(policy="dual", gen_length=32, block_length=8))
    L = 5 + 32
    sizes = out.stats["query_tokens_per_step"]
    assert all(q in (L, 8) for q in sizes) and sizes[0] == L
    assert sizes.count(L) == out.stats["nfe_full"] == 4


# ----------------------------------------------------------------------------- bad input


def _decode(nat, prompt, **kw):
    """Call the op directly (C++ validation), bypassing DecodeOptions' Python checks."""
    args = dict(policy="dual", gen_length=32, block_length=8, threshold=0.9)
    args.update(kw)
    return torch.ops.blockbatch.decode(nat.obj, prompt, **args)


@pytest.mark.parametrize(
    "kwargs,pattern",
    [
        (dict(gen_length=0), r"gen_length must be >= 1, got 0"),
        (dict(gen_length=2000), r"prompt length 3 \+ gen_length 2000 = 2003 exceeds max_sequence_length = 1024"),
        (dict(block_length=5), r"block_length = 5 must divide gen_length = 32"),
        (dict(block_length=64), r"block_length must be an integer in \[1, gen_length = 32\], got 64"),
        (dict(threshold=0.0), r"threshold must be in \(0, 1\], got 0"),
        (dict(threshold=1.5), r"threshold must be in \(0, 1\], got 1.5"),
        (dict(steps=-1), r"steps must be >= 0, got -1"),
        (dict(threshold=None, steps=3), r"steps must be a positive multiple of the number of blocks \(4"),
        (dict(factor=0.0), r"factor must be > 0 and finite, got 0"),
        (dict(temperature=-1.0), r"temperature must be >= 0 and finite, got -1"),
        (
            dict(policy="greedy"),
            r"policy must be one of 'vanilla', 'prefix', 'dual', 'blockbatch', 'block', 'window', 'wavefront', "
            r"got 'greedy'",
        ),
    ],
)
def test_cpp_rejects_bad_options(models, kwargs, pattern):
    _, _, nat = models
    with pytest.raises(ValueError, match=pattern):
        _decode(nat, torch.tensor([1, 2, 3]), **kwargs)


def test_cpp_rejects_bad_prompts(models):
    config, _, nat = models
    with pytest.raises(ValueError, match="prompt_ids must not be empty"):
        _decode(nat, torch.zeros(0, dtype=torch.long))
    with pytest.raises(
        ValueError,
        match=rf"prompt_ids\[1\] = {config.vocab_size} is outside the vocabulary "
        rf"\[0, {config.vocab_size}\)",
    ):
        _decode(nat, torch.tensor([1, config.vocab_size]))
    with pytest.raises(ValueError, match=rf"prompt_ids\[0\] is the mask id {config.mask_token_id}"):
        _decode(nat, torch.tensor([config.mask_token_id, 2]))
    with pytest.raises(TypeError, match="prompt_ids must be int64, got Float"):
        _decode(nat, torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match=r"prompt_ids must be 1-D \[prompt_length\], got shape \[1, 2\]"):
        _decode(nat, torch.tensor([[1, 2]]))


@pytest.mark.parametrize(
    "kwargs,pattern",
    [
        (
            dict(policy="greedy"),
            r"policy must be one of 'vanilla', 'prefix', 'dual', 'blockbatch', 'block', 'window', 'wavefront', "
            r"got 'greedy'",
        ),
        (dict(gen_length=-4), r"gen_length must be >= 1, got -4"),
        (dict(block_length=5), r"block_length = 5 must divide gen_length = 128"),
        (dict(threshold=0.0), r"threshold must be in \(0, 1\]"),
        (dict(threshold=None, steps=-2), r"steps must be >= 0, got -2"),
        (dict(threshold=None, steps=None), r"steps must be a positive multiple of the number of blocks \(4 = "),
        (dict(temperature=-0.5), r"temperature must be >= 0 and finite, got -0.5"),
        (dict(factor=-1.0), r"factor must be > 0"),
    ],
)
def test_python_options_reject_bad_values(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        DecodeOptions(**kwargs)


@pytest.mark.parametrize("policy", ["vanilla", "dual", "blockbatch"])
def test_cuda_graphs_option_is_inert_on_cpu(models, policy):
    """cuda_graphs only changes how CUDA steps are launched: on the CPU nothing changes and no
    graph is recorded (the GPU twin, tests/cuda/test_cuda.py, checks replay == eager on a device)."""
    _, _, native = models
    options = DecodeOptions(policy=policy, gen_length=32, block_length=8, block_sizes=(4, 8, 16))
    if policy == "vanilla":
        options = options.replace(threshold=None, steps=32)
    prompt = torch.tensor([3, 1, 4, 1, 5])
    on = run_decode(native.obj, prompt, options)
    off = run_decode(native.obj, prompt, options.replace(cuda_graphs=False))
    assert torch.equal(on.tokens, off.tokens)
    assert on.stats["graph_captures"] == on.stats["graph_replays"] == 0 == off.stats["graph_replays"]
    assert on.stats["committed_per_step"] == off.stats["committed_per_step"]
