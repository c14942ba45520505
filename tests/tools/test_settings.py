"""The settings table (python/blockbatch/settings.py) is the one description of every BLOCKBATCH_*
variable: the C++ reads agree with it, no source reads a variable it lacks, and the docs table (docs/install.md),
`generate --help` and the benchmarks' candidates are rendered from it. No build or GPU needed."""

import pathlib
import re

import pytest

from blockbatch import settings

ROOT = pathlib.Path(__file__).resolve().parents[2]
OPS_CUDA = ROOT / "csrc" / "ops" / "cuda" / "settings.cpp"
CXX_SUFFIXES = {".c", ".cc", ".cpp", ".cu", ".cuh", ".h", ".hpp"}
NAME = r"(?<!-D)(?<![\w])(BLOCKBATCH_[A-Z0-9_]*[A-Z0-9])\b"  # a variable name; CMake -D options aside


def cpp_reads() -> dict[str, dict]:
    """{variable: {"kind", "choices" / "range", "default"}} from ops/cuda/settings.cpp's env_choice / env_int calls
    and its kDefault* block (default None: the call falls back to a heuristic's choice)."""
    text = OPS_CUDA.read_text()
    constants = {m[0]: m[1] for m in re.findall(r'constexpr (?:const char\*|int) (kDefault\w+) = "?([\w.]+)"?;', text)}
    reads: dict[str, dict] = {}
    for name, choices, fallback in re.findall(r'env_choice\(\s*"(BLOCKBATCH_\w+)",\s*\{([^}]*)\},\s*(\w+)\)', text):
        assert name not in reads, f"{name} is read twice in ops/cuda/settings.cpp"
        reads[name] = {"choices": tuple(re.findall(r'"([^"]*)"', choices)), "default": constants.get(fallback)}
    for name, lo, hi, fallback in re.findall(r'env_int\(\s*"(BLOCKBATCH_\w+)",\s*(-?\d+),\s*(-?\d+),\s*(\w+)\)', text):
        assert name not in reads, f"{name} is read twice in ops/cuda/settings.cpp"
        reads[name] = {"range": (int(lo), int(hi)), "default": constants.get(fallback)}
    return reads


def test_cpp_reads_agree_with_the_table():
    reads = cpp_reads()
    assert {"BLOCKBATCH_ATTN_KERNEL", "BLOCKBATCH_ATTN_SPLITS", "BLOCKBATCH_CUDA_BATCHING"} <= set(
        reads
    )  # the scan finds them
    text = OPS_CUDA.read_text()
    calls = len(re.findall(r"\benv_(?:choice|int)\(\s*\"", text))
    assert calls == len(reads), "an env_choice / env_int call the scan does not parse"
    runtime = {s.name: s for s in settings.runtime()}
    assert set(reads) == set(runtime), "ops/cuda/settings.cpp and the table list different runtime variables"
    for name, read in reads.items():
        s = runtime[name]
        assert read["default"] == s.default, (
            f"{name}: ops/cuda/settings.cpp's default {read['default']} != the table's {s.default}"
        )
        if "choices" in read:
            assert s.kind in ("choice", "bool") and read["choices"] == s.choices, name
        else:
            assert s.kind == "int" and read["range"] == s.range, name


def test_every_kdefault_constant_is_used_once():
    text = OPS_CUDA.read_text()
    for const in re.findall(r"constexpr [\w ]+\*? (kDefault\w+) =", text):
        assert len(re.findall(rf"\b{const}\b", text)) == 2, f"{const}: declared and used once"


def test_the_table_is_consistent():
    names = [s.name for s in settings.SETTINGS]
    assert len(names) == len(set(names))
    for s in settings.SETTINGS:
        assert s.name.startswith("BLOCKBATCH_") and s.doc and "\n" not in s.doc
        assert s.status in ("promoted", "candidate", "build") and s.kind in ("choice", "int", "bool", "build", "text")
        assert (s.status == "build") == (s.kind == "build") == (s.scope == "build")
        assert (s.kind == "text") == (s.scope == "serve")  # read by blockbatch serve, never by _C
        if s.kind in ("choice", "bool"):
            assert s.default in s.choices and set(s.candidates) <= set(s.choices) - {s.default}
        if s.kind == "bool":
            assert s.choices == ("0", "1")
        if s.kind == "int":
            lo, hi = s.range
            assert s.default is None or lo <= int(s.default) <= hi
            assert all(lo <= int(c) <= hi for c in s.candidates) and s.default not in s.candidates
        if s.candidates:
            assert s.status == "candidate", f"{s.name} has opt-in values but is not a candidate"


