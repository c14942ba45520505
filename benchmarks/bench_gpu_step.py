"""GPU per-step latency at LLaDA-8B shape (random bf16 weights): native packed step vs plain PyTorch.

    python benchmarks/bench_gpu_step.py --out DIR [--part default|candidates] [--layers 32] [--repeats 10]

Steps: the 6-branch BlockBatch step (windows 4..128 = 252 query tokens, dual cache) and one
32-token dual-cache step, each over KV rows of L = 512 and 2048. "plain" is the same step in
plain PyTorch (cuBLAS GEMMs + SDPA per row). Latency: median over repeats, CUDA events.
Roofline per step: max(weight bytes / 4.8 TB/s, FLOPs / 790 TFLOP/s) (H200 bf16), and the same
with the cached K/V every row must read added to the bytes ("roofline_with_kv_ms").
Graph replay: the same step (forward + confidence, what the decode loop's StepRunner records)
captured once in a CUDA graph and replayed; GPU-busy time: the sum of the step's kernel times
(torch.profiler), the bound a replay can approach.
Bookkeeping (BlockBatch rows): what a decode step adds after the forward on the device, on a
random mid-decode state of the 6 branches: sparse probabilities + bb_absorb_ + bb_coordinate_
("bookkeeping_ms", graph-replayed, restoring the state first), and the leader sync's KV row
copies, which move whole KV rows ("sync_kv_copy_ms" per copied row).
Attention alone (one layer's packed_attention at the step's shape, dual cache): its time for
each tensor-core kernel (BLOCKBATCH_ATTN_KERNEL sync / pipelined / pipelined3) with the automatic key-split
count and with 1, 2, 4, 8 splits forced (BLOCKBATCH_ATTN_SPLITS), and the K/V bandwidth it
reaches (each row's K and V read once / time; the H200 peak is 4.8 TB/s). "top_kernels": the
step's kernels by device time (the profiler's names, cut short).
Candidates (--part candidates, a run of its own; CANDIDATES in common.py: the opt-in kernels of
the settings table): the whole step with the default kernels ("default_*") and again under each
candidate's environment variables and under all together ("<name>_eager_ms", "_replay_ms",
"_busy_ms", "_replay_over_busy", "_replay_over_roofline"; with no candidate left it says so and
times none). Candidates of LLaDA2's layers (Candidate.model "llada2": the fused MoE kernels) are
timed on LLaDA2-mini-shaped steps instead (--llada2-layers layers of the published mini: the first
dense, the others 256 experts top-8 + 1 shared; random bf16 weights): one block of 32 queries and
8 such blocks (8 requests in one pack) over 512 cached keys. The default there (grouped experts:
the router's choices read on the host) cannot be captured in a CUDA graph, so the decode loop runs
it eagerly and its "default_replay_ms" is its eager time ("default_replay_is_eager": true). Then
"gemm" in the JSON: cuBLAS at each of the step's weight shapes (fused QKV,
attention out, fused gate|up, MLP out, LM head) at 8, 32, 64, 252 and 256 rows: microseconds per
GEMM, the weight bandwidth and the TFLOP/s it reaches (weights rotated over copies larger than the
L2 cache together, so every call streams its weights from DRAM).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from common import environ

from blockbatch import settings

CANDIDATES = settings.candidates("llada")  # timed on the LLaDA-8B-shaped steps
LLADA2_CANDIDATES = settings.candidates("llada2")  # timed on LLaDA2-mini-shaped steps

LLADA_8B = dict(
    d_model=4096,
    n_layers=32,
    n_heads=32,
    n_kv_heads=32,
    mlp_hidden_size=12288,
    vocab_size=126464,
    max_sequence_length=4096,
    rope_theta=500000.0,
)
HBM_BYTES_PER_S = 4.8e12
BF16_FLOPS = 790e12


def cuda_ms(fn, repeats: int) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def graph_ms(fn, repeats: int) -> float:
    """Median replay time of fn captured in a CUDA graph (after one eager warm-up on the side stream)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return cuda_ms(graph.replay, repeats)


