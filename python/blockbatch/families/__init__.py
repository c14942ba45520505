"""Model families on the Python side: one module per family (``llada``, ``dream``, ``llada2``, ``sdar``)
holding all that differs between two families here: its ``config.json`` keys and checks (a ``ConfigCodec`` it
registers with ``blockbatch.config`` on import), its weight names and shapes, its random configs
and weights (``blockbatch make-random``, the tests), published shapes; and this registry, which
every other module asks instead of testing a family's name. Its C++ twin is the family table
(``csrc/model/families.h``); how the C++ decoders differ per family is each policy's per-family rules
table (``csrc/decode/policies/``). Adding a family: ``docs/adding-a-family.md``."""

from __future__ import annotations

import types

from ..config import ModelConfig

# LLaDA first: importing a family registers its config.json reader, and the order of registration
# is the order messages list the model types in (llada, Dream, llada2_moe, sdar).
from . import llada
from . import dream
from . import llada2
from . import sdar

# family name (ModelConfig.family) -> its module
REGISTRY: dict[str, types.ModuleType] = {m.NAME: m for m in (llada, dream, llada2, sdar)}


def get(name: str) -> types.ModuleType:
    """The module of family ``name``; ValueError naming the known families."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown model family {name!r}; the families are {', '.join(REGISTRY)}") from None


def of(config: ModelConfig) -> types.ModuleType:
    """The module of ``config``'s family (decided by its ``model_type``)."""
    return get(config.family)


def tensor_count(config: ModelConfig) -> int:
    """How many tensors a checkpoint of ``config`` holds, without listing them (the family's own
    count where its layers differ, else a fixed number per layer)."""
    module = of(config)
    if hasattr(module, "tensor_count"):
        return int(module.tensor_count(config))
    return module.TENSORS_PER_LAYER * config.n_layers + 2 + (0 if config.weight_tying else 1)


def default_options(config: ModelConfig) -> dict:
    """The decode options a request on ``config``'s family gets where it sets none (LLaDA2: policy
    'block', threshold 0.95), under every option the request or a preset gives."""
    return dict(of(config).DEFAULT_OPTIONS)


def weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint of ``config``'s family must hold, with its shape (HF names)."""
    return of(config).weight_shapes(config)


def published_shapes() -> dict[str, tuple[str, dict]]:
    """``make-random --preset`` shapes of every family: preset name -> (family, config fields)."""
    return {preset: (name, shape) for name, m in REGISTRY.items() for preset, shape in m.PUBLISHED_SHAPES.items()}


def decoding(policy: str) -> list[str]:
    """Display names of the families that decode with ``policy`` (their ``POLICIES``)."""
    return [m.DISPLAY_NAME for m in REGISTRY.values() if policy in m.POLICIES]


def per_family_text(attribute: str, sep: str = " ", otherwise: str | None = None) -> str:
    """Help text of a per-family tuple of policies, e.g. ``BENCH_POLICIES``: "vanilla dual blockbatch
    on LLaDA and Dream checkpoints; block on LLaDA2 checkpoints". Families whose value is None are
    described by ``otherwise`` (e.g. "the grid's")."""
    groups: dict[str, list[str]] = {}
    for m in REGISTRY.values():
        value = getattr(m, attribute)
        text = sep.join(value) if value is not None else otherwise
        groups.setdefault(text or "", []).append(m.DISPLAY_NAME)
    return "; ".join(
        f"{value} on {' and '.join([', '.join(names[:-1]), names[-1]] if len(names) > 1 else names)} checkpoints"
        for value, names in groups.items()
    )
