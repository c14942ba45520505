"""``blockbatch serve --replicas 2``: two toy-model replicas on Ray Serve behind one endpoint, in a
subprocess that starts its own local Ray instance (loopback, no dashboard, a small object store,
files in a fresh /tmp folder it logs), driven by the real ``openai`` client. Requests spread over
both replicas, streams equal non-streamed results, errors keep OpenAI's shape, every port the
instance opens is on loopback, and a replica killed with SIGKILL under load costs no client an
answer (the router sends a request whose replica died to the other one) or, at worst, gives an
OpenAI-shaped error: never a hang or a cut connection. The router caps request bodies (413). The
last test on that server sends it SIGTERM with long requests in flight: they are answered whole,
new ones get a 503, and it exits 0 leaving no Ray process and no folder. Two more servers (one
replica each) check the other ways out: a second signal (stops at once, status 130, cleaned up)
and SIGKILL (its watchdog cleans up). The router's body cap, errors and drain are also tested in
process, without Ray, on a fake engine handle."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import ipaddress
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
from openai import OpenAI

from blockbatch.toy import task
from helpers.serve import ROOT, ServeProcess, parse_metrics

pytest.importorskip("ray.serve", reason="blockbatch serve --replicas needs ray[serve]")

pytestmark = pytest.mark.slow

PROMPT = "72-2=__-3=__-3=__...............?"  # the toy task; greedy answer 72-2=70-3=67-3=64;64
PROMPTS = [PROMPT] + [p.prompt for p in task.make_problems(2, 0, "test")]
CALL_TIMEOUT_S = 60  # no client call may take longer, replica killed or not
LONG = {"policy": "vanilla", "gen_length": 256, "block_length": 32, "threshold": None, "steps": 256}  # 256 forwards


def _processes_mentioning(text: str) -> dict[int, str]:
    """pid -> command line of every process whose command line contains ``text``."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            out[int(entry)] = cmd
    return out


class RayServer(ServeProcess):
    """``python -m blockbatch.cli serve --replicas N`` (``args`` names N) on a free loopback port, in
    its own process group, up once /health has answered from all ``replicas`` replicas through Ray
    Serve's proxy (it may route to the first replica before it knows the second)."""

    def __init__(self, args: list[str], log_path: Path, replicas: int = 2):
        self.seen: set[str] = set()  # replica ids that answered /health

        def both_replicas(r) -> bool:
            self.seen.add(r.headers["x-blockbatch-replica"])
            return len(self.seen) == replicas

        super().__init__(args, log_path, timeout=150, new_session=True, ready=both_replicas, poll_s=0.25)
        m = re.search(r"files under (/tmp/bb-ray-\S+)\)", self.log())
        self.ray_dir: str | None = m.group(1) if m else None

    def stop(self) -> int:
        return super().stop(timeout=60)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = RayServer(
        ["--replicas", "2", "--max-batch", "4", "--max-queue", "16"], tmp_path_factory.mktemp("logs") / "ray-server.log"
    )
    try:
        assert s.ray_dir, f"the server did not log its Ray folder:\n{s.log()}"
        yield s
    finally:
        code = s.stop()
        # Ray's processes (gcs_server, raylet, workers) name the instance's folder on their command line.
        deadline = time.monotonic() + 20
        left = _processes_mentioning(s.ray_dir) if s.ray_dir else {}
        while left and time.monotonic() < deadline:
            time.sleep(0.5)
            left = _processes_mentioning(s.ray_dir)
        for pid in left:  # clean up before failing, so no test run leaves Ray behind
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        assert not left, f"Ray processes left after the server stopped: {left}"
        assert not (s.ray_dir and os.path.exists(s.ray_dir)), f"the Ray folder {s.ray_dir} is left"
        assert code == 0, f"the server exited with {code}:\n{s.log()}"


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server.url + "/v1", api_key="none", timeout=CALL_TIMEOUT_S, max_retries=0)


