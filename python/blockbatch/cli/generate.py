"""``blockbatch generate``: decode prompts (or a JSONL file of requests, ``--input``) with a policy
and print each text with a one-line stats summary (or JSON)."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from .. import outputs, policies, settings
from . import option_flags
from ..engine import DTYPES
from ..options import MAX_N
from ..errors import UnknownCharactersError
from ..tasks import jsonl_text, prompt_field
from .common import (
    UsageError,
    int_in,
    model_folder,
    one_line,
    option_values,
    parse_ids,
    positive_int,
    preset_help,
    summary_line,
)


def run(args: argparse.Namespace) -> int:
    from ..engine import Engine
    from ..options import DecodeOptions

    from .. import families
    from ..config import ModelConfig
    from ..loading import CONFIG_NAME

    # The model family's defaults (LLaDA2: policy 'block') sit under the flags: read its config first.
    config_path = os.path.join(args.model, CONFIG_NAME) if args.model else ""
    family = families.default_options(ModelConfig.from_json_file(config_path)) if os.path.isfile(config_path) else {}
    values = option_values(args, family)
    steps, threshold, factor = values["steps"], values["threshold"], values["factor"]
    steps_bound_confidence = policies.get(values["policy"]).STEPS_WITH_CONFIDENCE
    if not steps_bound_confidence and steps is not None and (threshold is not None or factor is not None):
        rule = f"--factor {factor}" if factor is not None else f"--threshold {threshold}"
        raise UsageError(
            f"--steps {steps} is used only by the fixed schedule, but {rule} commits by "
            f"confidence and would ignore it: pass --threshold none with --steps {steps}"
            + (" and drop --factor" if factor is not None else "")
        )
    options = DecodeOptions(**values)  # ValueError naming the bad option
    if args.input is not None:
        if args.prompts:
            raise UsageError("pass either PROMPTs or --input FILE, not both")
        if args.n != 1:
            raise UsageError(
                f"--n {args.n} applies to PROMPTs only: with --input each JSONL line is one request, decoded once"
            )
        _check_output(args)
        engine = Engine.from_pretrained(args.model, device=args.device, dtype=DTYPES[args.dtype])
        return _generate_jsonl(engine, args, options)
    if not args.prompts:
        raise UsageError("no PROMPT given (or pass --input FILE with JSONL requests)")
    prompts = [p if not args.ids else parse_ids(p, f"PROMPT {i + 1}") for i, p in enumerate(args.prompts)]
    engine = Engine.from_pretrained(args.model, device=args.device, dtype=DTYPES[args.dtype])
    chat = False if args.no_chat else None
    try:
        results = engine.generate(
            prompts,
            options,
            chat=chat,
            progress=not args.json and len(prompts) > 1,
            allow_unknown=args.allow_unknown,
            max_batch=args.max_batch,
            n=args.n,
        )
    except UnknownCharactersError as e:
        raise UsageError(f"{e}; pass --allow-unknown to decode it anyway") from None
    # --n N: each prompt's N generations in a row, generation i decoded with --seed + i
    for k, gen in enumerate(results):
        prompt, i = args.prompts[k // args.n], k % args.n
        if args.json:
            record = {"prompt": prompt, "text": gen.text, "ids": gen.ids, "stats": gen.stats}
            if gen.logprobs is not None:
                record["logprobs"] = logprob_records(engine, gen)
            if args.n > 1:
                record = {"prompt": prompt, "choice": i, "seed": options.seed + i, **record}
            print(json.dumps(record))
        else:
            label = f"{prompt!r}" + (f" #{i} (seed {options.seed + i})" if args.n > 1 else "")
            print(f"{label} -> {gen.text!r}" if len(args.prompts) > 1 or args.n > 1 else gen.text)
            print("  " + summary_line(gen.stats))
            if gen.logprobs is not None:
                for r in logprob_records(engine, gen):
                    top = " ".join(f"{t['text']!r}:{t['logprob']:.4f}" for t in r["top"])
                    value = "-" if r["logprob"] is None else f"{r['logprob']:.4f}"
                    print(f"  {r['text']!r} {value}" + (f"  top: {top}" if top else ""))
    return 0


def logprob_records(engine, gen) -> list[dict]:
    """``Generation.logprobs`` as JSON records: per token its id, its text (the token decoded alone;
    "" without a tokenizer), its log-probability (None for a token no step committed, a mask left
    undecoded) and its top alternatives (id, text, log-prob)."""

    def text(i: int) -> str:
        return engine.codec.decode([i]) if engine.codec else ""

    return [
        {
            "id": t.token,
            "text": text(t.token),
            "logprob": None if math.isnan(t.logprob) else t.logprob,  # a token no step committed: null, valid JSON
            "top": [{"id": i, "text": text(i), "logprob": v} for i, v in t.top],
        }
        for t in gen.logprobs
    ]


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)  # also through a symbolic or hard link
    except OSError:  # one does not exist (yet)
        return False


def _check_output(args: argparse.Namespace) -> None:
    """--output against the one output-file rule (blockbatch.outputs), before the model loads:
    not --input (by name, link or stdin), not the --preset file read, not a file of the model's
    checkpoint folder, a regular file (or a FIFO / character device to stream to) in a writable
    folder. '-' (stdout) is allowed."""
    if args.output == "-":
        return
    same = _same_file(args.input, args.output) if args.input != "-" else _stdin_is(args.output)
    if same:
        raise UsageError(
            f"--input {args.input} and --output {args.output} are the same file: the results "
            f"would replace the requests; write them to another file"
        )
    preset = args.preset if args.preset and os.path.exists(args.preset) else None
    try:
        outputs.check_output(
            args.output,
            "--output",
            inputs=[("--input", args.input), ("--preset", preset)],
            protected=[("the model folder", model_folder(args.model))],
            stream=True,
        )
    except outputs.OutputError as e:
        raise UsageError(str(e)) from None


def _line_request(text: str, line: int):
    """(id, prompt or ids, which) of one JSONL line; ValueError / TypeError saying what is wrong."""
    try:
        req = json.loads(text)
    except RecursionError:
        raise ValueError("not valid JSON (nested too deeply)") from None
    if not isinstance(req, dict):
        raise ValueError("expected a JSON object")
    rid = req.get("id", line)
    try:
        return rid, prompt_field(req)
    except ValueError as e:
        raise _LineError(rid, str(e)) from None


class _LineError(ValueError):
    """A line's error once its id is known."""

    def __init__(self, rid, message: str):
        super().__init__(message)
        self.rid = rid


