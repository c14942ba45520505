"""Presets (``blockbatch.presets``) through every front door: ``DecodeOptions.from_preset``,
``blockbatch generate --preset``, ``blockbatch bench --policies PRESET[:k=v,...]`` and the lm-eval
model's ``preset`` model arg (the server's forms: ``tests/serve/test_server.py``).

Nothing here depends on the values of ``blockbatch-best`` (the tune sweep sets them): the exact
checks use ``blockbatch-paper``, ``dual-fast-dllm`` and preset files written here.
"""

from __future__ import annotations

import json
import math

import pytest

from blockbatch import DecodeOptions, Engine, contract, presets
from blockbatch import cli as bb_cli
from blockbatch.bench import policy_kwargs, policy_options
from blockbatch.toy import checkpoint_path
from helpers.llada2 import toy_tokenizer_checkpoint

PROMPT = "72-2=__-3=__-3=__...............?"  # the toy task; greedy answer 72-2=70-3=67-3=64;64
# A file preset whose options all differ from the defaults (so "came from the preset" is observable).
MINE = {"policy": "blockbatch", "block_sizes": [8, 16, 48], "threshold": 0.7, "merge_gate": 0.8, "sync_gap": 4}


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    out = {family: Engine.from_pretrained(checkpoint_path(family)) for family in ("llada", "dream")}
    out["llada2"] = Engine.from_pretrained(str(toy_tokenizer_checkpoint(tmp_path_factory.mktemp("llada2"))))
    return out


@pytest.fixture
def mine(tmp_path):
    path = tmp_path / "mine.json"
    presets.write(str(path), "mine", MINE, description="a test preset", evidence={"measured": "nothing"})
    return str(path)


def _gen_length_for(preset: presets.Preset) -> int:
    """64 unless none of the preset's block sizes divides it (then their lcm)."""
    sizes = preset.options.get("block_sizes")
    if sizes and not any(64 % b == 0 for b in sizes):
        return math.lcm(*sizes)
    return 64


# --------------------------------------------------------------------------- the presets themselves


@pytest.mark.parametrize("family", ["llada", "dream", "llada2"])
@pytest.mark.parametrize("name", presets.names())
def test_built_in_presets_decode_on_every_family(engines, name, family):
    preset = presets.get(name)
    assert preset.source == "built-in" and preset.description and "gen_length" not in preset.options
    G = _gen_length_for(preset)
    options = DecodeOptions.from_preset(name, gen_length=G)
    assert options == DecodeOptions(**presets.values(name, {"gen_length": G}))
    assert options.policy == preset.options.get("policy", contract.DEFAULTS["policy"]) and options.gen_length == G
    for key, value in preset.options.items():  # every option the preset sets (sizes: those dividing G)
        if key == "block_sizes" and value:
            assert options.block_sizes == tuple(b for b in value if G % b == 0) and options.block_sizes
        else:
            assert getattr(options, key) == (tuple(value) if isinstance(value, list) else value), key
    if (options.policy == "block") != (family == "llada2"):  # LLaDA2's presets and the others' do not mix
        with pytest.raises(ValueError, match=r"policy 'block' is the decoder|not defined on llada2 checkpoints"):
            engines[family].generate(PROMPT, options, chat=False)
        return
    [gen] = engines[family].generate(PROMPT, options, chat=False)
    assert gen.stats["policy"] == options.policy and gen.stats["nfe"] >= 1
    if options.policy == "blockbatch":
        sizes = [b["block_size"] for b in gen.stats["branches"]]
        assert sizes == list(options.resolved("block_sizes", family))
        assert all(G % b == 0 for b in sizes)


def test_unknown_preset_names_the_choices():
    with pytest.raises(
        ValueError,
        match=r"unknown preset 'nope': the presets are blockbatch-paper, blockbatch-best, "
        r"dual-fast-dllm, llada2.0, llada2.1-edit, or give a preset file's path",
    ):
        DecodeOptions.from_preset("nope")
    with pytest.raises(TypeError, match="preset must be a preset name or a file path"):
        presets.get("")


def test_explicit_options_win_over_the_preset_and_the_preset_over_the_defaults(mine):
    paper = DecodeOptions.from_preset("blockbatch-paper", gen_length=64, threshold=0.7, merge=False)
    assert (paper.policy, paper.threshold, paper.merge, paper.merge_gate) == ("blockbatch", 0.7, False, 0.5)
    dual = DecodeOptions.from_preset("dual-fast-dllm", gen_length=64, block_length=16)
    assert (dual.policy, dual.block_length, dual.threshold) == ("dual", 16, 0.9)
    o = DecodeOptions.from_preset(mine, gen_length=96)
    assert (o.policy, o.block_sizes, o.threshold, o.merge_gate, o.sync_gap) == ("blockbatch", (8, 16, 48), 0.7, 0.8, 4)
    assert o.refresh_tokens == contract.DEFAULTS["refresh_tokens"]  # not in the preset: the default
    o = DecodeOptions.from_preset(mine, gen_length=96, merge_gate=0.5, block_sizes=(32,))
    assert (o.merge_gate, o.block_sizes, o.threshold) == (0.5, (32,), 0.7)


