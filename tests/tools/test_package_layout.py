"""The package's shape (issues "The Python package by job" and 52): each function does one job,
no import circle between its modules (imports inside functions count: a lazy import hides a
circle, it does not remove it), no module importing another's private names, and the wheel's
package holds no build-time tool or test helper.

One job per function, as three checkable rules (they replace a 500-line limit per module, which
a long table or a well-split module could break and a 300-line function inside a short module
could pass):

* no function over ``MAX_FUNCTION_LINES`` lines outside the reference decoders (``reference/``
  is written to read like the algorithm's pseudo-code, one loop per policy);
* no function defining more than ``MAX_INNER_FUNCTIONS`` functions in its body (methods of a
  class defined inside do not count): a function holding many closures is a module in disguise,
  as ``create_app`` was with its 17 routes, handlers and helpers (324 lines);
* HTTP routes are declared only in ``serve/routes/`` (one module per job: generation, status,
  errors), so the app builder cannot grow them back.
"""

from __future__ import annotations

import ast
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "blockbatch"
MAX_FUNCTION_LINES = 200
MAX_INNER_FUNCTIONS = 6
ROUTE_METHODS = {"get", "post", "put", "patch", "delete", "head", "options", "api_route", "websocket"}
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


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


def _functions(path: pathlib.Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, FUNCTIONS):
            yield node


def inner_functions(fn: ast.AST) -> list[ast.AST]:
    """The functions defined in ``fn``'s own body (not inside a nested function or class)."""
    out, stack = [], list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        if isinstance(node, FUNCTIONS):
            out.append(node)
        elif not isinstance(node, ast.ClassDef):
            stack.extend(ast.iter_child_nodes(node))
    return out


def _where(path: pathlib.Path, node: ast.AST) -> str:
    return f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"


def test_no_function_is_a_god_function():
    long = [
        f"{_where(path, fn)} ({fn.end_lineno - fn.lineno + 1} lines)"
        for name, path in _modules().items()
        if ".reference" not in name
        for fn in _functions(path)
        if fn.end_lineno - fn.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them by job):\n" + "\n".join(long)


def test_no_function_is_a_module_in_disguise():
    crowded = [
        f"{_where(path, fn)} defines {n} functions"
        for path in _modules().values()
        for fn in _functions(path)
        if (n := len(inner_functions(fn))) > MAX_INNER_FUNCTIONS
    ]
    assert not crowded, (
        f"functions defining more than {MAX_INNER_FUNCTIONS} functions (make them a module):\n" + "\n".join(crowded)
    )


def routes_declared(source: str) -> list[int]:
    """Lines of functions decorated as HTTP routes (``@x.get(...)``, ``@x.post(...)``, ...)."""
    return [
        fn.lineno
        for fn in ast.walk(ast.parse(source))
        if isinstance(fn, FUNCTIONS)
        for d in fn.decorator_list
        if isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr in ROUTE_METHODS
    ]


def test_routes_live_in_the_route_modules():
    routes = PACKAGE / "serve" / "routes"
    stray = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in _modules().values()
        if routes not in path.parents
        for line in routes_declared(path.read_text(encoding="utf-8"))
    ]
    assert not stray, "HTTP routes outside serve/routes/ (give them a route module):\n" + "\n".join(stray)
    assert routes_declared((routes / "generation.py").read_text(encoding="utf-8")), "the scan finds no route"


def test_the_job_rules_catch_an_app_of_closures():
    source = "def create_app(app):\n" + "".join(
        f"    @app.get('/r{i}')\n    async def r{i}():\n        return {i}\n" for i in range(MAX_INNER_FUNCTIONS + 1)
    )
    [fn] = [n for n in ast.parse(source).body]
    assert len(inner_functions(fn)) == MAX_INNER_FUNCTIONS + 1
    assert len(routes_declared(source)) == MAX_INNER_FUNCTIONS + 1


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
