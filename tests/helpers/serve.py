"""`blockbatch serve` started by a test: a subprocess on a free loopback port, up once /health answers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]


def parse_metrics(text: str) -> dict[str, float]:
    """Every sample of a /metrics answer: name{labels} -> value."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return out


class ServeProcess:
    """``python -m blockbatch.cli serve --port FREE --threads 1 ARGS``; waits until /health answers 200
    (and `ready(response)` holds, when given) within `timeout` seconds. `new_session`: its own process
    group (stop() kills the group if SIGTERM does not end it). `env`: variables added to this
    process's environment."""

    def __init__(
        self,
        args: list[str],
        log_path: Path,
        timeout: float = 120,
        new_session: bool = False,
        ready: Callable[[httpx.Response], bool] | None = None,
        poll_s: float = 0.1,
        env: dict[str, str] | None = None,
    ):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = open(log_path, "w")
        self._group = new_session
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "blockbatch.cli", "serve", "--port", str(self.port), "--threads", "1", *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=new_session,
            env=None if env is None else {**os.environ, **env},
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"the server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                r = httpx.get(self.url + "/health", timeout=2)
                if r.status_code == 200 and (ready is None or ready(r)):
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"the server did not come up in {timeout} s:\n{self.log()}"
            time.sleep(poll_s)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM (the server drains), then a kill after `timeout` s; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                if self._group:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                else:
                    self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def assert_block_completions_equal_the_engine(server, engine, model: str, prompt: str, blockbatch: dict) -> None:
    """A block-causal family's completion, whole and streamed, equals the engine's decode of the same
    options (policy block: text and NFE), through the real openai client."""
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
    body = {"blockbatch": {"gen_length": 40, **blockbatch}}
    done = client.completions.create(model=model, prompt=prompt, extra_body=body)
    chunks = list(client.completions.create(model=model, prompt=prompt, extra_body=body, stream=True))
    [expected] = engine.generate(prompt, engine.default_options(gen_length=40, **blockbatch), chat=False)
    assert expected.stats["policy"] == "block"
    assert done.choices[0].text == expected.text
    assert done.model_extra["nfe"] == expected.stats["nfe"]
    assert done.model_extra["blockbatch"]["policy"] == "block"
    assert "".join(c.choices[0].text for c in chunks) == expected.text
    assert chunks[-1].model_extra["nfe"] == expected.stats["nfe"]


def assert_refuses_policy_dual(server, model: str, prompt: str, family: str) -> None:
    """A block-causal family's server refuses policy dual, naming the family and the remedy."""
    import openai
    import pytest
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(
            model=model, prompt=prompt, extra_body={"blockbatch": {"policy": "dual", "gen_length": 32}}
        )
    assert f"not defined on {family} checkpoints" in str(e.value) and "policy='block'" in str(e.value)
