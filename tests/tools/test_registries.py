"""Families and policies are data (issue 52): the front doors ask ``families.REGISTRY`` and
``policies.REGISTRY``, never a name.

1. A static scan (ast) of python/blockbatch: outside the modules that *are* the registries or the
   tables keyed by them (``EXEMPT_FAMILY`` / ``EXEMPT_POLICY`` below, each with its reason), no
   module compares a value with a family name literal ("llada", "dream", "llada2") or a policy name
   literal ("vanilla", "prefix", "dual", "blockbatch", "block"): ``==``, ``!=``, ``in (...)``,
   ``x in "..."``, a dict display keyed by such literals, or a subscript by one (dispatch tables).
   Plain values stay allowed: ``DecodeOptions(policy="dual")``, ``Grid(policies=("dual", ...))``,
   CLI choices built from the registry. Each offence is reported as file:line.
2. Every registered module declares every field the front doors read (tests over the registries),
   and the two registries agree with each other and with the options table.
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import sys

import pytest

from blockbatch import contract, families, policies, tune

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "blockbatch"

FAMILY_NAMES = frozenset(contract.FAMILIES)
POLICY_NAMES = frozenset(contract.POLICIES)

# Paths relative to python/blockbatch; a folder ends with "/". Keep these few and say why.
EXEMPT_FAMILY = {
    "families/": "the family registry itself",
    "reference/": "the float32 oracle: its per-family rules table (reference.policies.RULES)",
    "policies/": "per-family rows inside a policy (its reference entries), as the C++ policy tables",
    "contract.py": "the options table: its by_family column and the family-named option groups",
    "settings.py": "bench_gpu_step's candidate models, named by the family whose steps they time",
    "toy/__init__.py": "the shipped toy checkpoints, one folder per family",
}
EXEMPT_POLICY = {
    "policies/": "the policy registry itself",
    "reference/": "the float32 oracle: one decoder per policy",
    "contract.py": "the options table: the policies each option applies to",
}


# Single comparisons allowed outside those: (file, the offending code) -> why. These are not
# policies at all; an entry whose code is gone must be removed (test_every_allowed_site_is_still_there).
NOT_A_POLICY = {
    ("bench.py", '"blockbatch": __version__'): "the package's name in the environment record",
    ("serve/responses.py", '"blockbatch": outcome.report'): "the response's blockbatch extension field",
    ("cli/tune.py", 'x == "block"'): "--refresh's keyword 'block' (the smallest branch), not the policy",
}


def _exempt(rel: str, table: dict[str, str]) -> bool:
    return any(rel == key or (key.endswith("/") and rel.startswith(key)) for key in table)


def _literals(node: ast.AST) -> list[str]:
    """The string constants ``node`` is or holds directly (a tuple, list or set of them)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def offences(source: str, names: frozenset[str]) -> list[tuple[int, str, str]]:
    """(line, code, what) for each comparison with, dict keyed by, or subscript by a literal of
    ``names``; ``code``: the comparison, the first such ``key: value`` pair, or the subscript."""
    found = []

    def code(*nodes: ast.AST) -> str:
        return ": ".join(ast.get_source_segment(source, n) or "" for n in nodes)

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            hit = sorted({s for operand in [node.left, *node.comparators] for s in _literals(operand)} & names)
            if hit:
                found.append((node.lineno, code(node), f"compares with {', '.join(map(repr, hit))}"))
        elif isinstance(node, ast.Dict):
            keyed = [(k, v) for k, v in zip(node.keys, node.values) if k is not None and set(_literals(k)) & names]
            if keyed:
                hit = sorted({s for k, _ in keyed for s in _literals(k)} & names)
                found.append((node.lineno, code(*keyed[0]), f"a dict keyed by {', '.join(map(repr, hit))}"))
        elif isinstance(node, ast.Subscript):
            hit = sorted(set(_literals(node.slice)) & names)
            if hit:
                found.append((node.lineno, code(node), f"looks up {', '.join(map(repr, hit))}"))
    return found


def _scan(names: frozenset[str], exempt: dict[str, str], allowed=()) -> list[str]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if _exempt(rel, exempt):
            continue
        for line, text, what in offences(path.read_text(encoding="utf-8"), names):
            if (rel, text) not in allowed:
                out.append(f"python/blockbatch/{rel}:{line}: {what}: {text}")
    return out


def test_no_front_door_tests_a_family_name():
    bad = _scan(FAMILY_NAMES, EXEMPT_FAMILY, {})
    assert not bad, "ask blockbatch.families.REGISTRY instead of naming a family:\n" + "\n".join(bad)


