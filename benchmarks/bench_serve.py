"""``blockbatch serve`` under load: N concurrent streaming clients against the offline batched engine.

    python benchmarks/bench_serve.py [--model DIR] [--clients 32] [--duration 20] [--policy dual]
        [--gen-length 128] [--threads N] [--out benchmarks/results/serve]
    python benchmarks/bench_serve.py --clients 16 --duration 15 --replicas 1,2   (Ray Serve, pip install "ray[serve]")

Starts the server itself (``python -m blockbatch.cli serve`` on a free loopback port, ``--max-batch``
= the number of clients), then for each client count runs that many asyncio clients for
``--duration`` seconds: each sends streaming ``/v1/completions`` requests (held-out toy problems,
or random-token prompts for a model without the toy's vocabulary) back to back over httpx and
reads the SSE stream to its ``[DONE]``. Per level: requests/s, output tokens/s (completion tokens:
the text up to EOS), canvas tokens/s (gen_length per request), time to first token, time per
output token (after the first), end-to-end latency (p50 / p99), errors, lost requests (sent but
neither answered nor failed; must be 0) and mismatches (a streamed text that differs from the
offline result of the same prompt; float32 CPU results are batch-invariant, so must be 0).

The offline reference: ``Engine.generate(prompts, options, max_batch=N)`` in this process on the
prompts the server completed (the same count, same order), output tokens/s by the same measure.
Each level's load is split into ``--rounds`` windows, each followed by its offline run, so that
the drift of a shared machine hits both sides alike.
Writes ``serve.json`` (every level, the environment) and ``serve.png`` (throughput against the
offline engine; latency distributions) under ``--out``.

``--replicas 1,2``: instead of client levels, one level per replica count R under the first
``--clients`` count, the server started as ``blockbatch serve --replicas R`` (Ray Serve on a local
Ray instance, each replica its own engine with ``--threads`` threads and ``--max-batch`` = the
number of clients); writes ``serve_replicas.json`` / ``serve_replicas.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    k = (len(v) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def _prompts(engine, n: int) -> list[str | list[int]]:
    if engine.codec is not None and engine.config.vocab_size < 1000:
        from blockbatch.toy import task

        return [p.prompt for p in task.make_problems(n, 0, "test")]
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        ids = torch.randint(0, engine.config.vocab_size - 2, (8 + (i * 7) % 33,), generator=g).tolist()
        out.append([t if t != engine.config.mask_token_id else 0 for t in ids])
    return out


class _Server:
    def __init__(
        self, model: str | None, max_batch: int, threads: int | None, log_path: str, replicas: int | None = None
    ):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [
            sys.executable,
            "-m",
            "blockbatch.cli",
            "serve",
            "--port",
            str(self.port),
            "--max-batch",
            str(max_batch),
            "--max-queue",
            str(max_batch),
            "--served-model-name",
            "bench",
            "--log-level",
            "warning",
        ]
        if model:
            cmd += ["--model", model]
        if threads:
            cmd += ["--threads", str(threads)]
        if replicas:
            cmd += ["--replicas", str(replicas)]  # Ray Serve: a local Ray instance, each replica its own engine
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        import httpx

        deadline = time.monotonic() + (240 if replicas else 120)
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}; see {log_path}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not come up in time; see {log_path}")
            time.sleep(0.1)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        finally:
            self.log.close()


async def _load(url: str, prompts: list, options: dict, clients: int, duration: float, first_index: int = 0) -> dict:
    """``clients`` tasks sending streaming requests back to back until ``duration`` has passed
    (prompts from ``first_index`` on, cycled)."""
    import httpx

    records: list[dict] = []
    errors: list[str] = []
    sent = 0
    next_prompt = first_index
    start = time.perf_counter()
    deadline = start + duration
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)

    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=httpx.Timeout(300.0)) as http:

        async def one(index: int) -> None:
            body = {"model": "bench", "prompt": prompts[index % len(prompts)], "stream": True, "blockbatch": options}
            t0 = time.perf_counter()
            first = None
            text = []
            final = None
            async with http.stream("POST", "/v1/completions", json=body) as r:
                if r.status_code != 200:
                    raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread()).decode()[:200]}")
                done = False
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[6:]
                    if data == "[DONE]":
                        done = True
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        raise RuntimeError(chunk["error"]["message"])
                    choice = chunk["choices"][0]
                    if choice["text"]:
                        if first is None:
                            first = time.perf_counter()
                        text.append(choice["text"])
                    if choice["finish_reason"] is not None:
                        final = chunk
                if not done or final is None:
                    raise RuntimeError("the stream ended without a final chunk and [DONE]")
            end = time.perf_counter()
            tokens = final["usage"]["completion_tokens"]
            records.append(
                {
                    "index": index,
                    "start": t0 - start,
                    "ttft": (first or end) - t0,
                    "e2e": end - t0,
                    "tpot": (end - first) / (tokens - 1) if first is not None and tokens > 1 else None,
                    "tokens": tokens,
                    "nfe": final["nfe"],
                    "text": "".join(text),
                }
            )

        async def client() -> None:
            nonlocal sent, next_prompt
            while time.perf_counter() < deadline:
                index = next_prompt
                next_prompt += 1
                sent += 1
                try:
                    await one(index)
                except Exception as e:  # noqa: BLE001 - every failure is counted and reported
                    errors.append(f"{type(e).__name__}: {e}")

        await asyncio.gather(*(client() for _ in range(clients)))
    wall = time.perf_counter() - start
    return {"records": records, "errors": errors, "sent": sent, "wall_s": wall}


def _level(engine, url: str, prompts: list, options, clients: int, duration: float, rounds: int) -> dict:
    """One client count: ``rounds`` windows of load, each followed by the offline engine on the
    prompts that window completed (interleaved, so that drift of a shared machine hits both)."""
    from blockbatch import DecodeOptions

    blockbatch = {"policy": options.policy, "gen_length": options.gen_length}
    offline_options = DecodeOptions(policy=options.policy, gen_length=options.gen_length)
    records, errors = [], []
    sent, wall, offline_s = 0, 0.0, 0.0
    offline_tokens = offline_requests = mismatches = 0
    for r in range(rounds):
        run = asyncio.run(_load(url, prompts, blockbatch, clients, duration / rounds, first_index=sent))
        window = sorted(run["records"], key=lambda rec: rec["index"])
        records += window
        errors += run["errors"]
        sent += run["sent"]
        wall += run["wall_s"]
        used = [prompts[rec["index"] % len(prompts)] for rec in window]
        if used:
            t0 = time.perf_counter()
            offline = engine.generate(used, offline_options, chat=False, max_batch=clients)
            offline_s += time.perf_counter() - t0
            offline_tokens += sum(len(g.ids) for g in offline)
            offline_requests += len(offline)
            mismatches += sum(rec["text"] != g.text for rec, g in zip(window, offline))
    done = len(records)
    lost = sent - done - len(errors)
    out_tokens = sum(rec["tokens"] for rec in records)

    def ms(values, q):
        p = _percentile([v for v in values if v is not None], q)
        return None if p is None else round(p * 1e3, 2)

    level = {
        "clients": clients,
        "duration_s": duration,
        "rounds": rounds,
        "wall_s": round(wall, 3),
        "requests": done,
        "errors": len(errors),
        "error_examples": errors[:5],
        "lost": lost,
        "mismatches": mismatches,
        "requests_per_s": done / wall,
        "output_tokens_per_s": out_tokens / wall,
        "canvas_tokens_per_s": done * options.gen_length / wall,
        "mean_output_tokens": out_tokens / done if done else None,
        "mean_nfe": statistics.fmean(rec["nfe"] for rec in records) if records else None,
        **{
            f"{name}_ms_p{q}": ms([rec[name] for rec in records], q)
            for name in ("ttft", "tpot", "e2e")
            for q in (50, 99)
        },
        "offline": {
            "requests": offline_requests,
            "wall_s": round(offline_s, 3),
            "requests_per_s": offline_requests / offline_s if offline_s else None,
            "output_tokens_per_s": offline_tokens / offline_s if offline_s else None,
        },
    }
    level["server_vs_offline"] = (
        level["output_tokens_per_s"] / level["offline"]["output_tokens_per_s"] if offline_tokens else None
    )
    level["latencies_s"] = {
        name: [round(rec[name], 5) for rec in records if rec[name] is not None] for name in ("ttft", "e2e")
    }
    return level


def _plot(report: dict, path: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not installed; no PNG (pip install matplotlib)", file=sys.stderr)
        return None
    levels = report["levels"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    x = range(len(levels))
    w = 0.38
    a.bar([i - w / 2 for i in x], [lv["output_tokens_per_s"] for lv in levels], w, label="server (streaming HTTP)")
    a.bar(
        [i + w / 2 for i in x],
        [lv["offline"]["output_tokens_per_s"] for lv in levels],
        w,
        label="offline Engine.generate",
    )
    for i, lv in enumerate(levels):
        a.annotate(
            f"{lv['server_vs_offline']:.0%}",
            (i - w / 2, lv["output_tokens_per_s"]),
            ha="center",
            va="bottom",
            fontsize=9,
        )
    a.set_xticks(
        list(x),
        [
            f"{lv['clients']} clients" + (f", {lv['replicas']} replica(s)" if lv.get("replicas") else "")
            for lv in levels
        ],
    )
    a.set_ylabel("output tokens / s")
    a.set_ylim(0, 1.3 * max(max(lv["output_tokens_per_s"], lv["offline"]["output_tokens_per_s"]) for lv in levels))
    a.set_title(
        f"{report['model']}, {report['policy']}, gen_length {report['gen_length']}, "
        f"{report['threads']} thread(s): throughput",
        fontsize=10,
    )
    a.legend(loc="upper center", ncol=2, fontsize=9)
    last = levels[-1]
    for name, label in (("ttft", "time to first token"), ("e2e", "end to end")):
        v = sorted(last["latencies_s"][name])
        if v:
            b.plot([t * 1e3 for t in v], [(i + 1) / len(v) for i in range(len(v))], label=label)
    b.set_xlim(left=0)
    b.set_xlabel("ms")
    b.set_ylabel("fraction of requests")
    b.set_title(
        f"latency at {last['clients']} clients"
        + (f", {last['replicas']} replica(s)" if last.get("replicas") else "")
        + f" ({last['requests']} requests)"
    )
    b.grid(alpha=0.3)
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="checkpoint folder (default: the shipped toy model)")
    ap.add_argument("--clients", default="32", help="concurrent clients, comma-separated levels (default 32)")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of load per level (default 20)")
    ap.add_argument(
        "--rounds",
        type=int,
        default=4,
        help="split each level's load into this many windows, each followed by the offline run on its "
        "prompts (default 4)",
    )
    ap.add_argument("--policy", default="dual", help="decode policy (default dual)")
    ap.add_argument("--gen-length", type=int, default=128, help="gen_length of every request (default 128)")
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="intra-op threads of the server and the offline engine (default: torch's choice)",
    )
    ap.add_argument("--prompts", type=int, default=400, help="distinct prompts, cycled (default 400)")
    ap.add_argument(
        "--out", default="benchmarks/results/serve", help="output folder (default benchmarks/results/serve)"
    )
    ap.add_argument(
        "--replicas",
        default=None,
        metavar="R1,R2",
        help="instead of client levels: serve with `blockbatch serve --replicas R` (Ray Serve, pip install "
        '"ray[serve]") for each R, under the first --clients count; writes serve_replicas.json / .png',
    )
    ap.add_argument("--replot", metavar="JSON", default=None, help="only redraw the PNG of a serve.json, next to it")
    args = ap.parse_args(argv)
    if args.replot:
        with open(args.replot, encoding="utf-8") as f:
            png = _plot(json.load(f), os.path.splitext(os.path.abspath(args.replot))[0] + ".png")
        print(f"wrote {png}")
        return 0
    try:
        levels = [int(c) for c in args.clients.split(",") if c]
        assert levels and all(c >= 1 for c in levels) and args.duration > 0 and args.prompts >= 1 and args.rounds >= 1
        replicas = [int(r) for r in args.replicas.split(",") if r] if args.replicas else [None]
        assert replicas and all(r is None or r >= 1 for r in replicas)
    except (ValueError, AssertionError):
        print(
            "error: --clients must be positive integers separated by commas, --duration > 0, --prompts >= 1, "
            "--rounds >= 1, --replicas positive integers separated by commas",
            file=sys.stderr,
        )
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    from common import environment, write_json

    from blockbatch import DecodeOptions
    from blockbatch.engine import Engine

    options = DecodeOptions(policy=args.policy, gen_length=args.gen_length)  # checked before anything starts
    engine = Engine.from_pretrained(args.model)
    prompts = _prompts(engine, args.prompts)
    os.makedirs(args.out, exist_ok=True)
    report = {
        "environment": environment(),
        "command": " ".join(["python", *sys.argv]),
        "model": args.model or "toy",
        "policy": args.policy,
        "gen_length": args.gen_length,
        "threads": torch.get_num_threads(),
        "duration_s": args.duration,
        "levels": [],
    }
    runs = [(c, None) for c in levels] if replicas == [None] else [(levels[0], r) for r in replicas]
    for clients, reps in runs:
        log_path = os.path.join(tempfile.gettempdir(), f"bench_serve_{os.getpid()}_{clients}_{reps}.log")
        server = _Server(args.model, clients, args.threads, log_path, replicas=reps)
        try:
            level = _level(engine, server.url, prompts, options, clients, args.duration, args.rounds)
        finally:
            status = server.stop()
        level["server_exit_status"] = status
        if reps:
            level["replicas"] = reps
        report["levels"].append(level)
        print(
            f"{clients:3d} clients{f', {reps} replica(s)' if reps else ''}: {level['requests_per_s']:.1f} req/s, "
            f"{level['output_tokens_per_s']:.0f} output "
            f"tok/s (offline {level['offline']['output_tokens_per_s']:.0f}: {level['server_vs_offline']:.0%}), "
            f"TTFT p50/p99 {level['ttft_ms_p50']}/{level['ttft_ms_p99']} ms, TPOT p50/p99 {level['tpot_ms_p50']}/"
            f"{level['tpot_ms_p99']} ms, e2e p50/p99 {level['e2e_ms_p50']}/{level['e2e_ms_p99']} ms, "
            f"errors {level['errors']}, lost {level['lost']}, mismatches {level['mismatches']}"
        )
    stem = "serve" if replicas == [None] else "serve_replicas"
    write_json(os.path.join(args.out, f"{stem}.json"), report)
    png = _plot(report, os.path.join(args.out, f"{stem}.png"))
    if png:
        print(f"wrote {png}")
    bad = [lv["clients"] for lv in report["levels"] if lv["errors"] or lv["lost"] or lv["mismatches"]]
    if bad:
        print(f"error: errors, lost requests or mismatches at {bad} clients", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