def test_block_sizes_are_fitted_to_gen_length(mine):
    assert presets.values(mine, gen_length=64)["block_sizes"] == (8, 16)
    assert presets.values(mine, gen_length=48)["block_sizes"] == (8, 16, 48)
    assert presets.values(mine, {"gen_length": 8})["block_sizes"] == (8,)
    assert presets.values(mine)["gen_length"] == contract.DEFAULTS["gen_length"]
    assert presets.values(mine, {"block_sizes": (4,)}, gen_length=12)["block_sizes"] == (4,)  # given: kept as is
    with pytest.raises(
        ValueError,
        match=r"preset 'mine': none of its block sizes \[8, 16, 48\] divides gen_length "
        r"12 .*or pass block_sizes",
    ):
        presets.values(mine, gen_length=12)
    with pytest.raises(ValueError, match="none of its block sizes"):
        DecodeOptions.from_preset(mine, gen_length=12)
    # a single-branch preset's block_length: the largest divisor of gen_length up to it
    assert DecodeOptions.from_preset("dual-fast-dllm", gen_length=48).block_length == 24
    assert DecodeOptions.from_preset("dual-fast-dllm", gen_length=64).block_length == 32


# --------------------------------------------------------------------------- preset files


def test_preset_file_round_trip(mine, tmp_path):
    data = json.loads(open(mine).read())
    assert data["blockbatch_preset"] == presets.FORMAT and data["name"] == "mine"
    assert data["options"] == MINE and data["evidence"] == {"measured": "nothing"}
    p = presets.get(mine)
    assert (p.name, p.description, p.options, p.source) == ("mine", "a test preset", MINE, mine)
    assert presets.read(mine) == p
    # gen_length is the request's: write leaves it out; tuples are written as lists
    again = tmp_path / "again.json"
    presets.write(str(again), "again", {**MINE, "block_sizes": (8, 16), "gen_length": 64})
    assert presets.read(str(again)).options == {**MINE, "block_sizes": [8, 16]}
    # the file's name when it has none
    unnamed = tmp_path / "unnamed.json"
    unnamed.write_text(json.dumps({"blockbatch_preset": 1, "options": {"threshold": 0.8}}))
    assert presets.get(str(unnamed)).name == "unnamed"


@pytest.mark.parametrize(
    "content,pattern",
    [
        ("{not json", r"not valid JSON"),
        (
            json.dumps({"blockbatch_preset": 2, "options": {"threshold": 0.8}}),
            r"not a BlockBatch preset \(expected an "
            r"object with \"blockbatch_preset\": 1\)",
        ),
        (json.dumps({"options": {"threshold": 0.8}}), r"not a BlockBatch preset"),
        (json.dumps([1, 2]), r"not a BlockBatch preset"),
        (json.dumps({"blockbatch_preset": 1, "options": {}}), r"\"options\" must be a non-empty object"),
        (json.dumps({"blockbatch_preset": 1, "options": {"colour": "red"}}), r"options.colour: unknown decode option"),
        (
            json.dumps({"blockbatch_preset": 1, "options": {"gen_length": 64}}),
            r"options.gen_length: a preset does not set gen_length",
        ),
        (json.dumps({"blockbatch_preset": 1, "options": {"threshold": "high"}}), r"options.threshold must be a number"),
        (
            json.dumps({"blockbatch_preset": 1, "options": {"block_sizes": [8, "x"]}}),
            r"options.block_sizes must be a list",
        ),
    ],
)
def test_bad_preset_files_name_the_file_and_the_key(tmp_path, content, pattern):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=rf"^preset file {path}: .*{pattern}"):
        presets.get(str(path))
    with pytest.raises(ValueError, match="options.gen_length: a preset does not set gen_length"):
        presets.check_options({"gen_length": 64})
    with pytest.raises(ValueError, match=rf"preset file {tmp_path / 'missing.json'}: file not found"):
        presets.get(str(tmp_path / "missing.json"))


# --------------------------------------------------------------------------- blockbatch generate --preset


