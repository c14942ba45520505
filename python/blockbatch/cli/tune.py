"""``blockbatch tune``: sweep decode settings on a task set, draw the accuracy-NFE-time frontier and
write the chosen setting as a preset (the sweep itself: ``blockbatch.tune``)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from .. import contract, outputs, tasks
from ..tune import GRIDS, OBJECTIVES, choose, configs, cost_key, frontier, run_tune, setup_key
from ..tune_report import format_report, save_plot
from .common import model_folder, positive_float, positive_int


def _floats(text: str) -> tuple[float, ...]:
    try:
        out = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by ',', got {text!r}") from None
    if not out:
        raise argparse.ArgumentTypeError("expected at least one number")
    return out


def _ints(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by ',', got {text!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by ',', got {text!r}")
    return out


def _branch_sets(text: str) -> tuple[tuple[int, ...], ...]:
    sets = []
    for part in text.split():
        try:
            sizes = tuple(int(x) for x in part.split("/") if x)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"branch sets are sizes joined by '/', separated by spaces (e.g. '8/16/32/64 32/64'), got {part!r}"
            ) from None
        if not sizes or min(sizes) < 1:
            raise argparse.ArgumentTypeError(f"a branch set needs positive sizes, got {part!r}")
        sets.append(sizes)
    if not sets:
        raise argparse.ArgumentTypeError("expected at least one branch set")
    return tuple(sets)


def _on_off(text: str) -> tuple[bool, ...]:
    vals = {"on": True, "off": False, "true": True, "false": False}
    try:
        return tuple(dict.fromkeys(vals[x.strip().lower()] for x in text.split(",") if x.strip()))
    except KeyError:
        raise argparse.ArgumentTypeError(f"expected on,off / on / off, got {text!r}") from None


def _refresh(text: str) -> tuple[str, ...]:
    out = []
    for x in (x.strip() for x in text.split(",")):
        if x == "block" or (x.isdigit() and int(x) >= 0):
            out.append(x)
        else:
            raise argparse.ArgumentTypeError(f"refresh values are token counts or 'block', got {x!r}")
    return tuple(out)


def add_parser(sub) -> argparse.ArgumentParser:
    from .. import families, policies

    grids_own = "the grid's"
    p = sub.add_parser(
        "tune",
        help="sweep decode settings on a task set: frontier JSON + PNG, the chosen setting as a preset",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\n\n")[0] + "\n\n" + "\n\n".join(__doc__.split("\n\n")[1:]),
        epilog="examples:\n"
        "  blockbatch tune --out results/tune                    (the toy model and toy tasks)\n"
        "  blockbatch tune --model DIR --tasks tasks.jsonl --n 200 --gen-length 128 --time-budget 3600\n"
        "  blockbatch tune --grid full --pick-policy blockbatch --write-preset my-best.json\n"
        "  blockbatch tune --step-time docs/bench/gpu/bench_gpu_step.json --objective time\n"
        "  blockbatch generate --preset results/tune/preset.json PROMPT   (use the choice)\n"
        "  blockbatch tune --model DIR --tasks cot.jsonl --answer-regex 'answer (-?[0-9]+)' --dev 100 --test 100\n"
        "  blockbatch tune --model DIR --lm-eval-task gsm8k --dev 200 --test 200 --gen-length 256\n"
        "  blockbatch tune --lm-eval-task my_task --include-path my_tasks/ --lm-eval-metric exact_match\n"
        'tasks: JSONL lines {"prompt": TEXT, "answer": ...} or {"ids": [TOKEN, ...], "answer": ...}; '
        '"answer" a string\nor number (checked by --answer / --answer-regex) or token ids (exact); '
        'without "answer" the score\nis agreement with a vanilla one-token-per-step decode. Rerun the '
        "same command to resume a sweep.",
    )
    p.add_argument("--model", default=None, help="checkpoint folder (default: the shipped toy model)")
    p.add_argument(
        "--tasks", default=None, help="JSONL of prompts (and answers) (default: the toy task's held-out problems)"
    )
    p.add_argument(
        "--n", type=positive_int, default=None, help="tasks used, all of them choosing (default 100; or --dev/--test)"
    )
    p.add_argument(
        "--no-chat",
        action="store_true",
        help="encode text prompts as they are, not through the checkpoint's chat template "
        "(--lm-eval-task prompts always are: the harness renders its own)",
    )
    a = p.add_argument_group("the tasks' answers and a held-out check")
    a.add_argument(
        "--answer",
        choices=("exact", "last-number"),
        default=None,
        help="how a --tasks file's answers are checked: exact (the stripped generation equals the answer; the "
        "default) or last-number (the generation's last number equals the answer as a number)",
    )
    a.add_argument(
        "--answer-regex",
        default=None,
        metavar="REGEX",
        help="check a --tasks file's answers by REGEX: its last match in the generation, the first capture group "
        "(or the whole match), stripped, equals the answer (e.g. 'answer:? *(-?[0-9]+)')",
    )
    a.add_argument(
        "--lm-eval-task",
        default=None,
        metavar="NAME",
        help="tune on an lm-evaluation-harness generate_until task instead of --tasks: its documents, prompt "
        "(few-shot context included), stop strings, filter and metric",
    )
    a.add_argument("--include-path", default=None, metavar="DIR", help="a folder of your own lm-eval task YAMLs")
    a.add_argument(
        "--lm-eval-metric", default=None, metavar="NAME", help="the task's metric scored (default: its first)"
    )
    a.add_argument(
        "--lm-eval-filter", default=None, metavar="NAME", help="the task's filter applied (default: its first)"
    )
    a.add_argument(
        "--dev",
        type=positive_int,
        default=None,
        metavar="N",
        help="choose on the first N tasks (replaces --n)",
    )
    a.add_argument(
        "--test",
        type=positive_int,
        default=None,
        metavar="M",
        help="and score every config on the next M tasks too, which choose nothing (default: none)",
    )
    p.add_argument("--gen-length", type=positive_int, default=64, help="generation length (default 64)")
    g = p.add_argument_group("the grid (each flag replaces that axis of --grid)")
    g.add_argument(
        "--grid",
        choices=list(GRIDS),
        default="default",
        help="small: ~25 configs; default: ~75; full: ~1000 (default default)",
    )
    g.add_argument(
        "--policies",
        type=lambda t: tuple(x for x in t.split(",") if x),
        default=None,
        help=f"comma-separated: {', '.join(policies.REGISTRY)} (default: "
        f"{families.per_family_text('TUNE_POLICIES', ',', otherwise=grids_own)}; "
        f"the default grid's: {','.join(GRIDS['default'].policies)})",
    )
    g.add_argument("--block-lengths", type=_ints, default=None, help="dual / prefix block lengths, e.g. 16,32,64")
    g.add_argument("--thresholds", type=_floats, default=None, help="e.g. 0.95,0.9,0.8")
    g.add_argument(
        "--branch-sets",
        type=_branch_sets,
        default=None,
        help="blockbatch branch sets, e.g. '4/8/16/32/64/128 16/32/64'",
    )
    g.add_argument("--merge-gates", type=_floats, default=None, help="blockbatch merge gates, e.g. 0.5,0.9")
    g.add_argument("--eos-exit", type=_on_off, default=None, help="blockbatch EOS exit: on, off or on,off")
    g.add_argument(
        "--refresh",
        type=_refresh,
        default=None,
        help="blockbatch refresh_tokens values; 'block': the smallest branch size (e.g. 32,block)",
    )
    g.add_argument(
        "--sync-refresh", type=_on_off, default=None, help="blockbatch sync_refresh variant: on, off or off,on"
    )
    g.add_argument("--refresh-intervals", type=_ints, default=None, help="window: steps per phase, e.g. 8,16,32")
    g.add_argument("--active-tokens", type=_ints, default=None, help="window: masks a pruned step computes, e.g. 8,16")
    g.add_argument("--window-tokens", type=_ints, default=None, help="window: masks kept as keys, e.g. 32,64,127")
    p.add_argument(
        "--out",
        default="results/tune",
        help="output folder: tune.json, tune.png (tune_<FILE>.png with --step-time FILE), preset.json "
        "(default results/tune)",
    )
    p.add_argument("--fresh", action="store_true", help="start over instead of resuming --out's tune.json")
    p.add_argument(
        "--time-budget",
        type=positive_float,
        default=None,
        metavar="SECONDS",
        help="start no config after this many seconds (one at least; rerun to continue)",
    )
    p.add_argument(
        "--step-time",
        default="measure",
        metavar="FILE|measure",
        help="step-time model: 'measure' (on this machine and model, ~3 s) or a JSON (a saved model, or "
        "a GPU step benchmark JSON such as docs/bench/gpu/bench_gpu_step.json)",
    )
    p.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default="nfe",
        help="cost the frontier and the choice minimise: mean NFE or modelled time (default nfe)",
    )
    p.add_argument(
        "--max-drop",
        type=float,
        default=0.01,
        help="accuracy the choice may give up against the best config swept (default 0.01)",
    )
    p.add_argument(
        "--pick-policy",
        default=None,
        choices=contract.POLICIES,
        help="choose among this policy's configs only",
    )
    p.add_argument(
        "--write-preset",
        default=None,
        metavar="FILE",
        help="where to write the chosen setting (default OUT/preset.json)",
    )
    p.add_argument("--preset-name", default=None, help="the preset's name (default: tuned-<model>-<policy>)")
    p.add_argument(
        "--max-batch",
        type=positive_int,
        default=1,
        help="decode the tasks of a config N at a time (faster on a CPU; wall time is then per-sample "
        "throughput; tokens and NFE do not change) (default 1)",
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=positive_int, default=None, help="intra-op threads (default: torch's choice)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
    return p


def load_task_set(args: argparse.Namespace):
    """The task set the flags name and how many of its tasks choose (None: all); errors name the flag."""

    if args.n is not None and args.dev is not None:
        raise ValueError("--n and --dev both say how many tasks choose: give one (--dev N --test M holds out M)")
    if args.answer is not None and args.answer_regex is not None:
        raise ValueError("--answer and --answer-regex are two answer checks: give one")
    dev = args.dev or args.n or 100
    n = dev + (args.test or 0)
    if args.lm_eval_task is not None:
        if args.tasks is not None:
            raise ValueError("--tasks and --lm-eval-task are two task sets: give one")
        if args.answer is not None or args.answer_regex is not None:
            raise ValueError("--answer / --answer-regex check --tasks files; an lm-eval task is scored by its metric")
        taskset = tasks.load_lm_eval(args.lm_eval_task, n, args.include_path, args.lm_eval_metric, args.lm_eval_filter)
    else:
        for flag, value in (
            ("--include-path", args.include_path),
            ("--lm-eval-metric", args.lm_eval_metric),
            ("--lm-eval-filter", args.lm_eval_filter),
        ):
            if value is not None:
                raise ValueError(f"{flag} goes with --lm-eval-task NAME")
        if args.tasks is None:
            if args.answer is not None or args.answer_regex is not None:
                raise ValueError("--answer / --answer-regex check a --tasks file; the toy task has its own check")
            taskset = tasks.load_toy(n)
        else:
            check = (
                tasks.AnswerCheck("regex", args.answer_regex)
                if args.answer_regex is not None
                else tasks.AnswerCheck(args.answer or "exact")
            )
            taskset = tasks.load_jsonl(args.tasks, n, check, answers_optional=True)
    what = f"--tasks {args.tasks}" if args.tasks else f"--lm-eval-task {args.lm_eval_task}" if args.lm_eval_task else ""
    if args.no_chat:
        raw = [s if s.encoding == "harness" else dataclasses.replace(s, encoding="raw") for s in taskset.samples]
        taskset.samples = raw
    if not taskset.samples:
        raise ValueError(f"{what}: holds no tasks")
    if args.test is not None and len(taskset.samples) < n:
        raise ValueError(
            f"{what}: holds {taskset.available} tasks; --dev {dev} --test {args.test} needs {n} "
            f"(the test tasks come after the dev tasks)"
        )
    if len(taskset.samples) < n and not args.quiet:
        print(f"note: {what} holds {len(taskset.samples)} tasks; tuning on all of them", file=sys.stderr)
    return taskset, (dev if args.test else None)


def _check_answers_decodable(engine, samples, source: str) -> None:
    """Text answers need the checkpoint's tokenizer to turn the generation into text."""
    if engine.codec is None:
        for i, s in enumerate(samples):
            if s.check is not None and not isinstance(s.answer, list) and source != "toy":
                raise ValueError(
                    f"{source}: task {i + 1} has a text answer but the checkpoint has no tokenizer.json to decode "
                    'generations into text: give "answer" as token ids'
                )
            if isinstance(s.prompt, str):
                raise ValueError(
                    f'{source}: task {i + 1} gives a text prompt but the checkpoint has no tokenizer.json: give "ids"'
                )


