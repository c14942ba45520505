"""Class: unclear errors. ``Engine(...)`` given a path (or anything not a loaded checkpoint) says
what it takes and points at ``Engine.from_pretrained`` instead of an AttributeError deep inside."""

from __future__ import annotations

import pathlib

import pytest

from blockbatch import Engine
from blockbatch.toy import checkpoint_path


@pytest.mark.parametrize("kind", ["str", "pathlib", "bytes", "none", "dict"])
def test_engine_constructor_points_at_from_pretrained(kind):
    folder = checkpoint_path()
    value = {
        "str": folder,
        "pathlib": pathlib.Path(folder),
        "bytes": folder.encode(),
        "none": None,
        "dict": {"config": None},
    }[kind]
    with pytest.raises(TypeError, match=r"Engine\.from_pretrained\(") as e:
        Engine(value)
    assert "loaded Checkpoint" in str(e.value)
    if kind in ("str", "pathlib"):
        assert folder in str(e.value)  # the call to make, with the user's own path
