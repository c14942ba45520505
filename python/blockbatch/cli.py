"""``blockbatch`` command line.

    blockbatch generate [--model DIR] [--policy P] PROMPT...   decode prompts (default: the shipped toy model)
    blockbatch serve [--model DIR] [--port 8000]   an OpenAI-compatible HTTP server (completions, chat, streaming)
    blockbatch forward --model DIR          load a checkpoint, run one native forward, print logits stats
    blockbatch make-random DIR [--family dream] [--preset dream-7b]
                                            write a random LLaDA or Dream checkpoint (for trying things out)

Run ``blockbatch COMMAND --help`` for every option.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import os
import stat
import sys
import tempfile
import time

import torch

from . import contract, guard, settings
from .errors import UnknownCharactersError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _cmd_forward(args: argparse.Namespace) -> int:
    from .loading import load_checkpoint
    from .native import NativeModel

    t0 = time.perf_counter()
    ckpt = load_checkpoint(args.model)
    model = NativeModel.from_checkpoint(ckpt, dtype=DTYPES[args.dtype])
    load_s = time.perf_counter() - t0
    cfg = ckpt.config
    if args.text is not None:
        if ckpt.tokenizer is None:
            raise UsageError(f"{args.model} has no tokenizer.json; pass --ids instead of --text")
        from .tokenization import TextCodec

        try:
            encoded = TextCodec(ckpt.tokenizer, cfg).encode(args.text, chat=False, allow_unknown=args.allow_unknown)
        except ValueError as e:
            raise UsageError(f"--text: {e}; pass --allow-unknown to run it anyway") from None
        ids = torch.tensor(encoded, dtype=torch.long)
    else:
        ids = torch.tensor(_parse_ids(args.ids, "--ids"), dtype=torch.long)
    if ids.numel() == 0:
        raise UsageError("the input is empty")
    if ids.numel() > cfg.max_sequence_length:
        raise UsageError(f"the input has {ids.numel()} tokens, more than max_sequence_length = "
                         f"{cfg.max_sequence_length}")
    t0 = time.perf_counter()
    logits = model.forward([ids], [torch.arange(ids.numel())])[0]
    fwd_s = time.perf_counter() - t0
    finite = torch.isfinite(logits)
    if not bool(finite.all()):
        nan = int(torch.isnan(logits).sum())
        inf = int(logits.numel() - finite.sum()) - nan
        hint = ("float16 overflows on activations this model produces; run with --dtype float32 or --dtype bfloat16"
                if args.dtype == "float16" else "the weights may hold NaN / inf, or the activations overflow "
                                                "this dtype; try --dtype float32")
        print(f"warning: the logits are not finite ({nan} NaN, {inf} inf of {logits.numel()}): the statistics "
              f"below are meaningless; {hint}", file=sys.stderr)
    probs = logits.double().softmax(-1)
    top = probs.max(-1)
    stats = {
        "model": args.model, "params": sum(t.numel() for t in ckpt.weights.values()), "dtype": args.dtype,
        "layers": cfg.n_layers, "d_model": cfg.d_model, "heads": cfg.n_heads, "kv_heads": cfg.n_kv_heads,
        "vocab": cfg.vocab_size, "tokens": ids.numel(), "logits_mean": logits.mean().item(),
        "logits_std": logits.std().item(), "argmax": top.indices.tolist(),
        "mean_top1_prob": top.values.mean().item(), "load_s": load_s, "forward_ms": fwd_s * 1e3,
    }
    if args.json:
        print(json.dumps(stats))
    else:
        print(f"{args.model}: {stats['params'] / 1e6:.2f}M params, {cfg.n_layers} layers, d={cfg.d_model}, "
              f"heads={cfg.n_heads}/{cfg.n_kv_heads}, vocab={cfg.vocab_size} ({args.dtype}; loaded in {load_s:.2f}s)")
        print(f"logits [{ids.numel()}, {cfg.vocab_size}]: mean {stats['logits_mean']:.4f}, std "
              f"{stats['logits_std']:.4f}, mean top-1 probability {stats['mean_top1_prob']:.4f}; "
              f"forward {stats['forward_ms']:.1f} ms")
        if ckpt.tokenizer is not None:
            print("argmax per position:", repr(ckpt.tokenizer.decode(top.indices.tolist(), skip_special_tokens=False)))
    return 0


class UsageError(Exception):
    """A user error found by the CLI itself: printed as one ``error: ...`` line, exit status 2."""


def _parse_ids(text: str, what: str) -> list[int]:
    ids = []
    for i, item in enumerate(text.split(",")):
        try:
            ids.append(int(item))
        except ValueError:
            raise UsageError(f"{what}: entry {i} ({item.strip()!r}) of {text!r} is not an integer token id; expected "
                             "comma-separated integers") from None
    return ids


def _int_in(low: int, high: int | None, expected: str, bound: str):
    """An argparse type: an integer in [low, high] (high None: unbounded); `expected` names what a
    non-integer should have been, `bound` the range an integer misses."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value

    return parse


_positive_int = _int_in(1, None, "a positive integer", "a positive integer (>= 1)")
_non_negative_int = _int_in(0, None, "an integer >= 0", ">= 0")
_port = _int_in(0, 65535, "a port number", "in [0, 65535]")


