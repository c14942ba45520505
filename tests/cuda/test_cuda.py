"""CUDA kernels and decode on GPU vs the CPU path (skipped cleanly without a GPU)."""

import pytest
import torch

import blockbatch.native  # noqa: F401
from blockbatch import settings
from blockbatch.native import NativeModel
from blockbatch.decoding import run_decode
from blockbatch.options import DecodeOptions
from blockbatch.reference import model as ref
from blockbatch.random_checkpoint import random_config, random_weights
from helpers.random_branch_state import coordinate_args, random_branch_state
from helpers.op_cases import absorb_case, commit_case, rope_kv_case, rope_table

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
ops = torch.ops.blockbatch
DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(params=[settings.param("BLOCKBATCH_ATTN_KERNEL", k) for k in ("sync", "pipelined", "pipelined3")])
def attn_kernel(request, monkeypatch):
    """Run the test with each tensor-core attention kernel (BLOCKBATCH_ATTN_KERNEL)."""
    monkeypatch.setenv("BLOCKBATCH_ATTN_KERNEL", request.param)
    return request.param


def _pytorch_error(fn, args32, dtype):
    """PyTorch's own error at `dtype` on the same computation (the FlashAttention test rule)."""
    exact = fn(*args32)
    low = fn(*[a.to(dtype) if torch.is_floating_point(a) else a for a in args32])
    return (low.float() - exact.float()).abs().max().item()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim,m", [(256, 256), (4096, 12288), (100, 12)])  # 16-byte chunks / scalar kernels
