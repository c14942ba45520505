"""``blockbatch serve``: the OpenAI-compatible HTTP server (``blockbatch.serve``), one engine in
this process or ``--replicas N`` on Ray Serve."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

import torch

from .. import settings
from ..serve import guard
from ..engine import DTYPES
from .common import UsageError, non_negative_int, port, positive_float, positive_int, preset_help


def run(args: argparse.Namespace) -> int:
    import logging

    missing = [m for m in ("fastapi", "uvicorn", "prometheus_client") if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(
            f"blockbatch serve needs {', '.join(missing)}: pip install fastapi uvicorn prometheus-client "
            f"(or the package's serve extra)"
        )
    if args.ray_address is not None and args.replicas is None:
        raise UsageError("--ray-address needs --replicas N")
    from ..engine import Engine, batches_on
    from ..serve import check_preset, default_model_name, serve

    preset = None
    if args.preset is not None:
        try:  # read and checked here, once: replicas get the preset itself, not a path to read again
            preset = check_preset(args.preset)
        except (TypeError, ValueError) as e:
            raise UsageError(f"--preset: {e}") from None
    if args.threads:
        torch.set_num_threads(args.threads)
    api_key = read_api_key(args)
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
        raise UsageError(
            "--device cuda: the server decodes on the batching scheduler, which BLOCKBATCH_CUDA_BATCHING=0 "
            "turns off on CUDA: unset it (packed steps replayed from CUDA graphs, the default) or set "
            "BLOCKBATCH_CUDA_BATCHING=1 (eager packed steps)"
        )
    # With --replicas each replica loads its own engine on --device; this one only checks the checkpoint.
    engine = Engine.from_pretrained(
        args.model, device="cpu" if args.replicas is not None else args.device, dtype=DTYPES[args.dtype]
    )
    if engine.codec is None:
        raise UsageError(f"{args.model}: the checkpoint has no tokenizer.json; the server needs one")
    limit = engine.config.max_sequence_length
    max_length = args.max_length if args.max_length is not None else min(limit, 4096)
    if max_length < 2 or max_length > limit:
        raise UsageError(f"--max-length {max_length}: must be in [2, {limit}] (the model's max_sequence_length)")
    if args.replicas is None or args.device == "cpu":  # the pool each replica (or this server) allocates
        from ..scheduler import check_pool

        try:
            check_pool(engine.model.obj, args.max_batch, max_length, args.kv_budget_bytes, args.kv_page_len)
        except (TypeError, ValueError) as e:
            raise UsageError(
                f"--max-batch {args.max_batch} / --max-length {max_length} / --kv-budget-bytes "
                f"{args.kv_budget_bytes} / --kv-page-len {args.kv_page_len}: {e}"
            ) from None
    name = args.served_model_name or default_model_name(engine)
    max_body = args.max_body_bytes if args.max_body_bytes is not None else guard.default_max_body_bytes(max_length)
    if max_body < 1024:
        raise UsageError(f"--max-body-bytes {max_body}: must be at least 1024")
    if not _loopback(args.host) and api_key is None:
        print(
            f"warning: serving on {args.host} without an API key: anyone who can reach this address can use "
            "the model (--api-key-file FILE or BLOCKBATCH_API_KEY)",
            file=sys.stderr,
        )
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(message)s")
    app_options = dict(  # create_app's, alike for one engine here and for every replica
        served_model_name=name,
        max_batch=args.max_batch,
        max_queue=args.max_queue,
        max_length=max_length,
        api_key=api_key,
        kv_budget_bytes=args.kv_budget_bytes,
        kv_page_len=args.kv_page_len,
        prefix_cache=args.prefix_cache,
        preset=preset,
        max_body_bytes=max_body,
        allowed_hosts=allowed_hosts,
        body_timeout_s=args.body_timeout,
    )
    if args.replicas is not None:
        if importlib.util.find_spec("ray") is None:
            raise UsageError(
                'blockbatch serve --replicas needs Ray Serve: pip install "ray[serve]" (or the '
                "package's replicas extra)"
            )
        from ..serve.replicas import serve_replicas

        logging.getLogger("blockbatch.serve").info(
            "serving %s as %r on %d Ray Serve replica(s): max_batch %d, max_queue %d, max_length %d each%s",
            args.model or "the toy model",
            name,
            args.replicas,
            args.max_batch,
            args.max_queue,
            max_length,
            (", API key required" if api_key else "") + (f", preset {preset.name}" if preset else ""),
        )
        del engine  # each replica loads its own
        serve_replicas(
            args.replicas,
            model=args.model,
            dtype_name=args.dtype,
            threads=args.threads,
            host=args.host,
            port=args.port,
            ray_address=args.ray_address,
            drain_timeout_s=args.drain_timeout,
            log_level=args.log_level,
            device=args.device,
            app_options=app_options,
        )
        return 0
    logging.getLogger("blockbatch.serve").info(
        "serving %s as %r: max_batch %d, max_queue %d, max_length %d%s",
        args.model or "the toy model",
        name,
        args.max_batch,
        args.max_queue,
        max_length,
        (", API key required" if api_key else "") + (f", preset {preset.name}" if preset else ""),
    )
    serve(
        engine,
        args.host,
        args.port,
        drain_timeout_s=args.drain_timeout,
        log_level=args.log_level,
        header_timeout_s=args.header_timeout,
        **app_options,
    )
    return 0


def read_api_key(args: argparse.Namespace) -> str | None:
    """The server's API key: --api-key, --api-key-file (its first line) or BLOCKBATCH_API_KEY, at
    most one of them; None: no key. A key an HTTP header cannot carry is refused."""
    given = [n for n, v in (("--api-key", args.api_key), ("--api-key-file", args.api_key_file)) if v is not None]
    if len(given) > 1:
        raise UsageError("give --api-key or --api-key-file, not both")
    key: str | None
    if args.api_key_file is not None:
        from ..errors import open_checked

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


def add_parser(sub) -> None:
    p = sub.add_parser(
        "serve",
        help="an OpenAI-compatible HTTP server (completions, chat, streaming) on the batching scheduler",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Serve a checkpoint over HTTP with the OpenAI API: POST /v1/completions, "
        "POST /v1/chat/completions\n"
        "(stream or not), GET /v1/models, GET /health, GET /metrics (Prometheus). Requests decode\n"
        "together on the batching scheduler: up to --max-batch at once, their forwards packed into one per\n"
        "step; --max-queue more wait (beyond that: 429). max_tokens becomes gen_length (rounded up to a\n"
        "length the policy decodes) and cuts the text; decode options go in the extra body field\n"
        '"blockbatch": {"policy": "blockbatch", ...} (or {"preset": NAME, ...}; --preset sets\n'
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
        '        -d \'{"model": "blockbatch-toy", "prompt": "72-2=__-3=__-3=__...............?", "max_tokens": 20}\'',
    )
    p.add_argument("--model", default=None, help="checkpoint folder (default: the toy model shipped in the package)")
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where the engine decodes (default cpu); cuda needs BLOCKBATCH_CUDA_BATCHING graphs (the default) "
        "or 1 (eager steps), not 0; with --replicas each replica reserves one GPU",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0: all)")
    p.add_argument("--port", type=port, default=8000, help="TCP port (default 8000)")
    p.add_argument(
        "--served-model-name",
        default=None,
        metavar="NAME",
        help="the model id clients send and /v1/models lists (default: the checkpoint folder's name; "
        "blockbatch-toy for the toy model); another id gets 404",
    )
    p.add_argument(
        "--max-batch",
        type=positive_int,
        default=8,
        metavar="N",
        help="requests decoding at once, packed into one forward per step (default 8)",
    )
    p.add_argument(
        "--max-queue",
        type=non_negative_int,
        default=64,
        metavar="M",
        help="requests waiting beyond the running ones; more get 429 (default 64)",
    )
    p.add_argument(
        "--max-length",
        type=positive_int,
        default=None,
        metavar="L",
        help="longest prompt + gen_length accepted, longer get 413 (default: the model's "
        "max_sequence_length, at most 4096)",
    )
    p.add_argument(
        "--api-key",
        default=None,
        metavar="K",
        help="require 'Authorization: Bearer K' on the /v1 routes (default: no key; /health and /metrics "
        "never need one). A key on the command line is visible to other users (ps, /proc): prefer "
        "--api-key-file or the environment variable BLOCKBATCH_API_KEY",
    )
    p.add_argument(
        "--api-key-file",
        default=None,
        metavar="FILE",
        help="read the API key from the first line of FILE instead of --api-key",
    )
    p.add_argument(
        "--allowed-hosts",
        default=None,
        metavar="H[,H...]",
        help="host names the server answers to (the Host header) besides IP addresses, localhost and this "
        "machine's names, which it always does; other names get 403, so a web page cannot drive a "
        "local server through DNS rebinding. '.example.com': a domain and its subdomains; '*': any",
    )
    p.add_argument(
        "--max-body-bytes",
        type=positive_int,
        default=None,
        metavar="B",
        help="largest request body; larger get 413 before they are read (default: 1 MiB + 256 bytes "
        "per position of --max-length)",
    )
    p.add_argument(
        "--header-timeout",
        type=positive_float,
        default=10.0,
        metavar="S",
        help="a connection must send a whole request head within S seconds of opening (or of its last "
        "response), else 408 and closed (default 10)",
    )
    p.add_argument(
        "--body-timeout",
        type=positive_float,
        default=30.0,
        metavar="S",
        help="a request body must arrive within S seconds, else 408 (default 30)",
    )
    p.add_argument(
        "--kv-budget-bytes",
        type=non_negative_int,
        default=0,
        metavar="B",
        help="bytes of the shared KV pool (default 0: room for --max-batch requests with the default "
        "BlockBatch branches at --max-length)",
    )
    p.add_argument(
        "--kv-page-len",
        type=int,
        default=-1,
        metavar="N",
        help="the KV pool's layout: pages of N positions, each request holding the pages of its own canvas "
        "(needed by share_prompt_kv); 0: dense rows of --max-length; default -1: pages of 16 on the CPU, "
        "dense rows on CUDA",
    )
    p.add_argument(
        "--no-prefix-cache",
        dest="prefix_cache",
        action="store_false",
        help="do not keep the K/V of earlier requests' complete prompt blocks for later requests with the same "
        "prompt start (block-causal models, LLaDA2; on by default: the same tokens, less prefill)",
    )
    p.add_argument("--dtype", choices=list(DTYPES), default="float32")
    p.add_argument("--threads", type=positive_int, default=None, help="intra-op threads (default: torch's choice)")
    p.add_argument(
        "--drain-timeout",
        type=positive_float,
        default=60.0,
        metavar="S",
        help="on SIGTERM, wait at most S seconds for running requests before cancelling them (default 60)",
    )
    p.add_argument("--log-level", choices=["critical", "error", "warning", "info", "debug"], default="info")
    p.add_argument(
        "--preset",
        metavar="NAME|FILE",
        default=None,
        help=preset_help(
            "the default decode options of every request: the request's own fields win "
            '(a request may name a built-in preset in "blockbatch": {"preset": NAME}); '
            "default: none, the options table's defaults"
        ),
    )
    p.add_argument(
        "--replicas",
        type=positive_int,
        default=None,
        metavar="N",
        help='run N engine replicas behind one endpoint on Ray Serve (pip install "ray[serve]"): one '
        "GPU each when torch sees CUDA, else a share of the CPUs; every response names its replica "
        "in the x-blockbatch-replica header (default: one engine in this process, no Ray)",
    )
    p.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDR",
        help="with --replicas: join a running Ray cluster ('auto', or HEAD:6379 after `ray start --head`) "
        "instead of starting a local Ray instance (default: local, stopped on exit)",
    )
    p.set_defaults(func=run)
