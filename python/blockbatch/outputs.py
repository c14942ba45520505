"""The one rule for every file a blockbatch command writes (``generate --output``, ``tune --out`` /
``--write-preset``, ``bench --out``, ``python -m blockbatch.toy.evaluate --json``, preset and
JSON files written from Python).

1. **Checked before the work** (:func:`check_output`): a path is refused when it is (the same
   file as, through symbolic or hard links) an input of the run, a file in the model's
   checkpoint folder (config.json, weights, tokenizer, ...; nothing new is written into that
   folder either), another output of the same run (tune's ``OUT/tune.json``), an existing file
   that is not a regular file (FIFO, device, directory, socket; a streamed output may take a
   FIFO or a character device, see below), or a path whose folder is missing, not a folder or
   not writable. Every message names the flag and the path.
2. **Written atomically** (:class:`AtomicFile`, :func:`write_atomic`): into an unnamed
   temporary file in the target's folder (Linux ``O_TMPFILE``; elsewhere a named
   ``.NAME.blockbatch-PID-XXXX.tmp``, swept once its process is dead), flushed, fsync'ed and
   renamed over the target only when whole: even SIGKILL leaves no temporary file behind and
   the target either as it was or whole. A streamed JSONL output keeps only whole lines (a line
   cut by a full disk is dropped) and says how many it kept. An error names the target file,
   never the temporary. The target keeps its mode (a new file gets ``0666 & ~umask``), and a
   symbolic link keeps naming the file it named (that file is replaced).
3. **Every terminating signal is Ctrl-C** (:func:`signals_as_interrupt`): SIGTERM, SIGHUP,
   SIGQUIT, SIGUSR1, SIGUSR2 and SIGXCPU raise :class:`Interrupted` (a KeyboardInterrupt) while
   a command writes, so what was written so far is kept as on Ctrl-C; the command exits with
   128 + the signal's number. SIGPIPE stays ignored (Python's default: a closed pipe is an
   EPIPE error on that write), SIGXFSZ too (a file past ``ulimit -f`` is an EFBIG error naming
   the file); SIGKILL cannot be caught, and loses only what was not yet renamed into place.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import re
import secrets
import signal
import stat
import sys
import threading
from typing import BinaryIO, Callable, Iterable, Iterator

STDOUT = "-"


class OutputError(ValueError):
    """An output path refused, or a write that failed; the message names the flag and the file."""


# --------------------------------------------------------------------------- the check


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except (OSError, ValueError):
        return None


def _same(st: os.stat_result | None, other: os.stat_result | None) -> bool:
    return st is not None and other is not None and os.path.samestat(st, other)


def _folder_files(folder: str) -> Iterator[tuple[str, os.stat_result]]:
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        st = _stat(os.path.join(folder, name))
        if st is not None and stat.S_ISREG(st.st_mode):
            yield os.path.join(folder, name), st


def check_output(
    path: str,
    flag: str,
    inputs: Iterable[tuple[str, str | None]] = (),
    protected: Iterable[tuple[str, str | None]] = (),
    others: Iterable[tuple[str, str | None]] = (),
    stream: bool = False,
) -> None:
    """Refuse ``path`` (given as ``flag``) before any work when writing it would destroy what the
    run reads or is: OutputError naming the flag and the path.

    ``inputs``: (what, path) of the run's input files (``--tasks FILE``...); ``protected``: (what,
    folder) whose files must not be replaced and into which nothing is written (the model's
    checkpoint folder); ``others``: (what, path) of the run's other outputs. ``stream``: a FIFO or
    a character device is a place to stream lines to (``generate --output``), not refused.
    ``-`` (standard output) is the caller's to allow or not."""
    where = f"{flag} {path}"
    if not path:
        raise OutputError(f"{flag}: the path is empty")
    if "\0" in path:
        raise OutputError(f"{flag} {path!r}: the path holds a NUL byte")
    st = _stat(path)
    real = os.path.realpath(path)  # a symbolic link: the file it names is what gets replaced
    if st is None and os.path.lexists(path) and not os.path.islink(path):
        raise OutputError(f"{where}: cannot be examined")
    if st is not None and not stat.S_ISREG(st.st_mode):
        if not (stream and (stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode))):
            raise OutputError(f"{where}: is {_kind(st.st_mode)}; give the path of a regular file to write")
    for what, other in inputs:
        if other and other != STDOUT and (_same(st, _stat(other)) or real == os.path.realpath(other)):
            raise OutputError(f"{where}: is {what} {other}, an input of this run; write to another file")
    for what, other in others:
        if other and other != STDOUT and (_same(st, _stat(other)) or real == os.path.realpath(other)):
            raise OutputError(f"{where}: is also {what} {other}, written by this run; give another path")
    folder = os.path.dirname(real) or "."
    for what, guarded in protected:
        if not guarded:
            continue
        guarded_real = os.path.realpath(guarded)
        if folder == guarded_real or real == guarded_real:
            raise OutputError(
                f"{where}: is in {what} {guarded}, which this run reads (a file there changes how it loads); "
                f"write elsewhere"
            )
        if st is not None:
            for name, fst in _folder_files(guarded):
                if _same(st, fst):
                    raise OutputError(f"{where}: is {name} of {what} {guarded} (a link to it); write elsewhere")
    if st is not None and not stat.S_ISREG(st.st_mode):
        return  # a stream: written in place, its folder is not written
    folder_st = _stat(folder)
    shown = folder if os.path.islink(path) else (os.path.dirname(path) or ".")  # as the user wrote it
    if folder_st is None:
        raise OutputError(f"{where}: the folder {shown} does not exist; create it first")
    if not stat.S_ISDIR(folder_st.st_mode):
        raise OutputError(f"{where}: {shown} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"{where}: the folder {shown} is not writable")


def check_output_folder(folder: str, flag: str, names: Iterable[str], **rules) -> None:
    """An output folder (``--out``) and the files a run writes in it: the folder is a folder (or
    is created: its nearest existing parent must be a writable folder) and each file passes
    :func:`check_output` (as ``flag``/NAME, each against the others)."""
    st = _stat(folder)
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise OutputError(f"{flag} {folder}: exists and is not a directory")
    if os.path.lexists(folder) and st is None:
        raise OutputError(f"{flag} {folder}: is a symbolic link to a missing folder")
    if st is None:
        parent = os.path.dirname(os.path.abspath(folder))
        while not os.path.exists(parent):
            parent = os.path.dirname(parent)
        if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
            raise OutputError(f"{flag} {folder}: cannot be created ({parent} is not a writable folder)")
    names = list(names)
    paths = [os.path.join(folder, n) for n in names]
    protected = list(rules.pop("protected", ()))
    for i, p in enumerate(paths):
        others = [*rules.get("others", ()), *((f"{flag}/{os.path.basename(q)}", q) for q in paths if q != p)]
        if st is None:  # the folder does not exist yet: only the names can clash
            real = os.path.realpath(p)
            for what, other in [*rules.get("inputs", ()), *others]:
                if other and other != STDOUT and real == os.path.realpath(other):
                    raise OutputError(f"{flag} {folder}: its {names[i]} would be {what} {other}")
            for what, guarded in protected:
                if guarded and os.path.dirname(real) == os.path.realpath(guarded):
                    raise OutputError(f"{flag} {folder}: is {what} {guarded}, which this run reads; write elsewhere")
            continue
        check_output(p, f"{flag} {folder}:", inputs=rules.get("inputs", ()), protected=protected, others=others)


# --------------------------------------------------------------------------- the writer


_TEMP = re.compile(r"^\.(?P<name>.+)\.blockbatch-(?P<pid>\d+)-[0-9a-f]+\.tmp$")


def _temp_name(target: str) -> str:
    """A named temporary beside ``target`` (the name _TEMP matches, so a dead process's is swept)."""
    folder, base = os.path.split(target)
    return os.path.join(folder, f".{base}.blockbatch-{os.getpid()}-{secrets.token_hex(4)}.tmp")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def sweep_stale_temporaries(folder: str, name: str) -> None:
    """Remove the named temporaries of ``name`` left in ``folder`` by processes now dead (where
    O_TMPFILE is not available, a SIGKILL leaves them)."""
    try:
        entries = os.listdir(folder)
    except OSError:
        return
    for entry in entries:
        m = _TEMP.match(entry)
        if m and m["name"] == name and int(m["pid"]) != os.getpid() and not _pid_alive(int(m["pid"])):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, entry))