def test_rms_norm_silu_cuda(dtype, dim, m):
    x = torch.randn(37, dim, device="cuda")
    w = 1 + 0.1 * torch.randn(dim, device="cuda")
    cpu = ops.rms_norm(x.cpu().to(dtype), w.cpu().to(dtype), 1e-5)
    gpu = ops.rms_norm(x.to(dtype), w.to(dtype), 1e-5)
    tol = (
        1e-4
        if dtype == torch.float32
        else 2 * _pytorch_error(lambda a, b: ref.rms_norm(a, b, 1e-5), (x, w), dtype) + 1e-2
    )
    assert (gpu.cpu().float() - cpu.float()).abs().max() <= tol
    strided = torch.randn(5, dim + 8, device="cuda").to(dtype)[:, :dim]  # rows 16-byte aligned, stride != dim
    torch.testing.assert_close(
        ops.rms_norm(strided, w.to(dtype), 1e-5).cpu().float(),
        ops.rms_norm(strided.cpu(), w.cpu().to(dtype), 1e-5).float(),
        atol=tol,
        rtol=0,
    )
    gu = torch.randn(19, 2 * m, device="cuda")
    torch.testing.assert_close(
        ops.silu_mul(gu.to(dtype)).cpu().float(),
        ops.silu_mul(gu.cpu().to(dtype)).float(),
        atol=1e-4 if dtype == torch.float32 else 3e-2,
        rtol=1e-4 if dtype == torch.float32 else 3e-2,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dim", [4096, 256, 100])  # 16-byte chunks (2 or 1 per thread) / scalar kernel
def test_add_rms_norm_cuda(dtype, dim):
    """Fused residual add + RMSNorm on the GPU == add_ then rms_norm on the GPU, bit for bit (x
    and the output), and == the CPU op within the rms_norm tolerance."""
    x = torch.randn(37, dim, device="cuda").to(dtype)
    delta = torch.randn(37, dim, device="cuda").to(dtype)
    w = (1 + 0.1 * torch.randn(dim, device="cuda")).to(dtype)
    x_cpu = x.clone().cpu()  # a copy also where "cuda" is the CPU (dry runs)
    expected_x = x.clone().add_(delta)
    expected = ops.rms_norm(expected_x, w, 1e-5)
    out = ops.add_rms_norm_(x, delta, w, 1e-5)
    assert torch.equal(x, expected_x) and torch.equal(out, expected)
    out_cpu = ops.add_rms_norm_(x_cpu, delta.cpu(), w.cpu(), 1e-5)
    assert torch.equal(x.cpu(), x_cpu)  # the add itself rounds the same on both
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.cpu().float(), out_cpu.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hd", [16, 128, 12])  # 16-byte accesses for 16 and 128; 12 falls back to pairs
@pytest.mark.parametrize("rope_kernel", [settings.param("BLOCKBATCH_ROPE_KERNEL", k) for k in ("scalar", "vec")])
def test_rope_kv_write_cuda(dtype, hd, rope_kernel, monkeypatch):
    """The fused RoPE + KV-slot write (each kernel: BLOCKBATCH_ROPE_KERNEL) == rope_ + kv_write_ on
    the GPU (bit for bit) and == the CPU ops (float32 bitwise: same operation order, no FMA
    contraction; bf16 within one ulp)."""
    monkeypatch.setenv("BLOCKBATCH_ROPE_KERNEL", rope_kernel)
    table = rope_table(32, hd, 1e4)
    results = []
    for device, fused in (("cuda", True), ("cuda", False), ("cpu", True)):
        qkv, q, k, v, kv, (pos, cu, rows) = rope_kv_case(device, dtype, hd=hd)
        t = table.to(device)
        if fused:
            ops.rope_kv_write_(q, k, v, pos, t, kv, cu, rows, 1)
        else:
            ops.rope_(q, pos, t)
            ops.rope_(k, pos, t)
            ops.kv_write_(kv, k, v, pos, cu, rows, 1)
        results.append((qkv.cpu(), kv.cpu()))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
    tol = 0 if dtype == torch.float32 else 1e-2
    for a, b in zip(results[0], results[2]):
        assert (a.float() - b.float()).abs().max().item() <= tol * b.float().abs().max().item()


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
    for cache, fresh in [
        (torch.full((6,), L, device="cuda"), False),
        (torch.tensor([0, 5, 17, 100, 299, 300], device="cuda"), True),
    ]:
        args = [t.to(dtype) for t in (q, k, v)]
        out = ops.packed_attention(*args, cu, kv.to(dtype), rows, cache, 1, fresh)
        expected = ops.packed_attention(
            *[t.cpu() for t in args], cu.cpu(), kv.to(dtype).cpu(), rows.cpu(), cache.cpu(), 1, fresh
        )
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(out.cpu().float(), expected.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [5000, 4999])  # rows read in 16-byte chunks / element by element
def test_confidence_and_sparse_probs_cuda(dtype, vocab):
    logits = (4 * torch.randn(33, vocab, device="cuda")).to(dtype)
    logits[3, 10] = logits[3, 2000] = logits[3].max() + 1  # a tie: the lower id wins
    a_gpu, c_gpu = ops.confidence(logits, 7)
    a_cpu, c_cpu = ops.confidence(logits.cpu(), 7)
    assert torch.equal(a_gpu.cpu(), a_cpu) and a_cpu[3].item() == 10
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
    options = DecodeOptions(policy=policy, gen_length=64, block_length=16, block_sizes=(4, 8, 16, 32))
    if policy == "vanilla":
        options = options.replace(threshold=None, steps=64)
    if policy == "blockbatch":  # at 0.9 this model finishes in init + refresh; 0.99 takes 11 block steps
        options = options.replace(threshold=0.99)
    prompt = torch.tensor([3, 1, 4, 1, 5, 9, 2])
    a = run_decode(cpu.obj, prompt, options)
    b = run_decode(gpu.obj, prompt.cuda(), options)
    agree = (a.tokens == b.tokens).float().mean().item()
    assert agree == 1.0, f"float32 GPU/CPU token agreement {agree:.3f}"


def _sdpa_rows(q, k, v, cu, kv, rows, cache_lens, layer, fresh):
    """The same packed attention in plain PyTorch (SDPA per row, GQA by repeating KV heads)."""
    outs = []
    heads, kv_heads = q.shape[1], k.shape[1]
    for r in range(len(cu) - 1):
        s, e = int(cu[r]), int(cu[r + 1])
        keys, values = [], []
        n = int(cache_lens[r])
        if n:
            keys.append(kv[int(rows[r]), layer, 0, :, :n].transpose(0, 1))
            values.append(kv[int(rows[r]), layer, 1, :, :n].transpose(0, 1))
        if fresh:
            keys.append(k[s:e])
            values.append(v[s:e])
        kk = torch.cat(keys).transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
        vv = torch.cat(values).transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
        o = torch.nn.functional.scaled_dot_product_attention(q[s:e].transpose(0, 1), kk, vv)
        outs.append(o.transpose(0, 1).reshape(e - s, -1))
    return torch.cat(outs)


def _attention_inputs(lengths, heads, kv_heads, hd, L, layers, dtype):
    """Random packed q, k, v [T, heads | kv_heads, hd], per-row KV buffers [rows, layers, 2,
    kv_heads, L, hd] (all in `dtype`, on the GPU) and cu_seqlens for rows of `lengths` queries."""
    T = sum(lengths)
    q = torch.randn(T, heads, hd, device="cuda").to(dtype)
    k = torch.randn(T, kv_heads, hd, device="cuda").to(dtype)
    v = torch.randn(T, kv_heads, hd, device="cuda").to(dtype)
    kv = torch.randn(len(lengths), layers, 2, kv_heads, L, hd, device="cuda").to(dtype)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), device="cuda")
    return q, k, v, kv, cu


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads,kv_heads,hd", [(8, 8, 64), (8, 2, 128), (4, 1, 64)])
def test_tensor_core_attention_error_within_2x_pytorch(dtype, heads, kv_heads, hd, attn_kernel):
    """bf16 / fp16 attention (tensor-core kernel for head_dim 64 / 128) against the float32 result
    on the same rounded inputs: no worse than 2x PyTorch's own SDPA error at that dtype."""
    torch.manual_seed(0)
    lengths, L = [1, 7, 64, 65, 130, 200], 333
    q, k, v, kv, cu = _attention_inputs(lengths, heads, kv_heads, hd, L, 2, dtype)
    rows = torch.tensor([2, 0, 5, 1, 4, 3], device="cuda")
    for cache, fresh in [
        (torch.full((6,), L, device="cuda"), False),
        (torch.tensor([0, 5, 64, 100, 299, 333], device="cuda"), True),
    ]:
        exact = _sdpa_rows(q.float(), k.float(), v.float(), cu, kv.float(), rows, cache, 1, fresh)
        torch_err = (_sdpa_rows(q, k, v, cu, kv, rows, cache, 1, fresh).float() - exact).abs().max().item()
        ours = ops.packed_attention(q, k, v, cu, kv, rows, cache, 1, fresh)
        our_err = (ours.float() - exact).abs().max().item()
        assert torch_err > 0
        assert our_err <= 2 * torch_err, f"ours {our_err:.3g} vs PyTorch {torch_err:.3g} (cache={cache.tolist()})"


