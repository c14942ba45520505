"""atheris fuzz targets for blockbatch's front door (issue 17).

    python tests/fuzz/fuzz_loaders.py TARGET [libFuzzer flags] [CORPUS_DIR ...]

TARGET:
  header  bytes -> a file -> ``loading.read_safetensors_header``
  config  bytes -> config.json -> ``ModelConfig.from_json_file`` (the Python config parser)
  model   bytes -> config values + the toy weights -> ``torch.classes.blockbatch.Model`` (the C++
          ``ModelConfig::validate`` and weight checks; needs the built extension)

The only exceptions allowed to escape are the documented ones: ``CheckpointError`` whose message
starts with the file it read (header, config), and for ``model`` the C++ ``ValueError`` /
``RuntimeError`` naming a config key or a weight. Anything else (another exception type, a
message without the file, a crash, a hang, a runaway allocation) is a finding: libFuzzer stops
with a nonzero status and writes the input to ``-artifact_prefix``.

Seed corpora live in ``tests/fuzz/corpus/{header,config}`` (``make_corpus.py`` writes them);
pass a copy, libFuzzer adds the inputs it finds to the first corpus directory.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile

import atheris
import torch  # imported before instrumentation: only blockbatch's own modules are instrumented

with atheris.instrument_imports(include=["blockbatch"]):
    import blockbatch  # noqa: F401
    from blockbatch.config import ModelConfig
    from blockbatch.errors import CheckpointError
    from blockbatch.loading import read_safetensors_header

WORK = tempfile.mkdtemp(prefix="bb-fuzz-")
PATH = os.path.join(WORK, "input.bin")


class Finding(AssertionError):
    """An escape that is not one of the documented errors."""


def _write(data: bytes) -> None:
    with open(PATH, "wb") as f:
        f.write(data)


def header_target(data: bytes) -> None:
    _write(data)
    try:
        infos = read_safetensors_header(PATH)
    except CheckpointError as e:
        if not str(e).startswith(PATH):
            raise Finding(f"CheckpointError without the file name: {e}") from e
        return
    # Accepted: the invariants the docstring promises.
    size = os.path.getsize(PATH)
    (n,) = __import__("struct").unpack("<Q", data[:8])
    covered = 0
    for info in infos.values():
        if not (0 <= info.begin <= info.end <= size - 8 - n):
            raise Finding(f"accepted tensor {info.name!r} with offsets {info.begin}, {info.end} outside the file")
        covered += info.end - info.begin
    if covered != size - 8 - n:
        raise Finding(f"accepted a header whose tensors cover {covered} of {size - 8 - n} data bytes")


def config_target(data: bytes) -> None:
    _write(data)
    try:
        config = ModelConfig.from_json_file(PATH)
    except CheckpointError as e:
        if not str(e).startswith(PATH):
            raise Finding(f"CheckpointError without the file name: {e}") from e
        return
    config.validate(PATH)  # an accepted config is valid, and survives a round trip
    again = ModelConfig.from_dict(json.loads(json.dumps(config.to_dict())), where=PATH)
    if again != config:
        raise Finding(f"config does not round-trip: {config} != {again}")


_INTERESTING = [
    0,
    1,
    2,
    4,
    8,
    16,
    20,
    21,
    64,
    128,
    384,
    512,
    -1,
    2**31,
    2**40,
    2**62,
    2**63 - 1,
    -(2**63),
    10**8,
    10**12,
]
_TOY = None


def _toy():
    global _TOY
    if _TOY is None:
        from blockbatch import toy

        ckpt = toy.load()
        _TOY = (ckpt.config, dict(ckpt.weights))
    return _TOY


def model_target(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    config, weights = _toy()
    ints = config.int_fields()
    floats = config.float_fields()
    for _ in range(fdp.ConsumeIntInRange(0, 4)):
        key = fdp.PickValueInList(sorted(ints))
        ints[key] = (
            fdp.PickValueInList(_INTERESTING) if fdp.ConsumeBool() else fdp.ConsumeIntInRange(-(2**63), 2**63 - 1)
        )
    for _ in range(fdp.ConsumeIntInRange(0, 2)):
        key = fdp.PickValueInList(sorted(floats))
        floats[key] = fdp.PickValueInList([0.0, -1.0, 1e-300, 1e300, float("inf"), float("nan"), 10000.0, 1e-5])
    names = sorted(weights)
    w = dict(weights)
    for _ in range(fdp.ConsumeIntInRange(0, 2)):
        w.pop(fdp.PickValueInList(names), None)
    try:
        torch.classes.blockbatch.Model(ints, floats, w, "")
    except (ValueError, RuntimeError) as e:
        text = str(e)
        if "config: key '" not in text and "weights: " not in text:
            raise Finding(f"{type(e).__name__} naming no key or weight: {text}") from e


TARGETS = {"header": header_target, "config": config_target, "model": model_target}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        sys.exit(f"usage: {sys.argv[0]} {{{'|'.join(TARGETS)}}} [libFuzzer flags] [CORPUS_DIR ...]")
    target = TARGETS[sys.argv.pop(1)]
    if target is model_target:
        from blockbatch._C_loader import load_extension

        load_extension()
    # A runaway allocation is a finding, not a swapping machine: cap the address space at 8 GiB.
    limit = 8 << 30
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    atheris.Setup(sys.argv, target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