def test_no_front_door_tests_a_policy_name():
    bad = _scan(POLICY_NAMES, EXEMPT_POLICY, NOT_A_POLICY)
    assert not bad, "ask blockbatch.policies.REGISTRY instead of naming a policy:\n" + "\n".join(bad)


def test_every_exemption_names_a_file_that_exists():
    for key in [*EXEMPT_FAMILY, *EXEMPT_POLICY]:
        assert (PACKAGE / key).exists(), f"exemption {key!r}: no such file or folder under python/blockbatch"


@pytest.mark.parametrize(
    "site, names",
    [(site, POLICY_NAMES) for site in NOT_A_POLICY],
    ids=lambda x: x[0] if isinstance(x, tuple) else "",
)
def test_every_allowed_site_is_still_there(site, names):
    """A site fixed (or moved) leaves the list: the allowances cannot outlive their code."""
    rel, text = site
    found = [t for _, t, _ in offences((PACKAGE / rel).read_text(encoding="utf-8"), names)]
    assert text in found, f"{rel}: {text!r} is no longer a name test there; remove it from the list"


@pytest.mark.parametrize(
    "source, names",
    [
        ('if config.family == "llada2":\n    pass\n', FAMILY_NAMES),
        ('x = "dream" != family\n', FAMILY_NAMES),
        ('ok = family in ("llada", "dream")\n', FAMILY_NAMES),
        ('HELP = {"llada2": "block only"}\n', FAMILY_NAMES),
        ('d = CHECKPOINTS["dream"]\n', FAMILY_NAMES),
        ('if stats["policy"] == "blockbatch":\n    pass\n', POLICY_NAMES),
        ('bases = {"vanilla": 1, "dual": 2}\n', POLICY_NAMES),
        ('if policy not in ("prefix", "dual"):\n    pass\n', POLICY_NAMES),
    ],
)
def test_the_scan_finds_a_name_test(source, names):
    assert offences(source, names), source


def test_a_failure_names_the_file_and_line(tmp_path, monkeypatch):
    (tmp_path / "front.py").write_text('x = 1\nif config.family == "llada2":\n    pass\n')
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path)
    assert _scan(FAMILY_NAMES, {}) == [
        "python/blockbatch/front.py:2: compares with 'llada2': config.family == \"llada2\""
    ]


@pytest.mark.parametrize(
    "source",
    [
        'o = DecodeOptions(policy="dual", gen_length=64)\n',
        'grid = Grid(policies=("dual", "blockbatch"))\n',
        'kw = dict(policy="block", threshold=0.95)\n',
        "choices = list(policies.REGISTRY)\n",
        'if module.MULTI_BRANCH and stats["policy"] == NAME:\n    pass\n',
    ],
)
def test_the_scan_lets_plain_values_pass(source):
    assert not offences(source, FAMILY_NAMES | POLICY_NAMES), source


# --------------------------------------------------------------------------- the registries' fields

# What the front doors read of a policy module: name -> a check of its value.
POLICY_FIELDS = {
    "NAME": lambda v: isinstance(v, str),
    "MULTI_BRANCH": lambda v: isinstance(v, bool),
    "OPTION_GROUP_HELP": lambda v: v is None or isinstance(v, str),
    "TUNE_AXES": lambda v: isinstance(v, tuple) and all(isinstance(a, str) for a in v),
    "bench_options": callable,
    "tune_rows": callable,
    "summary": callable,
    "REFERENCE": lambda v: isinstance(v, dict) and all(callable(e) for e in v.values()),
    "PLOT_COLOR": lambda v: isinstance(v, str),
    "unit_sizes": callable,
    "BLOCKS_ALIGNED_AT_ZERO": lambda v: isinstance(v, bool),
    "STEPS_WITH_CONFIDENCE": lambda v: isinstance(v, bool),
}
# What the front doors read of a family module (reference_model and tensor_count are optional:
# without them, bench uses reference.model.ReferenceModel and a fixed count per layer).
FAMILY_FIELDS = {
    "NAME": lambda v: isinstance(v, str),
    "DISPLAY_NAME": lambda v: isinstance(v, str),
    "MODEL_TYPE": lambda v: isinstance(v, str),
    "DEFAULT_OPTIONS": lambda v: isinstance(v, dict),
    "POLICIES": lambda v: isinstance(v, tuple) and len(v) > 0,
    "BENCH_POLICIES": lambda v: isinstance(v, tuple) and len(v) > 0,
    "TUNE_POLICIES": lambda v: v is None or (isinstance(v, tuple) and len(v) > 0),
    "TUNE_GRID": lambda v: isinstance(v, dict),
    "SAMPLERS": lambda v: isinstance(v, bool),
    "MIXTURE_OF_EXPERTS": lambda v: isinstance(v, bool),
    "OPTION_GROUP_HELP": lambda v: v is None or isinstance(v, str),
    "TOY_EVAL_POLICIES": lambda v: isinstance(v, tuple),
    "PUBLISHED_SHAPES": lambda v: isinstance(v, dict),
    "PROPOSALS_WITHIN_TOKENIZER": lambda v: isinstance(v, bool),
    "weight_shapes": callable,
    "random_config": callable,
    "random_weights": callable,
    "generation_config": callable,
    "default_kv_heads": callable,
    "missing_tensor_hint": callable,
}