def _session_processes(sid: int) -> list[int]:
    """The pids of every process in session ``sid`` (the server was started in its own session)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[3]) == sid:  # fields after the command: state ppid pgrp session
                out.append(int(entry))
    return out


def _listening(pids: list[int]) -> dict[str, int]:
    """'address:port' -> pid of every listening TCP socket those processes hold (from /proc/net)."""
    inodes = {}
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes[link[8:-1]] = pid
        except OSError:
            continue
    out = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            hex_ip, hex_port = local.split(":")
            raw = bytes.fromhex(hex_ip)
            words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))  # each 32-bit word little-endian
            ip = str(ipaddress.ip_address(words))
            out[f"{ip}:{int(hex_port, 16)}"] = inodes[inode]
    return out


def _loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.rsplit(":", 1)[0])
    return ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)


def test_every_port_of_the_local_instance_is_on_loopback(server):
    pids = _session_processes(server.proc.pid)
    names = {pid: Path(f"/proc/{pid}/comm").read_text().strip() for pid in pids if os.path.exists(f"/proc/{pid}")}
    assert any(n.startswith("gcs_server") for n in names.values()) and any(
        n.startswith("raylet") for n in names.values()
    ), f"Ray's daemons are not in the server's session: {names}"
    ports = _listening(pids)
    assert f"127.0.0.1:{server.port}" in ports, ports  # the HTTP proxy, on --host
    assert len(ports) >= 5, ports  # GCS, raylet, the replicas' gRPC servers, ...
    outside = {a: names.get(pid, pid) for a, pid in ports.items() if not _loopback(a)}
    assert not outside, f"listening beyond loopback: {outside}"


def _complete(client: OpenAI, prompt: str, **kw):
    raw = client.completions.with_raw_response.create(
        model="blockbatch-toy", prompt=prompt, max_tokens=20, temperature=0, **kw
    )
    return raw.parse(), raw.headers


def test_requests_spread_over_both_replicas(client):
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda i: _complete(client, PROMPTS[i % len(PROMPTS)]), range(20)))
    replicas = {h["x-blockbatch-replica"] for _, h in results}
    pids = {h["x-blockbatch-pid"] for _, h in results}
    assert len(replicas) == 2 and len(pids) == 2, (replicas, pids)
    for i, (completion, _) in enumerate(results):  # a result does not depend on its replica
        if PROMPTS[i % len(PROMPTS)] == PROMPT:
            assert completion.choices[0].text.startswith("72-2=70-3=67-3=64"), completion.choices[0].text
    assert len({c.choices[0].text for i, (c, _) in enumerate(results) if i % len(PROMPTS) == 0}) == 1


def test_stream_equals_non_stream(server, client):
    for prompt in PROMPTS:
        whole, _ = _complete(client, prompt)
        t0 = time.monotonic()
        chunks = list(
            client.completions.create(model="blockbatch-toy", prompt=prompt, max_tokens=20, temperature=0, stream=True)
        )
        assert time.monotonic() - t0 < CALL_TIMEOUT_S
        assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
        assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    # The raw protocol through Ray's proxy: server-sent events, ending with [DONE].
    with httpx.stream(
        "POST",
        server.url + "/v1/completions",
        timeout=CALL_TIMEOUT_S,
        json={"model": "blockbatch-toy", "prompt": PROMPT, "max_tokens": 20, "stream": True},
    ) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert "x-blockbatch-replica" in r.headers
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines)


def test_n_choices_go_whole_to_a_replica_with_seeds_seed_plus_i(client):
    """n=3 sampled through the router: one replica decodes the three choices, choice i equal to the
    engine's decode with seed + i (the draws differ: the seeds are shown, not assumed)."""
    from blockbatch import DecodeOptions, Engine

    options = {"policy": "dual", "gen_length": 32}
    raw = client.completions.with_raw_response.create(
        model="blockbatch-toy", prompt=PROMPT, n=3, temperature=20.0, seed=5, extra_body={"blockbatch": options}
    )
    done = raw.parse()
    engine = Engine.from_pretrained()
    alone = [
        engine.generate(PROMPT, DecodeOptions(**options, temperature=20.0, seed=5 + i), chat=False)[0] for i in range(3)
    ]
    assert [c.index for c in done.choices] == [0, 1, 2]
    assert [c.text for c in done.choices] == [g.text for g in alone]
    assert len({g.text for g in alone}) >= 2
    assert done.usage.completion_tokens == sum(len(g.ids) for g in alone)
    assert "x-blockbatch-replica" in raw.headers


