"""Property tests (hypothesis) of the config parser: whatever a config.json holds, the parser
returns a valid config or raises CheckpointError naming the file and the key."""

from __future__ import annotations

import json
import math

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from blockbatch.config import MAX_DIM, MAX_LAYERS, MAX_SEQUENCE_LENGTH, ModelConfig  # noqa: E402
from blockbatch.errors import CheckpointError  # noqa: E402

WHERE = "/ckpt/config.json"
TOY = {
    "d_model": 128,
    "n_layers": 4,
    "n_heads": 4,
    "n_kv_heads": 4,
    "mlp_hidden_size": 384,
    "vocab_size": 21,
    "embedding_size": 21,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-05,
    "weight_tying": False,
    "mask_token_id": 20,
    "eos_token_id": 19,
    "max_sequence_length": 512,
    "model_type": "llada",
    "pad_token_id": 0,
}
KEYS = sorted(TOY) + ["mlp_ratio"]

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.sampled_from(
        [
            0,
            1,
            2,
            4,
            19,
            20,
            21,
            64,
            128,
            512,
            2**20,
            2**24 + 1,
            10**8,
            10**12,
            1e-5,
            1e300,
            "false",
            "llada",
            "abc",
            "1",
        ]
    ),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=6,
)


@settings(max_examples=400, deadline=None)
@given(
    changes=st.dictionaries(st.sampled_from(KEYS), json_values, max_size=4),
    drop=st.sets(st.sampled_from(KEYS), max_size=2),
)
def test_any_config_is_valid_or_a_named_error(changes, drop):
    raw = {**TOY, **changes}
    for key in drop:
        raw.pop(key, None)
    try:
        config = ModelConfig.from_dict(raw, where=WHERE)
    except CheckpointError as e:
        text = str(e)
        assert text.startswith(f"{WHERE}: ") and "key '" in text, text
        return
    # Accepted: every value has its strict type and range.
    for key in (
        "d_model",
        "n_layers",
        "n_heads",
        "n_kv_heads",
        "mlp_hidden_size",
        "vocab_size",
        "embedding_size",
        "max_sequence_length",
        "mask_token_id",
        "eos_token_id",
    ):
        value = getattr(config, key)
        assert type(value) is int, (key, value)
    assert 0 < config.n_layers <= MAX_LAYERS and 0 < config.max_sequence_length <= MAX_SEQUENCE_LENGTH
    assert 0 < config.d_model <= MAX_DIM and config.d_model % config.n_heads == 0
    assert type(config.weight_tying) is bool
    assert math.isfinite(config.rope_theta) and config.rope_theta > 0
    assert math.isfinite(config.rms_norm_eps) and config.rms_norm_eps > 0
    assert config.mask_token_id != config.eos_token_id
    # and survives a round trip through config.json
    assert ModelConfig.from_dict(json.loads(json.dumps(config.to_dict())), where=WHERE) == config


@settings(max_examples=200, deadline=None)
@given(text=st.binary(max_size=300))
def test_any_bytes_parse_or_name_the_file(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("cfg") / "config.json"
    path.write_bytes(text)
    with pytest.raises(CheckpointError, match="^" + str(path)):
        ModelConfig.from_json_file(path)