@pytest.mark.parametrize("hd", [64, 128])
def test_split_key_attention_on_long_rows(hd, attn_kernel, monkeypatch):
    """Few queries over long KV rows (the Fast-dLLM 32-token step at L = 2048): the tensor-core
    kernel splits each row's keys over up to 16 blocks and merges them; same 2x-PyTorch rule,
    with rows whose cache is shorter than a split (empty splits) and rows of one query."""
    torch.manual_seed(1)
    dtype, heads, kv_heads, L = torch.bfloat16, 8, 4, 2048
    for lengths, cache_list, fresh in (([32], [L], False), ([3, 32, 1], [2048, 70, 0], True), ([16], [130], True)):
        q, k, v, kv, cu = _attention_inputs(lengths, heads, kv_heads, hd, L, 1, dtype)
        rows = torch.arange(len(lengths), device="cuda").flip(0)
        cache = torch.tensor(cache_list, device="cuda")
        exact = _sdpa_rows(q.float(), k.float(), v.float(), cu, kv.float(), rows, cache, 0, fresh)
        torch_err = (_sdpa_rows(q, k, v, cu, kv, rows, cache, 0, fresh).float() - exact).abs().max().item()
        ours = ops.packed_attention(q, k, v, cu, kv, rows, cache, 0, fresh)
        our_err = (ours.float() - exact).abs().max().item()
        assert torch_err > 0 and our_err <= 2 * torch_err, f"{lengths} {cache_list}: {our_err:.3g} vs {torch_err:.3g}"
        for forced in ("1", "3", "16"):  # any split count gives the same attention up to rounding
            monkeypatch.setenv("BLOCKBATCH_ATTN_SPLITS", forced)
            other = ops.packed_attention(q, k, v, cu, kv, rows, cache, 0, fresh)
            assert ((other.float() - exact).abs().max().item()) <= 2 * torch_err, f"splits {forced}"
        monkeypatch.delenv("BLOCKBATCH_ATTN_SPLITS")  # the next case's first call: the automatic count


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize(
    "pipelined", [settings.param("BLOCKBATCH_ATTN_KERNEL", k) for k in ("pipelined", "pipelined3")]
)
def test_pipelined_attention_equals_sync_bit_for_bit(dtype, hd, pipelined, monkeypatch):
    """The cp.async / ldmatrix kernels (2 and 3 stages) do the same arithmetic in the same order as
    the staged one: equal bits on random rows (cache only, cache + fresh, fresh only, empty and
    one-query rows), with and without key splits; every output element written (NaN poison)."""
    torch.manual_seed(2)
    heads, kv_heads, L = 8, 4, 700
    lengths = [0, 1, 5, 64, 65, 130, 31]
    T = sum(lengths)
    q, k, v, kv, cu = _attention_inputs(lengths, heads, kv_heads, hd, L, 2, dtype)
    rows = torch.randperm(len(lengths), device="cuda")
    cases = [
        (torch.full((len(lengths),), L, device="cuda"), False),
        (torch.tensor([0, 700, 63, 64, 1, 333, 129], device="cuda"), True),
        (torch.zeros(len(lengths), dtype=torch.long, device="cuda"), True),
    ]
    for cache, fresh in cases:
        for splits in ("", "1", "4", "16"):
            outs = {}
            for kernel in ("sync", pipelined):
                monkeypatch.setenv("BLOCKBATCH_ATTN_KERNEL", kernel)
                monkeypatch.setenv("BLOCKBATCH_ATTN_SPLITS", splits)
                poison = torch.full((T, heads * hd), float("nan"), device="cuda", dtype=dtype)
                del poison  # the caching allocator hands this NaN block to the output below
                outs[kernel] = ops.packed_attention(q, k, v, cu, kv, rows, cache, 1, fresh)
            assert not outs[pipelined].isnan().any()
            assert torch.equal(outs["sync"], outs[pipelined]), f"cache={cache.tolist()} fresh={fresh} splits={splits!r}"


