"""The options contract: one table (blockbatch.contract) from which the op schema, the C++ struct
and checks, DecodeOptions, the CLI, the bench / lm-eval parsers and docs/options.md's table are derived."""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import shutil
import subprocess

import pytest
import torch

import blockbatch
import gen_contract
from blockbatch import DecodeOptions, contract
from blockbatch.bench import SPEC_OPTIONS, policy_kwargs
from blockbatch.cli import build_parser, option_flags
from blockbatch.config import ModelConfig
from blockbatch.errors import CheckpointError

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_generated_files_are_up_to_date():
    stale = gen_contract.stale_files(ROOT)
    assert not stale, f"out of date with the table, run `python tools/gen_contract.py --write`: {stale}"


def test_the_check_fails_on_a_stale_file(tmp_path):
    """The CI check can fail: an edited generated file (or a table edit not rendered) is reported."""
    for rel in ("csrc/decode", "csrc/torch", "python/blockbatch", "docs"):
        (tmp_path / rel).mkdir(parents=True)
    shutil.copy(ROOT / "docs/options.md", tmp_path / "docs/options.md")
    for path, text in gen_contract.generated_files(tmp_path).items():
        path.write_text(text, encoding="utf-8")
    assert gen_contract.main(["--check", "--root", str(tmp_path)]) == 0
    header = tmp_path / "csrc/decode/options_table.h"
    header.write_text(header.read_text().replace("double merge_gate = 0.5;", "double merge_gate = 0.6;"))
    assert gen_contract.stale_files(tmp_path) == [header]
    assert gen_contract.main(["--check", "--root", str(tmp_path)]) == 1
    assert gen_contract.main(["--write", "--root", str(tmp_path)]) == 0
    assert gen_contract.stale_files(tmp_path) == []


def test_a_table_default_reaches_every_generated_artefact(monkeypatch):
    """Changing one row changes the C++ default, the schema default and the docs' table row."""
    row = contract.BY_NAME["sync_gap"]
    changed = dataclasses.replace(row, default=5)
    table = tuple(changed if o.name == "sync_gap" else o for o in contract.OPTIONS)
    monkeypatch.setattr(gen_contract, "OPTIONS", table)
    monkeypatch.setattr(gen_contract, "DEFAULTS", {**contract.DEFAULTS, "sync_gap": 5})
    monkeypatch.setattr(contract, "OPTIONS", table)
    assert "int64_t sync_gap = 5;" in gen_contract.render_header()
    assert "int sync_gap=5," in gen_contract.schema_options()
    assert "| `sync_gap` | int | `5` |" in gen_contract.markdown_table()
    assert "    sync_gap: int = 5\n" in gen_contract.render_python_fields()


def test_decode_options_is_an_explicit_dataclass():
    """DecodeOptions is an explicit dataclass (its fields generated into options_fields.py): one
    field per row, in the table's order, with the table's defaults and a type an editor sees."""
    import typing

    from blockbatch import options_fields

    fields = dataclasses.fields(DecodeOptions)
    assert [f.name for f in fields] == list(contract.NAMES)
    assert {f.name: f.default for f in fields} == contract.DEFAULTS
    hints = typing.get_type_hints(options_fields.DecodeOptionFields)
    assert hints["gen_length"] is int and hints["threshold"] == typing.Optional[float]
    assert hints["block_sizes"] == typing.Optional[tuple[int, ...]]
    assert "make_dataclass" not in (ROOT / "python/blockbatch/options.py").read_text()


def _schema_args():
    schema = torch.ops.blockbatch.decode.default._schema
    return {a.name: a for a in schema.arguments}


def test_op_schema_is_the_table():
    args = _schema_args()
    options = [a for a in args.values() if a.name not in ("model", "prompt_ids", "cancel")]
    assert [a.name for a in options] == list(contract.NAMES)
    for a in options:
        assert a.kwarg_only, f"{a.name} must be keyword-only"
        expected = contract.DEFAULTS[a.name]
        got = a.default_value
        if isinstance(expected, tuple):
            got = tuple(got)
        assert got == expected, (a.name, got, expected)
    check = {a.name: a for a in torch.ops.blockbatch.options.default._schema.arguments}
    assert list(check) == list(contract.NAMES)


