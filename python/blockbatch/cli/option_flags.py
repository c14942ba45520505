"""The decode options as command-line flags: one flag per row of the options table
(``blockbatch.contract``), with its default, type, range and help, and a record of the flags the
command line actually gave (a preset sits between them and the defaults)."""

from __future__ import annotations

import argparse
from typing import Any

from ..contract import DEFAULTS, NAMES, OPTIONS, Option, cli_help, parse_text


EXPLICIT_ATTR = "_explicit_options"  # the namespace attribute holding the option flags given


def _mark_explicit(namespace: argparse.Namespace, name: str) -> None:
    given = getattr(namespace, EXPLICIT_ATTR, None)
    if given is None:
        given = set()
        setattr(namespace, EXPLICIT_ATTR, given)
    given.add(name)


class _StoreOption(argparse.Action):
    """``store`` that also records the option as given on the command line (``explicit_from_args``)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        _mark_explicit(namespace, self.dest)


class _BooleanOption(argparse.BooleanOptionalAction):
    """``--flag`` / ``--no-flag`` that also records the option as given on the command line."""

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, values, option_string)
        _mark_explicit(namespace, self.dest)


def add_arguments(parser: argparse.ArgumentParser, groups: dict[str, str]) -> None:
    """One flag per option (``--gen-length``; bools ``--merge`` / ``--no-merge``), default from the
    table, in argument groups titled by `groups` (group name -> title). The flags the command line
    actually gave are recorded: ``explicit_from_args`` (a preset sits between them and the defaults)."""
    made = {g: parser.add_argument_group(title) for g, title in groups.items()}
    for o in OPTIONS:
        g = made[o.group]
        default = DEFAULTS[o.name]
        text = cli_help(o).replace("%", "%%")  # argparse formats help strings with %
        if o.type == "bool":
            g.add_argument(o.flag, dest=o.name, action=_BooleanOption, default=default, help=text)
            continue
        kind = _argparse_type(o)
        meta = {"int": "N", "float": "X", "int[]": "LIST"}.get(o.type)
        g.add_argument(
            o.flag,
            dest=o.name,
            action=_StoreOption,
            type=kind,
            default=default,
            metavar=meta,
            choices=o.choices or None,
            help=text,
        )


def _argparse_type(o: Option):
    def parse(text: str) -> Any:
        try:
            return parse_text(o.name, text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e).split(": ", 1)[1]) from None

    parse.__name__ = o.type  # argparse's "invalid <type> value" message
    return parse


def values_from_args(args: argparse.Namespace) -> dict[str, Any]:
    return {name: getattr(args, name) for name in NAMES}


def explicit_from_args(args: argparse.Namespace) -> set[str]:
    """The options whose flags the command line gave (``--threshold 0.8``, ``--no-merge``; a flag
    equal to its default counts too), as option names; the rest hold the table's defaults."""
    return set(getattr(args, EXPLICIT_ATTR, ()))
