"""Policy ``wavefront`` (FlowBlock's gated wavefront, issue 54) against ``block`` on the LLaDA2 toy.

    python benchmarks/bench_wavefront.py [--n 40] [--gen-lengths 64 256] [--threads 1] \\
        [--checkpoint llada2|llada2-edit|DIR] [--edit 1.0] [--gate-n 16] [--repeats 1] \\
        [--out docs/bench/wavefront/bench_wavefront.json]

On the toy task's held-out problems (``--checkpoint``: the LLaDA2 toy python/blockbatch/toy/checkpoint_llada2
by default, ``llada2-edit`` its editing continuation toy/checkpoint_llada2_edit; blocks of 32), per
generation length: ``block`` without editing (LLaDA2.0, threshold 0.95), ``block`` with LLaDA2.1's
editing rule (threshold 0.95; edit_threshold 0.9 and 1.0), and ``wavefront`` with max_active_blocks 1..4
(spawn_threshold 0.5; edit_threshold 0.9 and 1.0), each decoded alone: accuracy (exact final answer), mean
NFE, tokens committed per forward, forwards per answer token (the text up to its EOS), blocks in flight per
forward, edits, ms per sample (mean and median; the configs interleaved per problem). Then requests per
second through the scheduler (``Engine.generate`` with ``max_batch`` 1, 8, 32; the median of ``--repeats``
interleaved runs) for block without editing and block and wavefront (2 and 3 blocks) at edit_threshold
``--edit``. Then (``--gate-n`` > 0) the readiness gate: the float32 reference
(reference/wavefront.py) with the decoded-fraction gate (the policy's rule) and the mean-confidence gate
at spawn_threshold 0.25 / 0.5 / 0.75 and 2 / 3 blocks, gen 64: accuracy and NFE.

edit_threshold 1.0 keeps the editing rule (a block commits once a step starts without masks and edits
nothing) but no edit fires (a confidence is never > 1): the LLaDA2 toy was trained as a masked-diffusion model
only (tools/train_toy_llada2.py: loss on masked positions), so its predictions at decided positions are not
edits worth taking, and edit_threshold 0.9 rewrites correct answers (the rows say how much). The editing toy
(``--checkpoint llada2-edit``, ``train_toy_llada2.py --edit``: LLaDA2.1's token-to-token objective) is the one
whose edits at 0.9 are repairs; run it with ``--edit 0.9``. Writes the JSON and two PNGs beside it (forwards
per answer token and accuracy per config at ``--edit`` and without editing; the accuracy / time frontier).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from common import environment, write_json, write_png

BLOCK = 32
THRESHOLD = 0.95
SPAWN = 0.5
BATCHES = (1, 8, 32)


def configs() -> dict[str, dict]:
    out = {"block": dict(policy="block", threshold=THRESHOLD)}
    for edit in (0.9, 1.0):
        out[f"block edit {edit:g}"] = dict(policy="block", threshold=THRESHOLD, edit_threshold=edit)
        for k in (1, 2, 3, 4):
            out[f"wavefront {k} edit {edit:g}"] = dict(
                policy="wavefront", threshold=THRESHOLD, edit_threshold=edit, max_active_blocks=k, spawn_threshold=SPAWN
            )
    return out


def answer_tokens(gen, eos_id: int) -> int:
    """Generated tokens up to and including the first EOS (the answer's length in tokens)."""
    ids = list(gen.raw_ids)
    return ids.index(eos_id) + 1 if eos_id in ids else len(ids)


def run_alone(engine, problems, prompts, gen_length: int) -> dict:
    from blockbatch.toy import task as toy_task

    eos = engine.config.eos_token_id
    out = {}
    options = {
        name: engine.default_options(gen_length=gen_length, block_length=BLOCK, **kw) for name, kw in configs().items()
    }
    by_config: dict[str, list] = {name: [] for name in options}
    # Interleaved: every config decodes a problem before the next problem, so a change of the shared machine's
    # load reaches all configs alike.
    for problem, ids in zip(problems, prompts):
        for name, o in options.items():
            kw = configs()[name]
            t0 = time.perf_counter()
            [gen] = engine.generate(ids, o)
            ms = (time.perf_counter() - t0) * 1e3
            s = gen.stats
            by_config[name].append(
                dict(
                    correct=bool(toy_task.check_answer(problem, gen.text)),
                    nfe=s["nfe"],
                    committed=sum(s["committed_per_step"]),
                    answer=answer_tokens(gen, eos),
                    in_flight=sum(s["blocks_per_step"]) if kw["policy"] == "wavefront" else s["nfe"],
                    edits=s["edits"],
                    ms=ms,
                    blocks_per_step=s["blocks_per_step"],
                )
            )
    for name, rows in by_config.items():
        kw = configs()[name]
        nfe = sum(r["nfe"] for r in rows)
        out[name] = dict(
            options=kw,
            accuracy=sum(r["correct"] for r in rows) / len(rows),
            mean_nfe=statistics.mean(r["nfe"] for r in rows),
            tokens_per_forward=sum(r["committed"] for r in rows) / nfe,
            forwards_per_answer_token=nfe / sum(r["answer"] for r in rows),
            blocks_per_forward=sum(r["in_flight"] for r in rows) / nfe,
            mean_edits=statistics.mean(r["edits"] for r in rows),
            mean_ms=statistics.mean(r["ms"] for r in rows),
            median_ms=statistics.median(r["ms"] for r in rows),
            # forwards by blocks in flight (stats blocks_per_step), summed over the problems
            forwards_by_window={
                str(k): sum(r["blocks_per_step"].count(k) for r in rows)
                for k in sorted({w for r in rows for w in r["blocks_per_step"]})
            },
        )
    return out


def run_batched(engine, prompts, gen_length: int, edit: float, repeats: int = 1) -> dict:
    """Requests per second per config and max_batch: the median of ``repeats`` runs, the configs interleaved
    within each repeat (the shared machine's load drifts between runs)."""
    names = (f"block edit {edit:g}", f"wavefront 2 edit {edit:g}", f"wavefront 3 edit {edit:g}", "block")
    runs: dict[str, dict[str, list[float]]] = {name: {str(b): [] for b in BATCHES} for name in names}
    for _ in range(repeats):
        for batch in BATCHES:
            for name in names:
                o = engine.default_options(gen_length=gen_length, block_length=BLOCK, **configs()[name])
                t0 = time.perf_counter()
                engine.generate(prompts, [o] * len(prompts), max_batch=batch)
                runs[name][str(batch)].append(len(prompts) / (time.perf_counter() - t0))
    return {name: {b: statistics.median(v) for b, v in by_batch.items()} for name, by_batch in runs.items()}


def run_gates(engine, problems, prompts) -> dict:
    """The two readiness gates through the float32 reference, gen 64, edit_threshold 1.0."""
    from blockbatch import bench
    from blockbatch.reference.wavefront import wavefront_generate
    from blockbatch.toy import task as toy_task

    reference = bench.reference_model(engine.checkpoint)
    c = engine.config
    out = {}
    for gate in ("decoded", "confidence"):
        for k in (2, 3):
            for spawn in (0.25, 0.5, 0.75):
                correct, nfe = 0, 0
                for problem, ids in zip(problems, prompts):
                    canvas, st = wavefront_generate(
                        reference,
                        ids,
                        gen_length=64,
                        block_length=BLOCK,
                        threshold=THRESHOLD,
                        edit_threshold=1.0,
                        max_active_blocks=k,
                        spawn_threshold=spawn,
                        eos_id=c.eos_token_id,
                        mask_id=c.mask_token_id,
                        gate=gate,
                    )
                    gen = canvas[ids.numel() :].tolist()
                    gen = gen[: gen.index(c.eos_token_id)] if c.eos_token_id in gen else gen
                    correct += bool(toy_task.check_answer(problem, engine.codec.decode(gen)))
                    nfe += st["nfe"]
                out[f"{gate} {k} {spawn:g}"] = dict(accuracy=correct / len(problems), mean_nfe=nfe / len(problems))
    return out


def run_gates_random(n: int) -> dict:
    """The two gates on a random LLaDA2 checkpoint (blocks of 16 decode over many steps there, so the gates
    fire at different steps), gen 64, threshold 0.7, edit_threshold 0.5: mean NFE and the share of
    prompts whose text equals the serial decode's (max_active_blocks 1)."""
    from blockbatch.families import llada2 as fam
    from blockbatch.random_checkpoint import random_config, random_weights
    from blockbatch.reference.llada2 import LLaDA2Reference
    from blockbatch.reference.wavefront import wavefront_generate

    cfg = random_config("llada2", vocab_size=64, d_model=32, n_heads=4, n_kv_heads=2, head_size=16)
    model = LLaDA2Reference(fam.reference_config(cfg), random_weights(cfg, seed=3, logit_scale=4.0))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 60, (int(torch.randint(3, 24, (1,), generator=g)),), generator=g) for _ in range(n)]
    kw = dict(
        gen_length=64,
        block_length=16,
        threshold=0.7,
        edit_threshold=0.5,
        eos_id=cfg.eos_token_id,
        mask_id=cfg.mask_token_id,
    )
    serial = [wavefront_generate(model, p, max_active_blocks=1, **kw) for p in prompts]
    out = {"serial": dict(mean_nfe=statistics.mean(st["nfe"] for _, st in serial), same_as_serial=1.0)}
    for gate in ("decoded", "confidence"):
        for k in (2, 3):
            for spawn in (0.25, 0.5, 0.75):
                runs = [
                    wavefront_generate(model, p, max_active_blocks=k, spawn_threshold=spawn, gate=gate, **kw)
                    for p in prompts
                ]
                same = sum(a.tolist() == b.tolist() for (a, _), (b, _) in zip(runs, serial)) / n
                out[f"{gate} {k} {spawn:g}"] = dict(
                    mean_nfe=statistics.mean(st["nfe"] for _, st in runs), same_as_serial=same
                )
    return out