def _flags(values: dict) -> list[str]:
    """The explicit generate flags for option values."""
    out = []
    for key, value in values.items():
        flag = contract.BY_NAME[key].flag
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + flag[2:])
        elif value is None and contract.BY_NAME[key].type == "bool":
            continue  # None: the policy's / family's default, which an absent flag also gives
        elif value is None:
            out += [flag, "none"]
        elif isinstance(value, (list, tuple)):
            out += [flag, ",".join(map(str, value))]
        else:
            out += [flag, str(value)]
    return out


def _generate(capsys, *args) -> dict:
    assert bb_cli.main(["generate", "--json", *map(str, args), PROMPT]) == 0
    [line] = capsys.readouterr().out.splitlines()
    row = json.loads(line)
    return {
        "ids": row["ids"],
        "text": row["text"],
        "nfe": row["stats"]["nfe"],
        "policy": row["stats"]["policy"],
        "branches": [b["block_size"] for b in row["stats"]["branches"]],
    }


def _option_values(*args) -> dict:
    return bb_cli.common.option_values(bb_cli.build_parser().parse_args(["generate", *map(str, args), "x"]))


@pytest.mark.parametrize("preset", ["blockbatch-paper", "dual-fast-dllm", "file"])
def test_cli_preset_equals_the_explicit_flags(capsys, mine, preset):
    name = mine if preset == "file" else preset
    values = presets.values(name, gen_length=48)
    by_preset = _generate(capsys, "--preset", name, "--gen-length", 48)
    by_flags = _generate(capsys, *_flags(values))
    assert by_preset == by_flags
    assert by_preset["policy"] == values["policy"]
    if preset == "file":
        assert by_preset["branches"] == [8, 16, 48]


def test_cli_explicit_flags_win_over_the_preset(capsys, mine):
    # an explicit flag wins even when it holds the default value; flags not given keep the preset's
    got = _option_values("--preset", mine, "--threshold", "0.9", "--no-merge", "--gen-length", 64)
    assert (got["threshold"], got["merge"], got["merge_gate"], got["block_sizes"]) == (0.9, False, 0.8, (8, 16))
    got = _option_values("--preset", mine, "--threshold", "none", "--steps", 64, "--gen-length", 64)
    assert (got["threshold"], got["steps"], got["sync_gap"]) == (None, 64, 4)
    got = _option_values("--preset", "dual-fast-dllm", "--policy", "vanilla")
    assert (got["policy"], got["block_length"], got["gen_length"]) == ("vanilla", 32, 128)
    assert _option_values("--threshold", "0.8") == {**contract.DEFAULTS, "threshold": 0.8}  # no preset: unchanged
    # end to end: the override is the decode's
    over = _generate(capsys, "--preset", "dual-fast-dllm", "--gen-length", 32, "--block-length", 8)
    assert over["branches"] == [8] and over["policy"] == "dual"
    assert over == _generate(capsys, "--policy", "dual", "--gen-length", 32, "--block-length", 8, "--threshold", 0.9)
    sizes = _generate(capsys, "--preset", mine, "--gen-length", 32, "--block-sizes", "8,32")
    assert sizes["branches"] == [8, 32]


def test_cli_preset_errors_are_one_line(capsys, tmp_path, mine):
    def error(*args) -> str:
        assert bb_cli.main(["generate", *map(str, args), PROMPT]) == 2
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), err
        return lines[0]

    assert error("--preset", "nope").startswith(
        "error: --preset: unknown preset 'nope': the presets are blockbatch-paper, blockbatch-best, dual-fast-dllm"
    )
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"blockbatch_preset": 1, "options": {"colour": "red"}}))
    assert error("--preset", bad) == (
        f"error: --preset: preset file {bad}: options.colour: unknown decode option; "
        f"the options are {', '.join(contract.NAMES)}"
    )
    assert error("--preset", mine, "--gen-length", 12).startswith(
        "error: --preset: preset 'mine': none of its block sizes [8, 16, 48] divides gen_length 12"
    )
    assert error("--preset", mine, "--steps", 64) == (
        "error: --steps 64 is used only by the fixed schedule, but "
        "--threshold 0.7 commits by confidence and would ignore it: pass "
        "--threshold none with --steps 64"
    )


