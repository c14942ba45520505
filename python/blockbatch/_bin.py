"""Console entry points ``bb_forward`` and ``bb_bench_decode``: exec the packaged C++ binaries.

The binaries live in ``blockbatch/bin`` (they link libtorch, not Python). Their RUNPATH finds
torch's libraries at ``$ORIGIN/../../torch/lib``, i.e. when torch is installed in the same
site-packages as blockbatch. When it is not (torch in another path entry, e.g. a system
site-packages under a venv), torch/lib of the torch this Python would import is appended to
LD_LIBRARY_PATH, found without importing torch so that ``--help`` stays instant.

    bb_forward --help
    bb_bench_decode --model DIR --policy blockbatch --prompts F.jsonl
    python -m blockbatch._bin bb_forward --help      # the same without the console scripts
"""

from __future__ import annotations

import importlib.util
import os
import sys

BINARIES = ("bb_forward", "bb_bench_decode")


def binary_path(name: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", name)


def _torch_lib_dir() -> str | None:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    lib = os.path.join(list(spec.submodule_search_locations)[0], "lib")
    return lib if os.path.isdir(lib) else None


def exec_binary(name: str, argv: list[str]) -> int:
    path = binary_path(name)
    if not os.access(path, os.X_OK):
        print(
            f"error: {path} is missing or not executable: this blockbatch install has no C++ "
            "binaries (rebuild with `pip install --no-build-isolation --no-deps -e .`, see README.md)",
            file=sys.stderr,
        )
        return 2
    env = dict(os.environ)
    lib = _torch_lib_dir()
    if lib:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (env.get("LD_LIBRARY_PATH"), lib) if p)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(path, [name, *argv], env)
    return 0  # not reached


def bb_forward() -> int:
    return exec_binary("bb_forward", sys.argv[1:])


def bb_bench_decode() -> int:
    return exec_binary("bb_bench_decode", sys.argv[1:])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in BINARIES:
        print(
            f"usage: python -m blockbatch._bin {{{','.join(BINARIES)}}} [ARGS...]  (e.g. bb_forward --help)",
            file=sys.stderr,
        )
        return 2
    return exec_binary(argv[0], argv[1:])


if __name__ == "__main__":
    sys.exit(main())
