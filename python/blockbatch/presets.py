"""Named decode settings: ``blockbatch-paper``, ``blockbatch-best``, ... and preset files.

A preset is a partial set of decode options (a dict of option names to values) with a name and a
one-line description. Apply one with ``DecodeOptions.from_preset(NAME, **overrides)`` (Python),
``--preset NAME`` (``blockbatch generate`` / ``serve``), a ``NAME`` policy spec in
``blockbatch bench --policies`` or ``"blockbatch": {"preset": NAME}`` in a server request. NAME
is a built-in name or the path of a preset file, as ``blockbatch tune --write-preset`` writes it::

    {"blockbatch_preset": 1, "name": "my-setting", "description": "...",
     "options": {"policy": "blockbatch", "block_sizes": [16, 32, 64], "threshold": 0.9},
     "evidence": {...}}                      # optional: what the tuner measured

Options given next to a preset win over the preset's; the preset's win over the defaults. A
preset never sets ``gen_length``; its ``block_sizes`` (or ``block_length``) are kept where they
divide the request's gen_length, so one preset serves every length (an error names the preset
when none is left).

The built-in presets and the measurements that justify them: ``docs/ALGORITHMS.md`` section 10
and ``docs/bench/tune/``.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from . import contract

FORMAT = 1  # "blockbatch_preset" of the files this version writes and reads


@dataclasses.dataclass(frozen=True)
class Preset:
    name: str
    description: str
    options: dict[str, Any]  # option name -> value (never gen_length)
    source: str = "built-in"  # "built-in" or the file it was read from


# The authors' settings (the options table's defaults for the blockbatch policy: the family's
# branches (LLaDA 4..128, Dream 4..64), threshold 0.9, merge gate 0.5, sync gap 8, refresh every
# 32 tokens, the family's EOS exit (LLaDA on, Dream off)).
_PAPER = {
    "policy": "blockbatch",
    "block_sizes": None,
    "threshold": 0.9,
    "merge_gate": 0.5,
    "sync_gap": 8,
    "refresh_tokens": 32,
    "refresh_mode": "periodic",
    "stop_on_eos": None,
}

BUILT_IN: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "blockbatch-paper",
            "BlockBatch with the authors' settings (arXiv 2605.29233): the family's branches (LLaDA 4..128), "
            "threshold 0.9, merge gate 0.5, refresh every 32 tokens; on the toys below a dual's accuracy in "
            "16-19 of 24 held-out cells",
            dict(_PAPER),
        ),
        Preset(
            "blockbatch-best",
            "BlockBatch as tuned by `blockbatch tune` on the toy task: branches 32, 64, 128, strict merges "
            "(gate 0.9), threshold 0.9, a refresh after every leader sync (sync_refresh). One task away (6 task "
            "families, toy models, gen 64 and 128): as accurate as a dual chosen on the other tasks in 18 of 24 "
            "cells, faster in all 18; 0.02-0.16 below a dual tuned on the task in 11",
            {**_PAPER, "block_sizes": [32, 64, 128], "merge_gate": 0.9, "sync_refresh": True},
        ),
        Preset(
            "dual-fast-dllm",
            "Fast-dLLM's dual cache at the paper's setting: block 32, threshold 0.9",
            {"policy": "dual", "block_length": 32, "threshold": 0.9},
        ),
        Preset(
            "llada2.0",
            "LLaDA2 checkpoints: the authors' LLaDA2.0 decoder settings (policy block, blocks of 32, threshold 0.95, "
            "no editing); the default a LLaDA2 model gives a request",
            {"policy": "block", "block_length": 32, "threshold": 0.95, "edit_threshold": None},
        ),
        Preset(
            "llada2.1-edit",
            "LLaDA2 checkpoints: LLaDA2.1's recommended token editing (policy block, blocks of 32, threshold 0.7, "
            "edit_threshold 0.5)",
            {"policy": "block", "block_length": 32, "threshold": 0.7, "edit_threshold": 0.5},
        ),
    )
}


def names() -> list[str]:
    """The built-in presets' names."""
    return list(BUILT_IN)


