"""Gathered key sets (issue 52 item 1): the CPU attention op with each row's cached keys as a list
of the whole range vs the contiguous range, side by side in one process.

    python benchmarks/bench_gathered_keys.py [--repeats 31] [--threads 2]

Dual mode (6 rows of 32 queries over cached rows of L keys, 8 heads of 128, GQA 2), dense and
paged (pages of 16), float32 and bfloat16, L in 512 and 2048: one call of each in turn per round;
reported per case: median ms of the contiguous and the listed call and the median of the
per-round ratios listed / contiguous. The outputs are checked equal (bit for bit) first. A third
column, a half subset (every other key), shows what a gathered window saves.
"""

import argparse
import statistics
import time

import torch

import blockbatch.native  # noqa: F401

ops = torch.ops.blockbatch


def _case(dtype, L, paged, g):
    rows, nq, heads, kv_heads, hd = 6, 32, 8, 4, 128
    T = rows * nq
    q = torch.randn(T, heads, hd, generator=g).to(dtype)
    k = torch.randn(T, kv_heads, hd, generator=g).to(dtype)
    kv = torch.randn(rows, 1, 2, kv_heads, L, hd, generator=g).to(dtype)
    cu = torch.arange(rows + 1) * nq
    kv_rows = torch.arange(rows)
    lens = torch.full((rows,), L)
    table = None
    if paged:
        page = 16
        per_row = L // page
        order = torch.randperm(rows * per_row, generator=g)
        store = torch.empty(rows * per_row, 1, 2, kv_heads, page, hd, dtype=dtype)
        chunks = kv.view(rows, 1, 2, kv_heads, per_row, page, hd).permute(0, 4, 1, 2, 3, 5, 6)
        store[order] = chunks.reshape(-1, 1, 2, kv_heads, page, hd)
        kv, table = store, order.view(rows, per_row).contiguous()
    whole = (torch.arange(L).repeat(rows), torch.arange(rows + 1) * L)
    half = (torch.arange(0, L, 2).repeat(rows), torch.arange(rows + 1) * (L // 2))
    return (q, k, k, cu, kv, kv_rows, lens, 0, False, table), whole, half


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=31)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    print(f"{'case':34} {'contiguous ms':>14} {'listed ms':>10} {'ratio':>7} {'half-list ms':>13}")
    for dtype in (torch.float32, torch.bfloat16):
        for paged in (False, True):
            for L in (512, 2048):
                base, whole, half = _case(dtype, L, paged, g)
                calls = {
                    "contiguous": lambda: ops.packed_attention(*base),
                    "listed": lambda: ops.packed_attention(*base, *whole),
                    "half": lambda: ops.packed_attention(*base, *half),
                }
                assert torch.equal(calls["contiguous"](), calls["listed"]())
                times = {name: [] for name in calls}
                for _ in range(args.repeats):
                    for name, fn in calls.items():
                        t0 = time.perf_counter()
                        fn()
                        times[name].append(time.perf_counter() - t0)
                ratio = statistics.median(a / b for a, b in zip(times["listed"], times["contiguous"]))
                med = {name: 1e3 * statistics.median(t) for name, t in times.items()}
                name = f"{str(dtype).split('.')[1]} {'paged16' if paged else 'dense'} L={L}"
                print(f"{name:34} {med['contiguous']:14.2f} {med['listed']:10.2f} {ratio:7.3f} {med['half']:13.2f}")


if __name__ == "__main__":
    main()