def _new_mode(path: str) -> int:
    st = _stat(path)
    if st is not None and stat.S_ISREG(st.st_mode):
        return stat.S_IMODE(st.st_mode)
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _reason(e: OSError) -> str:
    if e.errno == errno.ENOSPC:
        return "no space left on the device"
    if e.errno == errno.EFBIG:
        return "file too large (the file size limit, ulimit -f, or the file system's)"
    if e.errno == errno.EDQUOT:
        return "disk quota exceeded"
    return e.strerror or str(e)


def _link_unnamed(fd: int, name: str, size: int) -> None:
    """Give the O_TMPFILE file ``fd`` the name ``name``: linkat through /proc/self/fd, else
    linkat(AT_EMPTY_PATH) (privileged before Linux 6.10), else a copy into a new file there."""
    try:
        os.link(f"/proc/self/fd/{fd}", name, follow_symlinks=True)
        return
    except OSError:
        pass
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.linkat(fd, b"", -100, os.fsencode(name), 0x1000) == 0:  # AT_FDCWD, AT_EMPTY_PATH
            return
    except (OSError, AttributeError):
        pass
    out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, os.fstat(fd).st_mode & 0o7777)
    try:
        done = 0
        while done < size:
            chunk = os.pread(fd, min(1 << 20, size - done), done)
            if not chunk:
                break
            view = memoryview(chunk)
            while view:
                view = view[os.write(out, view) :]
            done += len(chunk)
        os.fsync(out)
    except BaseException:
        os.close(out)
        with contextlib.suppress(OSError):
            os.unlink(name)
        raise
    os.close(out)