@pytest.mark.parametrize("name", list(policies.REGISTRY))
def test_every_policy_module_declares_what_the_front_doors_read(name):
    module = policies.REGISTRY[name]
    missing = [f for f in POLICY_FIELDS if not hasattr(module, f)]
    assert not missing, f"{module.__name__} lacks {', '.join(missing)}"
    bad = [f for f, ok in POLICY_FIELDS.items() if not ok(getattr(module, f))]
    assert not bad, f"{module.__name__}: {', '.join(bad)} of the wrong kind"
    assert module.NAME == name
    grid_fields = {f.name for f in dataclasses.fields(tune.Grid)}
    assert set(module.TUNE_AXES) <= grid_fields, f"{name}: TUNE_AXES not tune.Grid fields"
    options = module.bench_options(64)
    assert options["policy"] == name and "threshold" in options
    assert set(module.REFERENCE) <= FAMILY_NAMES, f"{name}: reference entries for unknown families"


@pytest.mark.parametrize("name", list(families.REGISTRY))
def test_every_family_module_declares_what_the_front_doors_read(name):
    module = families.REGISTRY[name]
    missing = [f for f in FAMILY_FIELDS if not hasattr(module, f)]
    assert not missing, f"{module.__name__} lacks {', '.join(missing)}"
    bad = [f for f, ok in FAMILY_FIELDS.items() if not ok(getattr(module, f))]
    assert not bad, f"{module.__name__}: {', '.join(bad)} of the wrong kind"
    assert module.NAME == name
    for field in ("POLICIES", "BENCH_POLICIES", "TUNE_POLICIES", "TOY_EVAL_POLICIES"):
        unknown = set(getattr(module, field) or ()) - set(policies.REGISTRY)
        assert not unknown, f"{name}.{field} names policies no module declares: {unknown}"
    assert set(module.BENCH_POLICIES) <= set(module.POLICIES)
    assert set(module.TUNE_POLICIES or ()) <= set(module.POLICIES)
    assert set(module.TOY_EVAL_POLICIES) <= set(module.POLICIES)
    default = module.DEFAULT_OPTIONS.get("policy", contract.BY_NAME["policy"].default)
    assert default in module.POLICIES, f"{name}: its default policy {default!r} is not one it decodes with"


def test_the_registries_follow_the_options_table():
    assert tuple(policies.REGISTRY) == contract.POLICIES
    assert tuple(families.REGISTRY) == contract.FAMILIES


@pytest.mark.parametrize("family", list(families.REGISTRY))
def test_every_policy_a_family_decodes_has_its_reference_entry(family):
    """bench --compare-reference and the toy evaluation can check every pair the engine runs."""
    lacking = [p for p in families.REGISTRY[family].POLICIES if family not in policies.REGISTRY[p].REFERENCE]
    assert not lacking, f"policies {lacking} decode {family} checkpoints but have no reference entry for it"


def test_every_option_group_has_a_title():
    """generate --help titles a group named after a family or a policy by that module's OPTION_GROUP_HELP."""
    from blockbatch.cli.generate import _option_groups

    groups = _option_groups()
    assert list(groups) == list(dict.fromkeys(o.group for o in contract.OPTIONS))
    assert all(groups.values())


def test_an_unknown_policy_is_named_with_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown policy 'fast'; the policies are vanilla, prefix, dual"):
        policies.get("fast")
    with pytest.raises(ValueError, match="policies: 'fast' is not one of vanilla, prefix, dual, blockbatch, block"):
        tune.configs(tune.Grid(policies=("fast",)), 64)


