import pytest

from blockbatch import bench
from helpers.batching import small_engine


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """``engines(family)``: a small random engine of the family (seed 9) and the float32 reference model
    of its checkpoint, made once per test module."""
    made: dict[str, tuple] = {}

    def get(family):
        if family not in made:
            engine = small_engine(tmp_path_factory.mktemp(family), family, seed=9)
            made[family] = (engine, bench.reference_model(engine.checkpoint))
        return made[family]

    yield get
    made.clear()
