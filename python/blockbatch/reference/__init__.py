"""Pure-PyTorch reference implementations: the oracle every native op and policy is tested against."""

from .model import ReferenceModel
from .policies import ReferenceResult, generate

__all__ = ["ReferenceModel", "ReferenceResult", "generate"]