def test_positional_options_are_refused():
    """merge_gate and prob_floor are both floats: a positional call could bind them silently swapped."""
    e = blockbatch.Engine.from_pretrained()
    with pytest.raises(RuntimeError, match="positional"):
        torch.ops.blockbatch.decode(e.model.obj, torch.tensor([5, 6]), "dual", 32)


def test_schema_argument_order_does_not_matter():
    """The op reads its options by name: the same call with the keywords in any order decodes the same."""
    e = blockbatch.Engine.from_pretrained()
    prompt = e.encode("72-2=__-3=__-3=__...............?")
    kw = DecodeOptions(
        policy="blockbatch", gen_length=64, block_sizes=(8, 32), merge_gate=0.7, prob_floor=0.05
    ).op_kwargs()
    a = torch.ops.blockbatch.decode(e.model.obj, prompt, **kw)
    b = torch.ops.blockbatch.decode(e.model.obj, prompt, **dict(reversed(list(kw.items()))))
    assert torch.equal(a[0], b[0]) and torch.equal(a[2], b[2])


def test_decode_options_fields_are_the_table():
    fields = dataclasses.fields(DecodeOptions)
    assert [f.name for f in fields] == list(contract.NAMES)
    d = DecodeOptions()
    for name in contract.NAMES:
        assert getattr(d, name) == contract.DEFAULTS[name], name


def test_per_policy_default_is_resolved_alike_in_python_and_cpp():
    """stop_on_eos None: on for blockbatch, off for the others (the table's per-policy column)."""
    assert DecodeOptions(policy="blockbatch").eos_exit is True
    assert DecodeOptions(policy="dual").eos_exit is False
    e = blockbatch.Engine.from_pretrained()
    prompt = e.encode("72-2=__-3=__-3=__...............?")
    for policy, default in (("blockbatch", True), ("dual", False)):
        o = DecodeOptions(policy=policy, gen_length=128, block_length=32)
        none = torch.ops.blockbatch.decode(e.model.obj, prompt, **o.op_kwargs())
        explicit = torch.ops.blockbatch.decode(e.model.obj, prompt, **o.replace(stop_on_eos=default).op_kwargs())
        other = torch.ops.blockbatch.decode(e.model.obj, prompt, **o.replace(stop_on_eos=not default).op_kwargs())
        assert torch.equal(none[0], explicit[0]) and torch.equal(none[2], explicit[2])
        assert none[2].shape != other[2].shape  # the toy answer ends early: the EOS exit changes the NFE


@pytest.mark.parametrize(
    "name,value",
    [
        ("gen_length", 0),
        ("threshold", 1.5),
        ("factor", -1.0),
        ("temperature", float("nan")),
        ("seed", -1),
        ("merge_gate", 0.0),
        ("sync_gap", -2),
        ("refresh_tokens", 2**31),
        ("prob_floor", 0.5**10),
        ("timeout_s", -0.5),
        ("policy", "greedy"),
        ("refresh_mode", "never"),
        ("block_sizes", (4, -8)),
    ],
)
def test_python_and_cpp_give_the_same_message(name, value):
    kwargs = dict(policy="blockbatch") if contract.BY_NAME[name].policies == ("blockbatch",) else {}
    if name == "factor":
        kwargs = dict(policy="dual")
    kwargs[name] = value
    with pytest.raises(ValueError) as py:
        DecodeOptions(**kwargs)
    e = blockbatch.Engine.from_pretrained()
    with pytest.raises(ValueError) as cpp:
        torch.ops.blockbatch.decode(e.model.obj, torch.tensor([5, 6]), **kwargs)
    assert str(py.value) == str(cpp.value)
    assert str(py.value).startswith(f"{name} must be ") or str(py.value).startswith("block_sizes must be")