def get(name: str) -> Preset:
    """A built-in preset by name, or the preset file at path ``name``; ValueError naming either."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"preset must be a preset name or a file path (a non-empty string), got {name!r}")
    if name in BUILT_IN:
        return BUILT_IN[name]
    if os.path.exists(name) or name.endswith(".json") or os.sep in name:
        return read(name)
    raise ValueError(
        f"unknown preset {name!r}: the presets are {', '.join(BUILT_IN)}, or give a preset file's path "
        f"(written by `blockbatch tune --write-preset`)"
    )


def read(path: str) -> Preset:
    """A preset file; errors name the file and the key at fault."""
    from .errors import CheckpointError, read_json_file

    try:
        data = read_json_file(path, "file", 1 << 20)
    except CheckpointError as e:  # "PATH: file not found", "PATH: not valid JSON (...)", ...
        raise ValueError(f"preset file {e}") from None
    if not isinstance(data, dict) or data.get("blockbatch_preset") != FORMAT:
        raise ValueError(
            f'preset file {path}: not a BlockBatch preset (expected an object with "blockbatch_preset": {FORMAT})'
        )
    options = data.get("options")
    if not isinstance(options, dict) or not options:
        raise ValueError(f'preset file {path}: "options" must be a non-empty object of decode options')
    try:
        checked = check_options(options)
    except (TypeError, ValueError) as e:
        raise ValueError(f"preset file {path}: {e}") from None
    name = data.get("name") or os.path.splitext(os.path.basename(path))[0]
    return Preset(str(name), str(data.get("description", "")), checked, path)


def check_options(options: dict[str, Any]) -> dict[str, Any]:
    """A preset's options with their types checked (lists as lists); errors name the option."""
    out = {}
    for key, value in options.items():
        if key not in contract.BY_NAME:
            raise ValueError(f"options.{key}: unknown decode option; the options are {', '.join(contract.NAMES)}")
        if key == "gen_length":
            raise ValueError("options.gen_length: a preset does not set gen_length (the request does)")
        if isinstance(value, list):
            value = tuple(value)
        try:
            contract.check_type(key, value)
        except TypeError as e:
            raise ValueError(f"options.{e}") from None
        out[key] = list(value) if isinstance(value, tuple) else value
    return out


def values(
    preset: str | Preset, overrides: dict[str, Any] | None = None, gen_length: int | None = None
) -> dict[str, Any]:
    """The option values of ``preset`` with ``overrides`` on top, fitted to the request's
    gen_length (``overrides``' or else the default): only block sizes that divide it are kept."""
    p = preset if isinstance(preset, Preset) else get(preset)
    out = {k: (tuple(v) if isinstance(v, list) else v) for k, v in p.options.items()}
    out.update(overrides or {})
    G = out.get("gen_length", gen_length if gen_length is not None else contract.DEFAULTS["gen_length"])
    out["gen_length"] = G
    if isinstance(G, int) and not isinstance(G, bool) and G > 0:
        sizes = out.get("block_sizes")
        if "block_sizes" in p.options and "block_sizes" not in (overrides or {}) and sizes:
            kept = tuple(b for b in sizes if G % b == 0)
            if not kept:
                raise ValueError(
                    f"preset {p.name!r}: none of its block sizes {list(sizes)} divides gen_length {G} "
                    f"(pick a gen_length that one of them divides, or pass block_sizes)"
                )
            out["block_sizes"] = kept
        bl = out.get("block_length")
        if (
            "block_length" in p.options
            and "block_length" not in (overrides or {})
            and isinstance(bl, int)
            and G % bl != 0
            and not _aligned_at_zero(out.get("policy"))  # such blocks need not divide gen_length
        ):
            out["block_length"] = max((d for d in range(1, bl + 1) if G % d == 0))
    return out


def write(
    path: str,
    name: str,
    options: dict[str, Any],
    description: str = "",
    evidence: dict | None = None,
    flag: str = "preset file",
) -> None:
    """Write a preset file (atomically, blockbatch.outputs: a reader never sees half of it; an
    existing FIFO, device or directory at ``path`` is refused, never replaced). Errors name
    ``flag`` and ``path``."""
    from .outputs import check_output

    check_output(path, flag)  # a FIFO, device or directory, a missing folder: refused before writing
    checked = check_options({k: v for k, v in options.items() if k != "gen_length"})
    data = {"blockbatch_preset": FORMAT, "name": name, "description": description, "options": checked}
    if evidence:
        data["evidence"] = evidence
    from .errors import write_json_file

    write_json_file(path, data, flag=flag)


def _aligned_at_zero(policy) -> bool:
    """Whether ``policy``'s blocks start at position 0, so that its block_length need not divide
    gen_length (blockbatch.policies; an unknown name is refused where the options are checked)."""
    from . import policies

    module = policies.REGISTRY.get(policy) if isinstance(policy, str) else None
    return bool(module is not None and module.BLOCKS_ALIGNED_AT_ZERO)
