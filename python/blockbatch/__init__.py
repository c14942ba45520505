"""BlockBatch: a native inference engine for diffusion language models (LLaDA family).

The pure-Python parts (config, loading, reference) import without the C++ extension; the
native parts (``NativeModel``, ops under ``torch.ops.blockbatch``) load ``blockbatch._C`` on
first use and raise ImportError with build instructions when it is missing.
"""

from __future__ import annotations

from .config import ModelConfig
from .errors import CheckpointError
from .loading import Checkpoint, load_checkpoint, save_checkpoint

__all__ = ["Checkpoint", "CheckpointError", "ModelConfig", "NativeModel", "load_checkpoint", "save_checkpoint"]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "NativeModel":
        from .native import NativeModel

        return NativeModel
    raise AttributeError(f"module 'blockbatch' has no attribute {name!r}")
