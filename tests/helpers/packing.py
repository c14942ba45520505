"""The recorded fixtures' token packing (tests/fixtures/authors_*_toy.json, authors_window_llada.json):
token ids as one base-36 digit each (the toys' vocabularies are below 36), and reading a fixture."""

from __future__ import annotations

import json
import os

DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")


def pack(ids) -> str:
    return "".join(DIGITS[int(i)] for i in ids)


def unpack(text: str) -> list[int]:
    return [DIGITS.index(c) for c in text]


def load_fixture(name: str) -> dict:
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as f:
        return json.load(f)


def fixture_runs(recorded: dict, key: str) -> list[dict]:
    """A recorded setting's runs, one dict per prompt (keys: the fixture's run_fields)."""
    return [dict(zip(recorded["run_fields"], row)) for row in recorded["runs"][key]]


def mismatches(recorded: dict, key: str, decode, every: int = 1) -> list:
    """(prompt index, {field: (recorded, got)}) for every ``every``-th prompt whose ``decode(ids)`` (a
    dict of run fields) differs from the recording in any of its fields."""
    import torch

    out = []
    for i, (prompt, run) in enumerate(zip(recorded["prompts"], fixture_runs(recorded, key))):
        if i % every:
            continue
        got = decode(torch.tensor(unpack(prompt)))
        diff = {k: (run[k], got.get(k)) for k in run if run[k] != got.get(k)}
        if diff:
            out.append((i, diff))
    return out


# On a CPU of another capability (AVX2 / AVX512) torch's float32 softmax rounds differently, and where
# two confidences of a recording were within a rounding of each other a selection may fall the other
# way. There at most this fraction of the recorded prompts may differ, each of them equal to the
# reference decoded on this machine (the oracle written from the authors' rules, equal to their code
# wherever the recording's machine ran both).
OTHER_CAPABILITY_SLACK = 0.05


def recorded_here(recorded: dict) -> bool:
    """Whether this machine runs the float32 kernels the recording ran (its CPU capability)."""
    import torch

    return recorded.get("cpu_capability") == torch.backends.cpu.get_cpu_capability()


def assert_matches_recording(recorded: dict, key: str, decode, every: int = 1, here=None) -> None:
    """Every ``every``-th recorded prompt of setting ``key`` decodes as recorded (``mismatches``). On a
    machine of another CPU capability than the recording's: at most OTHER_CAPABILITY_SLACK of them may
    differ, and each that does must equal ``here(ids)`` (the reference on this machine) when given."""
    import torch

    bad = mismatches(recorded, key, decode, every)
    checked = len(range(0, len(recorded["prompts"]), every))
    where = f"{len(bad)} of {checked} prompts of {key} differ, first: {bad[:3]}"
    if recorded_here(recorded):
        assert not bad, where
        return
    assert len(bad) <= max(1, int(OTHER_CAPABILITY_SLACK * checked)), (
        f"{where} (recorded on {recorded.get('cpu_capability')}, running on "
        f"{torch.backends.cpu.get_cpu_capability()}: more than float32 rounding explains)"
    )
    for i, _ in bad if here is not None else ():
        ids = torch.tensor(unpack(recorded["prompts"][i]))
        got, want = decode(ids), here(ids)
        assert got == want, f"prompt {i} of {key}: the engine {got} != the reference here {want}"