def frontier(points: dict[str, dict]) -> list[str]:
    """The configs no other beats in accuracy (>=) and time per sample (<=, one of them strictly), by time."""
    keep = [
        n
        for n, p in points.items()
        if not any(
            q["accuracy"] >= p["accuracy"]
            and q["mean_ms"] <= p["mean_ms"]
            and (q["accuracy"] > p["accuracy"] or q["mean_ms"] < p["mean_ms"])
            for m, q in points.items()
            if m != n
        )
    ]
    return sorted(keep, key=lambda n: points[n]["mean_ms"])


def plot(out: str, results: dict, edit: float = 1.0) -> None:
    """bench_wavefront.png (forwards per answer token, accuracy on the bars) and
    bench_wavefront_frontier.png (accuracy against time per sample, the frontier joined) beside ``out``."""

    def draw(ax):
        names = [n for n in configs() if "edit" not in n or n.endswith(f"edit {edit:g}")]
        Gs = list(results)
        width = 0.8 / len(Gs)
        for j, G in enumerate(Gs):
            xs = [i + j * width for i in range(len(names))]
            ax.bar(xs, [results[G][n]["forwards_per_answer_token"] for n in names], width, label=f"gen {G}")
            for x, n in zip(xs, names):
                ax.text(
                    x,
                    results[G][n]["forwards_per_answer_token"],
                    f"{results[G][n]['accuracy']:.2f}",
                    ha="center",
                    va="bottom",
                    fontsize=6,
                )
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(names))], names, rotation=30, ha="right", fontsize=7)
        ax.set_ylabel("forwards per answer token (label: accuracy)")
        ax.set_title(f"{toy_name}: block vs wavefront (CPU)" + ("" if edit == 1.0 else f", edits at {edit:g}"))
        ax.legend()

    def draw_frontier(ax):
        for G, points in results.items():
            xs = [p["mean_ms"] for p in points.values()]
            dots = ax.scatter(xs, [p["accuracy"] for p in points.values()], s=14, label=f"gen {G}")
            color = dots.get_facecolor()[0]
            editing = {n: p for n, p in points.items() if p["options"].get("edit_threshold") is not None}
            for subset, style in ((points, "-"), (editing, "--")):
                best = frontier(subset)
                ax.plot([subset[n]["mean_ms"] for n in best], [subset[n]["accuracy"] for n in best], style, color=color)
                for n in best:
                    xy = (subset[n]["mean_ms"], subset[n]["accuracy"])
                    ax.annotate(n, xy, fontsize=6, xytext=(3, 3), textcoords="offset points")
        ax.set_xscale("log")
        ax.set_xlabel("ms per sample (CPU, alone; log)")
        ax.set_ylabel("accuracy")
        ax.set_title(f"{toy_name}: accuracy / time frontier (solid: all; dashed: with the editing rule)", fontsize=9)
        ax.legend()

    toy_name = "LLaDA2 toy" if edit == 1.0 else "LLaDA2 editing toy"
    write_png(out, draw, size=(7, 4.5))
    write_png(os.path.splitext(out)[0] + "_frontier.json", draw_frontier, size=(7, 4.5))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=40, help="held-out problems (default 40)")
    ap.add_argument(
        "--gate-n", type=int, default=16, help="held-out problems of the gate measurement (default 16; 0: skip it)"
    )
    ap.add_argument(
        "--checkpoint",
        default="llada2",
        help="llada2 (the LLaDA2 toy, default), llada2-edit (the editing toy) or a checkpoint folder",
    )
    ap.add_argument(
        "--repeats", type=int, default=1, help="runs of each batched measurement, interleaved; the median (default 1)"
    )
    ap.add_argument(
        "--edit", type=float, default=1.0, help="edit_threshold of the batched rows and the figure (default 1.0)"
    )
    ap.add_argument("--gen-lengths", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default="docs/bench/wavefront/bench_wavefront.json")
    ap.add_argument("--plot-only", action="store_true", help="redraw the PNGs from --out's JSON, decoding nothing")
    args = ap.parse_args(argv)
    if args.plot_only:
        with open(args.out, encoding="utf-8") as f:
            d = json.load(f)
        plot(args.out, d["results"], d.get("edit_threshold", 1.0))
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    from blockbatch import toy
    from blockbatch.engine import Engine
    from blockbatch.toy import task as toy_task

    path = {"llada2": toy.checkpoint_path("llada2"), "llada2-edit": toy.LLADA2_EDIT_CHECKPOINT_DIR}.get(
        args.checkpoint, args.checkpoint
    )
    engine = Engine.from_pretrained(path)
    problems = toy_task.make_problems(args.n, seed=1000, split="test")
    prompts = [engine.encode(p.prompt, chat=False) for p in problems]
    results, batched = {}, {}
    for G in args.gen_lengths:
        results[str(G)] = run_alone(engine, problems, prompts, G)
        print(f"gen_length {G}:")
        for name, r in results[str(G)].items():
            print(
                f"  {name:20s} acc {r['accuracy']:.3f}  NFE {r['mean_nfe']:6.2f}"
                f"  tok/fwd {r['tokens_per_forward']:6.2f}"
                f"  fwd/answer tok {r['forwards_per_answer_token']:.3f}  blocks/fwd {r['blocks_per_forward']:.2f}"
                f"  edits {r['mean_edits']:5.1f}  {r['mean_ms']:6.1f} ms"
            )
        batched[str(G)] = run_batched(engine, prompts, G, args.edit, args.repeats)
        for name, r in batched[str(G)].items():
            print(f"  {name:20s} requests/s " + "  ".join(f"max_batch {b}: {v:6.1f}" for b, v in r.items()))
    gates, gates_random = {}, {}
    if args.gate_n > 0:
        gates = run_gates(engine, problems[: args.gate_n], prompts[: args.gate_n])
        print("readiness gates (reference, gen 64, edit_threshold 1.0):")
        for name, r in gates.items():
            print(f"  {name:18s} acc {r['accuracy']:.3f}  NFE {r['mean_nfe']:.2f}")
        gates_random = run_gates_random(args.gate_n)
        print("readiness gates (reference, random LLaDA2 checkpoint, gen 64, block 16, edit_threshold 0.5):")
        for name, r in gates_random.items():
            print(f"  {name:18s} NFE {r['mean_nfe']:6.2f}  same text as serial {r['same_as_serial']:.2f}")
    model = {
        "llada2": "LLaDA2 toy (python/blockbatch/toy/checkpoint_llada2)",
        "llada2-edit": "LLaDA2 editing toy (python/blockbatch/toy/checkpoint_llada2_edit)",
    }.get(args.checkpoint, args.checkpoint)
    payload = dict(
        benchmark="bench_wavefront",
        model=model,
        edit_threshold=args.edit,
        batched_repeats=args.repeats,
        problems=args.n,
        gate_problems=args.gate_n,
        block_length=BLOCK,
        environment=environment(),
        results=results,
        requests_per_s=batched,
        gates=gates,
        gates_random_checkpoint=gates_random,
    )
    write_json(args.out, payload)

    plot(args.out, results, args.edit)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