def test_errors_keep_openai_shape(server, client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="blockbatch-toy", prompt=PROMPT, max_tokens=20, temperature=-1)
    assert e.value.status_code == 400
    assert e.value.body["param"] == "temperature" and e.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as e:  # refused before the stream starts: a plain 400
        client.completions.create(model="blockbatch-toy", prompt=PROMPT, n=17, stream=True)
    assert e.value.body["param"] == "n"
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="no-such-model", prompt=PROMPT, max_tokens=20)
    assert e.value.body["code"] == "model_not_found"
    r = httpx.post(
        server.url + "/v1/completions", content=b"{not json", timeout=10, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    # Hostile JSON through the router: 400s that say what is wrong, no internals (was: 500 RecursionError)
    for raw in (
        b"[" * 100_000 + b"]" * 100_000,
        b'{"model": "blockbatch-toy", "prompt": "1+1", "max_tokens": 1' + b"0" * 5000 + b"}",
    ):
        r = httpx.post(
            server.url + "/v1/completions", content=raw, timeout=30, headers={"Content-Type": "application/json"}
        )
        assert r.status_code == 400, r.text
        assert "Error" not in r.json()["error"]["message"] and "JSON" in r.json()["error"]["message"]
    r = httpx.post(
        server.url + "/v1/completions",
        content=b'{"model": "blockbatch-toy", "prompt": "1+1"}',
        timeout=10,
        headers={"Content-Type": "text/plain", "Host": "evil.example"},
    )
    assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed"  # the replicas' guard
    models = client.models.list()
    assert [m.id for m in models.data] == ["blockbatch-toy"]


def _replica_metrics(server, replicas: int = 2) -> dict[str, dict[str, float]]:
    """replica id -> every sample of its /metrics (name{labels} -> value); /metrics answers for the
    replica a request reaches, so it is asked until all ``replicas`` have answered (a pause between
    asks: a replica the router has not yet listed gets none of a burst; a fresh-clone CI run once
    saw 200 back-to-back answers from one replica)."""
    out: dict[str, dict[str, float]] = {}
    for _ in range(200):
        r = httpx.get(server.url + "/metrics", timeout=10)
        out[r.headers["x-blockbatch-replica"]] = parse_metrics(r.text)
        if len(out) == replicas:
            return out
        time.sleep(0.05)
    raise AssertionError(f"/metrics answered from {sorted(out)} only")


def _total(metrics: dict[str, dict[str, float]], name: str) -> float:
    return sum(m.get(name, 0.0) for m in metrics.values())


def test_a_client_that_disconnects_cancels_its_decode_through_the_router(server, client):
    """A streamed request closed after its first chunk: the router cancels the forwarded call, the
    engine replica's app sees the disconnect and cancels the decode long before its 256 forwards."""
    before = _replica_metrics(server)
    stream = client.completions.create(
        model="blockbatch-toy", prompt=PROMPT, stream=True, extra_body={"blockbatch": LONG}
    )
    first = next(iter(stream))
    assert first.choices[0].text and first.choices[0].finish_reason is None
    stream.close()
    deadline = time.monotonic() + 20
    while True:
        after = _replica_metrics(server)
        if _total(after, "blockbatch_running") == 0 and _total(after, "blockbatch_queued") == 0:
            break
        assert time.monotonic() < deadline, "the request still runs after its client went away"
        time.sleep(0.1)
    cancelled = 'blockbatch_requests_total{status="cancelled"}'
    assert _total(after, cancelled) - _total(before, cancelled) == 1
    forwards = _total(after, "blockbatch_request_forwards_total") - _total(before, "blockbatch_request_forwards_total")
    assert 0 < forwards < 128, forwards  # cancelled well before its 256 forwards


def test_a_replica_killed_under_load_loses_no_answer(server):
    """SIGKILL one replica while 6 clients that never retry send requests (streamed and not): every
    call returns within CALL_TIMEOUT_S, with its answer (a request whose replica died before
    answering is sent to the other one by the router) or an OpenAI-shaped error (a stream cut after
    its first chunk); no connection is dropped. Afterwards the endpoint answers from a live replica."""
    _, headers = _complete(OpenAI(base_url=server.url + "/v1", api_key="none", timeout=CALL_TIMEOUT_S), PROMPT)
    victim = int(headers["x-blockbatch-pid"])
    client = OpenAI(base_url=server.url + "/v1", api_key="none", timeout=CALL_TIMEOUT_S, max_retries=0)
    stop_at = time.monotonic() + 8

    def worker(k: int) -> list[tuple[str, float]]:
        out = []
        while time.monotonic() < stop_at:
            t0 = time.monotonic()
            try:
                if k % 2:
                    chunks = list(
                        client.completions.create(
                            model="blockbatch-toy", prompt=PROMPT, max_tokens=20, temperature=0, stream=True
                        )
                    )
                    text = "".join(c.choices[0].text for c in chunks)
                else:
                    text = (
                        client.completions.create(model="blockbatch-toy", prompt=PROMPT, max_tokens=20, temperature=0)
                        .choices[0]
                        .text
                    )
                out.append(
                    ("ok" if text.startswith("72-2=70-3=67-3=64") else f"wrong text {text!r}", time.monotonic() - t0)
                )
            except openai.APIConnectionError as e:  # a cut connection or a timeout: what the router prevents
                out.append((f"connection {type(e).__name__}: {e}", time.monotonic() - t0))
            except openai.APIStatusError as e:  # an HTTP error: must be OpenAI's shape
                shaped = isinstance(e.body, dict) and e.body.get("code") == "replica_unavailable"
                out.append((f"{'error' if shaped else 'unshaped'} {e.status_code} {e.body}", time.monotonic() - t0))
            except openai.APIError as e:  # an error event inside a stream
                shaped = isinstance(e.body, dict) and e.body.get("code") == "replica_died"
                out.append((f"{'error' if shaped else 'unshaped'} in stream {e.body}", time.monotonic() - t0))
        return out

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(worker, k) for k in range(6)]
        time.sleep(2)
        os.kill(victim, signal.SIGKILL)
        done, not_done = concurrent.futures.wait(futures, timeout=8 + CALL_TIMEOUT_S + 30)
        assert not not_done, "a client hung after the replica was killed"
    calls = [c for f in futures for c in f.result()]
    print(
        "calls after the kill:",
        collections.Counter(outcome.split(" {")[0] for outcome, _ in calls),
        f"longest {max(seconds for _, seconds in calls):.1f} s",
    )  # shown with pytest -s
    bad = [c for c in calls if not (c[0] == "ok" or c[0].startswith("error "))]
    assert not bad, bad
    assert all(seconds < CALL_TIMEOUT_S for _, seconds in calls), calls
    assert sum(c[0] == "ok" for c in calls) >= 6, calls
    # The endpoint still answers, from a live replica.
    completion, headers = _complete(
        OpenAI(base_url=server.url + "/v1", api_key="none", timeout=CALL_TIMEOUT_S, max_retries=0), PROMPT
    )
    assert completion.choices[0].text.startswith("72-2=70-3=67-3=64")
    assert int(headers["x-blockbatch-pid"]) != victim


