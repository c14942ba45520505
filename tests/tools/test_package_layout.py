"""The package's shape (issue "The Python package by job"): no module over 500 lines outside the
reference decoders, no import circle between its modules (imports inside functions count: a lazy
import hides a circle, it does not remove it), no module importing another's private names, and
the wheel's package holds no build-time tool or test helper."""

from __future__ import annotations

import ast
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "blockbatch"
MAX_LINES = 500


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: pathlib.Path, modules: dict) -> list[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) for every import of a blockbatch module in ``path``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names if a.name.split(".")[0] == "blockbatch"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "blockbatch":
                continue
            names = [a.name for a in node.names]
            subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
            found += [(s, [], node.lineno) for s in subs]
            found.append((target, [n for n in names if f"{target}.{n}" not in modules], node.lineno))
    return [(t, n, line) for t, n, line in found if t in modules and t != name]


def test_no_module_is_a_god_file():
    long = {
        name: n
        for name, path in _modules().items()
        if ".reference" not in name and (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines (split them by job): {long}"


def test_no_import_circle():
    modules = _modules()
    graph = {name: sorted({t for t, _, _ in _imports(name, path, modules)}) for name, path in modules.items()}
    # Importing a submodule imports its package first: an edge from a package's __init__ to its own
    # submodules is how packages re-export, not a circle.
    graph = {name: [t for t in targets if not t.startswith(name + ".")] for name, targets in graph.items()}
    state: dict[str, int] = {}
    circles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                circles.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for name in graph:
        if name not in state:
            visit(name, [name])
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


def test_private_names_stay_in_their_module():
    modules = _modules()
    leaks = [
        f"{path.relative_to(ROOT)}:{line} takes {n} from {target}"
        for name, path in modules.items()
        for target, names, line in _imports(name, path, modules)
        for n in names
        if n.startswith("_")
        and not n.startswith("__")
        and target != "blockbatch._C_loader"
        and not target.startswith(name.rpartition(".")[0] + "._")
    ]
    assert not leaks, "\n".join(leaks)


@pytest.mark.parametrize(
    "gone",
    [
        "gen_contract.py",
        "random_branch_state.py",
        "toy/train.py",
        "server.py",
        "ray_serve.py",
        "cli.py",
        "dream_checkpoint.py",
    ],
)
def test_tools_and_helpers_are_outside_the_package(gone):
    assert not (PACKAGE / gone).exists()


def test_the_checker_finds_a_circle(tmp_path, monkeypatch):
    """The circle check can fail: two modules importing each other inside functions are reported."""
    pkg = tmp_path / "blockbatch"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from . import b\n")
    (pkg / "b.py").write_text("def g():\n    from .a import f\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", pkg)
    with pytest.raises(AssertionError, match="blockbatch.a -> blockbatch.b -> blockbatch.a"):
        test_no_import_circle()
