"""What the subcommands share: the one-line user error, argparse types, the generation summary
line, the decode options of the option flags (with ``--preset``) and the preset help."""

from __future__ import annotations

from typing import Any, Mapping

import argparse
import math

from . import option_flags


class UsageError(Exception):
    """A user error found by the CLI itself: printed as one ``error: ...`` line, exit status 2."""


def parse_ids(text: str, what: str) -> list[int]:
    ids = []
    for i, item in enumerate(text.split(",")):
        try:
            ids.append(int(item))
        except ValueError:
            raise UsageError(
                f"{what}: entry {i} ({item.strip()!r}) of {text!r} is not an integer token id; expected "
                "comma-separated integers"
            ) from None
    return ids


def int_in(low: int, high: int | None, expected: str, bound: str):
    """An argparse type: an integer in [low, high] (high None: unbounded); `expected` names what a
    non-integer should have been, `bound` the range an integer misses."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value

    return parse


positive_int = int_in(1, None, "a positive integer", "a positive integer (>= 1)")
non_negative_int = int_in(0, None, "an integer >= 0", ">= 0")
port = int_in(0, 65535, "a port number", "in [0, 65535]")


def summary_line(stats: Mapping[str, Any]) -> str:
    """One human line per generation: NFE split, tokens per forward, time (and each policy's extras:
    its module's ``summary``, ``blockbatch.policies``)."""
    from .. import policies

    return policies.summary_line(stats)


def option_values(args: argparse.Namespace, family_defaults: dict | None = None) -> dict:
    """The decode options of ``generate``'s flags; with ``--preset``: the option flags given
    explicitly on top of the preset, the preset on top of the model family's defaults
    (``family_defaults``: LLaDA2's policy 'block'), those on top of the table's."""
    values = option_flags.values_from_args(args)
    explicit = {name: values[name] for name in option_flags.explicit_from_args(args)}
    values = {**values, **(family_defaults or {}), **explicit}
    if args.preset is None:
        return values
    from .. import presets

    try:
        return {**values, **presets.values(args.preset, explicit)}
    except (TypeError, ValueError) as e:  # the message names the preset (or its file)
        raise UsageError(f"--preset: {e}") from None


def preset_names() -> list[str]:
    from .. import presets

    return presets.names()


def preset_help(what: str) -> str:
    """--help of a --preset NAME|FILE flag: the built-in presets and what a preset file is."""
    from .. import presets

    names = "; ".join(f"{p.name}: {p.description}" for p in presets.BUILT_IN.values())
    return (
        f"named decode settings, {what}. NAME is one of: {names}. FILE is a preset file: JSON "
        f'{{"blockbatch_preset": {presets.FORMAT}, "name": ..., "options": {{"policy": ..., ...}}}} '
        "as `blockbatch tune --write-preset` writes it. A preset's block sizes that do not divide "
        "gen_length are dropped"
    ).replace("%", "%%")


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``error: blockbatch bench: argument --n: ...`` (exit 2)."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def one_line(e: BaseException) -> str:
    text = " ".join(line.strip() for line in str(e).strip().splitlines() if line.strip())
    return text or type(e).__name__


def model_folder(model: str | None) -> str:
    """The checkpoint folder a ``--model`` value loads (None: the shipped toy's): what the output
    rule protects (blockbatch.outputs)."""
    if model:
        return model
    from ..toy import checkpoint_path

    return checkpoint_path()