def busy_ms(fn, top: int = 12) -> tuple[float, list]:
    """Sum of the device times of the kernels one call of fn launches, and the `top` kernels by
    total time as [name (cut to 90 characters), ms, launches]."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    total_us = 0.0  # as PyTorch's own table totals "Self CUDA": the device-side events' own time
    per_kernel: dict[str, list] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            us = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)
            total_us += us
            entry = per_kernel.setdefault(e.name[:90], [0.0, 0])
            entry[0] += us / 1e3
            entry[1] += 1
    ranked = sorted(([name, round(ms, 4), n] for name, (ms, n) in per_kernel.items()), key=lambda x: -x[1])
    return total_us / 1e3, ranked[:top]


def random_bf16_weights(config, device):
    from blockbatch.loading import expected_weight_shapes

    g = torch.Generator(device=device).manual_seed(0)
    out = {}
    for name, shape in expected_weight_shapes(config).items():
        t = torch.empty(shape, dtype=torch.bfloat16, device=device)
        t.normal_(0, 1.0 if len(shape) == 1 else shape[1] ** -0.5, generator=g)
        out[name] = t
    return out


class PlainStep:
    """The same dual-cache step in plain PyTorch: cuBLAS GEMMs, SDPA per row."""

    def __init__(self, config, weights):
        from blockbatch.families.llada import PREFIX
        from blockbatch.reference.model import rope_cos_sin

        self.c = config
        self.w = weights
        self.P = PREFIX
        cos, sin = rope_cos_sin(torch.arange(config.max_sequence_length), config.head_dim, config.rope_theta)
        self.cos, self.sin = cos.cuda(), sin.cuda()

    def __call__(self, ids, pos, lens, kv):
        """ids/pos packed [T]; lens[r] query tokens of row r, which uses KV row r."""
        c, w, P = self.c, self.w, self.P
        hd, H = c.head_dim, c.n_heads
        x = w[P + "wte.weight"][ids]
        rows = range(len(lens))
        for i in range(c.n_layers):
            b = f"{P}blocks.{i}."
            h = F.rms_norm(x.float(), (c.d_model,), eps=c.rms_norm_eps).to(x.dtype) * w[b + "attn_norm.weight"]
            q = (h @ w[b + "q_proj.weight"].T).view(-1, H, hd)
            k = (h @ w[b + "k_proj.weight"].T).view(-1, H, hd)
            v = (h @ w[b + "v_proj.weight"].T).view(-1, H, hd)
            cos, sin = self.cos[pos][:, None], self.sin[pos][:, None]
            rot = lambda t: torch.cat([-t[..., hd // 2 :], t[..., : hd // 2]], -1)  # noqa: E731
            q = (q.float() * cos + rot(q.float()) * sin).to(x.dtype)
            k = (k.float() * cos + rot(k.float()) * sin).to(x.dtype)
            outs, start = [], 0
            for r, n in zip(rows, lens):
                p = pos[start : start + n]
                kv[r, i, 0][:, p] = k[start : start + n].transpose(0, 1)
                kv[r, i, 1][:, p] = v[start : start + n].transpose(0, 1)
                o = F.scaled_dot_product_attention(
                    q[start : start + n].transpose(0, 1)[None], kv[r, i, 0][None], kv[r, i, 1][None]
                )
                outs.append(o[0].transpose(0, 1).reshape(n, -1))
                start += n
            x = x + torch.cat(outs) @ w[b + "attn_out.weight"].T
            h = F.rms_norm(x.float(), (c.d_model,), eps=c.rms_norm_eps).to(x.dtype) * w[b + "ff_norm.weight"]
            x = x + (F.silu(h @ w[b + "ff_proj.weight"].T) * (h @ w[b + "up_proj.weight"].T)) @ w[b + "ff_out.weight"].T
        x = F.rms_norm(x.float(), (c.d_model,), eps=c.rms_norm_eps).to(x.dtype) * w[P + "ln_f.weight"]
        return x @ w[P + "ff_out.weight"].T


def attention_sweep(config, kv, lengths, L: int, repeats: int, kernels=("sync", "pipelined", "pipelined3")) -> dict:
    """One layer's dual-cache attention at this step's shape, per kernel and key-split setting."""
    hd, heads, kv_heads = config.d_model // config.n_heads, config.n_heads, config.n_kv_heads
    T, R = sum(lengths), len(lengths)
    q = torch.randn(T, heads, hd, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(T, kv_heads, hd, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(T, kv_heads, hd, device="cuda", dtype=torch.bfloat16)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), device="cuda")
    rows, cache = torch.arange(R, device="cuda"), torch.full((R,), L, device="cuda")
    kv_bytes = R * kv_heads * L * hd * 2 * kv.element_size()
    out = {}
    for kernel in kernels:
        for splits in ("auto", "1", "2", "4", "8"):
            with environ(BLOCKBATCH_ATTN_KERNEL=kernel, BLOCKBATCH_ATTN_SPLITS=None if splits == "auto" else splits):
                ms = cuda_ms(
                    lambda: torch.ops.blockbatch.packed_attention(q, k, v, cu, kv, rows, cache, 0, False), repeats
                )
            out[f"attn_{kernel}_ms_splits_{splits}"] = ms
            out[f"attn_{kernel}_kv_tb_per_s_splits_{splits}"] = kv_bytes / (ms * 1e-3) / 1e12
    return out


def gemm_sweep(config, rows: int, repeats: int) -> dict:
    """x @ W.T at the step's weight shapes for `rows` tokens on cuBLAS."""
    d, m = config.d_model, config.mlp_hidden_size
    hd = d // config.n_heads
    shapes = {
        "qkv": ((config.n_heads + 2 * config.n_kv_heads) * hd, d),
        "attn_out": (d, config.n_heads * hd),
        "gate_up": (2 * m, d),
        "ff_out": (d, m),
        "lm_head": (config.vocab_size, d),
    }
    out = {}
    for name, (N, K) in shapes.items():
        nbytes = N * K * 2
        copies = max(2, -(-(256 << 20) // nbytes))  # > 256 MB together: more than the L2 cache holds
        ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        x = torch.randn(rows, K, device="cuda", dtype=torch.bfloat16)

        def run():
            for w in ws:  # noqa: F821 (the closure runs before the `del ws` below)
                torch.ops.blockbatch.linear(x, w)

        us = cuda_ms(run, repeats) / copies * 1e3
        out[f"{name}_cublas_us"] = us
        out[f"{name}_cublas_tb_per_s"] = nbytes / (us * 1e-6) / 1e12
        out[f"{name}_cublas_tflop_per_s"] = 2 * rows * N * K / (us * 1e-6) / 1e12
        del ws
    return out


def bookkeeping(config, model, kv, L: int, repeats: int) -> dict:
    """Device time of one BlockBatch step's bookkeeping at this shape (see the module docstring)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))  # tests/helpers
    from helpers.random_branch_state import coordinate_args, random_branch_state, window_spans

    ops = torch.ops.blockbatch
    lp = 128
    s0 = random_branch_state(
        0,
        prompt_len=lp,
        gen_length=L - lp,
        sizes=(4, 8, 16, 32, 64, 128),
        vocab=config.vocab_size,
        mask_id=config.mask_token_id,
        k=11,
    )
    s0 = {k: (v.cuda() if torch.is_tensor(v) else v) for k, v in s0.items()}
    s = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in s0.items()}
    spans, rows = window_spans(s0["state"].cpu())
    spans = torch.tensor(spans, device="cuda")
    logits = torch.randn(rows, config.vocab_size, device="cuda", dtype=torch.bfloat16) * 3

    def step():
        for k in ("canvas", "state", "map_ids", "map_probs", "flags", "sync_src"):
            s[k].copy_(s0[k])
        token, conf = ops.confidence(logits, config.mask_token_id)
        ids, probs = ops.sparse_probs(logits, 0.1, 11)
        ops.bb_absorb_(
            s["canvas"],
            s["state"],
            s["eos_prob"],
            s["map_ids"],
            s["map_probs"],
            spans,
            token,
            conf,
            ids,
            probs,
            logits,
            lp,
            config.mask_token_id,
            config.eos_token_id,
            0.9,
            True,
        )
        ops.bb_coordinate_(*coordinate_args(s))

    out = {"bookkeeping_ms": graph_ms(step, repeats), "bookkeeping_rows": rows}
    step()
    copied = int((s["sync_src"] >= 0).sum())
    if copied:
        src = s["sync_src"].clone()
        out["sync_kv_copy_ms"] = cuda_ms(lambda: ops.kv_copy_rows_(kv, src), repeats) / copied
        out["kv_row_bytes"] = kv[0].numel() * kv.element_size()
    return out


@contextlib.contextmanager
def section(row: dict, name: str):
    """Run one measured part; an exception is recorded in row[name + "_error"] instead of ending the run."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - every failure is reported in the JSON and the exit status
        row[f"{name}_error"] = f"{type(e).__name__}: {e}"
        print(f"error in {row['step']} L={row['L']} {name}: {row[name + '_error']}", file=sys.stderr, flush=True)


def step_roofline(config, params: int, lengths, L: int, kv) -> tuple[float, float, int]:
    """max(weight bytes / 4.8 TB/s, FLOPs / 790 TFLOP/s) in ms, the same with the cached K/V read
    added to the bytes, and those K/V bytes."""
    T = sum(lengths)
    flops = (
        2 * T * (params - 2 * config.vocab_size * config.d_model)
        + 2 * T * config.vocab_size * config.d_model
        + 4 * T * L * config.d_model * config.n_layers
    )
    weight_bytes = 2 * params - 2 * config.vocab_size * config.d_model  # the embedding table is gathered, not streamed
    roofline_ms = max(weight_bytes / HBM_BYTES_PER_S, flops / BF16_FLOPS) * 1e3
    # The roofline counts weights only; a dual-cache step must also read every row's
    # cached K and V once (6 rows x 1.07 GB at L 2048 for LLaDA-8B): the floor with them.
    kv_read = kv.numel() * kv.element_size()  # kv holds exactly the step's rows at length L
    roofline_kv_ms = max((weight_bytes + kv_read) / HBM_BYTES_PER_S, flops / BF16_FLOPS) * 1e3
    return roofline_ms, roofline_kv_ms, kv_read


def step_latency(config, params: int, step, plain, packed, lengths, kv, L: int, repeats: int) -> dict:
    """Eager, GPU-busy and plain-PyTorch times of one step, with its rooflines."""
    native_ms = cuda_ms(step, repeats)
    gpu_busy_ms, top_kernels = busy_ms(step)
    tokens, positions = packed[0], packed[1]
    plain_ms = cuda_ms(lambda: plain(tokens, positions, lengths, kv), repeats)
    roofline_ms, roofline_kv_ms, kv_read = step_roofline(config, params, lengths, L, kv)
    return {
        "native_eager_ms": native_ms,
        "plain_pytorch_ms": plain_ms,
        "gpu_busy_ms": gpu_busy_ms,
        "roofline_ms": roofline_ms,
        "native_over_roofline": native_ms / roofline_ms,
        "busy_over_roofline": gpu_busy_ms / roofline_ms,
        "kv_read_bytes": kv_read,
        "roofline_with_kv_ms": roofline_kv_ms,
        "plain_over_native": plain_ms / native_ms,
        "top_kernels": top_kernels,
    }


def replay_latency(step, row: dict, repeats: int) -> dict:
    """The step captured in a CUDA graph: replay time against the GPU-busy time and both rooflines."""
    replay_ms = graph_ms(step, repeats)
    out = {
        "graph_replay_ms": replay_ms,
        "replay_over_roofline": replay_ms / row["roofline_ms"],
        "replay_over_roofline_with_kv": replay_ms / row["roofline_with_kv_ms"],
    }
    if row.get("gpu_busy_ms"):
        out["replay_over_busy"] = replay_ms / row["gpu_busy_ms"]
    return out


def llada2_candidates(layers: int, repeats: int, results: list, save) -> None:
    """LLADA2_CANDIDATES against the grouped default on LLaDA2-mini-shaped steps (module docstring)."""
    from blockbatch.families.llada2 import LLADA2_MINI
    from blockbatch.native import NativeModel, pack_rows
    from blockbatch.random_checkpoint import random_config

    config = random_config("llada2", **{**LLADA2_MINI, "n_layers": layers, "max_sequence_length": 4096})
    model = NativeModel(config, random_bf16_weights(config, "cuda"), dtype=torch.bfloat16, device="cuda")
    L, B = 512, 32
    steps = []
    for label, n in (("llada2-block-32", 1), ("llada2-8x32", 8)):
        kv = model.new_kv(n, L)
        ids = [torch.randint(0, config.vocab_size, (B,)) for _ in range(n)]
        pos = [torch.arange(L - B, L) for _ in range(n)]
        tokens, positions, cu = pack_rows(ids, pos, "cuda")
        rows = torch.arange(n, device="cuda")
        ends = torch.full((n,), L, device="cuda")

        def step(tokens=tokens, positions=positions, cu=cu, kv=kv, rows=rows, ends=ends, obj=model.obj):
            logits = torch.ops.blockbatch.forward(obj, tokens, positions, cu, kv, rows, None, "dual", None, ends)
            return torch.ops.blockbatch.confidence(logits, config.mask_token_id)

        row = {"step": label, "L": L, "query_tokens": n * B, "layers": layers, "default_replay_is_eager": True}
        results.append(row)
        steps.append((row, step))
    for row, step in steps:
        with section(row, "default"):  # grouped: not capturable, so the eager step is what runs
            row["default_eager_ms"] = row["default_replay_ms"] = cuda_ms(step, repeats)
            row["default_busy_ms"], row["default_top_kernels"] = busy_ms(step)
    for name, env in LLADA2_CANDIDATES.items():
        for row, step in steps:
            with section(row, name), environ(**env):
                ref = step()[1].float()
                row.update(candidate_latency(name, step, row, repeats))
                row[f"{name}_max_conf_diff_vs_default"] = (step()[1].float() - ref).abs().max().item()
        print(json.dumps({"candidate": name, **{r["step"]: r.get(f"{name}_replay_ms") for r, _ in steps}}), flush=True)
        save()
    del steps, model
    torch.cuda.empty_cache()


def candidate_latency(name: str, step, row: dict, repeats: int) -> dict:
    """The step under one candidate's variables: eager, replay, GPU-busy, and the replay's ratios
    ("_replay_over_default_busy": against the default kernels' busy time)."""
    out = {f"{name}_eager_ms": cuda_ms(step, repeats), f"{name}_replay_ms": graph_ms(step, repeats)}
    out[f"{name}_busy_ms"], out[f"{name}_top_kernels"] = busy_ms(step)
    out[f"{name}_replay_over_busy"] = out[f"{name}_replay_ms"] / out[f"{name}_busy_ms"]
    if row.get("default_busy_ms"):
        out[f"{name}_replay_over_default_busy"] = out[f"{name}_replay_ms"] / row["default_busy_ms"]
    if "roofline_ms" in row:
        out[f"{name}_replay_over_roofline"] = out[f"{name}_replay_ms"] / row["roofline_ms"]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--out", required=True, help="folder for bench_gpu_step.json (--part default) or bench_gpu_candidates.json"
    )
    ap.add_argument(
        "--part",
        choices=("default", "candidates"),
        default="default",
        help="default: the steps as shipped (latency, replay, plain PyTorch, attention sweep, "
        "bookkeeping); candidates: each step's default replay beside every opt-in "
        "kernel's, then the GEMM sweep. Separate runs, so a faulting candidate (a CUDA "
        "error poisons its process) cannot take the default numbers with it",
    )
    ap.add_argument("--layers", type=int, default=32, help="layers of the LLaDA-8B-shaped model (default 32)")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument(
        "--llada2-layers",
        type=int,
        default=4,
        help="layers of the LLaDA2-mini-shaped model the LLaDA2 candidates are timed on (default 4: "
        "1 dense + 3 MoE, 5 GB of bf16 weights)",
    )
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: no CUDA device", file=sys.stderr)
        return 2
    from blockbatch.native import NativeModel, pack_rows
    from blockbatch.random_checkpoint import random_config

    config = random_config(**{**LLADA_8B, "n_layers": args.layers})
    weights = random_bf16_weights(config, "cuda")
    params = sum(t.numel() for t in weights.values())
    model = NativeModel(config, weights, dtype=torch.bfloat16, device="cuda")
    plain = PlainStep(config, weights)
    results, gemm = [], {}
    os.makedirs(args.out, exist_ok=True)
    candidates = args.part == "candidates"
    out_name = "bench_gpu_candidates.json" if candidates else "bench_gpu_step.json"

    def save():  # after every step shape, so a run cut short by its time limit keeps what it measured
        with open(os.path.join(args.out, out_name), "w") as f:
            json.dump(
                {
                    "device": torch.cuda.get_device_name(0),
                    "torch": torch.__version__,
                    "params": params,
                    "layers": args.layers,
                    "results": results,
                    "gemm": gemm,
                },
                f,
                indent=2,
            )

    def make_step(lengths, L):
        kv = model.new_kv(len(lengths), L)  # noqa: F821 (runs before the `del model` below)
        ids = [torch.randint(0, config.vocab_size, (n,)) for n in lengths]
        pos = [torch.arange(L // 2 // n * n, L // 2 // n * n + n) for n in lengths]
        packed = pack_rows(ids, pos, "cuda")

        def step():
            logits = model.forward_packed(*packed, kv, "dual")  # noqa: F821 (before the `del model` below)
            return torch.ops.blockbatch.confidence(logits, config.mask_token_id)

        return kv, packed, step

    shapes = [
        (L, label, lengths)
        for L in (512, 2048)
        for label, lengths in (("blockbatch-6", [4, 8, 16, 32, 64, 128]), ("single-32", [32]))
    ]
    if candidates and LLADA2_CANDIDATES:  # first: its weights are freed before the LLaDA-8B steps
        llada2_candidates(args.llada2_layers, args.repeats, results, save)
    if candidates and not CANDIDATES:
        print(
            "no LLaDA kernel candidates left in the settings table (python/blockbatch/settings.py): no LLaDA-8B "
            "step timings; the cuBLAS GEMM sweep only",
            flush=True,
        )
    elif candidates:  # the default step beside each opt-in kernel, in this one process, candidate by candidate
        steps = []
        for L, label, lengths in shapes:
            kv, _, step = make_step(lengths, L)
            row = {
                "step": label,
                "L": L,
                "query_tokens": sum(lengths),
                "roofline_ms": step_roofline(config, params, lengths, L, kv)[0],
            }
            results.append(row)
            steps.append((row, lengths, L, kv, step))
        for name, env in {"default": {}, **CANDIDATES}.items():
            for row, lengths, L, kv, step in steps:
                with section(row, name), environ(**env):
                    row.update(candidate_latency(name, step, row, args.repeats))
            print(
                json.dumps(
                    {"candidate": name, **{f"{r['step']} L{r['L']}": r.get(f"{name}_replay_ms") for r, *_ in steps}}
                ),
                flush=True,
            )
            save()
        del steps
    for L, label, lengths in shapes if not candidates else ():
        row = {"step": label, "L": L, "query_tokens": sum(lengths)}
        results.append(row)
        kv, packed, step = make_step(lengths, L)
        # Each part is measured on its own: one that fails records its error and the rest still run.
        with section(row, "step"):
            row.update(step_latency(config, params, step, plain, packed, lengths, kv, L, args.repeats))
        with section(row, "replay"):
            row.update(replay_latency(step, row, args.repeats))
        with section(row, "attention"):
            row.update(attention_sweep(config, kv, lengths, L, args.repeats))
        if label == "blockbatch-6":
            with section(row, "bookkeeping"):
                row.update(bookkeeping(config, model, kv, L, args.repeats))
        del kv
        print(json.dumps(row), flush=True)
        save()
    del model, plain, weights  # the sweep's weight copies need the room
    torch.cuda.empty_cache()
    # 252 and 256: the 6-branch step's row count and the next multiple of 64 (cuBLAS timed both
    # alike on the H200: padding the packed step buys nothing, docs/bench/gpu/NOTES.md).
    for rows in (8, 32, 64, 252, 256) if candidates else ():
        row = gemm[f"rows_{rows}"] = {"step": f"gemm-{rows}", "L": "-"}
        with section(row, "gemm"):
            row.update(gemm_sweep(config, rows, args.repeats))
        print(json.dumps(row), flush=True)
        save()
    failed = [f"gemm: {k}" for r in gemm.values() for k in r if k.endswith("_error")]
    failed += [f"{r['step']} L={r['L']}: {k}" for r in results for k in r if k.endswith("_error")]
    if failed:
        print("failed parts: " + "; ".join(failed), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