TOY_MAX_LENGTH = 512  # the toy's max_sequence_length: the servers' --max-length
BODY_CAP = 2**20 + 256 * TOY_MAX_LENGTH  # the router's default --max-body-bytes for it


def _raw_request(port: int, head: bytes, body: bytes = b"", timeout: float = 15) -> tuple[int, bytes]:
    """One HTTP/1.1 request as raw bytes (a Content-Length that the body need not match); the
    response's status and body (a Content-Length body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head + body)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"the connection closed before a response: {data!r}"
            data += chunk
        header, rest = data.split(b"\r\n\r\n", 1)
        lines = header.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        n = int(headers["content-length"])
        while len(rest) < n:
            chunk = sock.recv(65536)
            assert chunk, "the connection closed inside the response body"
            rest += chunk
        return int(lines[0].split()[1]), rest[:n]


def test_the_router_caps_the_body(server, client):
    """A Content-Length over the cap is refused at once, its body never sent; a chunked body as soon
    as it passes the cap; both with a 413 in OpenAI's shape naming the limit and the flag."""
    t0 = time.monotonic()
    status, body = _raw_request(
        server.port,
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n",
    )
    assert time.monotonic() - t0 < 10  # answered without waiting for the gigabyte that never comes
    error = json.loads(body)["error"]
    assert status == 413 and error["code"] == "body_too_large" and error["type"] == "invalid_request_error", body
    assert f"{BODY_CAP} bytes" in error["message"] and "--max-body-bytes" in error["message"], error

    def chunked():
        yield b'{"model": "blockbatch-toy", "prompt": "'
        for _ in range(BODY_CAP // 65536 + 2):  # bounded: 128 KiB past the cap
            yield b"1" * 65536
        yield b'"}'

    r = httpx.post(
        server.url + "/v1/completions", content=chunked(), timeout=30, headers={"Content-Type": "application/json"}
    )
    assert r.request.headers.get("transfer-encoding") == "chunked" and "content-length" not in r.request.headers
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large", r.text
    assert f"{BODY_CAP} bytes" in r.json()["error"]["message"]
    # A client that goes away in the middle of its body: no answer to give, no exception logged (below).
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b'Transfer-Encoding: chunked\r\n\r\n10\r\n{"model": "block\r\n'
        )
        time.sleep(0.5)
    completion, _ = _complete(client, PROMPT)  # and the endpoint goes on serving
    assert completion.choices[0].text.startswith("72-2=70-3=67-3=64")
    logs = Path(server.ray_dir) / "session_latest" / "logs"
    logged = "".join(f.read_text(errors="replace") for f in logs.rglob("*") if f.is_file() and "Router" in f.name)
    assert "ClientDisconnect" not in logged and "Traceback" not in logged, logged[-3000:]


