"""BlockBatch: a native inference engine for diffusion language models (the families of
``blockbatch.families``: LLaDA, Dream, LLaDA2).

``import blockbatch`` loads the compiled extension (``blockbatch._C``) when it is present, so
``torch.ops.blockbatch.*`` and ``torch.classes.blockbatch.Model`` are registered from then on,
and exports ``Engine``, ``DecodeOptions`` and ``NativeModel``. The modules import without the
extension; then the native attributes (``Engine``, ``NativeModel``) raise ImportError with the
build instructions, and so do the two validators that live in C++ (constructing a
``DecodeOptions``, validating a ``ModelConfig``).
"""

from __future__ import annotations

from ._C_loader import try_load_extension
from .config import ModelConfig
from .errors import CheckpointError, RequestError
from .loading import Checkpoint, load_checkpoint, save_checkpoint

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "DecodeOptions",
    "Engine",
    "ModelConfig",
    "NativeModel",
    "RequestError",
    "load_checkpoint",
    "save_checkpoint",
]
__version__ = "0.1.0"

from .options import DecodeOptions  # importable without the extension (construction needs it)

# Registers the ops now when the library is built (native.py adds their fake kernels for
# torch.compile); a missing or unloadable library is reported, with the reason and the build
# instructions, when a native attribute is used.
if try_load_extension():
    from . import native as _native  # noqa: F401

_NATIVE = {"Engine": "engine", "NativeModel": "native"}


def __getattr__(name: str):
    if name in _NATIVE:
        from importlib import import_module

        from ._C_loader import load_extension

        load_extension()  # ImportError with the build instructions when the library is missing
        value = getattr(import_module(f".{_NATIVE[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'blockbatch' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_NATIVE))
