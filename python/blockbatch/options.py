"""Decoding options (docs/ALGORITHMS.md sections 2-4): ``DecodeOptions``, one typed field per row of
the options table (``blockbatch.contract``; the fields are generated into ``options_fields.py``).

Its values are checked once, on construction, by the C++ validator: ``torch.ops.blockbatch.options``
builds the typed options object (``torch.classes.blockbatch.Options``, ``DecodeOptions.native``)
that every native entry point takes as it is (decode, decode_batch, the scheduler).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from . import contract
from .errors import RequestError, short_repr, typed_error
from .options_fields import DecodeOptionFields

POLICIES = contract.POLICIES
DEFAULT_BLOCK_SIZES = contract.BY_NAME["block_sizes"].default

_INT64 = (-(1 << 63), (1 << 63) - 1)


@dataclasses.dataclass(frozen=True)
class DecodeOptions(DecodeOptionFields):
    """How to decode one request: one field per row of the options table
    (``blockbatch.contract.OPTIONS``; ``docs/options.md`` lists them with their
    ranges).

    Commit rule: ``factor`` when ``factor`` is set, else ``threshold`` when ``threshold`` is set,
    else LLaDA's fixed schedule with ``steps`` total steps (``threshold=None, steps=gen_length`` is
    vanilla one-token-per-step decoding). Single-branch policies (vanilla / prefix / dual) use
    ``block_length``; ``blockbatch`` runs one branch per entry of ``block_sizes``.

    ``stop_on_eos`` None means the policy's own default: off for the single-branch policies (as in
    Fast-dLLM: the whole canvas is decoded, the text is cut at the first EOS afterwards) and on for
    ``blockbatch``, whose EOS early exit is part of the algorithm. ``timeout_s`` > 0 ends a decode
    that runs longer with ``TimeoutError``.

    Every field is checked on construction: a wrong type raises TypeError, a value out of range
    ValueError, each naming the field (the values by the C++ validator the op runs too).
    """

    def __post_init__(self) -> None:
        for name in contract.NAMES:
            value = getattr(self, name)
            contract.check_type(name, value)
            o = contract.BY_NAME[name]
            ints = (value or []) if o.type == "int[]" else [value] if o.type == "int" and value is not None else []
            if any(not _INT64[0] <= v <= _INT64[1] for v in ints):  # would not reach C++ as an int64
                bound = "" if o.hi is not None else f"{' and' if o.range_text() else ''} at most 2^63 - 1 (an int64)"
                message = f"{name} must be {o.range_text()}{bound}, got {short_repr(value, 60)}"
                raise RequestError(message, "invalid_option", name)
        if isinstance(self.block_sizes, list):  # frozen: keep it hashable and immutable
            object.__setattr__(self, "block_sizes", tuple(self.block_sizes))
        from ._C_loader import load_extension

        load_extension()
        # Checked once (RequestError naming the option) into the object every entry point takes.
        try:
            native = torch.ops.blockbatch.options(**self.op_kwargs())
        except ValueError as e:
            raise typed_error(e) from None
        object.__setattr__(self, "_native", native)

    @property
    def native(self) -> Any:
        """The options as the native ops take them (``torch.classes.blockbatch.Options``), built once."""
        return self.__dict__["_native"]

    def __reduce__(self):
        # pickle / copy rebuild from the fields (the native object is rebuilt, not pickled)
        return (_rebuild, ({name: getattr(self, name) for name in contract.NAMES},))

    @property
    def eos_exit(self) -> bool:
        """``stop_on_eos`` resolved against the policy's default (the table's per-policy column)."""
        return bool(self.resolved("stop_on_eos"))

    @property
    def commit(self) -> str:
        """The commit rule: factor, threshold or fixed (LLaDA's schedule)."""
        if self.factor is not None:
            return "factor"
        return "threshold" if self.threshold is not None else "fixed"

    def resolved(self, name: str, family: str = contract.FAMILIES[0]) -> Any:
        """Option `name` with a None that the table resolves replaced by its per-policy / per-family default."""
        value = getattr(self, name)
        o = contract.BY_NAME[name]
        if value is None and name == "block_sizes":  # the family's default branches that divide gen_length
            sizes = o.default_for(self.policy, family)
            return tuple(b for b in sizes if self.gen_length % b == 0) or sizes
        return o.default_for(self.policy, family) if value is None and o.resolved_by_table else value

    def replace(self, **changes: Any) -> DecodeOptions:
        """A copy with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)

    def op_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of torch.ops.blockbatch.decode for these options."""
        return contract.to_op_kwargs({name: getattr(self, name) for name in contract.NAMES})

    @classmethod
    def from_preset(cls, preset: Any, **overrides: Any) -> DecodeOptions:
        """The options of a preset (a name of ``blockbatch.presets``, a preset file's path or a
        ``Preset``) with ``overrides`` on top; block sizes that do not divide gen_length are dropped."""
        from . import presets

        return cls(**presets.values(preset, overrides))


def _rebuild(fields: dict) -> DecodeOptions:
    return DecodeOptions(**fields)


MAX_N = 16  # generations per prompt (Engine.generate's n, the server's n)


def seed_for_choice(options: DecodeOptions, i: int, n: int) -> DecodeOptions:
    """The options of choice ``i`` of ``n`` (``Engine.generate(n=...)``, the server's ``n``): the
    seed plus ``i``. ValueError naming ``seed`` when ``seed + n - 1`` passes the largest seed."""
    limit = contract.BY_NAME["seed"].hi
    if limit is not None and options.seed + n - 1 > limit:
        raise ValueError(
            f"seed: choice i of n decodes with seed + i, and seed {options.seed} + {n - 1} passes the "
            f"largest seed {limit}: give a smaller seed"
        )
    return options if i == 0 else options.replace(seed=options.seed + i)
