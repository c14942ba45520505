"""LLaDA2 on the CPU: K/V bytes per token at the published mini shape, and at a scaled mini shape
(the same structure: one dense layer then mixtures of 64 experts in 8 groups, 4 kept, top-8 + 1
shared; GQA 8/2 heads, RoPE on half of each head) the step time of the block decoder's exact
cache against the authors' recompute-the-window step, native and reference, and a whole decode.

Steps, one forward each, medians of interleaved runs:
  cached     the current block (32 queries) over the cached K/V of the prompt's blocks (dual, kv_lens)
  window     the authors' step: every block up to the current one recomputed (a row per block)
  reference  the cached step through reference/llada2.py (forward_window over the cached K/V)
and a decode: policy block (LLaDA2.0 settings, threshold 0.95) native vs the reference's
block_generate with its cache, the same tokens asserted.

    python benchmarks/bench_llada2.py [--repeats 7] [--threads 2] [--prompt 512] \
        [--out docs/bench/llada2/bench_llada2.json]
"""

from __future__ import annotations

import argparse
import sys

import torch

from common import environment, interleaved_medians, write_json, write_png

SCALED_MINI = dict(
    d_model=512,
    n_layers=4,
    n_heads=8,
    n_kv_heads=2,
    head_size=64,
    rope_dims=32,
    mlp_hidden_size=1280,
    vocab_size=8192,
    max_sequence_length=4096,
    num_experts=64,
    experts_per_token=8,
    expert_groups=8,
    expert_groups_kept=4,
    moe_hidden_size=128,
    shared_experts=1,
    first_dense_layers=1,
)


def kv_bytes_per_token(config, itemsize: int) -> int:
    return config.n_layers * 2 * config.n_kv_heads * config.head_dim * itemsize


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per step kind (default 7)")
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads (default: torch's)")
    parser.add_argument("--prompt", type=int, default=512, help="prompt tokens before the decoded block (default 512)")
    parser.add_argument("--gen-length", type=int, default=64, help="tokens of the timed decode (default 64)")
    parser.add_argument("--out", default="results/bench_llada2.json", help="JSON output path (a PNG beside it)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from blockbatch import DecodeOptions
    from blockbatch.families import llada2 as fam
    from blockbatch.native import NativeModel
    from blockbatch.random_checkpoint import random_config, random_weights
    from blockbatch.reference import llada2 as ref

    mini = random_config("llada2", **fam.LLADA2_MINI)
    config = random_config("llada2", **SCALED_MINI)
    weights = random_weights(config, seed=0, logit_scale=3.0)
    params = sum(t.numel() for t in weights.values())
    routed = sum(t.numel() for n, t in weights.items() if ".mlp.experts." in n)
    active = params - routed + routed * config.experts_per_token // config.num_experts
    native = NativeModel(config, weights)
    reference = ref.LLaDA2Reference(fam.reference_config(config), weights, config.mask_token_id, config.eos_token_id)
    B, P = 32, args.prompt
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config.vocab_size - 2, (P + B,), generator=g)
    ids[P:] = config.mask_token_id
    positions = torch.arange(P + B)
    kv = native.new_kv(1, P + B)
    rows = torch.zeros((P + B) // B, dtype=torch.long)
    cu = torch.arange(0, P + B + 1, B)
    ends = torch.arange(B, P + B + 1, B)

    def window():  # the authors' step: every block recomputed, each a row seeing itself and earlier blocks
        return torch.ops.blockbatch.forward(native.obj, ids, positions, cu, kv, rows, None, "dual", None, ends)

    window()  # fills the prompt's K/V

    def cached():  # the exact cache: the current block over the cached prompt blocks
        return torch.ops.blockbatch.forward(
            native.obj, ids[P:], positions[P:], cu[:2], kv, rows[:1], None, "dual", None, ends[-1:]
        )

    _, ref_cache = reference.forward_window(ids[:P], 0, B, None)

    def reference_cached():
        return reference.forward_window(ids[P:], P, B, ref_cache)[0]

    err = (cached() - reference_cached()).abs().max().item()
    steps = interleaved_medians(
        {"cached": cached, "window": window, "reference cached": reference_cached}, args.repeats
    )
    prompt = ids[:P]
    o = DecodeOptions(policy="block", gen_length=args.gen_length, block_length=B, threshold=0.95)
    out = {}

    def decode_native():
        out["native"] = torch.ops.blockbatch.decode(native.obj, prompt, o.native)

    def decode_reference():
        out["reference"] = ref.block_generate(
            reference,
            prompt,
            gen_length=args.gen_length,
            block_length=B,
            steps=B,
            threshold=0.95,
            eos_id=config.eos_token_id,
            mask_id=config.mask_token_id,
            cache=True,
        )

    decodes = interleaved_medians({"native": decode_native, "reference": decode_reference}, max(3, args.repeats // 2))
    same = out["native"][0].tolist() == out["reference"][0].tolist()
    nfe = int(out["reference"][1]["nfe"])
    assert same, "the native decode differs from the reference's"
    result = {
        "benchmark": "llada2_cpu",
        "environment": environment(),
        "kv_bytes_per_token": {
            "llada2-mini bfloat16": kv_bytes_per_token(mini, 2),
            "scaled mini float32": kv_bytes_per_token(config, 4),
        },
        "scaled_config": SCALED_MINI,
        "params": params,
        "active_params": active,
        "prompt": P,
        "block_length": B,
        "steps": steps,
        "window_over_cached": steps["window"]["median_s"] / steps["cached"]["median_s"],
        "reference_over_native_cached": steps["reference cached"]["median_s"] / steps["cached"]["median_s"],
        "max_abs_logit_diff_cached_vs_reference": err,
        "decode": decodes,
        "decode_gen_length": args.gen_length,
        "decode_nfe": nfe,
        "decode_equal_to_reference": same,
        "decode_reference_over_native": decodes["reference"]["median_s"] / decodes["native"]["median_s"],
    }
    write_json(args.out, result)
    print(
        f"scaled mini: {params / 1e6:.1f}M params ({active / 1e6:.1f}M active), prompt {P}, block {B}, "
        f"threads {torch.get_num_threads()}"
    )
    for name, t in steps.items():
        print(f"  step {name:17s} median {t['median_s'] * 1e3:8.2f} ms")
    print(
        f"  window / cached {result['window_over_cached']:.2f}x; reference / native (cached) "
        f"{result['reference_over_native_cached']:.2f}x; max |logit diff| {err:.1e}"
    )
    print(
        f"  decode gen {args.gen_length}: native {decodes['native']['median_s'] * 1e3:.1f} ms, reference "
        f"{decodes['reference']['median_s'] * 1e3:.1f} ms ({result['decode_reference_over_native']:.2f}x), "
        f"NFE {nfe}, same tokens: {same}"
    )
    print(f"  K/V bytes per token: {result['kv_bytes_per_token']}")

    def draw(ax):
        names = list(steps)
        ax.bar(names, [steps[n]["median_s"] * 1e3 for n in names], color=["tab:green", "tab:gray", "tab:blue"])
        ax.set_ylabel("median step time (ms)")
        ax.set_title(f"LLaDA2 scaled mini, CPU: one step after a {P}-token prompt")

    write_png(args.out, draw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