def preset_evidence(data: dict, chosen: str, args: argparse.Namespace, engine, key: str) -> dict:
    """What a tuned preset was measured on: the model, the task set (source, hash, check, sizes),
    the config and its scores on the dev tasks (which chose it) and on the test tasks (which did not)."""
    from ..tune import split

    p = data["configs"][chosen]
    setup = data["setup"]

    def scores(rec: dict, n: int) -> dict:
        return {
            "n": n,
            "accuracy": rec["accuracy"],
            "mean_nfe": rec["mean_nfe"],
            "mean_query_tokens": rec["mean_query_tokens"],
            "mean_model_ms": rec["mean_model_ms"],
        }

    return {
        "config": chosen,
        "objective": args.objective,
        "max_drop": args.max_drop,
        "model": {"path": str(args.model or "toy"), "family": engine.config.family, **_model_hash(args.model)},
        "tasks": {
            "source": setup["tasks"],
            "sha256": setup.get("tasks_sha256"),
            "check": setup.get("check", data["scored_by"]),
            "n": setup["n"],
        },
        "gen_length": setup["gen_length"],
        "dev": scores(p, split(setup)),
        "test": scores(p["test"], int(setup["test"])) if "test" in p else None,
        "accuracy": p["accuracy"],  # dev, as the fields above (kept for older readers)
        "mean_nfe": p["mean_nfe"],
        "mean_model_ms": p["mean_model_ms"],
        "step_time": data["step_time"]["source"],
        "setup": setup,
        "frontier": frontier(data["configs"], key),
    }


