import os
import pathlib
import signal

import pytest
import torch

# Subprocesses the tests start (`python -c ...`) see what pytest's `pythonpath` gives this process:
# the test helpers (tests/helpers) and the build-time tools (tools/), which the wheel does not ship.
_EXTRA = [str(pathlib.Path(__file__).resolve().parent), str(pathlib.Path(__file__).resolve().parents[1] / "tools")]
os.environ["PYTHONPATH"] = os.pathsep.join(
    _EXTRA + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
)
# The Ctrl-C tests send SIGINT to subprocesses, which inherit this process's SIGINT disposition
# across exec when it is "ignored": pytest started as a background job of a non-interactive shell
# (`bash .ci/run &`, nohup) has SIGINT ignored, and then so would every subprocess (no
# KeyboardInterrupt: the decode runs on; two CI runs started that way failed three tests). A
# Python-level handler is reset to the default on exec, so install the default one here.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# One intra-op thread: results do not depend on it (test_threads_do_not_change_results checks 2),
# and OpenMP spin-waits make multi-threaded runs crawl on a busy 2-core machine.
torch.set_num_threads(1)


def pytest_addoption(parser):
    parser.addoption(
        "--grid-stride",
        type=int,
        default=1,
        metavar="K",
        help="run every K-th case of each test marked `grid` (parity grids), in collection order; "
        ".ci/sanitize uses it: under ASan a sample of a grid finds what the whole would, in a "
        "fraction of the time (the README's test command runs every case)",
    )


def pytest_collection_modifyitems(config, items):
    stride = config.getoption("--grid-stride")
    if stride < 1:
        raise pytest.UsageError(f"--grid-stride must be >= 1, got {stride}")
    if stride == 1:
        return
    seen: dict[str, int] = {}
    kept, dropped = [], []
    for item in items:
        if item.get_closest_marker("grid") is None:
            kept.append(item)
            continue
        key = item.nodeid.split("[", 1)[0]
        index = seen[key] = seen.get(key, -1) + 1
        (kept if index % stride == 0 else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture
def make_ckpt(tmp_path):
    """Factory: write a random LLaDA checkpoint under tmp_path and return (path, config)."""
    from blockbatch.random_checkpoint import make_random_checkpoint

    counter = iter(range(10_000))

    def make(**kwargs):
        path = tmp_path / f"ckpt{next(counter)}"
        config = make_random_checkpoint(path, **kwargs)
        return str(path), config

    return make
