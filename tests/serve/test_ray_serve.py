"""``blockbatch serve --replicas 2``: two toy-model replicas on Ray Serve behind one endpoint, in a
subprocess that starts its own local Ray instance (loopback, no dashboard, a small object store,
files in a fresh /tmp folder it logs), driven by the real ``openai`` client. Requests spread over
both replicas, streams equal non-streamed results, errors keep OpenAI's shape, every port the
instance opens is on loopback, and a replica killed with SIGKILL under load costs no client an
answer (the router sends a request whose replica died to the other one) or, at worst, gives an
OpenAI-shaped error: never a hang or a cut connection. At the end no Ray process of the instance
is left."""

from __future__ import annotations

import collections
import concurrent.futures
import ipaddress
import os
import re
import signal
import subprocess
import sys
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
    """``python -m blockbatch.cli serve --replicas 2`` on a free loopback port, in its own process
    group, up once /health has answered from both replicas through Ray Serve's proxy (it may route
    to the first replica before it knows the second)."""

    def __init__(self, args: list[str], log_path: Path):
        self.seen: set[str] = set()  # replica ids that answered /health

        def both_replicas(r) -> bool:
            self.seen.add(r.headers["x-blockbatch-replica"])
            return len(self.seen) == 2

        super().__init__(args, log_path, timeout=150, new_session=True, ready=both_replicas, poll_s=0.25)
        m = re.search(r"files under (/tmp/bb-ray-\S+)\)", self.log())
        self.ray_dir: str | None = m.group(1) if m else None

    def stop(self) -> int:
        return super().stop(timeout=60)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = RayServer(["--replicas", "2", "--max-batch", "4", "--max-queue", "16"],
                  tmp_path_factory.mktemp("logs") / "ray-server.log")
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
            words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))  # each 32-bit word little-endian
            ip = str(ipaddress.ip_address(words))
            out[f"{ip}:{int(hex_port, 16)}"] = inodes[inode]
    return out


def _loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.rsplit(":", 1)[0])
    return ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)


def test_every_port_of_the_local_instance_is_on_loopback(server):
    pids = _session_processes(server.proc.pid)
    names = {pid: Path(f"/proc/{pid}/comm").read_text().strip() for pid in pids if os.path.exists(f"/proc/{pid}")}
    assert any(n.startswith("gcs_server") for n in names.values()) and \
        any(n.startswith("raylet") for n in names.values()), f"Ray's daemons are not in the server's session: {names}"
    ports = _listening(pids)
    assert f"127.0.0.1:{server.port}" in ports, ports  # the HTTP proxy, on --host
    assert len(ports) >= 5, ports  # GCS, raylet, the replicas' gRPC servers, ...
    outside = {a: names.get(pid, pid) for a, pid in ports.items() if not _loopback(a)}
    assert not outside, f"listening beyond loopback: {outside}"


def _complete(client: OpenAI, prompt: str, **kw):
    raw = client.completions.with_raw_response.create(model="blockbatch-toy", prompt=prompt, max_tokens=20,
                                                      temperature=0, **kw)
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
        chunks = list(client.completions.create(model="blockbatch-toy", prompt=prompt, max_tokens=20, temperature=0,
                                                stream=True))
        assert time.monotonic() - t0 < CALL_TIMEOUT_S
        assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
        assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    # The raw protocol through Ray's proxy: server-sent events, ending with [DONE].
    with httpx.stream("POST", server.url + "/v1/completions", timeout=CALL_TIMEOUT_S,
                      json={"model": "blockbatch-toy", "prompt": PROMPT, "max_tokens": 20, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert "x-blockbatch-replica" in r.headers
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines)


def test_errors_keep_openai_shape(server, client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="blockbatch-toy", prompt=PROMPT, max_tokens=20, temperature=-1)
    assert e.value.status_code == 400
    assert e.value.body["param"] == "temperature" and e.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as e:  # refused before the stream starts: a plain 400
        client.completions.create(model="blockbatch-toy", prompt=PROMPT, n=2, stream=True)
    assert e.value.body["param"] == "n"
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="no-such-model", prompt=PROMPT, max_tokens=20)
    assert e.value.body["code"] == "model_not_found"
    r = httpx.post(server.url + "/v1/completions", content=b"{not json", timeout=10,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    models = client.models.list()
    assert [m.id for m in models.data] == ["blockbatch-toy"]


def _replica_metrics(server) -> dict[str, dict[str, float]]:
    """replica id -> every sample of its /metrics (name{labels} -> value); /metrics answers for the
    replica a request reaches, so it is asked until both have answered."""
    out: dict[str, dict[str, float]] = {}
    for _ in range(200):
        r = httpx.get(server.url + "/metrics", timeout=10)
        out[r.headers["x-blockbatch-replica"]] = parse_metrics(r.text)
        if len(out) == 2:
            return out
    raise AssertionError(f"/metrics answered from {sorted(out)} only")


def _total(metrics: dict[str, dict[str, float]], name: str) -> float:
    return sum(m.get(name, 0.0) for m in metrics.values())


def test_a_client_that_disconnects_cancels_its_decode_through_the_router(server, client):
    """A streamed request closed after its first chunk: the router cancels the forwarded call, the
    engine replica's app sees the disconnect and cancels the decode long before its 256 forwards."""
    long = {"policy": "vanilla", "gen_length": 256, "block_length": 32, "threshold": None, "steps": 256}
    before = _replica_metrics(server)
    stream = client.completions.create(model="blockbatch-toy", prompt=PROMPT, stream=True,
                                       extra_body={"blockbatch": long})
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
                    chunks = list(client.completions.create(model="blockbatch-toy", prompt=PROMPT, max_tokens=20,
                                                            temperature=0, stream=True))
                    text = "".join(c.choices[0].text for c in chunks)
                else:
                    text = client.completions.create(model="blockbatch-toy", prompt=PROMPT, max_tokens=20,
                                                     temperature=0).choices[0].text
                out.append(("ok" if text.startswith("72-2=70-3=67-3=64") else f"wrong text {text!r}",
                            time.monotonic() - t0))
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
    print("calls after the kill:", collections.Counter(outcome.split(" {")[0] for outcome, _ in calls),
          f"longest {max(seconds for _, seconds in calls):.1f} s")  # shown with pytest -s
    bad = [c for c in calls if not (c[0] == "ok" or c[0].startswith("error "))]
    assert not bad, bad
    assert all(seconds < CALL_TIMEOUT_S for _, seconds in calls), calls
    assert sum(c[0] == "ok" for c in calls) >= 6, calls
    # The endpoint still answers, from a live replica.
    completion, headers = _complete(OpenAI(base_url=server.url + "/v1", api_key="none", timeout=CALL_TIMEOUT_S,
                                           max_retries=0), PROMPT)
    assert completion.choices[0].text.startswith("72-2=70-3=67-3=64")
    assert int(headers["x-blockbatch-pid"]) != victim


def test_ray_is_imported_only_with_replicas():
    code = ("import sys, blockbatch, blockbatch.cli, blockbatch.server\n"
            "assert 'ray' not in sys.modules, 'import blockbatch loaded ray'\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)
    r = subprocess.run([sys.executable, "-m", "blockbatch.cli", "serve", "--ray-address", "auto"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--ray-address needs --replicas N" in r.stderr, (r.returncode, r.stderr)