def _model_hash(model: str | None) -> dict:
    """The checkpoint's config.json hash (the weights are too big to hash on every run)."""
    import hashlib

    from ..toy import checkpoint_path

    folder = model or checkpoint_path()
    try:
        with open(os.path.join(folder, "config.json"), "rb") as f:
            return {"config_sha256": hashlib.sha256(f.read()).hexdigest()}
    except OSError:
        return {}


def run(args: argparse.Namespace) -> int:
    import torch

    from .. import families, presets, steptime
    from ..engine import Engine

    if args.threads:
        torch.set_num_threads(args.threads)
    _check_outputs(args)  # before the model loads and long before the sweep
    engine = Engine.from_pretrained(args.model, device=args.device)
    if args.policies is None:  # the family's own where it has one (LLaDA2: block), else the grid's
        args.policies = families.of(engine.config).TUNE_POLICIES
    # The family's own axes (SDAR: its unmasking rules), under the flags given.
    base = dataclasses.replace(GRIDS[args.grid], **families.of(engine.config).TUNE_GRID)
    grid = dataclasses.replace(
        base,
        **{
            k: v
            for k, v in (
                ("policies", args.policies),
                ("block_lengths", args.block_lengths),
                ("thresholds", args.thresholds),
                ("branch_sets", args.branch_sets),
                ("merge_gates", args.merge_gates),
                ("eos_exit", args.eos_exit),
                ("refresh", args.refresh),
                ("sync_refresh", args.sync_refresh),
                ("refresh_intervals", args.refresh_intervals),
                ("active_tokens", args.active_tokens),
                ("window_tokens", args.window_tokens),
            )
            if v is not None
        },
    )
    specs = configs(grid, args.gen_length)
    if not specs:
        raise ValueError(
            f"the grid has no config for --gen-length {args.gen_length} (no block length or branch set divides it)"
        )
    taskset, dev = load_task_set(args)
    samples = taskset.samples
    _check_answers_decodable(engine, samples, taskset.source)
    if args.step_time == "measure":
        L = max(tasks.encode(engine, s).numel() for s in samples) + args.gen_length
        step_model = steptime.measure(engine.model, lengths=(L, 2 * L))
    else:
        step_model = steptime.load(args.step_time)
    os.makedirs(args.out, exist_ok=True)
    out_json = os.path.join(args.out, "tune.json")
    setup = setup_key(
        args.model or "toy",
        taskset.source,
        samples,
        len(samples),
        args.gen_length,
        dev=dev,
        tasks_sha256=taskset.sha256,
        scored_by=taskset.scored_by if all(s.check is not None for s in samples) else "reference",
    )
    _check_outputs(args)  # again: files may have appeared while the model loaded and the tasks were read
    # SIGTERM, SIGHUP, ... stop the sweep as Ctrl-C does: the configs done are saved (blockbatch.outputs)
    with outputs.signals_as_interrupt() as signals:
        data = run_tune(
            engine,
            samples,
            specs,
            args.gen_length,
            out_json,
            setup,
            step_model,
            args.time_budget,
            progress=not args.quiet,
            fresh=args.fresh,
            max_batch=args.max_batch,
        )
    key = cost_key(args.objective)
    # A sweep cut short (Ctrl-C, a signal, --time-budget) chooses nothing: a preset chosen from
    # some of the configs would look like the sweep's answer (and replace a complete one).
    partial = bool(data["remaining"])
    chosen = None if partial else choose(data["configs"], key, args.max_drop, args.pick_policy)
    print(format_report(data, args.objective, chosen))
    print(f"wrote {out_json}")
    png = save_plot(data, _plot_path(args), chosen, "--out")
    if png:
        print(f"wrote {png}")
    preset_path = args.write_preset or os.path.join(args.out, "preset.json")
    if chosen is not None:
        p = data["configs"][chosen]
        path = args.write_preset or os.path.join(args.out, "preset.json")
        model_name = os.path.basename(str(args.model or "toy").rstrip("/"))
        name = args.preset_name or f"tuned-{model_name}-{p['policy']}"
        opts = {k: v for k, v in p["options"].items() if k != "gen_length"}
        presets.write(
            path,
            name,
            opts,
            description=f"chosen by blockbatch tune: {chosen}",
            evidence=preset_evidence(data, chosen, args, engine, key),
            flag="--write-preset" if args.write_preset else "--out",
        )
        print(f"wrote {path} (preset {name!r}: {chosen})")
    if partial:
        left = len(data["remaining"])
        done = len(specs) - left
        stopped = data["stopped"] or "stopped"
        if stopped == "interrupted" and signals.name != "SIGINT":
            stopped += f" ({signals.name})"
        kept = (
            f"{preset_path} keeps its earlier content" if os.path.lexists(preset_path) else f"{preset_path} not written"
        )
        print(
            f"{stopped}: {done} of {len(specs)} configs done, {left} left; no preset written from a partial "
            f"sweep ({kept}); rerun the same command to continue",
            file=sys.stderr,
        )
        return signals.exit_status if data["stopped"] == "interrupted" else 0
    return 0