def _generate_jsonl(engine, args: argparse.Namespace, options) -> int:
    """--input JSONL -> --output JSONL. On the CPU the requests go to one batching scheduler (up to
    --max-batch decode together, new ones join as others finish, at most 4 x max-batch read ahead);
    each result line is written and flushed the moment its request finishes. A bad line (not
    UTF-8, not JSON, bad ids) or a request that fails gives an error line (with its line number)
    and a note on stderr, and the others go on. On CUDA the requests decode one by one, in order.
    --output follows the one output-file rule (blockbatch.outputs): checked before the work,
    replaced at the end by the whole lines written (also on Ctrl-C, SIGTERM, SIGHUP, a full disk)."""
    import queue
    import time

    name = "stdin" if args.input == "-" else args.input
    _check_output(args)  # again: the file may have changed while the model loaded
    try:
        src = sys.stdin.buffer if args.input == "-" else open(args.input, "rb")  # bytes: each line decoded here
    except OSError as e:
        raise UsageError(f"--input {args.input}: {e.strerror}") from None
    try:
        out = outputs.AtomicFile(args.output, "--output", lines=True, stream=True)
    except BaseException:
        if src is not sys.stdin.buffer:
            src.close()
        raise
    chat = False if args.no_chat else None
    done = failed = tokens = 0
    t0 = time.perf_counter()

    def emit(record: dict) -> None:
        out.write(json.dumps(record) + "\n")

    def progress() -> None:
        rate = tokens / max(time.perf_counter() - t0, 1e-9)
        sys.stderr.write(f"\r{done} done, {failed} failed, {rate:.1f} generated tokens/s")
        sys.stderr.flush()

    def bad(line: int, rid, message: str) -> None:
        nonlocal failed
        failed += 1
        sys.stderr.write(f"\rerror: {name}:{line}: {message}\n")
        emit({"id": rid, "line": line, "error": message})
        progress()

    def good(rid, g) -> None:
        nonlocal done, tokens
        done += 1
        tokens += len(g.ids)
        record = {"id": rid, "text": g.text, "ids": g.ids, "nfe": g.stats["nfe"], "wall_ms": g.stats["wall_ms"]}
        if g.logprobs is not None:
            record["logprobs"] = logprob_records(engine, g)
        emit(record)
        progress()

    def requests():
        for line, raw in enumerate(src, 1):
            rid = line
            try:
                text = jsonl_text(raw, line)
                if not text.strip():
                    continue
                rid, (prompt, which) = _line_request(text, line)
                ids = engine.encode(prompt, chat, allow_unknown=args.allow_unknown, name=which)
            except _LineError as e:
                bad(line, e.rid, one_line(e))
                continue
            except Exception as e:  # noqa: BLE001 - any bad line is its error line, the others go on
                bad(line, rid, one_line(e))
                continue
            yield line, rid, ids

    sched = None
    finished_normally = False
    guard = outputs.signals_as_interrupt()  # SIGTERM, SIGHUP, ...: as Ctrl-C (blockbatch.outputs)
    signals = guard.__enter__()
    try:
        if not engine.batches:
            for line, rid, ids in requests():
                try:
                    good(rid, engine.generate([ids], options)[0])
                except Exception as e:  # noqa: BLE001 - a request that fails is its error line
                    bad(line, rid, one_line(e))
        else:
            finished: queue.SimpleQueue = queue.SimpleQueue()
            max_length = args.max_length or min(engine.config.max_sequence_length, options.gen_length + 1024)
            sched = engine.scheduler(max_batch=args.max_batch, max_length=max_length)
            pending: dict[int, tuple] = {}

            def collect(block: bool) -> None:
                while pending:
                    try:
                        event = finished.get(timeout=None if block else 0)
                    except queue.Empty:
                        return
                    if not event.final:
                        continue
                    line, rid, ids = pending.pop(event.request_id)
                    if event.kind == "finished":
                        good(rid, engine._generation(ids, event.output))
                    else:
                        bad(line, rid, one_line(event.error))
                    block = False

            for line, rid, ids in requests():
                try:
                    request = sched.submit(ids, options, callback=finished.put)
                except Exception as e:  # noqa: BLE001 - a request the scheduler refuses is its error line
                    bad(line, rid, one_line(e))
                    continue
                pending[request.id] = (line, rid, ids)
                collect(block=len(pending) >= 4 * args.max_batch)  # read ahead at most 4 x max-batch
            while pending:
                collect(block=True)
        finished_normally = True
    except KeyboardInterrupt:
        by = "" if signals.name == "SIGINT" else f" ({signals.name})"
        sys.stderr.write(f"\ninterrupted: {done} results written{by}; the requests still running were dropped\n")
        return signals.exit_status
    finally:
        try:
            if sched is not None:
                sched.close()
        finally:
            try:
                # every whole line written is kept (Ctrl-C, a signal, a full disk); a run that
                # failed before any result leaves an existing --output as it was
                if finished_normally or out.lines:
                    out.commit()
                else:
                    out.discard()
            finally:
                guard.__exit__(None, None, None)
                if src is not sys.stdin.buffer:
                    src.close()
    sys.stderr.write("\n")
    return 1 if failed else 0


