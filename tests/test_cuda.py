"""CUDA kernels and decode on GPU vs the CPU path (skipped cleanly without a GPU)."""

import pytest
import torch

import blockbatch.native  # noqa: F401
from blockbatch.native import NativeModel
from blockbatch.options import DecodeOptions, run_decode
from blockbatch.reference import model as ref
from blockbatch.testing import random_config, random_weights

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
ops = torch.ops.blockbatch
DTYPES = [torch.float32, torch.bfloat16]


def _pytorch_error(fn, args32, dtype):
    """PyTorch's own error at `dtype` on the same computation (the FlashAttention test rule)."""
    exact = fn(*args32)
    low = fn(*[a.to(dtype) if torch.is_floating_point(a) else a for a in args32])
    return (low.float() - exact.float()).abs().max().item()


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_silu_cuda(dtype):
    x = torch.randn(37, 256, device="cuda")
    w = 1 + 0.1 * torch.randn(256, device="cuda")
    cpu = ops.rms_norm(x.cpu().to(dtype), w.cpu().to(dtype), 1e-5)
    gpu = ops.rms_norm(x.to(dtype), w.to(dtype), 1e-5)
    tol = 1e-4 if dtype == torch.float32 else 2 * _pytorch_error(lambda a, b: ref.rms_norm(a, b, 1e-5), (x, w), dtype) + 1e-2
    assert (gpu.cpu().float() - cpu.float()).abs().max() <= tol
    gu = torch.randn(19, 512, device="cuda")
    torch.testing.assert_close(ops.silu_mul(gu.to(dtype)).cpu().float(), ops.silu_mul(gu.cpu().to(dtype)).float(),
                               atol=1e-4 if dtype == torch.float32 else 3e-2, rtol=1e-4 if dtype == torch.float32 else 3e-2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,hd", [(8, 8, 64), (8, 2, 128)])
def test_packed_attention_cuda(dtype, heads, kv_heads, hd):
    lengths, L = [4, 8, 16, 32, 64, 128], 300
    T = sum(lengths)
    q = torch.randn(T, heads, hd, device="cuda")
    k = torch.randn(T, kv_heads, hd, device="cuda")
    v = torch.randn(T, kv_heads, hd, device="cuda")
    kv = torch.randn(6, 2, 2, kv_heads, L, hd, device="cuda")
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), device="cuda")
    rows = torch.tensor([5, 4, 3, 2, 1, 0], device="cuda")
    for cache, fresh in [(torch.full((6,), L, device="cuda"), False), (torch.tensor([0, 5, 17, 100, 299, 300], device="cuda"), True)]:
        args = [t.to(dtype) for t in (q, k, v)]
        out = ops.packed_attention(*args, cu, kv.to(dtype), rows, cache, 1, fresh)
        expected = ops.packed_attention(*[t.cpu() for t in args], cu.cpu(), kv.to(dtype).cpu(), rows.cpu(),
                                        cache.cpu(), 1, fresh)
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(out.cpu().float(), expected.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_confidence_and_sparse_probs_cuda(dtype):
    logits = (4 * torch.randn(33, 5000, device="cuda")).to(dtype)
    a_gpu, c_gpu = ops.confidence(logits, 7)
    a_cpu, c_cpu = ops.confidence(logits.cpu(), 7)
    assert torch.equal(a_gpu.cpu(), a_cpu)
    torch.testing.assert_close(c_gpu.cpu(), c_cpu, atol=1e-9, rtol=1e-7)
    ids_g, p_g = ops.sparse_probs(logits, 0.1, 11)
    ids_c, p_c = ops.sparse_probs(logits.cpu(), 0.1, 11)
    for r in range(33):  # same set of (token, prob) per row; order on GPU is unspecified
        g = sorted((int(i), float(p)) for i, p in zip(ids_g[r].cpu(), p_g[r].cpu()) if i >= 0)
        c = sorted((int(i), float(p)) for i, p in zip(ids_c[r], p_c[r]) if i >= 0)
        assert [i for i, _ in g] == [i for i, _ in c]


@pytest.mark.parametrize("policy", ["vanilla", "prefix", "dual", "blockbatch"])
def test_decode_on_gpu_float32_equals_cpu(policy):
    config = random_config(d_model=128, n_heads=4, n_kv_heads=2, mlp_hidden_size=256, vocab_size=64)
    weights = random_weights(config, seed=4, logit_scale=6.0)
    cpu = NativeModel(config, weights)
    gpu = NativeModel(config, weights, device="cuda")
    options = DecodeOptions(policy=policy, gen_length=64, block_length=16)
    if policy == "vanilla":
        options = options.replace(threshold=None, steps=64)
    prompt = torch.tensor([3, 1, 4, 1, 5, 9, 2])
    a = run_decode(cpu.obj, prompt, options)
    b = run_decode(gpu.obj, prompt.cuda(), options)
    agree = (a.tokens == b.tokens).float().mean().item()
    assert agree == 1.0, f"float32 GPU/CPU token agreement {agree:.3f}"