class AtomicFile:
    """A file written whole or not at all, renamed over ``path`` at :meth:`commit`.

    ``flag`` names the file in errors (``--output``, ``--write-preset``, or "file"). Bytes go in
    through :meth:`write`; ``lines=True`` tracks whole lines (each ``write`` a whole line or
    several), and a write that fails (full disk) cuts the file back to its last whole line.
    ``stream=True``: a FIFO, a character device or ``-`` (stdout) is written in place (else
    refused). Use as a context manager:
    :meth:`commit` on a normal exit, :meth:`discard` on an exception."""

    def __init__(self, path: str, flag: str = "file", lines: bool = False, stream: bool = False):
        self.path, self.flag, self.line_mode = path, flag, lines
        self.lines = 0  # whole lines written (lines=True)
        self._good = 0  # bytes of whole content (whole lines) in the file
        self._tmp_name: str | None = None
        self._fd: int | None = None
        self._stream: BinaryIO | None = None
        self.failed: str | None = None  # the write error, once one happened
        if path == STDOUT and stream:
            self._stream = sys.stdout.buffer
            return
        check_output(path, flag, stream=stream)  # a FIFO or device never replaced, a missing folder named
        st = _stat(path)
        try:
            if st is not None and not stat.S_ISREG(st.st_mode):
                self._stream = open(path, "wb", buffering=0)  # noqa: SIM115 - a FIFO / device: no replace
                return
            self.target = os.path.realpath(path)
            folder = os.path.dirname(self.target) or "."
            mode = _new_mode(self.target)
            self._fd = self._open_unnamed(folder, mode)
            if self._fd is None:
                sweep_stale_temporaries(folder, os.path.basename(self.target))
                self._tmp_name = _temp_name(self.target)
                self._fd = os.open(self._tmp_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            os.fchmod(self._fd, mode)
        except OSError as e:
            self.discard()
            raise OutputError(f"{flag} {path}: cannot write it ({_reason(e)})") from None

    @staticmethod
    def _open_unnamed(folder: str, mode: int) -> int | None:
        flag = getattr(os, "O_TMPFILE", 0)
        if not flag or not os.path.isdir("/proc/self/fd"):
            return None
        try:
            return os.open(folder, flag | os.O_RDWR | os.O_CLOEXEC, mode)  # RDWR: copied out if linking fails
        except OSError as e:
            if e.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT):
                return None  # the file system (or kernel) has no O_TMPFILE: a named temporary
            raise

    def write(self, data: bytes | str) -> None:
        """Write ``data`` (str: UTF-8); with ``lines`` it must end with a newline. An error names
        the file; the file is cut back to its last whole content first."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        if self._stream is not None:
            try:
                self._stream.write(data)
                self._stream.flush()
            except BrokenPipeError:
                raise  # `... | head`: the reader is gone; the CLI stops quietly
            except OSError as e:
                self.failed = _reason(e)
                raise OutputError(f"{self.flag} {self.path}: cannot write it ({self.failed})") from None
            self.lines += data.count(b"\n")
            return
        assert self._fd is not None, "written after commit or discard"
        view = memoryview(data)
        try:
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
        except OSError as e:
            self.failed = _reason(e)
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._good)  # a cut line never lands
                os.lseek(self._fd, self._good, os.SEEK_SET)
            raise OutputError(self._failure_message()) from None
        self._good += len(data)
        self.lines += data.count(b"\n")

    def _failure_message(self) -> str:
        msg = f"{self.flag} {self.path}: cannot write it ({self.failed})"
        if self.line_mode:
            msg += f"; the {self.lines} whole lines written before are kept"
        return msg

    def commit(self) -> None:
        """Flush, fsync and rename the whole content over the target; errors name the target."""
        if self._stream is not None:
            if self._stream is not sys.stdout.buffer:
                self._stream.close()
            self._stream = None
            return
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.fsync(fd)
            if self._tmp_name is None:  # unnamed: give it a name only for the rename
                self._tmp_name = _temp_name(self.target)
                _link_unnamed(fd, self._tmp_name, self._good)
            os.replace(self._tmp_name, self.target)
            self._tmp_name = None
        except OSError as e:
            raise OutputError(f"{self.flag} {self.path}: cannot write it ({_reason(e)})") from None
        finally:
            os.close(fd)
            self.discard()

    def discard(self) -> None:
        """Drop what was written: the target stays as it was."""
        if self._stream is not None:
            if self._stream is not sys.stdout.buffer:
                with contextlib.suppress(OSError):
                    self._stream.close()
            self._stream = None
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        if self._tmp_name is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._tmp_name)
            self._tmp_name = None

    def __enter__(self) -> AtomicFile:
        return self

    def __exit__(self, kind, value, tb) -> None:
        if kind is None:
            self.commit()
        else:
            self.discard()


def write_atomic(path: str, data: bytes | str | Callable[[io.BytesIO], None], flag: str = "file") -> None:
    """Write ``data`` (bytes, text, or a function writing into a binary buffer: matplotlib's
    ``savefig``) as the whole new content of ``path``; errors name ``flag`` and ``path``."""
    if callable(data):
        buf = io.BytesIO()
        data(buf)
        data = buf.getvalue()
    with AtomicFile(path, flag) as f:
        f.write(data)


# --------------------------------------------------------------------------- signals

# The signals whose default action ends the process, handled as Ctrl-C while a command writes.
TERMINATING = tuple(
    getattr(signal, name)
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGXCPU")
    if hasattr(signal, name)
)


class Interrupted(KeyboardInterrupt):
    """A terminating signal, raised as Ctrl-C is; ``signum``: which (SIGINT for Ctrl-C)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class SignalGuard:
    """What :func:`signals_as_interrupt` saw: ``signum``, the first signal (None: none)."""

    def __init__(self):
        self.signum: int | None = None

    @property
    def exit_status(self) -> int:
        """128 + the signal's number (130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP)."""
        return 128 + (self.signum or signal.SIGINT)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum or signal.SIGINT).name


@contextlib.contextmanager
def signals_as_interrupt() -> Iterator[SignalGuard]:
    """Within: every terminating signal (:data:`TERMINATING`) raises :class:`Interrupted` once,
    as Ctrl-C raises KeyboardInterrupt; later ones, while the command saves its results, are
    noted and not raised again (SIGKILL still ends it). The previous handlers come back after.
    Outside the main thread (where Python cannot handle signals) it changes nothing."""
    guard = SignalGuard()
    if threading.current_thread() is not threading.main_thread():
        yield guard
        return

    def handler(signum, frame):
        if guard.signum is None:
            guard.signum = signum
            raise Interrupted(signum)
        sys.stderr.write(f"\n{signal.Signals(signum).name}: already stopping, saving the results written\n")

    previous = {}
    for s in TERMINATING:
        with contextlib.suppress(OSError, ValueError):
            previous[s] = signal.signal(s, handler)
    try:
        yield guard
    except KeyboardInterrupt:
        if guard.signum is None:
            guard.signum = signal.SIGINT
        raise
    finally:
        for s, h in previous.items():
            with contextlib.suppress(OSError, ValueError, TypeError):
                signal.signal(s, h if h is not None else signal.SIG_DFL)
