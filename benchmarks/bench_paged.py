"""Paged KV (issue 37, ALGORITHMS.md section 12): the page length, the bytes per request, what
share_prompt_kv costs and saves, and what copy on write saves a leader sync.

    python benchmarks/bench_paged.py [--parts pages,pool,bytes,share,cow,prefix] [--n 50] [--repeats 5]
        [--out docs/bench/paged/bench_paged.json]

pages: the attention op (dual mode: 6 rows of 32 queries over a cached row of L keys, 8 heads of
  128 on the CPU, 32 with --device cuda, bfloat16 and float32) over a dense buffer and over page stores
  of 8, 16, 32 and 64 positions (shuffled pages), one call of each in turn per round (--repeats
  rounds); reported: the median time and the median of the per-round ratios paged / dense. The
  outputs are checked equal to the dense ones first.
pool: the toys' 50 held-out problems (gen 64, dual-fast-dllm and blockbatch-best) through a scheduler of
  max_batch 8 with dense rows and with pages of 8, 16 and 32, in turn (15 rounds): wall time per run
  and the median ratio to dense rows (the outputs checked equal).
bytes: KV bytes per request for every policy (vanilla, prefix, dual, blockbatch with the default
  branch set, blockbatch with share_prompt_kv) at prompts of 128, 1024 and 4096 tokens and 256
  generated, on the LLaDA-8B shape (32 layers, 32 KV heads of 128, bf16) and the Dream-7B shape
  (28 layers, 4 KV heads of 128), and the largest batch a 1 GiB budget holds: before (a dense pool:
  every KV row max_length = 4096 + 256 positions) and after (pages of 16: each row the pages of its
  own canvas; share_prompt_kv: the prompt's complete pages once); and a 64 GiB budget (an 80 GB
  GPU's KV room), where 1 GiB holds no LLaDA-8B request. Checked against the pool on a
  small random LLaDA: the pages a running request holds (the scheduler's kv_pages_in_use) equal
  the formula.
share: blockbatch-paper and blockbatch-best with share_prompt_kv off and on, on the LLaDA and Dream
  toys (--n held-out problems, gen 64) and on a random 4-layer LLaDA (20 prompts of 128..256 random
  tokens: no accuracy, how often the option changes a decode): accuracy (whole trace and final
  answer), mean NFE and refreshes, the pages held per request (prompt + gen), decodes changed, CPU
  ms per sample (the two in turn, median of 3 rounds).
cow: blockbatch-paper and blockbatch-best (gen 64) through a scheduler of max_batch 8 over dense rows
  and over pages of 16 (row copies as page-table entries, a page copied when written), in turn
  (3 rounds), on the toys' --n held-out problems and the random 4-layer LLaDA's 20 prompts: row
  copies (init, syncs, folded twins) per request, the K/V positions they move as whole rows of the
  canvas and as pages copied on write, and the wall time per run (the outputs checked equal).
prefix: --requests LLaDA2 requests (a random 4-layer LLaDA2 of width 128) sharing a --prefix-token
  prompt start, each with 1..40 tokens of its own and 32 generated in blocks of 32, submitted at
  once to a scheduler of max_batch 8, with the prefix cache and without, in turn (3 rounds):
  hit rate (prompt tokens read from the cache), query tokens, wall time and requests per second,
  median time to a request's first streamed tokens. The outputs are checked equal first.
Writes the JSON and a PNG next to it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
from common import environment, write_json, write_png

from blockbatch import presets
from blockbatch.options import DecodeOptions

ops = torch.ops.blockbatch
PAGE = 16  # the pool's automatic page length on the CPU (decode/step.h kDefaultKvPageLen)


def _to_pages(kv: torch.Tensor, page_len: int, g: torch.Generator):
    R, layers, _, kvh, L, hd = kv.shape
    per_row = -(-L // page_len)
    padded = torch.zeros(R, layers, 2, kvh, per_row * page_len, hd, dtype=kv.dtype)
    padded[..., :L, :] = kv
    chunks = padded.view(R, layers, 2, kvh, per_row, page_len, hd).permute(0, 4, 1, 2, 3, 5, 6)
    order = torch.randperm(R * per_row, generator=g)
    store = torch.empty(R * per_row, layers, 2, kvh, page_len, hd, dtype=kv.dtype)
    store[order] = chunks.reshape(R * per_row, layers, 2, kvh, page_len, hd)
    return store, order.view(R, per_row).contiguous()


def part_pages(repeats: int, device: str = "cpu") -> dict:
    out = {}
    g = torch.Generator().manual_seed(0)
    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for dtype in (torch.bfloat16, torch.float32):
        for L in (1088, 4160):
            heads, hd, R, nq = (32 if cuda else 8), 128, 6, 32  # CUDA: LLaDA-8B's 32 heads
            kv = torch.randn(R, 1, 2, heads, L, hd, generator=g).to(dtype)
            q = torch.randn(R * nq, heads, hd, generator=g).to(dtype)
            k = torch.randn(R * nq, heads, hd, generator=g).to(dtype)
            cu = torch.arange(R + 1) * nq
            rows, lens = torch.arange(R), torch.full((R,), L)
            layouts = {"dense": (kv, None)}
            for P in (8, 16, 32, 64):
                layouts[str(P)] = _to_pages(kv, P, g)
            if cuda:
                kv, q, k, cu, rows, lens = (t.cuda() for t in (kv, q, k, cu, rows, lens))
                layouts = {n: (s.cuda(), t.cuda() if t is not None else None) for n, (s, t) in layouts.items()}
            want = ops.packed_attention(q, k, k, cu, kv, rows, lens, 0, False)
            for name, (store, table) in layouts.items():
                got = ops.packed_attention(q, k, k, cu, store, rows, lens, 0, False, table)
                if not torch.equal(got, want):
                    raise SystemExit(f"paged attention ({name}) differs from the dense one")
            times: dict[str, list[float]] = {n: [] for n in layouts}
            for _ in range(repeats):
                for name, (store, table) in layouts.items():  # one call each, in turn: drift hits all alike
                    sync()
                    t0 = time.perf_counter()
                    ops.packed_attention(q, k, k, cu, store, rows, lens, 0, False, table)
                    sync()
                    times[name].append((time.perf_counter() - t0) * 1e3)
            key = f"{device}/{str(dtype).split('.')[1]}/L{L}"
            out[key] = {
                name: {
                    "median_ms": statistics.median(t),
                    "ratio_to_dense": statistics.median(a / b for a, b in zip(t, times["dense"])),
                }
                for name, t in times.items()
            }
            print(
                f"pages {key}: "
                + ", ".join(f"{n} {v['median_ms']:.2f} ms (x{v['ratio_to_dense']:.3f})" for n, v in out[key].items()),
                file=sys.stderr,
            )
    return out


def part_pool(repeats: int) -> dict:
    """The toys' 50 held-out problems through a scheduler (max_batch 8, gen 64) with dense rows and
    with pages of 8, 16 and 32, in turn: wall time per run (the same outputs, checked)."""
    from blockbatch.engine import Engine
    from blockbatch.toy import DREAM_CHECKPOINT_DIR, task

    problems = task.make_problems(50, 0, "test")
    out = {}
    for label, engine in (
        ("llada-toy", Engine.from_pretrained()),
        ("dream-toy", Engine.from_pretrained(DREAM_CHECKPOINT_DIR)),
    ):
        prompts = [torch.tensor(engine.codec.encode(p.prompt, chat=False)) for p in problems]
        for preset in ("dual-fast-dllm", "blockbatch-best"):
            o = DecodeOptions(**presets.values(preset, gen_length=64))
            times: dict[int, list[float]] = {P: [] for P in (0, 8, 16, 32)}
            ref = None
            for _ in range(repeats):
                for P in times:  # in turn: drift hits all alike
                    with engine.scheduler(max_batch=8, max_length=256, adaptive=False, kv_page_len=P) as s:
                        t0 = time.perf_counter()
                        outs = [h.result(timeout=600) for h in [s.submit(p, o) for p in prompts]]
                        times[P].append(time.perf_counter() - t0)
                    ids = [x.tokens.tolist() for x in outs]
                    if ref is None:
                        ref = ids
                    elif ids != ref:
                        raise SystemExit(f"{label} {preset}: pages of {P} changed the outputs")
            out[f"{label}/{preset}"] = {
                str(P): {
                    "median_s": statistics.median(t),
                    "ratio_to_dense": statistics.median(a / b for a, b in zip(t, times[0])),
                }
                for P, t in times.items()
            }
            print(
                f"pool {label}/{preset}: "
                + ", ".join(
                    f"{P}: {v['median_s']:.2f} s (x{v['ratio_to_dense']:.3f})"
                    for P, v in out[f"{label}/{preset}"].items()
                ),
                file=sys.stderr,
            )
    return out


SHAPES = {
    # logit_shift: Dream's block steps feed (and write the K/V of) the position before their window,
    # so the page holding the prompt's last position is not shared (decode/policies/branch_rows.cpp).
    "llada-8b": dict(
        layers=32, kv_heads=32, head_dim=128, dtype_bytes=2, branches=(4, 8, 16, 32, 64, 128), logit_shift=0
    ),
    "dream-7b": dict(
        layers=28, kv_heads=4, head_dim=128, dtype_bytes=2, branches=(4, 8, 16, 32, 64, 128), logit_shift=1
    ),
}
POLICIES = ("vanilla", "prefix", "dual", "blockbatch", "blockbatch+share")


def request_pages(policy: str, branches: int, prompt: int, gen: int, page: int, logit_shift: int = 0) -> int:
    """Pages of `page` positions a request holds in the paged pool (decode/batch/kv_pool.cpp;
    shared prompt pages: shared_prompt_pages in decode/policies/branch_rows.cpp)."""
    per = -(-(prompt + gen) // page)
    if policy == "vanilla":
        return 0
    if policy in ("prefix", "dual"):
        return per
    if policy == "blockbatch":
        return branches * per
    shared = max(prompt - logit_shift, 0) // page
    return shared + branches * (per - shared)


def part_bytes(gen: int = 256, max_prompt: int = 4096) -> dict:
    out = {}
    budget = 1 << 30
    for shape, s in SHAPES.items():
        pos_bytes = s["layers"] * 2 * s["kv_heads"] * s["head_dim"] * s["dtype_bytes"]
        B = len(s["branches"])
        for prompt in (128, 1024, 4096):
            for policy in POLICIES:
                rows = 0 if policy == "vanilla" else (B if policy.startswith("blockbatch") else 1)
                before = rows * (max_prompt + gen) * pos_bytes  # dense pool rows of max_length
                exact = rows * (prompt + gen) * pos_bytes  # Engine.kv_report: rows of the canvas
                after = request_pages(policy, B, prompt, gen, PAGE, s["logit_shift"]) * PAGE * pos_bytes
                out[f"{shape}/prompt{prompt}/{policy}"] = {
                    "rows": rows,
                    "bytes_dense_pool": before,
                    "bytes_canvas_rows": exact,
                    "bytes_paged": after,
                    "largest_batch_dense_pool": budget // before if before else -1,
                    "largest_batch_paged": budget // after if after else -1,
                    "largest_batch_64gib_dense_pool": 64 * budget // before if before else -1,
                    "largest_batch_64gib_paged": 64 * budget // after if after else -1,
                }
        for prompt in (128, 1024, 4096):
            dual = out[f"{shape}/prompt{prompt}/dual"]["bytes_paged"]
            for policy in ("blockbatch", "blockbatch+share"):
                r = out[f"{shape}/prompt{prompt}/{policy}"]
                r["ratio_to_dual"] = r["bytes_paged"] / dual
    return out


def check_bytes_on_the_toy() -> dict:
    """kv_pages_in_use of one running request against request_pages(), on a small random LLaDA and
    Dream (random: its requests run many steps; the toys finish some in one)."""
    import tempfile

    from blockbatch.engine import Engine
    from blockbatch.random_checkpoint import make_random_checkpoint

    checked = {}
    for family, shift in (("llada", 0), ("dream", 1)):  # Dream: the logit shift keeps a prompt page per row
        folder = tempfile.mkdtemp(prefix="bench-paged-")
        make_random_checkpoint(folder, seed=0, family=family, d_model=64, n_layers=2, vocab_size=97)
        engine = Engine.from_pretrained(folder)
        for prompt_len in (40, 48, 300):  # 48: a whole number of pages
            prompt = torch.tensor([1 + i % 9 for i in range(prompt_len)])
            for policy in POLICIES[1:]:
                base = dict(policy=policy.split("+")[0], gen_length=64, stop_on_eos=False)  # still running after a step
                if policy.startswith("blockbatch"):
                    base.update(block_sizes=(4, 8, 16, 32, 64), share_prompt_kv=policy.endswith("share"))
                else:
                    base.update(block_length=16)
                s = torch.classes.blockbatch.Scheduler(engine.model.obj, 1, 512, 0, [], [], 0.0, PAGE, False)
                s.add(prompt, DecodeOptions(**base).native, False)
                s.step(0.0)
                held = dict(s.counters())["kv_pages_in_use"]
                s.close()
                want = request_pages(policy, 5, prompt_len, 64, PAGE, shift)
                if held != want:
                    raise SystemExit(
                        f"{family} {policy} prompt {prompt_len}: the pool holds {held} pages, the formula {want}"
                    )
                checked[f"{family}/prompt{prompt_len}/{policy}"] = held
    print(f"bytes: the pool's pages equal the formula in {len(checked)} cases", file=sys.stderr)
    return checked


def part_share(n: int, repeats: int) -> dict:
    import tempfile

    from blockbatch.engine import Engine
    from blockbatch.random_checkpoint import make_random_checkpoint
    from blockbatch.toy import DREAM_CHECKPOINT_DIR, task

    problems = task.make_problems(n, 0, "test")
    folder = tempfile.mkdtemp(prefix="bench-share-")
    make_random_checkpoint(folder, seed=0, d_model=128, n_layers=4, vocab_size=97, logit_scale=5.0)
    g = torch.Generator().manual_seed(0)
    random_prompts = [
        [t for t in torch.randint(2, 90, (int(torch.randint(128, 257, (1,), generator=g)),), generator=g).tolist()]
        for _ in range(20)
    ]
    out = {}
    cases = []
    for label, engine in (
        ("llada-toy", Engine.from_pretrained()),
        ("dream-toy", Engine.from_pretrained(DREAM_CHECKPOINT_DIR)),
    ):
        cases.append((label, engine, [engine.codec.encode(p.prompt, chat=False) for p in problems], problems))
    cases.append(("random-llada-4l", Engine.from_pretrained(folder), random_prompts, None))
    for label, engine, prompts, probs in cases:
        for preset in ("blockbatch-paper", "blockbatch-best"):
            base = DecodeOptions(**presets.values(preset, gen_length=64))
            res: dict[bool, dict] = {}
            times: dict[bool, list[float]] = {False: [], True: []}
            gens: dict[bool, list] = {False: [], True: []}
            for ids in prompts:
                t: dict[bool, list[float]] = {False: [], True: []}
                last = {}
                for _ in range(repeats):
                    for share in (False, True):  # in turn: drift hits both alike
                        t0 = time.perf_counter()
                        [last[share]] = engine.generate([ids], base.replace(share_prompt_kv=share))
                        t[share].append((time.perf_counter() - t0) * 1e3)
                for share in (False, True):
                    times[share].append(statistics.median(t[share]))
                    gens[share].append(last[share])
            for share in (False, True):
                gs = gens[share]
                acc = lambda check: (  # noqa: E731
                    statistics.mean(check(p, x.text) for p, x in zip(probs, gs)) if probs is not None else None
                )
                res[share] = {
                    "trace_accuracy": acc(task.check_trace),
                    "answer_accuracy": acc(task.check_answer),
                    "mean_nfe": statistics.mean(x.stats["nfe"] for x in gs),
                    "mean_refreshes": statistics.mean(x.stats["nfe_refresh"] for x in gs),
                    "mean_pages": statistics.mean(
                        request_pages(
                            "blockbatch+share" if share else "blockbatch",
                            len(x.stats["branches"]),
                            len(ids),
                            64,
                            PAGE,
                            int(label.startswith("dream")),  # Dream: logit shift 1,
                        )
                        for ids, x in zip(prompts, gs)
                    ),
                    "median_cpu_ms": statistics.median(times[share]),
                }
            changed = sum(a.ids != b.ids for a, b in zip(gens[False], gens[True]))
            out[f"{label}/{preset}"] = {
                "n": len(prompts),
                "mean_prompt": statistics.mean(len(x) for x in prompts),
                "off": res[False],
                "on": res[True],
                "decodes_changed": changed,
                "median_cpu_ratio_off_on": statistics.median(a / b for a, b in zip(times[False], times[True])),
            }
            r = out[f"{label}/{preset}"]
            off, on = r["off"], r["on"]
            print(
                f"share {label}/{preset}: trace acc {off['trace_accuracy']} -> {on['trace_accuracy']}, "
                f"NFE {off['mean_nfe']:.1f} -> {on['mean_nfe']:.1f} ({off['mean_refreshes']:.1f} refreshes), pages "
                f"{off['mean_pages']:.1f} -> {on['mean_pages']:.1f}, {changed}/{len(prompts)} decodes changed, "
                f"CPU x{r['median_cpu_ratio_off_on']:.2f}",
                file=sys.stderr,
            )
    return out


def part_prefix(requests: int, prefix: int, repeats: int) -> dict:
    """`requests` LLaDA2 requests sharing a `prefix`-token prompt start (each then 1..40 tokens of its
    own, 32 generated in blocks of 32), submitted at once to a scheduler of max_batch 8, with and
    without the prefix cache, in turn. Each run's outputs equal the other's (tokens and NFE)."""
    import tempfile

    from blockbatch.engine import Engine
    from blockbatch.random_checkpoint import make_random_checkpoint

    folder = tempfile.mkdtemp(prefix="bench-prefix-")
    make_random_checkpoint(folder, seed=0, family="llada2", d_model=128, n_layers=4, vocab_size=97, logit_scale=4.0)
    engine = Engine.from_pretrained(folder)
    c = engine.config
    g = torch.Generator().manual_seed(0)
    ok = lambda t: [x if x != c.mask_token_id else 1 for x in t.tolist()]  # noqa: E731
    shared = ok(torch.randint(2, c.vocab_size - 2, (prefix,), generator=g))
    prompts = [
        shared + ok(torch.randint(2, c.vocab_size - 2, (int(torch.randint(1, 41, (1,), generator=g)),), generator=g))
        for _ in range(requests)
    ]
    o = DecodeOptions(policy="block", gen_length=32, block_length=32, threshold=0.9)
    runs: dict[bool, list[dict]] = {False: [], True: []}
    outs: dict[bool, list] = {}
    for _ in range(repeats):
        for cached in (False, True):  # in turn: drift hits both alike
            with engine.scheduler(
                max_batch=8, max_length=prefix + 128, adaptive=False, kv_page_len=PAGE, prefix_cache=cached
            ) as s:
                first: dict[int, float] = {}
                t0 = time.perf_counter()
                hs = []
                for i, p in enumerate(prompts):
                    cb = lambda ev, i=i: ev.kind == "tokens" and first.setdefault(i, time.perf_counter())  # noqa: E731
                    hs.append(s.submit(torch.tensor(p), o, stream=True, callback=cb))
                outs[cached] = [h.result(timeout=600) for h in hs]
                wall = time.perf_counter() - t0
                k = s.counters()
            runs[cached].append(
                {
                    "wall_s": wall,
                    "median_first_tokens_s": statistics.median(first[i] - t0 for i in first),
                    "hit_tokens": k["prefix_cache_hit_tokens"],
                }
            )
    for a, b in zip(outs[False], outs[True]):
        if a.tokens.tolist() != b.tokens.tolist() or a.stats["nfe"] != b.stats["nfe"]:
            raise SystemExit("the prefix cache changed a request's tokens or NFE")
    prompt_tokens = sum(len(p) for p in prompts)
    out = {"requests": requests, "prefix": prefix, "prompt_tokens": prompt_tokens}
    for cached in (False, True):
        r = runs[cached]
        out["cache" if cached else "no_cache"] = {
            "median_wall_s": statistics.median(x["wall_s"] for x in r),
            "requests_per_s": requests / statistics.median(x["wall_s"] for x in r),
            "median_first_tokens_s": statistics.median(x["median_first_tokens_s"] for x in r),
            "hit_rate": r[0]["hit_tokens"] / prompt_tokens,
            "query_tokens": sum(sum(x.stats["query_tokens_per_step"]) for x in outs[cached]),
        }
    out["speedup"] = statistics.median(a["wall_s"] / b["wall_s"] for a, b in zip(runs[False], runs[True]))
    print(
        f"prefix: {requests} requests over a {prefix}-token prefix: hit rate {out['cache']['hit_rate']:.2f}, "
        f"query tokens {out['no_cache']['query_tokens']} -> {out['cache']['query_tokens']}, wall "
        f"{out['no_cache']['median_wall_s']:.2f} -> {out['cache']['median_wall_s']:.2f} s (x{out['speedup']:.2f}), "
        f"first tokens {out['no_cache']['median_first_tokens_s']:.2f} -> {out['cache']['median_first_tokens_s']:.2f} s",
        file=sys.stderr,
    )
    return out


def part_cow(n: int, repeats: int) -> dict:
    """Row copies as page-table entries (copy on write) against whole-row copies: blockbatch-paper and
    blockbatch-best (gen 64) through a scheduler (max_batch 8) over dense rows and over pages of 16,
    in turn, on the toys' held-out problems and a random 4-layer LLaDA with 128..256-token prompts."""
    import tempfile

    from blockbatch.engine import Engine
    from blockbatch.random_checkpoint import make_random_checkpoint
    from blockbatch.toy import DREAM_CHECKPOINT_DIR, task

    folder = tempfile.mkdtemp(prefix="bench-cow-")
    make_random_checkpoint(folder, seed=0, d_model=128, n_layers=4, vocab_size=97, logit_scale=5.0)
    g = torch.Generator().manual_seed(0)
    random_prompts = [
        torch.randint(2, 90, (int(torch.randint(128, 257, (1,), generator=g)),), generator=g) for _ in range(20)
    ]
    problems = task.make_problems(n, 0, "test")
    cases = []
    for label, engine in (
        ("llada-toy", Engine.from_pretrained()),
        ("dream-toy", Engine.from_pretrained(DREAM_CHECKPOINT_DIR)),
    ):
        cases.append((label, engine, [torch.tensor(engine.codec.encode(p.prompt, chat=False)) for p in problems]))
    cases.append(("random-llada-4l", Engine.from_pretrained(folder), random_prompts))
    out = {}
    for label, engine, prompts in cases:
        for preset in ("blockbatch-paper", "blockbatch-best"):
            o = DecodeOptions(**presets.values(preset, gen_length=64))
            times: dict[int, list[float]] = {0: [], PAGE: []}
            runs: dict[int, list] = {}
            for _ in range(repeats):
                for P in times:  # in turn: drift hits both alike
                    with engine.scheduler(max_batch=8, max_length=320, adaptive=False, kv_page_len=P) as s:
                        t0 = time.perf_counter()
                        runs[P] = [h.result(timeout=600) for h in [s.submit(p, o) for p in prompts]]
                        times[P].append(time.perf_counter() - t0)
            if [x.tokens.tolist() for x in runs[0]] != [x.tokens.tolist() for x in runs[PAGE]]:
                raise SystemExit(f"{label} {preset}: copy on write changed the outputs")
            # Whole-row copies: the init's (every branch but the first), each sync received, each folded
            # twin, a canvas each (a dense pool row is longer still); copy on write: the pages copied.
            rows = [
                len(x.stats["branches"]) - 1 + sum(b["copied"] for b in x.stats["branches"]) + x.stats["folded_rows"]
                for x in runs[PAGE]
            ]
            row_positions = [r * (len(p) + 64) for r, p in zip(rows, prompts)]
            cow_positions = [x.stats["kv_pages_copied"] * PAGE for x in runs[PAGE]]
            out[f"{label}/{preset}"] = {
                "n": len(prompts),
                "mean_prompt": statistics.mean(len(p) for p in prompts),
                "mean_row_copies": statistics.mean(rows),
                "mean_syncs": statistics.mean(sum(b["copied"] for b in x.stats["branches"]) for x in runs[PAGE]),
                "mean_positions_copied_rows": statistics.mean(row_positions),
                "mean_positions_copied_cow": statistics.mean(cow_positions),
                "copied_ratio": sum(cow_positions) / max(1, sum(row_positions)),
                "median_s_dense": statistics.median(times[0]),
                "median_s_paged": statistics.median(times[PAGE]),
                "median_ratio_paged_dense": statistics.median(a / b for a, b in zip(times[PAGE], times[0])),
            }
            r = out[f"{label}/{preset}"]
            print(
                f"cow {label}/{preset}: {r['mean_row_copies']:.1f} row copies ({r['mean_syncs']:.1f} syncs) a request, "
                f"positions copied {r['mean_positions_copied_rows']:.0f} -> {r['mean_positions_copied_cow']:.0f} "
                f"(x{r['copied_ratio']:.3f}); wall {r['median_s_dense']:.2f} -> {r['median_s_paged']:.2f} s "
                f"(x{r['median_ratio_paged_dense']:.3f})",
                file=sys.stderr,
            )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", default="pages,pool,bytes,share,cow,prefix")
    p.add_argument("--requests", type=int, default=32, help="prefix: requests sharing the prompt start")
    p.add_argument("--prefix", type=int, default=1024, help="prefix: tokens of the shared prompt start")
    p.add_argument("--n", type=int, default=50, help="held-out toy problems (share)")
    p.add_argument("--repeats", type=int, default=40, help="timed rounds of the pages part (share and prefix: 3)")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (1: the two cores do not interfere)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="pages: time the CPU or the CUDA kernels")
    p.add_argument("--out", default=os.path.join("docs", "bench", "paged", "bench_paged.json"))
    p.add_argument("--merge", action="store_true", help="keep the other parts' results already in --out")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    parts = args.parts.split(",")
    results: dict = {}
    if args.merge and os.path.exists(args.out):
        with open(args.out, encoding="utf-8") as f:
            results = {k: v for k, v in json.load(f).items() if k not in ("benchmark", "args", "environment")}
    if "pages" in parts:
        results["pages"] = part_pages(args.repeats, args.device)
    if "pool" in parts:
        results["pool"] = part_pool(15)
    if "bytes" in parts:
        results["bytes"] = part_bytes()
        results["bytes_checked_on_toy"] = check_bytes_on_the_toy()
    if "share" in parts:
        results["share"] = part_share(args.n, 3)
    if "cow" in parts:
        results["cow"] = part_cow(args.n, 3)
    if "prefix" in parts:
        results["prefix"] = part_prefix(args.requests, args.prefix, 3)
    write_json(args.out, {"benchmark": "bench_paged", "args": vars(args), "environment": environment(), **results})

    def draw(ax):
        b = results.get("bytes")
        if not b:
            return
        for shape, marker in (("llada-8b", "o"), ("dream-7b", "s")):
            for policy in ("dual", "blockbatch", "blockbatch+share"):
                xs, ys = [], []
                for prompt in (128, 1024, 4096):
                    r = b[f"{shape}/prompt{prompt}/{policy}"]
                    xs.append(prompt)
                    ys.append(r["largest_batch_64gib_paged"])
                ax.plot(xs, ys, marker=marker, label=f"{shape} {policy} (paged)")
            r = [b[f"{shape}/prompt{p}/blockbatch"]["largest_batch_64gib_dense_pool"] for p in (128, 1024, 4096)]
            ax.plot((128, 1024, 4096), r, marker=marker, linestyle=":", label=f"{shape} blockbatch (dense pool)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("prompt tokens (gen 256)")
        ax.set_ylabel("requests a 64 GiB KV budget holds")
        ax.set_title("paged KV: requests in 64 GiB (pages of 16; dense pool rows of 4352)", fontsize=8)
        ax.legend(fontsize=5)

    write_png(args.out, draw, size=(6, 4))
    return 0


if __name__ == "__main__":
    sys.exit(main())