def summary_line(stats: dict) -> str:
    """One human line per generation: NFE split, tokens per forward, time (and BlockBatch extras)."""
    committed = sum(stats["committed_per_step"])
    tpf = committed / stats["nfe"] if stats["nfe"] else 0.0
    if stats["policy"] == "blockbatch":
        branches = stats["branches"]
        return (f"[blockbatch {','.join(str(b['block_size']) for b in branches)}] nfe={stats['nfe']} "
                f"(init {stats['nfe_init']} + block {stats['nfe_block']} + refresh {stats['nfe_refresh']}), "
                f"paper NFE {stats['nfe_paper']}, winner block {stats['winner_block_size']}"
                f"{' (EOS exit)' if stats['early_exit'] else ''}, merged {sum(b['merged'] for b in branches)}, "
                f"synced {sum(b['copied'] for b in branches)} tokens, {stats['wall_ms']:.1f} ms")
    block = stats["branches"][0]["block_size"]
    where = f"block {block}" if block else "whole canvas"  # Dream's vanilla sampler has no blocks
    return (f"[{stats['policy']} {where}] nfe={stats['nfe']} "
            f"(full {stats['nfe_full']} + block {stats['nfe_block']}), {tpf:.2f} tokens/forward, "
            f"{stats['wall_ms']:.1f} ms")


def _option_values(args: argparse.Namespace) -> dict:
    """The decode options of ``generate``'s flags; with ``--preset``: the option flags given
    explicitly on top of the preset, the preset on top of the defaults."""
    values = contract.values_from_args(args)
    if args.preset is None:
        return values
    from . import presets

    explicit = {name: values[name] for name in contract.explicit_from_args(args)}
    try:
        return {**values, **presets.values(args.preset, explicit)}
    except (TypeError, ValueError) as e:  # the message names the preset (or its file)
        raise UsageError(f"--preset: {e}") from None


def _preset_names() -> list[str]:
    from . import presets

    return presets.names()


def _preset_help(what: str) -> str:
    """--help of a --preset NAME|FILE flag: the built-in presets and what a preset file is."""
    from . import presets

    names = "; ".join(f"{p.name}: {p.description}" for p in presets.BUILT_IN.values())
    return (f"named decode settings, {what}. NAME is one of: {names}. FILE is a preset file: JSON "
            f"{{\"blockbatch_preset\": {presets.FORMAT}, \"name\": ..., \"options\": {{\"policy\": ..., ...}}}} "
            "as `blockbatch tune --write-preset` writes it. A preset's block sizes that do not divide "
            "gen_length are dropped").replace("%", "%%")


def _cmd_generate(args: argparse.Namespace) -> int:
    from .engine import Engine
    from .options import DecodeOptions

    values = _option_values(args)
    steps, threshold, factor = values["steps"], values["threshold"], values["factor"]
    if steps is not None and (threshold is not None or factor is not None):
        rule = f"--factor {factor}" if factor is not None else f"--threshold {threshold}"
        raise UsageError(f"--steps {steps} is used only by the fixed schedule, but {rule} commits by "
                         f"confidence and would ignore it: pass --threshold none with --steps {steps}"
                         + (" and drop --factor" if factor is not None else ""))
    options = DecodeOptions(**values)  # ValueError naming the bad option
    if args.input is not None:
        if args.prompts:
            raise UsageError("pass either PROMPTs or --input FILE, not both")
        engine = Engine.from_pretrained(args.model, device=args.device, dtype=DTYPES[args.dtype])
        return _generate_jsonl(engine, args, options)
    if not args.prompts:
        raise UsageError("no PROMPT given (or pass --input FILE with JSONL requests)")
    prompts = [p if not args.ids else _parse_ids(p, f"PROMPT {i + 1}") for i, p in enumerate(args.prompts)]
    engine = Engine.from_pretrained(args.model, device=args.device, dtype=DTYPES[args.dtype])
    chat = False if args.no_chat else None
    try:
        results = engine.generate(prompts, options, chat=chat, progress=not args.json and len(prompts) > 1,
                                  allow_unknown=args.allow_unknown, max_batch=args.max_batch)
    except UnknownCharactersError as e:
        raise UsageError(f"{e}; pass --allow-unknown to decode it anyway") from None
    for prompt, gen in zip(args.prompts, results):
        if args.json:
            print(json.dumps({"prompt": prompt, "text": gen.text, "ids": gen.ids, "stats": gen.stats}))
        else:
            print(f"{prompt!r} -> {gen.text!r}" if len(args.prompts) > 1 else gen.text)
            print("  " + summary_line(gen.stats))
    return 0


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)  # also through a symbolic or hard link
    except OSError:  # one does not exist (yet)
        return False


class _JsonlOutput:
    """Where --output's lines go. A regular file (or a new one) is written through a temporary
    file in its folder, renamed over it at the end, also after Ctrl-C or an error: the lines
    written are kept, and an existing file is replaced only by a run's results (never truncated
    first, never left half written). Standard output, FIFOs and devices are written directly."""

    def __init__(self, path: str):
        self.path, self.tmp, self.lines = path, None, 0
        if path == "-":
            self.file = sys.stdout
            return
        try:
            st = os.stat(path)
        except FileNotFoundError:
            st = None
        except OSError as e:
            raise UsageError(f"--output {path}: {e.strerror}") from None
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise UsageError(f"--output {path}: is a directory")
        try:
            if st is not None and not stat.S_ISREG(st.st_mode):
                self.file = open(path, "w", encoding="utf-8")  # a FIFO or device: nothing to replace
                return
            self.target = os.path.realpath(path)  # a symbolic link: replace the file it names
            folder = os.path.dirname(self.target)
            fd, self.tmp = tempfile.mkstemp(prefix=f".{os.path.basename(self.target)}.", suffix=".tmp", dir=folder)
        except OSError as e:
            raise UsageError(f"--output {path}: {e.strerror}") from None
        # The mode the file has, or open() would have given a new one (mkstemp's is 0600).
        if st is not None:
            mode = stat.S_IMODE(st.st_mode)
        else:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.fchmod(fd, mode)
        self.file = os.fdopen(fd, "w", encoding="utf-8")

    def write(self, line: str) -> None:
        self.file.write(line)
        self.file.flush()
        self.lines += 1

    def close(self, keep: bool) -> None:
        """Close; a temporary file is renamed over --output when ``keep`` or a line was written,
        else removed (a run that failed before any result leaves an existing output as it was)."""
        if self.file is sys.stdout:
            self.file.flush()
            return
        try:
            self.file.close()
        finally:
            if self.tmp is not None:
                if keep or self.lines:
                    os.replace(self.tmp, self.target)
                else:
                    os.unlink(self.tmp)