def test_benchmark_candidates_derive_from_the_table():
    cands = settings.candidates()
    for name, env in cands.items():
        for var, value in env.items():
            assert settings.is_candidate(var, value), f"{name}: {var}={value} is not a candidate in the table"
    # Every candidate value of the table is timed by some benchmark candidate.
    timed = {(k, v) for env in cands.values() for k, v in env.items()}
    for s in settings.SETTINGS:
        for value in s.candidates:
            assert (s.name, value) in timed, f"{s.name}={value} is a candidate no benchmark times"
    # "all" (every in_all candidate together) comes last, and only when there is one.
    in_all = any(c.in_all for c in settings.CANDIDATES if c.name in cands)
    assert ("all" in cands) == in_all and (not in_all or list(cands)[-1] == "all")
    # Each candidate is timed on the model whose layers run it, and on that one only.
    for model in ("llada", "llada2"):
        mine = set(settings.candidates(model)) - {"all"}
        assert mine == {c.name for c in settings.CANDIDATES if c.model == model and c.name in cands}
    groups = {g for g, _ in settings.candidate_test_groups()}
    assert {c.group for c in settings.CANDIDATES} <= groups
    assert set(settings.candidate_tests()) == set(cands) - {"all"}


def test_benchmarks_use_the_table(monkeypatch):
    """benchmarks/common.py CANDIDATES and gpu_summary's verdict tests are the table's (today's set:
    the fused MoE kernels, timed on LLaDA2-mini-shaped steps only)."""
    import importlib.util

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    common = pytest.importorskip("common")
    assert common.CANDIDATES == settings.candidates()
    assert common.CANDIDATES == {"moe_fused": {"BLOCKBATCH_MOE_KERNEL": "fused"}}
    assert settings.candidates("llada") == {}
    spec = importlib.util.spec_from_file_location("gpu_summary", ROOT / "benchmarks" / "gpu_summary.py")
    gpu_summary = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_summary)
    assert gpu_summary.CANDIDATE_TESTS == settings.candidate_tests()


def test_promoting_a_candidate_drops_it_everywhere(monkeypatch):
    """A candidate value is in CANDIDATES (with "all"), the verdict tests, the test groups and the
    pytest mark; promoted, it leaves all of them. On a made-up trial of the scalar RoPE kernel
    (today's table has no candidate left)."""
    import dataclasses

    rope = settings.get("BLOCKBATCH_ROPE_KERNEL")
    trial = dataclasses.replace(rope, status="candidate", candidates=("scalar",))
    monkeypatch.setitem(settings.BY_NAME, "BLOCKBATCH_ROPE_KERNEL", trial)
    monkeypatch.setattr(
        settings,
        "CANDIDATES",
        (
            settings.Candidate(
                "rope_scalar", {"BLOCKBATCH_ROPE_KERNEL": "scalar"}, "pair RoPE", ("rope_kv_write_cuda",), "rope"
            ),
        ),
    )
    monkeypatch.setattr(settings, "TEST_GROUPS", (("rope", "rope_kv_write_cuda"),))
    assert settings.candidates() == {
        "rope_scalar": {"BLOCKBATCH_ROPE_KERNEL": "scalar"},
        "all": {"BLOCKBATCH_ROPE_KERNEL": "scalar"},
    }
    assert settings.candidate_tests() == {"rope_scalar": ("rope_kv_write_cuda",)}
    assert settings.candidate_test_groups() == [("rope", "rope_kv_write_cuda")]
    assert settings.param("BLOCKBATCH_ROPE_KERNEL", "scalar").marks
    assert not settings.param("BLOCKBATCH_ROPE_KERNEL", "vec").marks
    monkeypatch.setitem(
        settings.BY_NAME,
        "BLOCKBATCH_ROPE_KERNEL",
        dataclasses.replace(trial, default="scalar", status="promoted", candidates=()),
    )
    assert settings.candidates() == {} and settings.candidate_tests() == {}
    assert settings.candidate_test_groups() == []
    assert not settings.param("BLOCKBATCH_ROPE_KERNEL", "scalar").marks