@settings.candidate_mark("BLOCKBATCH_ROPE_KERNEL")
def test_rope_kernel_variable_is_checked(monkeypatch):
    monkeypatch.setenv("BLOCKBATCH_ROPE_KERNEL", "fast")
    qkv, q, k, v, kv, (pos, cu, rows) = rope_kv_case("cuda", torch.bfloat16)
    with pytest.raises(ValueError, match="BLOCKBATCH_ROPE_KERNEL must be 'scalar' or 'vec', got 'fast'"):
        ops.rope_kv_write_(q, k, v, pos, rope_table(32, 16, 1e4).cuda(), kv, cu, rows, 1)


def test_attention_kernel_variable_is_checked(monkeypatch):
    monkeypatch.setenv("BLOCKBATCH_ATTN_KERNEL", "fast")
    q = torch.randn(4, 2, 64, device="cuda", dtype=torch.bfloat16)
    cu = torch.tensor([0, 4], device="cuda")
    with pytest.raises(
        ValueError, match="BLOCKBATCH_ATTN_KERNEL must be 'sync', 'pipelined' or 'pipelined3', got 'fast'"
    ):
        ops.packed_attention(q, q, q, cu, None, None, None, 0, True)
    monkeypatch.delenv("BLOCKBATCH_ATTN_KERNEL")
    monkeypatch.setenv("BLOCKBATCH_ATTN_SPLITS", "0")
    with pytest.raises(ValueError, match=r"BLOCKBATCH_ATTN_SPLITS must be an integer in \[1, 16\], got '0'"):
        ops.packed_attention(q, q, q, cu, None, None, None, 0, True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("policy", ["vanilla", "prefix", "dual", "blockbatch"])
def test_cuda_graph_replay_equals_eager(policy, dtype):
    """Decoding with recorded CUDA graphs gives the same tokens and counters as eager decoding."""
    config = random_config(d_model=128, n_heads=4, n_kv_heads=2, mlp_hidden_size=256, vocab_size=64)
    weights = random_weights(config, seed=4, logit_scale=6.0)
    gpu = NativeModel(config, weights, dtype=dtype, device="cuda")
    options = DecodeOptions(policy=policy, gen_length=64, block_length=16, block_sizes=(4, 8, 16, 32))
    if policy == "vanilla":
        options = options.replace(threshold=None, steps=64)
    if policy == "blockbatch":  # block steps over one branch set repeat (at 0.9: init + refresh only)
        options = options.replace(threshold=0.99)
    prompt = torch.tensor([3, 1, 4, 1, 5, 9, 2], device="cuda")
    eager = run_decode(gpu.obj, prompt, options.replace(cuda_graphs=False))
    graph = run_decode(gpu.obj, prompt, options.replace(cuda_graphs=True))
    assert torch.equal(eager.tokens, graph.tokens)
    skip = {"wall_ms", "graph_captures", "graph_replays"}
    assert {k: v for k, v in eager.stats.items() if k not in skip} == {
        k: v for k, v in graph.stats.items() if k not in skip
    }
    assert (
        eager.stats["graph_replays"] == 0 and graph.stats["graph_captures"] >= 1 and graph.stats["graph_replays"] >= 1
    )


@pytest.mark.parametrize("policy", ["vanilla", "prefix", "dual", "blockbatch"])
def test_vector_rope_changes_no_bits(policy, monkeypatch):
    """The 16-byte rope_kv_write (BLOCKBATCH_ROPE_KERNEL=vec, the default) does the pair kernel's
    (scalar) arithmetic: decoding with either gives the same tokens and counters exactly, eager
    and graph-replayed, in float32 and bf16."""
    config = random_config(d_model=128, n_heads=4, n_kv_heads=2, mlp_hidden_size=256, vocab_size=64)
    weights = random_weights(config, seed=4, logit_scale=6.0)
    prompt = torch.tensor([3, 1, 4, 1, 5, 9, 2], device="cuda")
    options = DecodeOptions(policy=policy, gen_length=64, block_length=16, block_sizes=(4, 8, 16, 32), threshold=0.99)
    if policy == "vanilla":
        options = options.replace(threshold=None, steps=64)
    skip = {"wall_ms", "graph_captures", "graph_replays"}
    for dtype in (torch.float32, torch.bfloat16):
        gpu = NativeModel(config, weights, dtype=dtype, device="cuda")
        for graphs in (False, True):
            opts = options.replace(cuda_graphs=graphs)
            monkeypatch.setenv("BLOCKBATCH_ROPE_KERNEL", "scalar")
            base = run_decode(gpu.obj, prompt, opts)
            monkeypatch.delenv("BLOCKBATCH_ROPE_KERNEL")
            out = run_decode(gpu.obj, prompt, opts)
            label = f"{dtype} graphs={graphs}"
            assert torch.equal(out.tokens, base.tokens), label
            assert {k: v for k, v in out.stats.items() if k not in skip} == {
                k: v for k, v in base.stats.items() if k not in skip
            }, label


def test_decode_reads_back_once_per_step_on_gpu():
    """Each forward of a decode makes one device->host copy (the step's counts / BlockBatch's state
    table), plus the final canvas row; BlockBatch may also coordinate once without a forward after
    a refresh that completed every window. Counted with the CUDA profiler."""
    from torch.profiler import ProfilerActivity, profile

    config = random_config(d_model=128, n_heads=4, n_kv_heads=2, mlp_hidden_size=256, vocab_size=64)
    gpu = NativeModel(config, random_weights(config, seed=4, logit_scale=6.0), device="cuda")
    prompt = torch.tensor([3, 1, 4, 1, 5, 9, 2])
    for policy in ("dual", "blockbatch"):
        options = DecodeOptions(
            policy=policy, gen_length=64, block_length=16, block_sizes=(4, 8, 16, 32), stop_on_eos=False, threshold=0.99
        )
        run_decode(gpu.obj, prompt, options)  # warm-up
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            out = run_decode(gpu.obj, prompt, options)
        names = [e.name for e in prof.events()]
        d2h = sum("DtoH" in n for n in names)
        forwards = out.stats["nfe"]
        bound = forwards + 1 + (out.stats["nfe_refresh"] if policy == "blockbatch" else 0)
        # at least one per forward plus the final canvas (a profile that missed the copies fails)
        assert forwards + 1 <= d2h <= bound, f"{policy}: {d2h} device-to-host copies for {forwards} forwards"


@pytest.mark.parametrize("rule", ["threshold", "fixed", "factor"])
def test_commit_cuda_equals_cpu(rule):
    g = torch.Generator().manual_seed(1)
    for n in (1, 5, 32, 33, 300, 4096):
        canvas, window, token, conf, k = commit_case(g, n)
        cpu, gpu = canvas.clone(), canvas.cuda()
        a = ops.commit_(cpu, window, token, conf, k, 9, 0, rule, 0.8, 1.0)
        b = ops.commit_(gpu, window.cuda(), token.cuda(), conf.cuda(), k.cuda(), 9, 0, rule, 0.8, 1.0)
        assert torch.equal(gpu.cpu(), cpu) and b.cpu().tolist() == a.tolist(), f"n={n}"


def _to(s, device):
    return {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in s.items()}


def test_coordinate_cuda_equals_cpu():
    """bb_coordinate_ (one thread block) == the CPU loops on random mid-decode states, for every
    output: canvases, state table, flags, sync sources; then kv_copy_rows_ on both."""
    for seed in range(60):
        for kwargs in ({}, {"merge_gate": 0.7, "sync_gap": 4}, {"periodic_refresh": False}):
            cpu = random_branch_state(seed, gen_length=256 if seed % 5 == 0 else 64)
            gpu = _to(cpu, "cuda")
            ops.bb_coordinate_(*coordinate_args(cpu, **kwargs))
            ops.bb_coordinate_(*coordinate_args(gpu, **kwargs))
            for k in ("canvas", "state", "flags", "sync_src"):
                assert torch.equal(gpu[k].cpu(), cpu[k]), f"seed {seed} {kwargs}: {k}"
            kv = torch.randn(4, 2, 3, 67 if seed % 5 else 259, 8)
            kv_gpu = kv.cuda()
            ops.kv_copy_rows_(kv, cpu["sync_src"])
            ops.kv_copy_rows_(kv_gpu, gpu["sync_src"])
            assert torch.equal(kv_gpu.cpu(), kv)


@pytest.mark.parametrize("dtype", DTYPES)
def test_absorb_cuda_equals_cpu(dtype):
    """bb_absorb_ (one block per span) == the CPU loops: map rows, commits, counters, EOS
    readiness (its float64 softmax probability within 1e-12)."""
    eos = 7
    for seed in range(40):
        case = absorb_case(seed, dtype, eos)
        if case is None:
            continue
        cpu, spans, logits, token, conf, ids, probs = case
        gpu = _to(cpu, "cuda")
        for s, dev in ((cpu, "cpu"), (gpu, "cuda")):
            ops.bb_absorb_(
                s["canvas"],
                s["state"],
                s["eos_prob"],
                s["map_ids"],
                s["map_probs"],
                torch.tensor(spans, device=dev),
                token.to(dev),
                conf.to(dev),
                ids.to(dev),
                probs.to(dev),
                logits.to(dev),
                s["prompt_len"],
                s["mask_id"],
                eos,
                0.8,
                True,
            )
        for k in ("canvas", "state", "map_ids", "map_probs"):
            assert torch.equal(gpu[k].cpu(), cpu[k]), f"seed {seed}: {k}"
        assert torch.allclose(gpu["eos_prob"].cpu(), cpu["eos_prob"], rtol=1e-12, atol=0)


def _dream_models(dtype=torch.float32):
    """A random Dream model (GQA 4:2 heads, q/k/v biases) on the CPU and the GPU."""
    from blockbatch.random_checkpoint import random_config, random_weights

    config = random_config("dream", d_model=128, n_heads=4, n_kv_heads=2, mlp_hidden_size=256, vocab_size=64)
    weights = random_weights(config, seed=4, logit_scale=5.0)
    return NativeModel(config, weights), NativeModel(config, weights, dtype=dtype, device="cuda")


def _dream_options(policy):
    if policy == "vanilla":
        return DecodeOptions(policy="vanilla", gen_length=64, steps=32)
    if policy == "blockbatch":
        return DecodeOptions(policy="blockbatch", gen_length=64, block_sizes=(4, 8, 16, 32), threshold=0.95)
    return DecodeOptions(policy=policy, gen_length=64, block_length=16)


@pytest.mark.parametrize("policy", ["vanilla", "prefix", "dual", "blockbatch"])
def test_dream_decode_on_gpu_float32_equals_cpu(policy):
    cpu, gpu = _dream_models()
    prompt = torch.tensor([3, 1, 4, 1, 5, 9, 2])
    a = run_decode(cpu.obj, prompt, _dream_options(policy))
    b = run_decode(gpu.obj, prompt.cuda(), _dream_options(policy))
    agree = (a.tokens == b.tokens).float().mean().item()
    assert agree == 1.0, f"Dream {policy}: float32 GPU/CPU token agreement {agree:.3f}"
    assert a.stats["nfe"] == b.stats["nfe"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("policy", ["prefix", "dual", "blockbatch"])
def test_dream_cuda_graph_replay_equals_eager(policy, dtype):
    """Dream decodes with recorded CUDA graphs (repeated window shapes) equal eager decodes."""
    _, gpu = _dream_models(dtype)
    prompt = torch.tensor([3, 1, 4, 1, 5, 9, 2], device="cuda")
    options = _dream_options(policy)
    eager = run_decode(gpu.obj, prompt, options.replace(cuda_graphs=False))
    graph = run_decode(gpu.obj, prompt, options.replace(cuda_graphs=True))
    assert torch.equal(eager.tokens, graph.tokens)
    skip = {"wall_ms", "graph_captures", "graph_replays"}
    assert {k: v for k, v in eager.stats.items() if k not in skip} == {
        k: v for k, v in graph.stats.items() if k not in skip
    }
    assert graph.stats["graph_replays"] >= 1


MOE_KERNELS = [settings.param("BLOCKBATCH_MOE_KERNEL", k) for k in ("grouped", "fused")]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("moe_kernel", MOE_KERNELS)
@pytest.mark.parametrize("tokens,slots,experts,d,m", [(7, 2, 8, 64, 40), (300, 8, 16, 256, 96), (5, 3, 4, 36, 20)])
def test_moe_experts_cuda(dtype, moe_kernel, tokens, slots, experts, d, m, monkeypatch):
    """moe_experts on CUDA (grouped GEMMs, or the fused kernels) == the CPU op: float32 within 1e-4,
    bf16 within 2e-2; the output buffer poisoned with NaN first."""
    monkeypatch.setenv("BLOCKBATCH_MOE_KERNEL", moe_kernel)
    g = torch.Generator().manual_seed(tokens + d)
    x = torch.randn(tokens, d, generator=g).to(dtype)
    gate_up = (torch.randn(experts, 2 * m, d, generator=g) / d**0.5).to(dtype)
    down = (torch.randn(experts, d, m, generator=g) / m**0.5).to(dtype)
    chosen = torch.stack([torch.randperm(experts, generator=g)[:slots] for _ in range(tokens)])
    weights = torch.rand(tokens, slots, generator=g)
    expected = ops.moe_experts(x, chosen, weights, gate_up, down)
    poison = torch.full((tokens, d), float("nan"), device="cuda", dtype=dtype)
    del poison  # the caching allocator hands this NaN block to the output below
    args = [t.cuda() for t in (x, chosen, weights, gate_up, down)]
    out = ops.moe_experts(*args)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.cpu().float(), expected.float(), atol=tol, rtol=tol)
    # A token's output does not depend on the others sharing the call (one token alone, bit for bit).
    alone = ops.moe_experts(args[0][3:4], args[1][3:4], args[2][3:4], args[3], args[4])
    if moe_kernel == "fused":
        assert torch.equal(alone, out[3:4])


@settings.candidate_mark("BLOCKBATCH_MOE_KERNEL")
def test_moe_kernel_variable_is_checked(monkeypatch):
    monkeypatch.setenv("BLOCKBATCH_MOE_KERNEL", "fast")
    x = torch.randn(2, 8, device="cuda")
    with pytest.raises(ValueError, match="BLOCKBATCH_MOE_KERNEL must be 'grouped' or 'fused', got 'fast'"):
        ops.moe_experts(
            x,
            torch.zeros(2, 1, dtype=torch.long, device="cuda"),
            torch.ones(2, 1, device="cuda"),
            torch.randn(1, 4, 8, device="cuda"),
            torch.randn(1, 8, 2, device="cuda"),
        )


def _llada2_models(dtype=torch.float32):
    from blockbatch.random_checkpoint import random_config as family_config

    config = family_config(
        "llada2", d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, num_experts=8, expert_groups=4, expert_groups_kept=2
    )
    weights = random_weights(config, seed=5, logit_scale=6.0)
    return NativeModel(config, weights), NativeModel(config, weights, dtype=dtype, device="cuda")


def _llada2_options(edit: bool):
    options = DecodeOptions(policy="block", gen_length=48, block_length=16, threshold=0.9)
    return options.replace(edit_threshold=0.5, max_post_steps=4) if edit else options


@pytest.mark.parametrize("moe_kernel", MOE_KERNELS)
@pytest.mark.parametrize("edit", [False, True])
def test_llada2_cuda_decode_float32_equals_cpu(moe_kernel, edit, monkeypatch):
    """LLaDA2 (MoE layers, block policy with and without editing) on the GPU in float32 == the CPU."""
    monkeypatch.setenv("BLOCKBATCH_MOE_KERNEL", moe_kernel)
    cpu, gpu = _llada2_models()
    prompt = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6, 5, 3])
    a = run_decode(cpu.obj, prompt, _llada2_options(edit))
    b = run_decode(gpu.obj, prompt.cuda(), _llada2_options(edit))
    assert torch.equal(a.tokens, b.tokens.cpu())
    assert (a.stats["nfe"], a.stats["edits"]) == (b.stats["nfe"], b.stats["edits"])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("moe_kernel", MOE_KERNELS)
