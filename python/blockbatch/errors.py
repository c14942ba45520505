"""Exceptions raised by blockbatch's Python layer, the check of int arguments before they reach
C++ (``checked_int``), and the checked way to open checkpoint files.

Every file a checkpoint folder names is opened through ``open_checked``: a missing file, a
dangling or looping symbolic link, a directory, a FIFO or a device is refused with a
``CheckpointError`` naming the file (a FIFO would block ``open`` forever, ``/dev/zero`` would
never end), and JSON files are read through ``read_json_file``: size-capped, UTF-8, strict
(no duplicate keys), with the file and the byte position in every message.
"""

from __future__ import annotations

import errno
import json
import numbers
import os
import stat
from typing import Any, BinaryIO


INT64_MAX = 2**63 - 1


def checked_int(name: str, value: Any, low: int, high: int = INT64_MAX) -> int:
    """``value`` as the integer argument ``name`` in [low, high], checked in Python before any C++
    call takes it: there a bool passes as 0 / 1, a float or an int past int64 fails with the op's
    schema dump. An int (numpy integers too; a bool is not) or TypeError naming the argument; in
    the range or ValueError naming the argument and the range. ``high`` defaults to int64's
    largest (below 2**63), the most an int64 argument holds."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"{name} must be an integer {_int_range(low, high)}, got {type(value).__name__} {short_repr(value)}"
        )
    value = int(value)
    if not low <= value <= high:
        raise ValueError(f"{name} must be an integer {_int_range(low, high)}, got {short_repr(value)}")
    return value


def _int_range(low: int, high: int) -> str:
    return f">= {low} (and below 2**63)" if high == INT64_MAX else f"in [{low}, {high}]"


def short_repr(value: Any, limit: int = 40) -> str:
    """``repr(value)`` for an error message: a long one cut, with its length (an int of thousands
    of digits, a huge list)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}... ({len(text)} characters)"


class RequestError(ValueError):
    """A request refused before it decoded, by kind (``kind``: a name of
    ``blockbatch.contract.ERROR_KINDS``: ``invalid_option``, ``unsupported``, ``invalid_prompt``,
    ``context_length``, ``kv_budget``) and the argument to change (``param``: an option's name,
    ``prompt_ids``, ...; None when none applies). A ValueError, with the native validator's message."""

    def __init__(self, message: str, kind: str, param: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.param = param


def typed_error(error: BaseException) -> BaseException:
    """``error`` (just caught from a native op, on the thread that called it) as a ``RequestError``
    when the op refused the request: the kind and the argument come from the refusal record the
    op left on this thread (``torch.ops.blockbatch.last_refusal``), never from the message's text.
    Any other error comes back as it is. Call it right after catching, before another op runs."""
    import torch

    if isinstance(error, RequestError) or not isinstance(error, ValueError):
        return error
    kind, param, message = torch.ops.blockbatch.last_refusal()
    if not kind or message not in str(error):  # an older refusal, caught inside C++: not this error
        return error
    typed = RequestError(message, kind, param or None)
    typed.__cause__ = None
    return typed


class UnknownCharactersError(ValueError):
    """Text holds characters the tokenizer cannot encode (the message names them and where).
    ``allow_unknown=True`` (``--allow-unknown``) encodes them as the unknown token instead."""


class CheckpointError(ValueError):
    """A checkpoint folder or file is missing, malformed or inconsistent.

    The message always names the file and, where it applies, the tensor or config key.
    """


def _describe_os_error(path: str, what: str, e: OSError) -> str:
    if e.errno == errno.ENOENT:
        if os.path.islink(path):
            return f"{path}: {what} is a symbolic link to a missing file ({os.readlink(path)})"
        return f"{path}: {what} not found"
    if e.errno == errno.ELOOP:
        return f"{path}: {what} is a symbolic link loop (too many levels of symbolic links)"
    if e.errno == errno.EISDIR:
        return f"{path}: {what} is a directory, not a file"
    return f"{path}: cannot open {what} ({e.strerror or e})"


def open_checked(path: str, what: str) -> tuple[BinaryIO, int]:
    """Open a regular file for binary reading; returns (file, size). Raises ``CheckpointError``.

    The file is opened non-blocking and checked with ``fstat`` on the open descriptor, so a FIFO
    or device is refused without ever blocking on it.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise CheckpointError(_describe_os_error(path, what, e)) from None
    except ValueError as e:  # a NUL byte in the path
        raise CheckpointError(f"{path!r}: cannot open {what} ({e})") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise CheckpointError(f"{path}: {what} is a directory, not a file")
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointError(f"{path}: {what} is not a regular file (a FIFO, socket or device)")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb"), st.st_size
    except BaseException:
        os.close(fd)
        raise


def checked_exists(path: str) -> bool:
    """True when ``path`` names anything, including a dangling or looping symbolic link (which
    ``os.path.exists`` reports as absent; opening it then says what is wrong)."""
    return os.path.lexists(path)


def _no_duplicates(where: str):
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise CheckpointError(f"{where}: key '{key}' appears twice")
            out[key] = value
        return out

    return hook


def parse_json_bytes(data: bytes, where: str, subject: str = "") -> Any:
    """Strict JSON of ``data``: UTF-8, no duplicate keys. Errors name ``where`` (and ``subject``,
    e.g. "header") and the position.

    NaN / Infinity literals parse (as Python's json does); the key checks reject them with the
    key's name.
    """
    what = f"{subject} is " if subject else ""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(
            f"{where}: {what}not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})"
        ) from None
    if text.startswith("\ufeff"):
        text = text[1:]
    invalid = f"{where}: {subject + ' is ' if subject else ''}not valid JSON"
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates(where))
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{invalid} ({e})") from None
    except RecursionError:
        raise CheckpointError(f"{invalid} (nested too deeply)") from None
    except CheckpointError:
        raise
    except ValueError as e:  # e.g. an integer literal of more than 4300 digits
        raise CheckpointError(f"{invalid} ({e})") from None


def read_file_bytes(path: str, what: str, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most ``max_bytes`` bytes; every error names the file."""
    f, size = open_checked(path, what)
    with f:
        if size > max_bytes:
            raise CheckpointError(f"{path}: {what} is {size} bytes, more than the {max_bytes} allowed")
        try:
            data = f.read(max_bytes + 1)
        except OSError as e:
            raise CheckpointError(f"{path}: cannot read {what} ({e.strerror or e})") from None
    if len(data) > max_bytes:
        raise CheckpointError(f"{path}: {what} is more than {max_bytes} bytes")
    return data


def write_json_file(path: str, data: Any, indent: int | None = 2, flag: str = "file") -> None:
    """Write JSON atomically (blockbatch.outputs: a temporary file renamed over ``path`` when
    whole: a reader, or a run cut short, never sees half of it); ``indent`` None writes it
    compact. An error (a full disk, a missing folder) names ``flag`` and ``path``, never the
    temporary file."""
    from .outputs import write_atomic

    text = json.dumps(data, indent=indent, separators=None if indent is not None else (",", ":")) + "\n"
    write_atomic(path, text, flag)


def read_json_file(path: str, what: str, max_bytes: int) -> Any:
    """Parse a JSON file of at most ``max_bytes`` bytes; every error names the file."""
    return parse_json_bytes(read_file_bytes(path, what, max_bytes), path)