def _instance_gone(s: RayServer, timeout: float) -> tuple[bool, dict, list]:
    """Wait (at most ``timeout`` s) until the instance of ``s`` (its process exited) has no process
    left (none naming its folder, none in the server's session) and no folder; what is left then."""
    deadline = time.monotonic() + timeout
    while True:
        mentioning = _processes_mentioning(s.ray_dir)
        in_session = _session_processes(s.proc.pid)
        folder = os.path.exists(s.ray_dir)
        if not (mentioning or in_session or folder) or time.monotonic() > deadline:
            return folder, mentioning, in_session
        time.sleep(0.25)


def _reap(s: RayServer) -> None:
    """After a test that stopped ``s`` itself: whatever it left, killed and removed (so no test run
    leaves Ray behind, whether the test passed or not)."""
    if s.proc.poll() is None:
        os.killpg(s.proc.pid, signal.SIGKILL)
    s.stop()
    if s.ray_dir:
        for pid in set(_processes_mentioning(s.ray_dir)) | set(_session_processes(s.proc.pid)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        subprocess.run(["rm", "-rf", s.ray_dir], check=False)


def _long_calls(client: OpenAI, kinds: list[bool]) -> tuple[concurrent.futures.ThreadPoolExecutor, list, list]:
    """One LONG request per entry of ``kinds`` (True: streamed), each in its own thread, sent in
    that order; a future per call giving ``(text, finish_reason)`` or the exception it raised, and
    an event per streamed call, set once its first chunk arrived (the request is in flight then)."""

    def call(stream: bool, first: threading.Event):
        try:
            if stream:
                chunks = []
                for chunk in client.completions.create(
                    model="blockbatch-toy", prompt=PROMPT, stream=True, extra_body={"blockbatch": LONG}
                ):
                    chunks.append(chunk)
                    first.set()
                return "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason
            choice = client.completions.create(
                model="blockbatch-toy", prompt=PROMPT, extra_body={"blockbatch": LONG}
            ).choices[0]
            return choice.text, choice.finish_reason
        except Exception as e:
            return e
        finally:
            first.set()  # also when it failed: nothing to wait for

    pool = concurrent.futures.ThreadPoolExecutor(len(kinds))
    firsts = [threading.Event() for _ in kinds]
    calls = []
    for stream, first in zip(kinds, firsts):
        calls.append(pool.submit(call, stream, first))
        time.sleep(0.05)  # in this order
    return pool, calls, [first for stream, first in zip(kinds, firsts) if stream]


def _wait_first_chunks(firsts: list, calls: list, timeout: float = CALL_TIMEOUT_S) -> None:
    """Until every streamed call has its first chunk (the calls sent before them are in flight too,
    almost surely: the test asserts how many the drain found); fails at once if a call ended."""
    deadline = time.monotonic() + timeout
    while not all(first.is_set() for first in firsts):
        assert time.monotonic() < deadline, "the streams got no first chunk"
        time.sleep(0.05)
    ended = [c.result() for c in calls if c.done()]
    assert not ended, f"calls ended before the signal: {ended}"


def _wait_draining(server, timeout: float = 20) -> dict:
    """Until /health answers 503 (the router drains); its JSON."""
    deadline = time.monotonic() + timeout
    while True:
        r = httpx.get(server.url + "/health", timeout=10)
        if r.status_code == 503:
            return r.json()
        assert time.monotonic() < deadline, "the router did not start draining"
        time.sleep(0.05)


def test_sigterm_drains_in_flight_requests_then_exits_0(server, client):
    """The last test on the module's server: it stops it. SIGTERM with 6 long requests in flight (3
    not streamed, then 3 streamed that have their first chunk): /health answers 503, a new request
    gets OpenAI's 503 ``shutting_down``, every request in flight is answered whole (equal to an
    undisturbed one), and only then does the server shut down: exit status 0, no Ray process, no
    folder left."""
    assert server.proc.poll() is None, "the module's server is gone: this test must run last on it"
    reference = client.completions.create(model="blockbatch-toy", prompt=PROMPT, extra_body={"blockbatch": LONG})
    expected = (reference.choices[0].text, reference.choices[0].finish_reason)
    pool, calls, firsts = _long_calls(client, [False] * 3 + [True] * 3)
    try:
        _wait_first_chunks(firsts, calls)
        time.sleep(0.2)
        t0 = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        health = _wait_draining(server)
        assert health["status"] == "draining" and health["requests"] >= 1, health
        with pytest.raises(openai.APIStatusError) as e:
            client.completions.create(model="blockbatch-toy", prompt=PROMPT, max_tokens=5)
        assert e.value.status_code == 503, e.value
        assert e.value.body == {
            "message": "the server is shutting down: it takes no new requests",
            "type": "service_unavailable",
            "param": None,
            "code": "shutting_down",
        }, e.value.body
        assert not all(c.done() for c in calls), "the requests ended before the new one was refused: too short a test"
        results = [c.result(timeout=CALL_TIMEOUT_S) for c in calls]
    finally:
        pool.shutdown(wait=True)
    assert results == [expected] * 6, results
    answered_s = time.monotonic() - t0
    assert server.proc.wait(timeout=60) == 0, server.log()
    print(f"answered {answered_s:.1f} s after SIGTERM, exited after {time.monotonic() - t0:.1f} s")
    folder, mentioning, in_session = _instance_gone(server, 20)
    assert not (folder or mentioning or in_session), (folder, mentioning, in_session)
    # All six were in flight at the signal. The router counts a request until its response has left
    # whole, so the reference request answered just before may still be counted: at least six.
    drained = re.search(r"draining (\d+) request\(s\)", server.log())
    assert drained and int(drained.group(1)) >= 6, server.log()


def test_a_second_signal_stops_at_once_and_cleans_up(tmp_path):
    """SIGTERM, then while it drains a long stream SIGTERM again: the server stops without waiting
    for the stream, exits 130 ("interrupted"), and leaves no Ray process and no folder."""
    s = RayServer(["--replicas", "1", "--max-batch", "2"], tmp_path / "twice.log", replicas=1)
    try:
        assert s.ray_dir, s.log()
        client = OpenAI(base_url=s.url + "/v1", api_key="none", timeout=CALL_TIMEOUT_S, max_retries=0)
        pool, calls, firsts = _long_calls(client, [True, True])
        try:
            _wait_first_chunks(firsts, calls)
            s.proc.send_signal(signal.SIGTERM)
            _wait_draining(s)
            s.proc.send_signal(signal.SIGTERM)
            t0 = time.monotonic()
            code = s.proc.wait(timeout=60)
            stopped_s = time.monotonic() - t0
            ended = concurrent.futures.wait(calls, timeout=CALL_TIMEOUT_S)
        finally:
            pool.shutdown(wait=True)
        assert code == 130 and "interrupted" in s.log(), (code, s.log())
        assert not ended.not_done, "a client hung after the server stopped"
        print(f"stopped {stopped_s:.1f} s after the second signal; the calls: {[c.result() for c in calls]}")
        folder, mentioning, in_session = _instance_gone(s, 30)
        assert not (folder or mentioning or in_session), (folder, mentioning, in_session)
    finally:
        _reap(s)


def test_sigkill_of_the_server_leaves_nothing_behind(tmp_path):
    """The server killed with SIGKILL (no cleanup of its own can run): its watchdog stops what is
    left of the local instance and removes its folder within a minute."""
    s = RayServer(["--replicas", "1"], tmp_path / "killed.log", replicas=1)
    try:
        assert s.ray_dir, s.log()
        assert _processes_mentioning(s.ray_dir), "no Ray process names the folder: the check below proves nothing"
        os.kill(s.proc.pid, signal.SIGKILL)
        s.proc.wait(timeout=10)
        t0 = time.monotonic()
        folder, mentioning, in_session = _instance_gone(s, 60)
        assert not (folder or mentioning or in_session), (folder, mentioning, in_session, s.log())
        print(f"the instance was gone {time.monotonic() - t0:.1f} s after the kill")
    finally:
        _reap(s)


def test_ray_is_imported_only_with_replicas():
    code = (
        "import sys, blockbatch, blockbatch.cli, blockbatch.serve\n"
        "assert 'ray' not in sys.modules, 'import blockbatch loaded ray'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)
    r = subprocess.run(
        [sys.executable, "-m", "blockbatch.cli", "serve", "--ray-address", "auto"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "--ray-address needs --replicas N" in r.stderr, (r.returncode, r.stderr)


# ------------------------------------------------------------------ the router in process (no Ray)


class _FakeCall:
    """A stand-in for the router's forwarded call (a streaming ``DeploymentResponseGenerator``):
    ``first`` (a response's head: status, headers, body, more), then ``rest`` (bytes), each after
    ``gate`` is set when given; ``error`` is raised instead of the first item."""

    def __init__(self, first=None, rest=(), gate: asyncio.Event | None = None, error: Exception | None = None):
        self.items = [first, *rest]
        self.gate, self.error, self.cancelled = gate, error, False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.error is not None:
            raise self.error
        if self.cancelled:
            from ray.serve.exceptions import RequestCancelledError

            raise RequestCancelledError("cancelled")
        if not self.items:
            raise StopAsyncIteration
        if self.gate is not None and len(self.items) == 1:  # the last chunk waits for the gate
            waiter = asyncio.ensure_future(self.gate.wait())
            while not waiter.done():
                if self.cancelled:
                    waiter.cancel()
                    from ray.serve.exceptions import RequestCancelledError

                    raise RequestCancelledError("cancelled")
                await asyncio.sleep(0.01)
        return self.items.pop(0)

    def cancel(self):
        self.cancelled = True


class _FakeEngine:
    """The engine deployment's handle as the router uses it: ``options(stream=True).http.remote(request)``."""

    def __init__(self, make_call):
        self.make_call, self.requests = make_call, []

    def options(self, **_):
        return self

    @property
    def http(self):
        return self

    def remote(self, request):
        self.requests.append(request)
        return self.make_call(request)


def _head(status: int = 200, body: bytes = b'{"ok": true}', more: bool = False, stream: bool = False):
    kind = b"text/event-stream" if stream else b"application/json"
    return {"status": status, "headers": [(b"content-type", kind)], "body": body, "more": more}


class _Client:
    """ASGI request messages for the router: ``chunks`` of the body, then (``disconnect``) the
    client going away; counts how many messages the router took."""

    def __init__(self, chunks: list[bytes], disconnect: bool = False):
        self.messages = [
            {"type": "http.request", "body": c, "more_body": i + 1 < len(chunks) or disconnect}
            for i, c in enumerate(chunks)
        ]
        if disconnect:
            self.messages.append({"type": "http.disconnect"})
        self.taken = 0

    async def receive(self):
        self.taken += 1
        if self.messages:
            return self.messages.pop(0)
        await asyncio.sleep(3600)


def _request(client: _Client, path: str = "/v1/completions", headers: dict | None = None, method: str = "POST"):
    from starlette.requests import Request

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
        "scheme": "http",
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 1),
        "root_path": "",
        "http_version": "1.1",
    }
    return Request(scope, client.receive)


async def _send_response(response) -> tuple[int, bytes]:
    """Run a response as the ASGI server would; its status and whole body."""
    out = {"status": None, "body": b""}

    async def receive():
        await asyncio.sleep(3600)

    async def send(message):
        if message["type"] == "http.response.start":
            out["status"] = message["status"]
        elif message["type"] == "http.response.body":
            out["body"] += message.get("body", b"")

    await response({"type": "http", "asgi": {"spec_version": "2.4"}}, receive, send)
    return out["status"], out["body"]


def _router(make_call, max_body_bytes: int = 100):
    from blockbatch.serve.router import RouterReplica

    return RouterReplica(_FakeEngine(make_call), local_instance=False, max_body_bytes=max_body_bytes)


def test_router_body_cap_in_process():
    from blockbatch.serve.router import max_body_bytes

    assert max_body_bytes({"max_length": TOY_MAX_LENGTH}) == BODY_CAP
    assert max_body_bytes({}) == 2**20 + 256 * 4096 and max_body_bytes({"max_body_bytes": 5000}) == 5000
    with pytest.raises(ValueError, match="--max-body-bytes"):
        max_body_bytes({"max_body_bytes": 0})

    async def run():
        router = _router(lambda request: _FakeCall(_head()))
        declared = _Client([b"x" * 10])  # says more than it sends: refused before a byte is read
        status, body = await _send_response(await router(_request(declared, headers={"content-length": "101"})))
        assert status == 413 and declared.taken == 0, (status, declared.taken)
        error = json.loads(body)["error"]
        assert (
            error["code"] == "body_too_large"
            and "100 bytes" in error["message"]
            and "--max-body-bytes" in error["message"]
        ), error
        chunked = _Client([b"x" * 40] * 5)  # no Content-Length: refused once past 100, the rest unread
        status, body = await _send_response(await router(_request(chunked)))
        assert status == 413 and chunked.taken == 3 and json.loads(body)["error"]["code"] == "body_too_large"
        whole = _Client([b"x" * 40, b"y" * 60])  # at the cap: forwarded whole
        status, body = await _send_response(await router(_request(whole)))
        assert status == 200 and router.engine.requests[-1]["body"] == b"x" * 40 + b"y" * 60
        assert router.requests == 0 and len(router.engine.requests) == 1

    asyncio.run(run())


def test_router_errors_in_process(caplog):
    """A client that disconnects mid-body is no error (nothing logged above INFO, no 500); an
    unexpected failure answers a 500 naming an error id (also in the log line) and no internals."""

    async def run():
        router = _router(lambda request: _FakeCall(error=RuntimeError("secret internals at /srv/x")))
        with caplog.at_level(logging.INFO, logger="blockbatch.serve"):
            status, _ = await _send_response(await router(_request(_Client([b'{"mod'], disconnect=True))))
            assert status != 500 and router.engine.requests == []
            assert not [r for r in caplog.records if r.levelno > logging.INFO or r.exc_info], caplog.records
            status, body = await _send_response(await router(_request(_Client([b"{}"]))))
        error = json.loads(body)["error"]
        assert status == 500 and error["code"] == "internal_error" and "secret" not in body.decode(), body
        error_id = re.search(r"internal error (\w+)", error["message"]).group(1)
        logged = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(logged) == 1 and error_id in logged[0].getMessage() and logged[0].exc_info, logged
        assert router.requests == 0

    asyncio.run(run())


def test_router_drain_in_process():
    """drain(): new requests and /health get 503 while a stream admitted before goes on, counted
    in flight until its last byte is sent; cancel_all() ends a stream with a shutting_down event."""

    async def run():
        gate = asyncio.Event()
        router = _router(
            lambda request: _FakeCall(
                _head(body=b"data: 1\n\n", more=True, stream=True), [b"data: 2\n\n", b"data: [DONE]\n\n"], gate=gate
            )
        )
        streamed = await router(_request(_Client([b"{}"])))
        sending = asyncio.ensure_future(_send_response(streamed))
        await asyncio.sleep(0.05)
        assert await router.drain() == 1
        status, body = await _send_response(await router(_request(_Client([b"{}"]))))
        assert status == 503 and json.loads(body) == {
            "error": {
                "message": "the server is shutting down: it takes no new requests",
                "type": "service_unavailable",
                "param": None,
                "code": "shutting_down",
            }
        }, body
        status, body = await _send_response(await router(_request(_Client([]), "/health", method="GET")))
        assert status == 503 and json.loads(body) == {"status": "draining", "requests": 1}
        assert await router.in_flight() == 1 and not sending.done()
        gate.set()
        status, body = await asyncio.wait_for(sending, 5)
        assert status == 200 and body == b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
        assert await router.in_flight() == 0
        # The drain ran out: a stream still running is cancelled and told so.
        router = _router(
            lambda request: _FakeCall(
                _head(body=b"data: 1\n\n", more=True, stream=True), [b"data: 2\n\n"], gate=asyncio.Event()
            )
        )
        sending = asyncio.ensure_future(_send_response(await router(_request(_Client([b"{}"])))))
        await asyncio.sleep(0.05)
        await router.drain()
        assert await router.cancel_all() == 1
        status, body = await asyncio.wait_for(sending, 5)
        events = [line[6:] for line in body.decode().split("\n\n") if line]
        assert events[0] == "1" and events[-1] == "[DONE]", events
        assert json.loads(events[1])["error"]["code"] == "shutting_down", events
        assert await router.in_flight() == 0

    asyncio.run(run())
