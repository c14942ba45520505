"""``blockbatch bench``: accuracy, NFE and time of several policies side by side on a task set."""

from __future__ import annotations

import argparse
import dataclasses
import os

import torch

from ..engine import DTYPES
from ..errors import write_json_file
from .common import UsageError, model_folder, positive_int, preset_names


def run(args: argparse.Namespace) -> int:
    from .. import bench, families
    from ..engine import Engine

    _check_out(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    engine = Engine.from_pretrained(args.model, device=args.device, dtype=DTYPES[args.dtype])
    if args.policies is None:  # the family's own (families.REGISTRY: LLaDA2 has one decoder, block)
        args.policies = list(families.of(engine.config).BENCH_POLICIES)
    policies = {name: bench.policy_options(name, args.gen_length) for name in args.policies}
    samples = bench.load_tasks(args.tasks, args.n)
    if not samples:
        raise UsageError(f"--tasks {args.tasks}: the file holds no tasks")
    result = bench.run_bench(
        engine, samples, policies, compare_reference=args.compare_reference, progress=not args.quiet
    )
    print(bench.format_table(result))
    _check_out(args)  # again: the folder may have changed during the run
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "bench.json")
    write_json_file(
        path,
        {
            "environment": bench.environment(),
            "model": args.model or "toy",
            "tasks": args.tasks or "toy",
            "gen_length": args.gen_length,
            "policies": {k: dataclasses.asdict(v) for k, v in policies.items()},
            **result,
        },
        flag="--out",
    )
    print(f"wrote {path}")
    for png in bench.save_plots(result, args.out, "--out"):
        print(f"wrote {png}")
    return 0


def _check_out(args: argparse.Namespace) -> None:
    """--out and the files written in it against the one output-file rule (blockbatch.outputs),
    before the work: not the --tasks file, a preset file of --policies or a file of the model's
    checkpoint folder; regular files in a folder that is (or can be made) a writable folder."""
    from .. import bench, outputs

    presets = [("--policies", spec.split(":")[0]) for spec in args.policies or () if os.path.isfile(spec.split(":")[0])]
    try:
        outputs.check_output_folder(
            args.out,
            "--out",
            ("bench.json", *bench.PLOTS),
            inputs=[("--tasks", args.tasks), *presets],
            protected=[("the model folder", model_folder(args.model))],
        )
    except outputs.OutputError as e:
        raise UsageError(str(e)) from None


def add_parser(sub) -> None:
    from .. import families, policies

    p = sub.add_parser(
        "bench",
        help="accuracy / NFE / time of several policies side by side on a task set",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run a task set under several policies on one checkpoint, interleaved per sample; print a "
        "table, write JSON (every per-sample record + environment) and PNG plots to --out.",
        epilog="policies: "
        + " | ".join(f"{name} ({', '.join(families.decoding(name))})" for name in policies.REGISTRY)
        + ", a preset ("
        + ", ".join(preset_names())
        + ")\n"
        "or a preset file's path, each optionally name:key=value,... (the pairs win over the preset;\n"
        "a preset's block sizes that do not divide --gen-length are dropped), e.g.\n"
        "  blockbatch bench --policies dual blockbatch blockbatch:block_sizes=8/32,sync_gap=4\n"
        "  blockbatch bench --policies dual blockbatch-paper blockbatch-best:threshold=0.8 my-preset.json\n"
        '  blockbatch bench --tasks my.jsonl --model DIR   (lines: {"prompt": ..., "answer": ...})',
    )
    p.add_argument("--model", default=None, help="checkpoint folder (default: the shipped toy model)")
    p.add_argument("--tasks", default=None, help="JSONL of prompts and answers (default: toy held-out problems)")
    p.add_argument("--n", type=positive_int, default=200, help="samples (default 200)")
    p.add_argument(
        "--policies",
        nargs="+",
        default=None,
        help=f"space-separated policy specs (default: {families.per_family_text('BENCH_POLICIES')}): a "
        "policy, a preset name "
        "or a preset file, each optionally with :key=value,... (see below); the table and the JSON "
        "name each as given",
    )
    p.add_argument("--gen-length", type=int, default=128, help="generation length (default 128)")
    p.add_argument(
        "--compare-reference",
        action="store_true",
        help="also run each policy through the pure-PyTorch reference loop and report the speed ratio",
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=list(DTYPES), default="float32")
    p.add_argument("--threads", type=positive_int, default=None, help="intra-op threads (default: torch's choice)")
    p.add_argument("--out", default="results/bench", help="output folder (default results/bench)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