def test_cli_flags_are_the_table():
    parser = build_parser()
    gen = next(a for a in parser._subparsers._group_actions[0].choices.items() if a[0] == "generate")[1]
    dests = {a.dest: a for a in gen._actions}
    for o in contract.OPTIONS:
        assert o.name in dests, f"blockbatch generate has no flag for {o.name}"
        action = dests[o.name]
        assert o.flag in action.option_strings
        assert action.default == contract.DEFAULTS[o.name]
        if o.type == "bool":
            assert isinstance(action, argparse.BooleanOptionalAction)
    args = parser.parse_args(["generate", "x"])
    assert DecodeOptions(**option_flags.values_from_args(args)) == DecodeOptions()
    args = parser.parse_args(
        [
            "generate",
            "--policy",
            "blockbatch",
            "--block-sizes",
            "8,32",
            "--no-merge",
            "--threshold",
            "none",
            "--prob-floor",
            "0.2",
            "--stop-on-eos",
            "x",
        ]
    )
    got = option_flags.values_from_args(args)
    assert got["block_sizes"] == (8, 32) and got["merge"] is False and got["threshold"] is None
    assert got["prob_floor"] == 0.2 and got["stop_on_eos"] is True


def test_bench_and_lm_eval_specs_take_every_option():
    assert set(SPEC_OPTIONS) == set(contract.NAMES) - {"policy", "gen_length"}
    kw = policy_kwargs(
        "blockbatch:block_sizes=8/32,merge=false,refresh_mode=divergence,stop_on_eos=none,timeout_s=2.5,cuda_graphs=0",
        64,
    )
    assert kw["block_sizes"] == (8, 32) and kw["merge"] is False and kw["refresh_mode"] == "divergence"
    assert kw["stop_on_eos"] is None and kw["timeout_s"] == 2.5 and kw["cuda_graphs"] is False
    DecodeOptions(**kw)
    with pytest.raises(ValueError, match="unknown option 'colour'"):
        policy_kwargs("dual:colour=red", 64)
    with pytest.raises(ValueError, match="sync_gap='x' is not a valid value for sync_gap"):
        policy_kwargs("blockbatch:sync_gap=x", 64)


def _bench_binary() -> str | None:
    path = os.path.join(os.path.dirname(blockbatch.__file__), "bin", "bb_bench_decode")
    return path if os.path.exists(path) else None


def test_bench_binary_takes_the_table_options():
    binary = _bench_binary()
    if binary is None:
        pytest.skip("bb_bench_decode not built in this tree")
    env = {**os.environ, "LD_LIBRARY_PATH": os.path.join(os.path.dirname(torch.__file__), "lib")}

    def run(*args):
        return subprocess.run([binary, *args], capture_output=True, text=True, timeout=60, env=env)

    text = run("--help").stdout
    for o in contract.OPTIONS:
        assert o.flag in text, o.name
    for args, message in [
        (["--merge-gate", "2"], "merge_gate must be in (0, 1], got 2"),
        (["--refresh-mode", "never"], "refresh_mode must be one of 'periodic', 'divergence', got 'never'"),
        (["--sync-gap", "x"], "sync_gap: expected an integer, got 'x'"),
        (["--policy", "dual", "--steps", "8"], "--steps is used only by the fixed schedule"),
        (["--colour", "red"], "unknown argument '--colour'"),
    ]:
        bad = run("--model", "x", "--prompts", "y", *args)
        assert bad.returncode == 2 and message in bad.stderr, (args, bad.stderr)


def test_one_config_validator():
    """ModelConfig.validate runs the C++ validator: the same rules and message as the engine's."""
    config = blockbatch.Engine.from_pretrained().config
    bad = dataclasses.replace(config, eos_token_id=config.mask_token_id)
    with pytest.raises(
        CheckpointError,
        match=rf"^config: key 'eos_token_id' = {config.mask_token_id} equals "
        "mask_token_id$",
    ):
        bad.validate()
    with pytest.raises(
        ValueError,
        match=rf"^config: key 'eos_token_id' = {config.mask_token_id} equals "
        "mask_token_id$",
    ):
        torch.ops.blockbatch.check_config(bad.int_fields(), bad.float_fields())
    from blockbatch import config as config_module

    assert config_module.MAX_LAYERS == 1 << 16 and config_module.MAX_SEQUENCE_LENGTH == 1 << 20
    assert ModelConfig.validate is type(config).validate