def test_llada2_cuda_graph_replay_equals_eager(dtype, moe_kernel, monkeypatch):
    """With the fused MoE kernels a LLaDA2 step is recorded in a CUDA graph (same tokens and counters
    as eager); with the grouped experts (the choices read on the host) none is recorded."""
    monkeypatch.setenv("BLOCKBATCH_MOE_KERNEL", moe_kernel)
    _, gpu = _llada2_models(dtype)
    prompt = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6, 5, 3], device="cuda")
    options = _llada2_options(False)
    eager = run_decode(gpu.obj, prompt, options.replace(cuda_graphs=False))
    graph = run_decode(gpu.obj, prompt, options.replace(cuda_graphs=True))
    assert torch.equal(eager.tokens, graph.tokens)
    skip = {"wall_ms", "graph_captures", "graph_replays"}
    assert {k: v for k, v in eager.stats.items() if k not in skip} == {
        k: v for k, v in graph.stats.items() if k not in skip
    }
    if moe_kernel == "fused":
        assert graph.stats["graph_captures"] >= 1 and graph.stats["graph_replays"] >= 1
    else:
        assert graph.stats["graph_captures"] == 0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_len", [16, 5])
def test_paged_kv_equals_dense_cuda(dtype, page_len, attn_kernel):
    """Every KV kernel through a page table (shuffled pages) == itself on the dense buffer holding
    the same K/V, bit for bit: attention (each tensor-core variant; float32: the reference kernel),
    the fused RoPE + KV write, the KV write and the row copy (ALGORITHMS.md 12.1)."""
    from helpers.pages import from_pages, to_pages

    g = torch.Generator().manual_seed(page_len)
    heads, kv_heads, hd, L = 8, 2, 128, 300
    lengths = [4, 8, 16, 32, 64, 128]
    T = sum(lengths)
    q, k, v = (torch.randn(T, h, hd, generator=g).to(dtype) for h in (heads, kv_heads, kv_heads))
    dense = torch.randn(6, 2, 2, kv_heads, L, hd, generator=g).to(dtype)
    store, table = to_pages(dense, page_len, g)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)))
    rows = torch.tensor([5, 4, 3, 2, 1, 0])
    c = lambda t: t.cuda()  # noqa: E731
    for cache, fresh in [(torch.full((6,), L), False), (torch.tensor([0, 5, 17, 100, 299, 300]), True)]:
        want = ops.packed_attention(c(q), c(k), c(v), c(cu), c(dense), c(rows), c(cache), 1, fresh)
        got = ops.packed_attention(c(q), c(k), c(v), c(cu), c(store), c(rows), c(cache), 1, fresh, c(table))
        assert torch.equal(got, want), cache.tolist()
    pos = torch.cat([torch.randperm(L, generator=g)[:n] for n in lengths])
    t = rope_table(L, hd, 1e4).cuda()
    d, s = c(dense), c(store)
    q1, k1, q2, k2 = c(q), c(k), c(q), c(k)
    ops.rope_kv_write_(q1, k1, c(v), c(pos), t, d, c(cu), c(rows), 1)
    ops.rope_kv_write_(q2, k2, c(v), c(pos), t, s, c(cu), c(rows), 1, c(table))
    assert torch.equal(q1, q2) and torch.equal(k1, k2)
    assert torch.equal(from_pages(s.cpu(), table, L), d.cpu())
    ops.kv_write_(d, c(k), c(v), c(pos), c(cu), c(rows), 0)
    ops.kv_write_(s, c(k), c(v), c(pos), c(cu), c(rows), 0, c(table))
    src = torch.tensor([-1, 3, 0, -1, 5, -1])
    ops.kv_copy_rows_(d, c(src))
    ops.kv_copy_rows_(s, c(src), c(table))
    assert torch.equal(from_pages(s.cpu(), table, L), d.cpu())
