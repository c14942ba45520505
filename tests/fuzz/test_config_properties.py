"""Property tests (hypothesis) of the config parser: whatever a config.json holds, the parser
returns a valid config or raises CheckpointError naming the file and the key."""

from __future__ import annotations

import json
import math
import re

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


# LLaDA2 and Dream: the same property, plus the reference's rules on what is accepted and errors that
# name a key the family's config.json holds (never a ModelConfig field such as n_layers or head_size).
LLADA2 = {
    "model_type": "llada2_moe",
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "intermediate_size": 384,
    "partial_rotary_factor": 0.5,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-06,
    "vocab_size": 21,
    "mask_token_id": 20,
    "eos_token_id": 19,
    "max_position_embeddings": 512,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "n_group": 4,
    "topk_group": 2,
    "moe_intermediate_size": 96,
    "num_shared_experts": 1,
    "first_k_dense_replace": 1,
    "routed_scaling_factor": 2.5,
}
DREAM = {
    "model_type": "Dream",
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 256,
    "vocab_size": 97,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-06,
    "mask_token_id": 96,
    "eos_token_id": 95,
    "max_position_embeddings": 1024,
}
FIELD_NAMES = {"d_model", "n_layers", "n_heads", "n_kv_heads", "mlp_hidden_size", "max_sequence_length", "head_size"}
FIELD_NAMES |= {"rope_dims", "experts_per_token", "expert_groups", "moe_hidden_size", "first_dense_layers"}
sizes = st.one_of(
    json_scalars,
    st.sampled_from([0, 1, 2, 3, 8, 16, 32, 33, 64, 2**63, 2**64, -(2**63) - 1, 0.01, 0.03, 1e-300, 0.5625, 1.0]),
)


def _family_property(base, changes, drop):
    raw = {**base, **changes}
    for key in drop:
        raw.pop(key, None)
    try:
        return ModelConfig.from_dict(raw, where=WHERE)
    except CheckpointError as e:
        text = str(e)
        assert text.startswith(f"{WHERE}: ") and "key" in text, text
        named = set(re.findall(r"key '(\w+)'", text))
        assert named and not named & FIELD_NAMES, text  # the user's key, not an internal field
        return None


@settings(max_examples=400, deadline=None)
@given(
    changes=st.dictionaries(st.sampled_from(sorted(LLADA2)), sizes, max_size=3),
    drop=st.sets(st.sampled_from(sorted(LLADA2)), max_size=2),
)
def test_any_llada2_config_meets_the_reference_rules_or_names_the_users_key(changes, drop):
    config = _family_property(LLADA2, changes, drop)
    if config is None:
        return
    # Accepted: the reference's rules (reference/llada2.py cfg_ok), 0 never standing for "unset".
    assert type(config.head_size) is int and config.head_size >= 1
    assert type(config.rope_dims) is int and 0 < config.rope_dims <= config.head_size and config.rope_dims % 2 == 0
    assert config.num_experts == 0 or 1 <= config.num_experts <= 65536
    assert ModelConfig.from_dict(json.loads(json.dumps(config.to_dict())), where=WHERE) == config


@settings(max_examples=200, deadline=None)
@given(
    changes=st.dictionaries(st.sampled_from(sorted(DREAM)), sizes, max_size=3),
    drop=st.sets(st.sampled_from(sorted(DREAM)), max_size=2),
)
def test_any_dream_config_is_valid_or_names_the_users_key(changes, drop):
    config = _family_property(DREAM, changes, drop)
    if config is not None:
        assert config.head_size is None and config.rope_dims is None and config.head_dim % 2 == 0
