"""Subprocess helpers of the Ctrl-C tests."""

from __future__ import annotations

import signal
import subprocess
import time


def interrupt_once_printed(
    proc: subprocess.Popen, marker: str, wait_s: float = 240, signum: int = signal.SIGINT
) -> tuple[str, str]:
    """Read ``proc``'s stderr (text) until ``marker`` shows (at most ``wait_s`` seconds, or until it
    exits), then send it ``signum`` (SIGINT: Ctrl-C) and wait for its end; returns (stderr before
    the signal, the rest). The process is killed if it outlives that."""
    seen = ""
    try:
        deadline = time.monotonic() + wait_s
        while marker not in seen and time.monotonic() < deadline and proc.poll() is None:
            seen += proc.stderr.read(1)
        assert marker in seen, seen
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return seen, err