def _decoded_line(raw: bytes, line: int) -> str:
    """A JSONL line's text: UTF-8 (a BOM at the start of the file dropped), else ValueError
    naming the byte and its offset in the line."""
    if line == 1 and raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 text (byte 0x{raw[e.start]:02x} at byte offset {e.start} of the line)") from None


def _line_request(text: str, line: int):
    """(id, prompt or ids, which) of one JSONL line; ValueError / TypeError saying what is wrong."""
    try:
        req = json.loads(text)
    except RecursionError:
        raise ValueError("not valid JSON (nested too deeply)") from None
    if not isinstance(req, dict):
        raise ValueError("expected a JSON object")
    rid = req.get("id", line)
    if ("prompt" in req) == ("ids" in req):
        raise _LineError(rid, 'give exactly one of "prompt" (text) and "ids" (token ids)')
    return rid, (req["prompt"], "prompt") if "prompt" in req else (req["ids"], "ids")


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
    --input and --output may not be the same file; a regular --output is replaced at the end
    (_JsonlOutput)."""
    import queue
    import time

    name = "stdin" if args.input == "-" else args.input
    if args.output != "-":
        same = _same_file(args.input, args.output) if args.input != "-" else _stdin_is(args.output)
        if same:
            raise UsageError(f"--input {args.input} and --output {args.output} are the same file: the results "
                             f"would replace the requests; write them to another file")
    try:
        src = sys.stdin.buffer if args.input == "-" else open(args.input, "rb")  # bytes: each line decoded here
    except OSError as e:
        raise UsageError(f"--input {args.input}: {e.strerror}") from None
    try:
        out = _JsonlOutput(args.output)
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
        emit({"id": rid, "text": g.text, "ids": g.ids, "nfe": g.stats["nfe"], "wall_ms": g.stats["wall_ms"]})
        progress()

    def requests():
        for line, raw in enumerate(src, 1):
            rid = line
            try:
                text = _decoded_line(raw, line)
                if not text.strip():
                    continue
                rid, (prompt, which) = _line_request(text, line)
                ids = engine.encode(prompt, chat, allow_unknown=args.allow_unknown, name=which)
            except _LineError as e:
                bad(line, e.rid, _one_line(e))
                continue
            except Exception as e:  # noqa: BLE001 - any bad line is its error line, the others go on
                bad(line, rid, _one_line(e))
                continue
            yield line, rid, ids

    sched = None
    finished_normally = False
    try:
        if not engine.batches:
            for line, rid, ids in requests():
                try:
                    good(rid, engine.generate([ids], options)[0])
                except Exception as e:  # noqa: BLE001 - a request that fails is its error line
                    bad(line, rid, _one_line(e))
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
                        bad(line, rid, _one_line(event.error))
                    block = False

            for line, rid, ids in requests():
                try:
                    request = sched.submit(ids, options, callback=finished.put)
                except Exception as e:  # noqa: BLE001 - a request the scheduler refuses is its error line
                    bad(line, rid, _one_line(e))
                    continue
                pending[request.id] = (line, rid, ids)
                collect(block=len(pending) >= 4 * args.max_batch)  # read ahead at most 4 x max-batch
            while pending:
                collect(block=True)
        finished_normally = True
    except KeyboardInterrupt:
        sys.stderr.write(f"\ninterrupted: {done} results written; the requests still running were dropped\n")
        return 130
    finally:
        try:
            if sched is not None:
                sched.close()
        finally:
            out.close(keep=finished_normally)
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


def _cmd_bench(args: argparse.Namespace) -> int:
    from . import bench
    from .engine import Engine

    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise UsageError(f"--out {args.out}: exists and is not a directory")
    if args.threads:
        torch.set_num_threads(args.threads)
    policies = {name: bench.policy_options(name, args.gen_length) for name in args.policies}
    samples = bench.load_tasks(args.tasks, args.n)
    if not samples:
        raise UsageError(f"--tasks {args.tasks}: the file holds no tasks")
    engine = Engine.from_pretrained(args.model, device=args.device, dtype=DTYPES[args.dtype])
    result = bench.run_bench(engine, samples, policies, compare_reference=args.compare_reference,
                             progress=not args.quiet)
    print(bench.format_table(result))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "bench.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"environment": bench.environment(), "model": args.model or "toy", "tasks": args.tasks or "toy",
                   "gen_length": args.gen_length,
                   "policies": {k: dataclasses.asdict(v) for k, v in policies.items()}, **result}, f, indent=2)
    print(f"wrote {path}")
    for png in bench.save_plots(result, args.out):
        print(f"wrote {png}")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    import logging

    missing = [m for m in ("fastapi", "uvicorn", "prometheus_client") if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(f"blockbatch serve needs {', '.join(missing)}: pip install fastapi uvicorn prometheus-client "
                         f"(or the package's serve extra)")
    if args.ray_address is not None and args.replicas is None:
        raise UsageError("--ray-address needs --replicas N")
    from .engine import Engine, batches_on
    from .server import check_preset, default_model_name, serve

    preset = None
    if args.preset is not None:
        try:  # read and checked here, once: replicas get the preset itself, not a path to read again
            preset = check_preset(args.preset)
        except (TypeError, ValueError) as e:
            raise UsageError(f"--preset: {e}") from None
    if args.threads:
        torch.set_num_threads(args.threads)
    api_key = _api_key(args)
    try:
        allowed_hosts = guard.parse_allowed_hosts(args.allowed_hosts)
    except ValueError as e:
        raise UsageError(str(e)) from None
    try:
        settings.value("BLOCKBATCH_CUDA_BATCHING")  # a bad value is an error on any --device
        batches = batches_on(args.device)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if not batches:
        raise UsageError("--device cuda: the server decodes on the batching scheduler, which BLOCKBATCH_CUDA_BATCHING=0 "
                         "turns off on CUDA: unset it (packed steps replayed from CUDA graphs, the default) or set "
                         "BLOCKBATCH_CUDA_BATCHING=1 (eager packed steps)")
    # With --replicas each replica loads its own engine on --device; this one only checks the checkpoint.
    engine = Engine.from_pretrained(args.model, device="cpu" if args.replicas is not None else args.device,
                                    dtype=DTYPES[args.dtype])
    if engine.codec is None:
        raise UsageError(f"{args.model}: the checkpoint has no tokenizer.json; the server needs one")
    limit = engine.config.max_sequence_length
    max_length = args.max_length if args.max_length is not None else min(limit, 4096)
    if max_length < 2 or max_length > limit:
        raise UsageError(f"--max-length {max_length}: must be in [2, {limit}] (the model's max_sequence_length)")
    if args.replicas is None or args.device == "cpu":  # the pool each replica (or this server) allocates
        from .scheduler import check_pool

        try:
            check_pool(engine.model.obj, args.max_batch, max_length, args.kv_budget_bytes)
        except (TypeError, ValueError) as e:
            raise UsageError(f"--max-batch {args.max_batch} / --max-length {max_length} / --kv-budget-bytes "
                             f"{args.kv_budget_bytes}: {e}") from None
    name = args.served_model_name or default_model_name(engine)
    max_body = args.max_body_bytes if args.max_body_bytes is not None else guard.default_max_body_bytes(max_length)
    if max_body < 1024:
        raise UsageError(f"--max-body-bytes {max_body}: must be at least 1024")
    if not _loopback(args.host) and api_key is None:
        print(f"warning: serving on {args.host} without an API key: anyone who can reach this address can use "
              "the model (--api-key-file FILE or BLOCKBATCH_API_KEY)", file=sys.stderr)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(message)s")
    if args.replicas is not None:
        if importlib.util.find_spec("ray") is None:
            raise UsageError("blockbatch serve --replicas needs Ray Serve: pip install \"ray[serve]\" (or the "
                             "package's replicas extra)")
        from .ray_serve import serve_replicas

        logging.getLogger("blockbatch.serve").info(
            "serving %s as %r on %d Ray Serve replica(s): max_batch %d, max_queue %d, max_length %d each%s",
            args.model or "the toy model", name, args.replicas, args.max_batch, args.max_queue, max_length,
            (", API key required" if api_key else "") + (f", preset {preset.name}" if preset else ""))
        del engine  # each replica loads its own
        serve_replicas(args.replicas, model=args.model, dtype_name=args.dtype, threads=args.threads, host=args.host,
                       port=args.port, ray_address=args.ray_address, drain_timeout_s=args.drain_timeout,
                       log_level=args.log_level, device=args.device,
                       app_options=dict(served_model_name=name, max_batch=args.max_batch, max_queue=args.max_queue,
                                        max_length=max_length, api_key=api_key, kv_budget_bytes=args.kv_budget_bytes,
                                        preset=preset, max_body_bytes=max_body, allowed_hosts=allowed_hosts,
                                        body_timeout_s=args.body_timeout))
        return 0
    logging.getLogger("blockbatch.serve").info(
        "serving %s as %r: max_batch %d, max_queue %d, max_length %d%s", args.model or "the toy model", name,
        args.max_batch, args.max_queue, max_length,
        (", API key required" if api_key else "") + (f", preset {preset.name}" if preset else ""))
    serve(engine, args.host, args.port, drain_timeout_s=args.drain_timeout, log_level=args.log_level,
          header_timeout_s=args.header_timeout, served_model_name=name, max_batch=args.max_batch,
          max_queue=args.max_queue, max_length=max_length, api_key=api_key, kv_budget_bytes=args.kv_budget_bytes,
          preset=preset, max_body_bytes=max_body, allowed_hosts=allowed_hosts, body_timeout_s=args.body_timeout)
    return 0


def _api_key(args: argparse.Namespace) -> str | None:
    """The server's API key: --api-key, --api-key-file (its first line) or BLOCKBATCH_API_KEY, at
    most one of them; None: no key. A key an HTTP header cannot carry is refused."""
    given = [n for n, v in (("--api-key", args.api_key), ("--api-key-file", args.api_key_file)) if v is not None]
    if len(given) > 1:
        raise UsageError("give --api-key or --api-key-file, not both")
    if args.api_key_file is not None:
        from .errors import open_checked

        try:
            f, size = open_checked(args.api_key_file, "API key file")
        except ValueError as e:
            raise UsageError(f"--api-key-file: {e}") from None
        with f:
            raw = f.read(4096)
        try:
            lines = raw.decode("utf-8").splitlines()
        except UnicodeDecodeError:
            raise UsageError(f"--api-key-file {args.api_key_file}: not UTF-8 text") from None
        key, what = (lines[0] if lines else ""), f"--api-key-file {args.api_key_file}"
    elif args.api_key is not None:
        key, what = args.api_key, "--api-key"
    else:
        key, what = os.environ.get("BLOCKBATCH_API_KEY") or None, "BLOCKBATCH_API_KEY"
        if key is None:
            return None
    try:
        return guard.check_api_key(key, what)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


# Shape flags of make-random -> ModelConfig field, and their defaults per family (Dream: GQA).
_SHAPE_FLAGS = {"d_model": "d_model", "layers": "n_layers", "heads": "n_heads", "kv_heads": "n_kv_heads",
                "mlp": "mlp_hidden_size", "vocab": "vocab_size"}
_SHAPE_DEFAULTS = {"d_model": 128, "layers": 2, "heads": 4, "mlp": 256, "vocab": 256}
PRESETS = {"dream-7b": "dream"}  # preset -> family
_SHARD_BYTES = 5 * 10**9  # presets are written in shards of at most 5 GB, as save_pretrained does


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _make_random_shape(args: argparse.Namespace, family: str) -> dict:
    """ModelConfig fields of the shape make-random writes (the preset's, or the flags' with defaults)."""
    given = [name for name in _SHAPE_FLAGS if getattr(args, name) is not None]
    if args.preset is not None:
        if given:
            raise UsageError(f"--preset {args.preset} fixes the shape; drop "
                             f"{' / '.join(_flag(n) for n in given)} (or drop --preset to choose the shape)")
        from .dream_checkpoint import DREAM_7B

        return dict(DREAM_7B)
    shape = {_SHAPE_FLAGS[n]: getattr(args, n) if getattr(args, n) is not None else _SHAPE_DEFAULTS[n]
             for n in _SHAPE_FLAGS if n != "kv_heads"}
    heads = shape["n_heads"]
    if args.kv_heads is not None:
        shape["n_kv_heads"] = args.kv_heads
    else:  # LLaDA: no GQA by default; Dream: half as many KV heads (GQA, as Dream has)
        shape["n_kv_heads"] = heads // 2 if family == "dream" and heads % 2 == 0 and heads > 1 else heads
    return shape


def _cmd_make_random(args: argparse.Namespace) -> int:
    from .config import ModelConfig
    from .loading import (CONFIG_NAME, INDEX_NAME, TOKENIZER_CONFIG_NAME, TOKENIZER_NAME, WEIGHTS_NAME,
                          expected_weight_shapes)

    family = args.family
    if args.preset is not None:
        if family is not None and family != PRESETS[args.preset]:
            raise UsageError(f"--preset {args.preset} is a {PRESETS[args.preset]} shape, but --family is {family}; "
                             f"drop --family or pass --family {PRESETS[args.preset]}")
        family = PRESETS[args.preset]
    family = family or "llada"
    if os.path.lexists(args.out) and not os.path.isdir(args.out):
        raise UsageError(f"{args.out}: exists and is not a directory; make-random writes a checkpoint folder")
    present = [n for n in (CONFIG_NAME, WEIGHTS_NAME, INDEX_NAME, TOKENIZER_NAME, TOKENIZER_CONFIG_NAME)
               if os.path.lexists(os.path.join(args.out, n))]
    if present and not args.force:
        raise UsageError(f"{args.out}: already holds {', '.join(present)}; pass --force to overwrite that checkpoint")
    shape = _make_random_shape(args, family)
    if family == "dream":
        from .dream_checkpoint import make_random_dream_checkpoint as make, random_dream_config as make_config
    else:
        from .random_checkpoint import make_random_checkpoint as make, random_config as make_config
    config: ModelConfig = make_config(**shape)  # CheckpointError naming a bad size

    dtype = DTYPES[args.dtype]
    params = sum(math.prod(s) for s in expected_weight_shapes(config).values())
    nbytes = params * dtype.itemsize
    memory = _physical_memory()
    if memory and 2 * nbytes > memory:
        what = (f"a {family} checkpoint of shape {args.preset} ({params / 1e9:.2f}B parameters) in {args.dtype}"
                if args.preset else f"a {family} checkpoint of this shape in {args.dtype}")
        if args.preset:
            fix = (f"run it on a machine with at least {2 * nbytes / 2**30:.0f} GiB"
                   + (", or pass --dtype bfloat16 to halve it" if dtype.itemsize > 2 else "")
                   + f", or drop --preset {args.preset} and choose a small shape with --d-model / --layers / --mlp "
                     "/ --vocab")
        else:
            fix = "pass smaller --d-model / --layers / --mlp / --vocab" + (
                " or --dtype bfloat16" if dtype.itemsize > 2 else "")
        raise UsageError(f"{what} is {nbytes / 2**30:.1f} GiB, too large to build in this machine's "
                         f"{memory / 2**30:.1f} GiB of memory (writing it takes about twice its size): {fix}")
    config = make(args.out, seed=args.seed, dtype=dtype, logit_scale=args.logit_scale,
                  max_shard_bytes=_SHARD_BYTES if args.preset and nbytes > _SHARD_BYTES else None, **shape)
    name = "Dream" if family == "dream" else "LLaDA"
    print(f"wrote a random {name} checkpoint{f' (preset {args.preset})' if args.preset else ''} to {args.out}: "
          f"d_model={config.d_model}, layers={config.n_layers}, heads={config.n_heads}/{config.n_kv_heads} (q/kv), "
          f"mlp={config.mlp_hidden_size}, vocab={config.vocab_size}, {params / 1e6:.2f}M parameters in {args.dtype} "
          f"({nbytes / 2**20:.1f} MiB); mask id {config.mask_token_id}, eos id {config.eos_token_id}")
    return 0


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``error: blockbatch bench: argument --n: ...`` (exit 2)."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="blockbatch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser(
        "generate", help="decode prompts with a policy (default model: the shipped toy model)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Decode each PROMPT with the native engine and print the text plus a one-line stats summary.",
        epilog="examples:\n"
               "  blockbatch generate '72-2=__-3=__-3=__...............?'   (the shipped toy model)\n"
               "  blockbatch generate --policy blockbatch --gen-length 128 PROMPT\n"
               "  blockbatch generate --policy vanilla --threshold none --steps 64 PROMPT   (LLaDA fixed schedule)\n"
               "  blockbatch generate --model /path/to/LLaDA-8B-Instruct --dtype bfloat16 --device cuda 'Hi'\n"
               "\n" + settings.help_text())
    p.add_argument("prompts", nargs="*", metavar="PROMPT", help="prompt text (or ids with --ids)")
    p.add_argument("--input", metavar="FILE", default=None,
                   help="JSONL requests instead of PROMPTs ('-': stdin): one object per line with \"prompt\" (text) or "
                        "\"ids\" (token ids) and optionally \"id\"; results go to --output as JSON lines")
    p.add_argument("--output", metavar="FILE", default="-",
                   help="with --input: where the result lines go (default '-': stdout); one line per request "
                        "(id, text, ids, nfe, wall_ms; or id, line, error for a bad line), written and flushed as each "
                        "request finishes, so in finishing order (Ctrl-C keeps every line written)")
    p.add_argument("--max-batch", type=_positive_int, default=1, metavar="N",
                   help="decode up to N requests together, their forwards packed into one per step (CPU; each "
                        "result equals its decode alone); default 1")
    p.add_argument("--max-length", type=_positive_int, default=None, metavar="L",
                   help="with --input on the CPU: the longest prompt + gen-length accepted (the shared KV pool's row "
                        "length; longer requests get an error line); default gen-length + 1024, at most the model's "
                        "max_sequence_length")
    p.add_argument("--model", default=None, help="checkpoint folder (default: the toy model shipped in the package)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--dtype", choices=list(DTYPES), default="float32")
    p.add_argument("--ids", action="store_true", help="prompts are comma-separated token ids")
    p.add_argument("--no-chat", action="store_true", help="do not apply the checkpoint's chat template")
    p.add_argument("--allow-unknown", action="store_true",
                   help="encode characters outside the tokenizer's vocabulary as its unknown token instead of "
                        "refusing the prompt")
    p.add_argument("--json", action="store_true", help="one JSON object per prompt (text, ids, all stats)")
    p.add_argument("--preset", metavar="NAME|FILE", default=None,
                   help=_preset_help("applied under the decode option flags (a flag given explicitly wins over the "
                                     "preset, the preset over the defaults)"))
    # One flag per decode option, from the options table (blockbatch.contract): defaults, types,
    # ranges and help text are the table's.
    contract.add_arguments(p, {"decoding": "decoding (every policy; docs/ALGORITHMS.md)",
                               "dream": "Dream-family samplers (alg: vanilla, both families; the others: Dream only)",
                               "blockbatch": "blockbatch (policy blockbatch only)",
                               "runtime": "runtime"})
    p.set_defaults(func=_cmd_generate)

    p = sub.add_parser(
        "bench", help="accuracy / NFE / time of several policies side by side on a task set",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run a task set under several policies on one checkpoint, interleaved per sample; print a "
                    "table, write JSON (every per-sample record + environment) and PNG plots to --out.",
        epilog="policies: vanilla | prefix | dual | blockbatch, a preset (" + ", ".join(_preset_names()) + ")\n"
               "or a preset file's path, each optionally name:key=value,... (the pairs win over the preset;\n"
               "a preset's block sizes that do not divide --gen-length are dropped), e.g.\n"
               "  blockbatch bench --policies dual blockbatch blockbatch:block_sizes=8/32,sync_gap=4\n"
               "  blockbatch bench --policies dual blockbatch-paper blockbatch-best:threshold=0.8 my-preset.json\n"
               "  blockbatch bench --tasks my.jsonl --model DIR   (lines: {\"prompt\": ..., \"answer\": ...})")
    p.add_argument("--model", default=None, help="checkpoint folder (default: the shipped toy model)")
    p.add_argument("--tasks", default=None, help="JSONL of prompts and answers (default: toy held-out problems)")
    p.add_argument("--n", type=_positive_int, default=200, help="samples (default 200)")
    p.add_argument("--policies", nargs="+", default=["vanilla", "dual", "blockbatch"],
                   help="space-separated policy specs (default: vanilla dual blockbatch): a policy, a preset name "
                        "or a preset file, each optionally with :key=value,... (see below); the table and the JSON "
                        "name each as given")
    p.add_argument("--gen-length", type=int, default=128, help="generation length (default 128)")
    p.add_argument("--compare-reference", action="store_true",
                   help="also run each policy through the pure-PyTorch reference loop and report the speed ratio")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=list(DTYPES), default="float32")
    p.add_argument("--threads", type=_positive_int, default=None, help="intra-op threads (default: torch's choice)")
    p.add_argument("--out", default="results/bench", help="output folder (default results/bench)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser(
        "serve", help="an OpenAI-compatible HTTP server (completions, chat, streaming) on the batching scheduler",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Serve a checkpoint over HTTP with the OpenAI API: POST /v1/completions, POST /v1/chat/completions\n"
                    "(stream or not), GET /v1/models, GET /health, GET /metrics (Prometheus). Requests decode\n"
                    "together on the batching scheduler: up to --max-batch at once, their forwards packed into one per\n"
                    "step; --max-queue more wait (beyond that: 429). max_tokens becomes gen_length (rounded up to a\n"
                    "length the policy decodes) and cuts the text; decode options go in the extra body field\n"
                    "\"blockbatch\": {\"policy\": \"blockbatch\", ...} (or {\"preset\": NAME, ...}; --preset sets\n"
                    "every request's default options). Streaming sends the generation's stable prefix\n"
                    "as it grows. SIGTERM / Ctrl-C drains: running requests finish, new ones get 503, then exit 0\n"
                    "(a second signal stops at once).",
        epilog="examples:\n"
               "  blockbatch serve                                   (the shipped toy model, as 'blockbatch-toy')\n"
               "  blockbatch serve --model /path/to/LLaDA-8B-Instruct --dtype bfloat16 --max-batch 16 --port 8000\n"
               "  blockbatch serve --host 0.0.0.0 --api-key-file key.txt --allowed-hosts llm.example.com\n"
               "                                  (clients send Authorization: Bearer <the file's first line>)\n"
               "  blockbatch serve --replicas 2                      (two engines on Ray Serve, one endpoint)\n"
               "  blockbatch serve --replicas 8 --ray-address auto   (a cluster made with ray start --head / --address)\n"
               "then: curl localhost:8000/v1/completions -H 'Content-Type: application/json' \\\n"
               "        -d '{\"model\": \"blockbatch-toy\", \"prompt\": \"72-2=__-3=__-3=__...............?\", \"max_tokens\": 20}'")
    p.add_argument("--model", default=None, help="checkpoint folder (default: the toy model shipped in the package)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the engine decodes (default cpu); cuda needs BLOCKBATCH_CUDA_BATCHING graphs (the default) "
                        "or 1 (eager steps), not 0; with --replicas each replica reserves one GPU")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0: all)")
    p.add_argument("--port", type=_port, default=8000, help="TCP port (default 8000)")
    p.add_argument("--served-model-name", default=None, metavar="NAME",
                   help="the model id clients send and /v1/models lists (default: the checkpoint folder's name; "
                        "blockbatch-toy for the toy model); another id gets 404")
    p.add_argument("--max-batch", type=_positive_int, default=8, metavar="N",
                   help="requests decoding at once, packed into one forward per step (default 8)")
    p.add_argument("--max-queue", type=_non_negative_int, default=64, metavar="M",
                   help="requests waiting beyond the running ones; more get 429 (default 64)")
    p.add_argument("--max-length", type=_positive_int, default=None, metavar="L",
                   help="longest prompt + gen_length accepted, longer get 413 (default: the model's "
                        "max_sequence_length, at most 4096)")
    p.add_argument("--api-key", default=None, metavar="K",
                   help="require 'Authorization: Bearer K' on the /v1 routes (default: no key; /health and /metrics "
                        "never need one). A key on the command line is visible to other users (ps, /proc): prefer "
                        "--api-key-file or the environment variable BLOCKBATCH_API_KEY")
    p.add_argument("--api-key-file", default=None, metavar="FILE",
                   help="read the API key from the first line of FILE instead of --api-key")
    p.add_argument("--allowed-hosts", default=None, metavar="H[,H...]",
                   help="host names the server answers to (the Host header) besides IP addresses, localhost and this "
                        "machine's names, which it always does; other names get 403, so a web page cannot drive a "
                        "local server through DNS rebinding. '.example.com': a domain and its subdomains; '*': any")
    p.add_argument("--max-body-bytes", type=_positive_int, default=None, metavar="B",
                   help="largest request body; larger get 413 before they are read (default: 1 MiB + 256 bytes "
                        "per position of --max-length)")
    p.add_argument("--header-timeout", type=_positive_float, default=10.0, metavar="S",
                   help="a connection must send a whole request head within S seconds of opening (or of its last "
                        "response), else 408 and closed (default 10)")
    p.add_argument("--body-timeout", type=_positive_float, default=30.0, metavar="S",
                   help="a request body must arrive within S seconds, else 408 (default 30)")
    p.add_argument("--kv-budget-bytes", type=_non_negative_int, default=0, metavar="B",
                   help="bytes of the shared KV pool (default 0: room for --max-batch requests with the default "
                        "BlockBatch branches at --max-length)")
    p.add_argument("--dtype", choices=list(DTYPES), default="float32")
    p.add_argument("--threads", type=_positive_int, default=None, help="intra-op threads (default: torch's choice)")
    p.add_argument("--drain-timeout", type=_positive_float, default=60.0, metavar="S",
                   help="on SIGTERM, wait at most S seconds for running requests before cancelling them (default 60)")
    p.add_argument("--log-level", choices=["critical", "error", "warning", "info", "debug"], default="info")
    p.add_argument("--preset", metavar="NAME|FILE", default=None,
                   help=_preset_help("the default decode options of every request: the request's own fields win "
                                     "(a request may name a built-in preset in \"blockbatch\": {\"preset\": NAME}); "
                                     "default: none, the options table's defaults"))
    p.add_argument("--replicas", type=_positive_int, default=None, metavar="N",
                   help="run N engine replicas behind one endpoint on Ray Serve (pip install \"ray[serve]\"): one "
                        "GPU each when torch sees CUDA, else a share of the CPUs; every response names its replica "
                        "in the x-blockbatch-replica header (default: one engine in this process, no Ray)")
    p.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="with --replicas: join a running Ray cluster ('auto', or HEAD:6379 after `ray start --head`) "
                        "instead of starting a local Ray instance (default: local, stopped on exit)")
    p.set_defaults(func=_cmd_serve)

    from . import tune

    tune.add_parser(sub, _positive_int, _positive_float)

    p = sub.add_parser("forward", help="load a checkpoint and print logits statistics of one native forward",
                       description="Load a Hugging Face checkpoint folder (LLaDA or Dream) with blockbatch's strict loader, "
                                   "run one full-canvas native forward and print logits statistics.")
    p.add_argument("--model", required=True, help="checkpoint folder (config.json, *.safetensors, tokenizer.json)")
    p.add_argument("--dtype", choices=list(DTYPES), default="float32", help="weight/compute dtype (default float32)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--text", default=None, help="text to tokenize with the checkpoint's tokenizer")
    src.add_argument("--ids", default="1,2,3,4,5,6,7,8", help="comma-separated token ids (default 1..8)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--allow-unknown", action="store_true",
                   help="with --text: encode characters outside the vocabulary as the unknown token")
    p.set_defaults(func=_cmd_forward)

    p = sub.add_parser(
        "make-random", help="write a random LLaDA or Dream checkpoint folder",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Write a checkpoint with random weights in the exact Hugging Face layout of its family: LLaDA\n"
                    "(model.transformer.*, config.json) or Dream (Qwen2 names with q/k/v biases, config.json with\n"
                    "model_type \"Dream\", generation_config.json). The weights are random: such a checkpoint\n"
                    "exercises loading, the forward and the decoders at a given shape, never answers anything.\n"
                    "The shipped trained toys are python/blockbatch/toy/checkpoint{,_dream}.",
        epilog="examples:\n"
               "  blockbatch make-random /tmp/llada                       (LLaDA, d_model 128, 2 layers, vocab 256)\n"
               "  blockbatch make-random /tmp/dream --family dream        (Dream, same shape, 4 query / 2 KV heads)\n"
               "  blockbatch make-random /tmp/dream --family dream --layers 4 --kv-heads 1\n"
               "  blockbatch make-random /tmp/dream7b --preset dream-7b --dtype bfloat16\n"
               "        (the real Dream-v0-7B shape: 7.6B parameters, about 15 GB in bfloat16, written in 5 GB\n"
               "         shards; refused when the machine has less than about twice that in memory)\n"
               "then e.g.: blockbatch forward --model /tmp/dream")
    p.add_argument("out", help="folder to create (or an empty / new one)")
    p.add_argument("--family", choices=["llada", "dream"], default=None,
                   help="model family and checkpoint layout (default llada; dream with --preset dream-7b)")
    p.add_argument("--preset", choices=list(PRESETS), default=None,
                   help="a published shape instead of the shape flags: dream-7b = Dream-v0-7B (d_model 3584, "
                        "28 layers, 28/4 heads, mlp 18944, vocab 152064); use --dtype bfloat16")
    p.add_argument("--force", action="store_true", help="overwrite a checkpoint already in the folder")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    p.add_argument("--dtype", choices=list(DTYPES), default="float32", help="weight dtype (default float32)")
    shape = p.add_argument_group("shape (without --preset)")
    shape.add_argument("--d-model", type=int, default=None, help=f"hidden size (default {_SHAPE_DEFAULTS['d_model']})")
    shape.add_argument("--layers", type=int, default=None, help=f"default {_SHAPE_DEFAULTS['layers']}")
    shape.add_argument("--heads", type=int, default=None, help=f"query heads (default {_SHAPE_DEFAULTS['heads']})")
    shape.add_argument("--kv-heads", type=int, default=None,
                       help="key/value heads, must divide --heads (default: --heads for llada, no GQA; half of "
                            "--heads for dream)")
    shape.add_argument("--mlp", type=int, default=None, help=f"MLP hidden size (default {_SHAPE_DEFAULTS['mlp']})")
    shape.add_argument("--vocab", type=int, default=None,
                       help=f"vocabulary size; the last id is the mask, the one before EOS (default "
                            f"{_SHAPE_DEFAULTS['vocab']})")
    p.add_argument("--logit-scale", type=float, default=1.0, help="LM-head scale (sharper softmax when larger)")
    p.set_defaults(func=_cmd_make_random)
    return parser


def _one_line(e: BaseException) -> str:
    text = " ".join(line.strip() for line in str(e).strip().splitlines() if line.strip())
    return text or type(e).__name__


def main(argv: list[str] | None = None) -> int:
    """Run the CLI. User errors (bad arguments, checkpoints, prompts, files) print one line
    ``error: ...`` on stderr and return 2; Ctrl-C prints ``interrupted`` and returns 130."""
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except UsageError as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 2
    except (ValueError, RuntimeError, TypeError, OSError, ImportError) as e:
        # CheckpointError, DecodeOptions, TORCH_CHECK (RuntimeError / ValueError), files: one clear line
        if isinstance(e, BrokenPipeError):  # `blockbatch generate ... | head`: stop quietly
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 2
    except MemoryError:
        print("error: out of memory", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
