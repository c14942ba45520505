"""The cleanup of a local Ray instance that ``blockbatch serve --replicas N`` started: its leftover
processes stopped, its temporary folder removed. Standard library only, so that it runs as a small
process of its own (``python -I _ray_watchdog.py``, started by ``serve.replicas.serve_replicas`` next to
the instance) without loading blockbatch, torch or Ray.

The watchdog blocks reading its stdin, a pipe whose only writer is the serving process: when that
process exits, however it exits (also SIGKILL, which runs no cleanup of its own), the pipe closes
and the watchdog cleans up. It has its own session, so a signal to the server's process group
(Ctrl-C in a terminal, ``kill -- -PGID``) does not end it first.

Only the processes of THAT instance are touched: those whose command line names the instance's
folder as a path (Ray's daemons: ``--temp-dir=...``, ``--session-dir=...``), those whose
environment has ``INSTANCE_VARIABLE`` set to it (every process of the instance inherits it from
the serving process, also the workers, whose command line Ray overwrites with a title such as
``ray::ServeReplica:...``) and those holding a file in it open (Ray's agents, whose title
overwrites their environment too, keep their logs there). Other Ray instances of the machine use
other folders.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import time

INSTANCE_VARIABLE = "BB_RAY_INSTANCE"  # the instance's folder: set for its processes, read here
TERM_WAIT_S = 2.0  # after SIGTERM, before SIGKILL
KILL_WAIT_S = 5.0  # after SIGKILL, for the processes to be gone
SCAN_PAUSE_S = 0.1


def _names_folder(cmdline: bytes, folder: bytes) -> bool:
    """True when ``folder`` is on the command line as a path: itself or a path under it (not a
    longer name that starts the same)."""
    return re.search(re.escape(folder) + rb"(?![^/\0\s\"'=,:;])", cmdline) is not None


def instance_processes(folder: str, spare: tuple[int, ...] = ()) -> list[int]:
    """The pids (this process and ``spare`` left out) of the processes of the Ray instance whose
    folder is ``folder``: its path on their command line, or ``INSTANCE_VARIABLE=folder`` in their
    environment."""
    raw = os.fsencode(os.path.abspath(folder))
    marker = os.fsencode(INSTANCE_VARIABLE) + b"=" + raw
    skip = {os.getpid(), *spare}
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in skip:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            if not cmdline:  # a kernel thread or a zombie: nothing to stop
                continue
            if _names_folder(cmdline, raw):
                out.append(int(entry))
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    out.append(int(entry))
                    continue
            if _holds_files_in(entry, folder):
                out.append(int(entry))
        except OSError:  # gone meanwhile, or another user's
            continue
    return out


def _holds_files_in(pid: str, folder: str) -> bool:
    """True when process ``pid`` has a file under ``folder`` open (Ray's logs, sockets)."""
    prefix = os.path.abspath(folder) + os.sep
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(prefix):
                return True
        except OSError:
            continue
    return False


def _signal_all(pids, sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _wait_gone(folder: str, seconds: float, spare: tuple[int, ...]) -> list[int]:
    deadline = time.monotonic() + seconds
    left = instance_processes(folder, spare)
    while left and time.monotonic() < deadline:
        time.sleep(SCAN_PAUSE_S)
        left = instance_processes(folder, spare)
    return left


def clean(folder: str, term_wait_s: float = TERM_WAIT_S, spare: tuple[int, ...] = ()) -> int:
    """Stop what is left of the instance whose folder is ``folder`` (SIGTERM, then SIGKILL after
    ``term_wait_s``; a process started meanwhile is caught by the next scan), ``spare`` and this
    process left alone, and remove the folder. Returns how many processes had to be stopped."""
    stopped: set[int] = set()
    left = instance_processes(folder, spare)
    if left:
        stopped.update(left)
        _signal_all(left, signal.SIGTERM)
        left = _wait_gone(folder, term_wait_s, spare)
    for _ in range(3):  # a daemon may start a worker while it is being stopped
        if not left:
            break
        stopped.update(left)
        _signal_all(left, signal.SIGKILL)
        left = _wait_gone(folder, KILL_WAIT_S, spare)
    for _ in range(5):  # a process that was writing a log line as it died: try again
        shutil.rmtree(folder, ignore_errors=True)
        if not os.path.exists(folder):
            break
        time.sleep(0.2)
    if left or os.path.exists(folder):
        print(
            f"blockbatch: could not clean up the Ray instance {folder}: processes {left} left, "
            f"folder {'left' if os.path.exists(folder) else 'removed'}",
            file=sys.stderr,
            flush=True,
        )
    return len(stopped)


def main() -> int:
    folder = os.environ.get(INSTANCE_VARIABLE)
    if not folder:
        print(f"blockbatch ray watchdog: {INSTANCE_VARIABLE} is not set", file=sys.stderr)
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server's Ctrl-C is for the server
    server = os.getppid()  # never stopped here, should it match (it is alive when it closes the pipe)
    try:
        while sys.stdin.buffer.read(65536):  # the server writes nothing: this returns at its exit
            pass
    except OSError:
        pass
    n = clean(folder, spare=(server,))
    if n:
        print(
            f"blockbatch: stopped {n} leftover process(es) of the Ray instance {folder} and removed it",
            file=sys.stderr,
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