def test_a_policy_without_a_reference_for_the_family_is_named_with_those_it_has():
    """bench --compare-reference on a pair the engine refuses: a ValueError naming both, not a
    wrong decoder (the old bench ran LLaDA2's block decoder whatever the policy)."""
    import torch

    from blockbatch import DecodeOptions

    with pytest.raises(ValueError, match=r"policy 'dual' has no reference decoder for llada2 checkpoints; it decodes "):
        policies.reference(None, torch.tensor([1, 2]), DecodeOptions(policy="dual", gen_length=32), "llada2")


def _call_keywords(function) -> set[str]:
    """The keyword names of the calls inside ``function``'s source."""
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    return {k.arg for node in ast.walk(tree) if isinstance(node, ast.Call) for k in node.keywords if k.arg}


def test_llada_reference_entries_pass_every_option_their_reference_reads():
    """Class: a reference decode checked under other options than the engine's. bench
    --compare-reference and the toy evaluation call a policy's REFERENCE entry; LLaDA's BlockBatch
    entry once dropped share_prompt_kv and fold_rows, so a share decode was compared with the exact
    one. Every parameter of the reference function that is a decode option LLaDA reads must be
    passed (Dream's samplers, the options table's group "dream", are Dream's entry's)."""
    import inspect

    from blockbatch import contract, policies
    from blockbatch.policies import blockbatch as blockbatch_policy
    from blockbatch.reference.blockbatch import blockbatch_generate
    from blockbatch.reference.policies import generate

    options = {o.name for o in contract.OPTIONS if o.group != "dream"}
    # BlockBatch's entry returns the tokens and NFE of llada_reference_result (which logprobs' tests also
    # call for the commit rows): that is the function that calls the reference.
    entry = policies.get("blockbatch").REFERENCE["llada"]
    assert "llada_reference_result(model, prompt, o)" in inspect.getsource(entry)
    for entry, reference in (
        (blockbatch_policy.llada_reference_result, blockbatch_generate),
        (policies.get("dual").REFERENCE["llada"], generate),
    ):
        wanted = {p for p in inspect.signature(reference).parameters if p in options}
        missing = sorted(wanted - _call_keywords(entry) - {"policy", "gen_length", "block_length", "block_sizes"})
        assert not missing, f"{entry.__module__}.{entry.__name__} does not pass {missing} to {reference.__name__}"


# Counters every policy fills (the rest are a policy's own, declared in its C++ descriptor).
SHARED_STATS = frozenset(
    {"nfe", "nfe_paper", "winner_block_size", "wall_ms", "steps", "branches", "graph_captures", "graph_replays"}
)


def test_the_python_policy_registry_is_the_native_policy_table():
    import torch

    import blockbatch  # noqa: F401  (loads the ops)

    names, kinds, stats, steps_with_confidence = torch.ops.blockbatch.policy_table()
    assert names == list(policies.REGISTRY) == list(contract.POLICIES)
    stat_names = set(torch.ops.blockbatch.decode_stat_names())
    for name, k, s, flag in zip(names, kinds, stats, steps_with_confidence):
        assert policies.REGISTRY[name].STEPS_WITH_CONFIDENCE == flag, name
        assert k, f"policy {name!r} declares no step kinds"
        assert set(filter(None, s.split(","))) <= stat_names, (name, s)


@pytest.mark.parametrize(
    "family, policy",
    [(f, p) for f, module in families.REGISTRY.items() for p in module.POLICIES],
)
def test_a_decode_fills_only_the_counters_its_policy_declares(tmp_path, family, policy):
    """A decode fills only the shared counters and those its descriptor's `stats` declare: a counter
    set by a policy that does not declare it is a descriptor out of date."""
    import torch

    from blockbatch import DecodeOptions, Engine
    from blockbatch.random_checkpoint import make_random_checkpoint

    make_random_checkpoint(tmp_path / "m", family=family)
    engine = Engine.from_pretrained(str(tmp_path / "m"))
    names, _, stats, _ = torch.ops.blockbatch.policy_table()
    declared = set(filter(None, stats[names.index(policy)].split(",")))
    from helpers.families import REQUIRED_OPTIONS

    options = DecodeOptions(policy=policy, gen_length=16, block_length=8, **REQUIRED_OPTIONS.get(policy, {}))
    (out,) = engine.generate([[5, 6, 7, 8, 9]], options)
    counters = set(torch.ops.blockbatch.decode_stat_names())
    filled = {k for k, v in out.stats.items() if k in counters and v}
    assert filled - SHARED_STATS <= declared, (policy, sorted(filled - SHARED_STATS - declared))