def _stdin_is(path: str) -> bool:
    """Whether standard input reads the file ``path`` names (``--input - < F --output F``)."""
    try:
        return os.path.samestat(os.fstat(sys.stdin.fileno()), os.stat(path))
    except (OSError, ValueError, AttributeError):  # no such file, stdin closed or not a real file
        return False


def add_parser(sub) -> None:
    p = sub.add_parser(
        "generate",
        help="decode prompts with a policy (default model: the shipped toy model)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Decode each PROMPT with the native engine and print the text plus a one-line stats summary.",
        epilog="examples:\n"
        "  blockbatch generate '72-2=__-3=__-3=__...............?'   (the shipped toy model)\n"
        "  blockbatch generate --policy blockbatch --gen-length 128 PROMPT\n"
        "  blockbatch generate --policy vanilla --threshold none --steps 64 PROMPT   (LLaDA fixed schedule)\n"
        "  blockbatch generate --model /path/to/LLaDA-8B-Instruct --dtype bfloat16 --device cuda 'Hi'\n"
        "\n" + settings.help_text(),
    )
    p.add_argument("prompts", nargs="*", metavar="PROMPT", help="prompt text (or ids with --ids)")
    p.add_argument(
        "--input",
        metavar="FILE",
        default=None,
        help="JSONL requests instead of PROMPTs ('-': stdin): one object per line with \"prompt\" (text) or "
        '"ids" (token ids) and optionally "id"; results go to --output as JSON lines',
    )
    p.add_argument(
        "--output",
        metavar="FILE",
        default="-",
        help="with --input: where the result lines go (default '-': stdout); one line per request "
        "(id, text, ids, nfe, wall_ms; or id, line, error for a bad line), written and flushed as each "
        "request finishes, so in finishing order (Ctrl-C keeps every line written)",
    )
    p.add_argument(
        "--max-batch",
        type=positive_int,
        default=1,
        metavar="N",
        help="decode up to N requests together, their forwards packed into one per step (CPU; each "
        "result equals its decode alone); default 1",
    )
    p.add_argument(
        "--n",
        type=int_in(1, MAX_N, "an integer", f"in [1, {MAX_N}]"),
        default=1,
        metavar="N",
        help=f"generations per PROMPT (at most {MAX_N}), generation i decoded with seed --seed + i: N draws "
        "with --temperature > 0, N equal greedy texts with temperature 0; default 1",
    )
    p.add_argument(
        "--max-length",
        type=positive_int,
        default=None,
        metavar="L",
        help="with --input on the CPU: the longest prompt + gen-length accepted (the shared KV pool's row "
        "length; longer requests get an error line); default gen-length + 1024, at most the model's "
        "max_sequence_length",
    )
    p.add_argument("--model", default=None, help="checkpoint folder (default: the toy model shipped in the package)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--dtype", choices=list(DTYPES), default="float32")
    p.add_argument("--ids", action="store_true", help="prompts are comma-separated token ids")
    p.add_argument("--no-chat", action="store_true", help="do not apply the checkpoint's chat template")
    p.add_argument(
        "--allow-unknown",
        action="store_true",
        help="encode characters outside the tokenizer's vocabulary as its unknown token instead of refusing the prompt",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per prompt (text, ids, all stats)")
    p.add_argument(
        "--preset",
        metavar="NAME|FILE",
        default=None,
        help=preset_help(
            "applied under the decode option flags (a flag given explicitly wins over the "
            "preset, the preset over the defaults)"
        ),
    )
    # One flag per decode option, from the options table (blockbatch.contract): defaults, types,
    # ranges and help text are the table's; the groups' titles are the registries'.
    option_flags.add_arguments(p, _option_groups())
    p.set_defaults(func=run)


def _option_groups() -> dict[str, str]:
    """The titles of the options table's groups, in the table's order: a group named after a family
    or a policy takes that module's ``OPTION_GROUP_HELP``; "decoding" and "runtime" are every policy's."""
    from .. import contract, families, policies

    own = {"decoding": "decoding (every policy; docs/ALGORITHMS.md)", "runtime": "runtime"}
    for registry in (families.REGISTRY, policies.REGISTRY):
        own.update({name: m.OPTION_GROUP_HELP for name, m in registry.items() if m.OPTION_GROUP_HELP})
    groups = dict.fromkeys(o.group for o in contract.OPTIONS)
    missing = [g for g in groups if g not in own]
    if missing:  # a group no registry titles: tests/tools/test_registries.py fails first
        raise RuntimeError(f"option groups without a title: {', '.join(missing)}")
    return {g: own[g] for g in groups}