def test_docs_table_is_rendered_from_the_table():
    page = (ROOT / "docs" / "install.md").read_text(encoding="utf-8")
    assert settings.replace_docs_table(page) == page, (
        "docs/install.md's settings table is out of date: run `python -m blockbatch.settings docs`"
    )


def test_help_block_lists_every_runtime_variable_with_its_default():
    text = settings.help_text()
    for s in settings.runtime():
        assert f"  {s.syntax}" in text and f"(default {s.default_text}" in text  # never wrapped apart
    assert all(len(line) <= 100 for line in text.splitlines())
    assert "not yet" not in text


def _reads_in_scripts() -> dict[str, set]:
    """{variable: files} of every BLOCKBATCH_* name in the Python / shell sources, CMake -D options aside."""
    files = [
        p
        for d in ("python", "benchmarks", "tests", ".ci")
        for p in (ROOT / d).rglob("*")
        if p.is_file() and (p.suffix in (".py", ".sh") or p.parent.name == ".ci")
    ]
    files.append(ROOT / "setup.py")
    found: dict[str, set] = {}
    for f in files:
        if f.name == "test_settings.py":
            continue
        for name in re.findall(NAME, f.read_text(errors="replace")):
            found.setdefault(name, set()).add(str(f.relative_to(ROOT)))
    return found


def _reads_in_cxx() -> dict[str, set]:
    pattern = r'(?:getenv|env_choice|env_int)\(\s*"(BLOCKBATCH_\w+)"'
    found: dict[str, set] = {}
    for f in (ROOT / "csrc").rglob("*"):
        if f.suffix in CXX_SUFFIXES:
            for name in re.findall(pattern, f.read_text(errors="replace")):
                found.setdefault(name, set()).add(str(f.relative_to(ROOT)))
    cmake = (ROOT / "CMakeLists.txt").read_text()
    for name in re.findall(r"\$ENV\{(BLOCKBATCH_\w+)\}", cmake):
        found.setdefault(name, set()).add("CMakeLists.txt")
    return found


def test_no_source_reads_a_variable_the_table_lacks():
    found = _reads_in_scripts()
    for name, where in _reads_in_cxx().items():
        found.setdefault(name, set()).update(where)
    assert {"BLOCKBATCH_ATTN_KERNEL", "BLOCKBATCH_SANITIZE", "BLOCKBATCH_CUDA"} <= set(found)  # the scans find them
    unknown = {name: sorted(where) for name, where in found.items() if name not in settings.BY_NAME}
    assert not unknown, f"BLOCKBATCH_* variables not in python/blockbatch/settings.py: {unknown}"


def test_the_scan_catches_an_unknown_variable(tmp_path):
    """The check above is not vacuous: a new os.environ read of an unlisted name is found."""
    f = tmp_path / "x.py"
    f.write_text('import os\nos.environ.get("BLOCKBATCH_NEW_THING")\nflags = ["-DBLOCKBATCH_OUTPUT_DIR=x"]\n')
    names = re.findall(NAME, f.read_text())
    assert names == ["BLOCKBATCH_NEW_THING"]


def test_status_prose_lives_in_the_notes_not_in_code():
    """'not yet timed / checked on a GPU' is the status column's job (prose: docs/bench/gpu/NOTES.md)."""
    phrase = re.compile(r"not yet (?:timed|checked|run)|until a GPU run", re.IGNORECASE)
    hits = []
    for d in ("csrc", "python", "benchmarks"):
        for f in (ROOT / d).rglob("*"):
            if f.is_file() and (f.suffix in CXX_SUFFIXES or f.suffix in (".py", ".sh")) and f.name != "settings.py":
                hits += [
                    f"{f.relative_to(ROOT)}:{i}"
                    for i, line in enumerate(f.read_text(errors="replace").splitlines(), 1)
                    if phrase.search(line)
                ]
    assert not hits, hits