def _plot_path(args: argparse.Namespace) -> str:
    stem = (
        "tune" if args.step_time == "measure" else "tune_" + os.path.splitext(os.path.basename(args.step_time))[0]
    )  # one plot per time source
    return os.path.join(args.out, stem + ".png")


def _check_outputs(args: argparse.Namespace) -> None:
    """--out (tune.json, the plot, preset.json) and --write-preset against the one output-file
    rule (blockbatch.outputs): none may be an input of the run (--tasks, --step-time FILE, a file
    of --include-path), a file of the model's checkpoint folder, another of the run's outputs
    (--write-preset OUT/tune.json would lose the sweep) or an existing FIFO / device / directory,
    and each folder must be there and writable. Errors name the flag and the path."""
    inputs = [("--tasks", args.tasks)]
    if args.step_time != "measure":
        inputs.append(("--step-time", args.step_time))
    protected = [("the model folder", model_folder(args.model))]
    if args.include_path:
        protected.append(("--include-path", args.include_path))
    names = ["tune.json", os.path.basename(_plot_path(args))] + ([] if args.write_preset else ["preset.json"])
    outputs.check_output_folder(args.out, "--out", names, inputs=inputs, protected=protected)
    if args.write_preset:
        outputs.check_output(
            args.write_preset,
            "--write-preset",
            inputs=inputs,
            protected=protected,
            others=[("--out's", os.path.join(args.out, n)) for n in names],
        )
