"""Class: a process that leaves a scheduler open must still exit cleanly.

The scheduler's thread steps inside C++ with the GIL released; a script that ends without closing
it (a scheduler made and dropped, a stream not run to its end, a request still decoding) once
aborted at interpreter exit ("terminate called without an active exception", exit 134) after its
work had succeeded. Every case runs as a real ``python -c`` subprocess and must exit 0 with
nothing on stderr about ``terminate``.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

_HEAD = "from blockbatch import DecodeOptions, Engine\ne = Engine.from_pretrained()\n"

CASES = {
    # the two scripts
    "scheduler-never-used": "s = e.scheduler(max_batch=1)\n",
    "stream-not-finished": (
        'it = e.stream(["72-2=__-3=__", "5+5=__"], DecodeOptions(gen_length=32))\nprint(next(it).index)\n'
    ),
    # variants: a request still decoding when the script ends, a scheduler dropped unnamed,
    # several schedulers at once, one closed and one not, a callback that is still registered
    "request-still-running": (
        "s = e.scheduler(max_batch=2, adaptive=False)\n"
        'r = s.submit(e.encode("72-2=__-3=__"), DecodeOptions(policy="blockbatch", gen_length=128))\n'
        "print('submitted', r.id)\n"
    ),
    "scheduler-dropped-unnamed": "e.scheduler(max_batch=1, adaptive=False)\nprint('dropped')\n",
    "several-open-one-closed": (
        "a = e.scheduler(max_batch=1, adaptive=False)\n"
        "b = e.scheduler(max_batch=2, adaptive=False)\n"
        "c = e.scheduler(max_batch=3, adaptive=False)\n"
        "b.close()\n"
        'r = c.submit(e.encode("1+1"), DecodeOptions(gen_length=32), callback=lambda ev: None)\n'
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_exit_closes_open_schedulers(case):
    proc = subprocess.run([sys.executable, "-c", _HEAD + CASES[case]], capture_output=True, text=True, timeout=300)
    assert "terminate called" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])


def test_exit_cancels_the_requests_left_running():
    """A request still running at exit is cancelled (its event delivered) by the scheduler's close,
    not left inside C++ mid-step: a hook that runs after blockbatch's own (atexit runs last-in
    first-out, so it is registered before blockbatch's is re-registered) sees its final event."""
    script = _HEAD + (
        "import atexit, sys\n"
        "import blockbatch.scheduler as bs\n"
        "s = e.scheduler(max_batch=1, adaptive=False)\n"
        "kinds = []\n"
        'r = s.submit(e.encode("72-2=__-3=__"), DecodeOptions(policy="blockbatch", gen_length=256), '
        "callback=lambda ev: kinds.append(ev.kind))\n"
        "atexit.unregister(bs._close_open_schedulers)\n"
        "atexit.register(lambda: sys.stderr.write('final at exit: %s\\n' % kinds[-1:]))\n"
        "atexit.register(bs._close_open_schedulers)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "final at exit: ['cancelled']" in proc.stderr or "final at exit: ['finished']" in proc.stderr, proc.stderr