def test_cli_generate_help_lists_the_presets(capsys):
    with pytest.raises(SystemExit) as e:
        bb_cli.main(["generate", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    text = " ".join(out.split())
    flat = "".join(out.split())  # argparse may wrap a name at its hyphen
    assert "--preset NAME|FILE" in text and "preset file" in text and "blockbatch_preset" in flat
    assert all(f"{name}:" in flat for name in presets.names())


# --------------------------------------------------------------------------- blockbatch bench


def test_bench_policy_specs_take_presets(mine):
    assert policy_options("blockbatch-paper", 64) == DecodeOptions.from_preset("blockbatch-paper", gen_length=64)
    assert policy_options("dual-fast-dllm:block_length=16,threshold=0.7", 64) == DecodeOptions(
        policy="dual", gen_length=64, block_length=16, threshold=0.7
    )
    o = policy_options(f"{mine}:threshold=0.8,block_sizes=8/32", 64)
    assert (o.policy, o.threshold, o.block_sizes, o.merge_gate) == ("blockbatch", 0.8, (8, 32), 0.8)
    assert policy_options(mine, 64).block_sizes == (8, 16)  # fitted to --gen-length
    assert policy_kwargs(mine, 64, fit=False)["block_sizes"] == (8, 16, 48)
    assert policy_options("blockbatch-best:threshold=0.8", 128).threshold == 0.8
    with pytest.raises(
        ValueError,
        match=r"policy must be one of vanilla, prefix, dual, blockbatch, block, window, wavefront, a preset "
        r"\(blockbatch-paper, blockbatch-best, dual-fast-dllm, llada2.0, llada2.1-edit\) or a preset file",
    ):
        policy_options("greedy", 64)
    with pytest.raises(ValueError, match=r"'blockbatch-paper:gate=3': unknown option 'gate'"):
        policy_options("blockbatch-paper:gate=3", 64)
    with pytest.raises(ValueError, match=r"'missing.json': preset file missing.json: file not found"):
        policy_options("missing.json", 64)
    with pytest.raises(ValueError, match=rf"'{mine}': preset 'mine': none of its block sizes"):
        policy_options(mine, 12)


@pytest.mark.slow
def test_cli_bench_runs_presets_under_the_names_given(capsys, tmp_path, mine):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"prompt": PROMPT, "answer": "72-2=70-3=67-3=64;64"}) + "\n")
    specs = ["dual:block_length=16", "dual-fast-dllm", "blockbatch-paper:threshold=0.8", mine]
    assert (
        bb_cli.main(
            [
                "bench",
                "--tasks",
                str(tasks),
                "--n",
                "1",
                "--gen-length",
                "48",
                "--quiet",
                "--out",
                str(tmp_path / "out"),
                "--policies",
                *specs,
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert all(spec in printed for spec in specs)
    data = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert list(data["summary"]) == specs
    assert data["policies"]["blockbatch-paper:threshold=0.8"]["threshold"] == 0.8
    assert data["policies"][mine]["block_sizes"] == [8, 16, 48]
    assert data["policies"]["dual-fast-dllm"]["block_length"] == 24  # 32 fitted to gen_length 48
    assert all(s["mean_nfe"] >= 1 for s in data["summary"].values())


# --------------------------------------------------------------------------- lm-eval model


def test_lm_eval_preset_model_arg(mine):
    pytest.importorskip("lm_eval", reason="lm-eval is not installed (pip install lm-eval)")
    from blockbatch.lm_eval import BlockBatchLM

    dual = BlockBatchLM(preset="dual-fast-dllm", device="cpu")
    options, budget = dual.options_for({"max_gen_toks": 40})
    assert (options.policy, options.block_length, options.threshold, options.gen_length, budget) == (
        "dual",
        32,
        0.9,
        64,
        40,
    )  # 40 rounded up to the preset's block
    lm = BlockBatchLM(preset=mine, device="cpu", threshold=0.8)
    options, _ = lm.options_for({"max_gen_toks": 20})
    assert (options.gen_length, options.block_sizes, options.threshold, options.merge_gate) == (
        48,
        (8, 16, 48),
        0.8,
        0.8,
    )
    fixed = BlockBatchLM(preset=mine, device="cpu", gen_length=32)
    assert fixed.options_for({"max_gen_toks": 20})[0].block_sizes == (8, 16)  # fitted to the fixed canvas
    assert lm.generate_until([_Request(PROMPT, {"until": ["\n"], "max_gen_toks": 20})], disable_tqdm=True) == [
        lm.engine.codec.decode(lm.engine.generate(PROMPT, options, chat=False)[0].ids[:20])
    ]
    with pytest.raises(ValueError, match="give policy or preset, not both"):
        BlockBatchLM(policy="dual", preset="dual-fast-dllm")
    with pytest.raises(ValueError, match="unknown preset 'nope'"):
        BlockBatchLM(preset="nope")
    with pytest.raises(ValueError, match="none of its block sizes"):
        BlockBatchLM(preset=mine, gen_length=12)


class _Request:
    def __init__(self, context: str, gen_kwargs: dict):
        self.args = (context, gen_kwargs)
