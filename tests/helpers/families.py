"""Per-family test data, keyed by family name: the rows the registry-parametrized tests read
(tests/tools/test_cpp_reader.py, tests/decode/test_family_decode.py, tests/ops/test_batch_invariance.py).

The tests themselves iterate over ``blockbatch.families.REGISTRY`` and the policy table, so a new
family runs every generic test (its forward through bb_forward, each policy it decodes against the
reference, batch invariance, the refusals of the policies it does not decode) without a line here;
what only a family has (the config keys it refuses and the message each gives, its shapes, the
options its decoders refuse) is a row below. A family without a row has no such cases.
"""

from __future__ import annotations

from blockbatch import families

NULL = object()  # an edit_json value that writes JSON null (None deletes the key)


def names() -> list[str]:
    """Every family, in the registry's order."""
    return list(families.REGISTRY)


def rows(table: dict[str, list], family_names: list[str] | None = None) -> list[tuple]:
    """(family, *row) for each row of ``table`` (family -> rows), registry order; ids ``family-i``."""
    out = []
    for name in family_names or names():
        for row in table.get(name, []):
            out.append((name, *row) if isinstance(row, tuple) else (name, row))
    return out


def ids(rows_: list[tuple]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for r in rows_:
        i = seen[r[0]] = seen.get(r[0], -1) + 1
        out.append(f"{r[0]}-{i}")
    return out


# --------------------------------------------------------------------------- checkpoints


def _llada2_small(**overrides):
    """A two-layer LLaDA2 shape: a dense layer, then 8 experts in 4 groups (top-2 of 2 kept groups)
    plus a shared expert; RoPE on half of each 16-dim head, QK-norm, GQA 4 / 2."""
    return {**dict(n_layers=2, num_experts=8, expert_groups=4, expert_groups_kept=2, first_dense_layers=1), **overrides}


# make_random_checkpoint's shape for the reader tests (default: the family's random_config).
READER_SHAPE = {"llada2": _llada2_small()}


# What the reader shape must hold for its tests to read the family's optional parts.
READER_SHAPE_HAS = {
    "llada2": lambda c: c.qk_norm and c.rope_dim == c.head_dim // 2 and c.moe_layer(1) and not c.moe_layer(0),
}


def reader_shape(family: str, **overrides) -> dict:
    return {**READER_SHAPE.get(family, {}), **overrides}


# config.json's architectures as the family publishes them (checked against what make-random writes).
ARCHITECTURES = {"llada": ["LLaDAModelLM"], "dream": ["DreamModel"], "llada2": ["LLaDA2MoeModelLM"]}

# The bb_* binaries' "model ..." line: the fields it must print for the family beyond the base ones
# (every printed field is compared with the Python loader's config).
BASE_PRINTED = (
    "attention_bias",
    "d_model",
    "n_layers",
    "n_heads",
    "n_kv_heads",
    "mlp_hidden_size",
    "vocab_size",
    "embedding_size",
    "mask_token_id",
    "eos_token_id",
    "max_sequence_length",
    "weight_tying",
    "rope_theta",
    "rms_norm_eps",
)
PRINTED = {
    "llada2": (
        "head_size",
        "rope_dims",
        "num_experts",
        "experts_per_token",
        "expert_groups",
        "expert_groups_kept",
        "moe_hidden_size",
        "shared_experts",
        "first_dense_layers",
        "qk_norm",
        "attn_out_bias",
        "routed_scaling",
    ),
}
# Values the line must hold whatever the random config (Dream: q/k/v biases always).
PRINTED_VALUES = {"dream": {"attention_bias": "1"}}

# config.json edits refused by the C++ reader and the Python loader with the same message after
# "<folder>/config.json: " (on the family's reader shape).
SAME_MESSAGE = {
    "dream": [
        (
            dict(num_key_value_heads=3),
            "key 'num_key_value_heads' = 3 must divide num_attention_heads = 4 (grouped-query attention)",
        ),
        (dict(mask_token_id=500), "key 'mask_token_id' = 500 is outside the vocabulary [0, 97)"),
        (dict(mask_token_id=-1), "key 'mask_token_id' = -1 is outside the vocabulary [0, 97)"),
        (dict(hidden_size=66), "key 'hidden_size' = 66 is not a multiple of num_attention_heads = 4"),
        (dict(pad_token_id=97), "key 'pad_token_id' = 97 is outside the vocabulary [0, 97)"),
        (dict(eos_token_id=[]), "key 'eos_token_id' must be an integer or a non-empty list of integers"),
        (dict(num_attention_heads=None), "required key 'num_attention_heads' is missing"),
    ],
    "llada2": [
        (dict(moe_intermediate_size=None), "required key 'moe_intermediate_size' is missing (num_experts is set)"),
        (dict(intermediate_size=None), "required key 'intermediate_size' is missing (dense MLP layers)"),
        (dict(num_hidden_layers=None), "required key 'num_hidden_layers' is missing"),
        (dict(num_attention_heads=0), "key 'num_attention_heads' must be a positive integer, got 0"),
        (dict(num_key_value_heads=3), "key 'num_key_value_heads' = 3 must divide num_attention_heads = 4"),
        (dict(mask_token_id=500), "key 'mask_token_id' = 500 is outside the vocabulary [0, 97)"),
        (
            dict(mask_token_id=None),
            "key 'mask_token_id' = 156895 is outside the vocabulary [0, 97) (the authors' default)",
        ),
        (dict(pad_token_id=97), "key 'pad_token_id' = 97 is outside the vocabulary [0, 97)"),
        (dict(partial_rotary_factor=1.5), "key 'partial_rotary_factor' must be a number in (0, 1], got 1.5"),
        (dict(partial_rotary_factor=NULL), "key 'partial_rotary_factor' must be a number in (0, 1], got"),
        (dict(score_function="softmax"), "key 'score_function' is 'softmax'; LLaDA2 checkpoints use 'sigmoid'"),
        (dict(hidden_act="gelu"), "key 'hidden_act' is 'gelu'; LLaDA2 checkpoints use 'silu'"),
        (dict(norm_topk_prob=False), "key 'norm_topk_prob' must be true"),
        (dict(n_group=3), "key 'n_group' = 3 must divide num_experts = 8 into groups of at least 2"),
        (dict(topk_group=5), "key 'topk_group' = 5 must be in [1, n_group = 4]"),
        (dict(num_experts_per_tok=5), "key 'num_experts_per_tok' = 5 must be in [1, 4]"),
        (
            dict(partial_rotary_factor=0.1),
            "key 'partial_rotary_factor' gives head_dim * partial_rotary_factor = 1 rotary dims (head_dim = 16); "
            "they must be even and in (0, head_dim]",
        ),
        (dict(routed_scaling_factor=0), "key 'routed_scaling_factor' must be a positive finite number, got 0"),
    ],
}

# config.json edits whose C++ refusal matches the pattern (naming the key the file holds, not the
# ModelConfig field); python: the Python loader refuses it too (any message).
KEY_PATTERN = {
    "dream": [
        (
            dict(num_hidden_layers=10**8),
            r"config.json: key 'num_hidden_layers' = 100000000 is larger than the supported maximum 65536",
            False,
        ),
        (
            dict(num_hidden_layers=1000),
            r"config.json: key 'num_hidden_layers' = 1000 needs 12003 tensors but the weight files hold 27",
            False,
        ),
        (
            dict(max_position_embeddings=10**12),
            r"config.json: key 'max_position_embeddings' = 1000000000000 is larger",
            False,
        ),
        (dict(intermediate_size=0), r"config.json: key 'intermediate_size' must be a positive integer, got 0", False),
        (dict(tie_word_embeddings="false"), r"config.json: key 'tie_word_embeddings' must be true or false", False),
        (dict(eos_token_id=96), r"config.json: key 'eos_token_id' = 96 equals mask_token_id", False),
        (
            dict(model_type="dream"),
            r"config.json: key 'model_type' must be \"llada\", \"Dream\", \"llada2_moe\" or \"sdar\"",
            False,
        ),
    ],
    "llada2": [
        (
            dict(model_type="llada2"),
            r"config.json: key 'model_type' must be \"llada\", \"Dream\", \"llada2_moe\" or \"sdar\"",
            True,
        ),
        (dict(hidden_size=0), r"config.json: key 'hidden_size' must be a positive integer, got 0", True),
        (dict(num_hidden_layers=10**8), r"config.json: key 'num_hidden_layers' = 100000000 is larger than", True),
        (
            dict(num_hidden_layers=1000),
            r"config.json: key 'num_hidden_layers' = 1000 needs \d+ tensors but the weight",
            True,
        ),
        (
            dict(num_experts=4096),
            r"config.json: keys 'num_hidden_layers' = 2 and 'num_experts' = 4096 need 12\d+ tens",
            True,
        ),
        (dict(use_qk_norm="true"), r"config.json: key 'use_qk_norm' must be true or false", True),
        (dict(vocab_size=97.0), r"config.json: key 'vocab_size' must be an integer", True),
    ],
}

# A tensor left out of a checkpoint (single file or sharded): its name and the hint both loaders add.
MISSING_TENSOR = {
    "dream": [("model.layers.1.self_attn.k_proj.bias", " (Dream's q/k/v projections carry biases)")],
    "llada2": [
        (
            "model.layers.1.mlp.experts.5.down_proj.weight",
            " (the layers from first_k_dense_replace on are mixtures of experts)",
        )
    ],
}

# A tensor of the wrong shape: (name, the bad shape as a function of the config, the message's
# "has shape [..], expected [..]" part).
BAD_SHAPE = {
    "dream": [
        (
            "model.layers.0.self_attn.q_proj.bias",
            lambda c: (c.d_model + 1,),
            "has shape [65], expected [64]",
        )
    ],
    "llada2": [
        (
            "model.layers.1.mlp.experts.5.up_proj.weight",
            lambda c: (c.moe_hidden_size + 1, c.d_model),
            "has shape [33, 64], expected [32, 64]",
        )
    ],
}

# A tensor the config has no place for: (name, its shape as a function of the config).
EXTRA_TENSOR = {
    "dream": [("model.layers.0.self_attn.o_proj.bias", lambda c: (c.d_model,))],  # Qwen2's o_proj has none
    "llada2": [("model.layers.0.mlp.experts.0.up_proj.weight", lambda c: (c.moe_hidden_size, c.d_model))],
}

# config.json edits both loaders read to the same config (on the given shape), and checks of the
# config the Python loader read.
CONFIG_VARIANTS = {
    "llada2": {
        # every key whose default families/llada2.py read_config supplies, left out (rms_norm_eps, the
        # RoPE base, the maximum length and the MoE scaling then take the authors' defaults)
        "defaults": (
            _llada2_small(),
            dict(
                head_dim=None,
                partial_rotary_factor=None,
                rope_theta=None,
                rms_norm_eps=None,
                tie_word_embeddings=None,
                use_qkv_bias=None,
                use_qk_norm=None,
                max_position_embeddings=None,
                num_experts_per_tok=None,
                routed_scaling_factor=None,
                hidden_act=None,
                score_function=None,
                norm_topk_prob=None,
                pad_token_id=None,
            ),
            lambda c: (
                (c.rms_norm_eps, c.max_sequence_length, c.rope_theta, c.routed_scaling) == (1e-5, 32768, 10000.0, 2.5)
                and c.qk_norm
                and c.rope_dim == c.head_dim // 2 == 8
            ),
        ),
        "null-is-default": (
            _llada2_small(),
            dict(
                rope_theta=NULL,
                use_qk_norm=NULL,
                num_experts_per_tok=NULL,
                routed_scaling_factor=NULL,
                pad_token_id=NULL,
            ),
            None,
        ),
        "dense": (dict(n_layers=2, num_experts=0), dict(num_experts=NULL), None),
        # every layer a mixture: intermediate_size is not needed then (it reads moe_intermediate_size)
        "all-moe": (_llada2_small(first_dense_layers=0), dict(intermediate_size=None), None),
        "biases-tied-full-rotary": (
            _llada2_small(weight_tying=True, attention_bias=True, attn_out_bias=True, rope_dims=16, shared_experts=0),
            dict(eos_token_id=[95, 3], pad_token_id=[0], use_bias=None),  # use_bias: true unless told
            None,
        ),
    },
}

# The shipped toy's facts beyond its family (checked after bb_forward reads it).
TOY_FACTS = {"llada2": {"num_experts": 8}}

# Families whose config.json pad_token_id must be one integer (Dream's may be a list).
PAD_ID_INTEGER_ONLY = ("llada",)

# The tensor made non-finite in the reader's finiteness check (default: the first 2-D tensor).
NON_FINITE_TENSOR = {"llada2": "model.layers.1.mlp.gate.weight"}

# bb_bench_decode on the shipped toy, --verify against the Engine: (flags, the Engine's option
# overrides, the policy it decodes with).
BENCH_DECODE_TOY = {
    "llada2": [
        ([], {}, "block"),  # the family's defaults: policy block, threshold 0.95
        (["--block-length", "16", "--threshold", "0.8"], dict(block_length=16, threshold=0.8), "block"),
        (["--policy", "block", "--threshold", "none", "--steps", "4"], dict(threshold=None, steps=4), "block"),
    ],
}
# bb_bench_decode --help states the family's defaults: (its DEFAULT_OPTIONS, a pattern of the help).
BENCH_DECODE_HELP = {
    "llada2": [({"policy": "block", "threshold": 0.95}, r"on LLaDA2 checkpoints.*\n?.*block with threshold 0\.95")],
}
# Flags of the family's default policy, taken without --policy: (flags, the policy decoded with).
BENCH_DECODE_FLAGS_WITHOUT_POLICY = {"llada2": [(["--edit-threshold", "0.5"], "block")]}


def all_policies() -> list[str]:
    from blockbatch import policies

    return list(policies.REGISTRY)


# How a policy refuses a family it has no decoder for (the C++ descriptor's family_refusal), then
# the policies that do decode it.
_BIDIRECTIONAL = "is the decoder of block-causal checkpoints; {family} checkpoints are bidirectional"
_REFUSAL = {"block": _BIDIRECTIONAL, "wavefront": _BIDIRECTIONAL}
# A policy with a decoder for the family's attention but no row for it in its rules table.
_NO_ROW = {("wavefront", "sdar")}


def policy_refusal(policy: str, family: str) -> str:
    """A pattern of the refusal of ``policy`` on ``family``'s checkpoints, naming the remedy: the
    policies that decode the family (its POLICIES, in the table's order)."""
    import re

    words = (
        "has no rules for {family} checkpoints"
        if (policy, family) in _NO_ROW
        else _REFUSAL.get(policy, "is not defined on {family} checkpoints")
    ).format(family=family)
    names = [f"'{p}'" for p in all_policies() if p in families.get(family).POLICIES]
    remedy = "use policy=" + (", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0])
    return re.escape(f"policy '{policy}' {words}") + ".*" + re.escape(remedy)


# config.json edits the reference refuses (reference/llada2.py cfg_ok: rope_dim = int(head_dim *
# partial_rotary_factor) even and in (0, head_dim]) that once loaded as "RoPE on the whole head", with the
# message each front door must give. The reader shape has head_dim 16.
_ROTARY_REFUSED = (
    "key 'partial_rotary_factor' gives head_dim * partial_rotary_factor = {} rotary dims (head_dim = {}); "
)
_ROTARY_RULE = "they must be even and in (0, head_dim]"
ZERO_AS_UNSET = {
    "llada2": [
        (dict(partial_rotary_factor=0.01), _ROTARY_REFUSED.format(0, 16) + _ROTARY_RULE),
        (dict(partial_rotary_factor=0.03), _ROTARY_REFUSED.format(0, 16) + _ROTARY_RULE),
        (dict(partial_rotary_factor=1e-300), _ROTARY_REFUSED.format(0, 16) + _ROTARY_RULE),
        (dict(partial_rotary_factor=0.5625), _ROTARY_REFUSED.format(9, 16) + _ROTARY_RULE),
        (dict(head_dim=0), "key 'head_dim' = 0 must be in [1, "),
        (dict(head_dim=0, partial_rotary_factor=1.0), "key 'head_dim' = 0 must be in [1, "),
        (dict(head_dim=2), _ROTARY_REFUSED.format(1, 2) + _ROTARY_RULE),
    ],
}


def handle_error(family: str, changes: dict) -> str:
    """The Python -> C++ handle (torch.classes.blockbatch.Model, what NativeModel builds) given the fields
    the config.json change implies (head_dim, partial_rotary_factor), Python's own checks bypassed: C++
    must refuse them by itself. The first line of its error."""
    import pytest
    import torch

    fam = families.get(family)
    config = fam.random_config(**reader_shape(family))
    head = changes.get("head_dim", config.head_dim)
    ints = config.int_fields() | {"head_size": head, "rope_dims": int(head * changes.get("partial_rotary_factor", 0.5))}
    with pytest.raises(ValueError) as e:
        torch.classes.blockbatch.Model(ints, config.float_fields(), fam.random_weights(config), "")
    return str(e.value).splitlines()[0]


# config.json edits that still load, and the config field they set: (changes, field, value).
EDITS_THAT_LOAD = {
    "llada2": [
        (dict(partial_rotary_factor=factor), "rope_dim", rope) for factor, rope in ((1.0, 16), (0.25, 4), (0.125, 2))
    ]
    + [(dict(partial_rotary_factor=0.5), "rope_dim", 8)],
}

# config.json edits both loaders refuse with this message ({where}: the config.json path, {file}: the
# weights file), exactly (True) or as a part (False).
EXACT_MESSAGE = {
    "llada2": [
        # 0 experts is not null (dense)
        (
            dict(num_experts=0),
            "{where}: key 'num_experts' = 0 must be in [1, 65536] (or null: every layer dense)",
            True,
        ),
        # head_dim absent and hidden_size // num_attention_heads == 0: named by the keys that made it
        (
            dict(head_dim=None, num_attention_heads=128, num_key_value_heads=128),
            "key 'num_attention_heads' = 128 is more than hidden_size = 64",
            False,
        ),
        # num_experts absent means the authors' 16 experts: the router of the 8-expert weights has the
        # wrong shape, named with its file
        (
            dict(num_experts=None),
            "{file}: tensor 'model.layers.1.mlp.gate.weight' has shape [8, 64], expected [16, 64]",
            True,
        ),
    ],
}

# config.json edits whose refusal names the user's key (and integers past int64), both loaders.
USER_KEYS = {
    "llada2": [
        (dict(num_hidden_layers=0), "key 'num_hidden_layers' must be a positive integer, got 0"),
        (dict(max_position_embeddings=2**21), "key 'max_position_embeddings' = 2097152 is larger"),
        (dict(head_dim=33), "key 'head_dim' = 33 is odd"),
        (dict(num_key_value_heads=0), "key 'num_key_value_heads' = 0 must divide num_attention_heads"),
        (dict(intermediate_size=0), "key 'intermediate_size' must be a positive integer, got 0"),
        (dict(num_experts=2**70), "key 'num_experts' = 1180591620717411303424 does not fit in 64"),
        (dict(head_dim=2**64), "key 'head_dim' = 18446744073709551616 does not fit in 64 bits"),
        (dict(n_group=-(2**70)), "key 'n_group' = -1180591620717411303424 does not fit in 64 bits"),
    ],
}

# Another family's weights under this family's config.json: (the other family, the tensor the reader
# names as missing). LLaDA names in a Dream folder: the Dream names are what is asked for.
FOREIGN_NAMES = {"dream": [("llada", "model.embed_tokens.weight")]}


# --------------------------------------------------------------------------- decoding

# A small random checkpoint of the family for the decode tests (make_random_checkpoint's overrides).
SMALL_CHECKPOINT = {
    "llada": dict(d_model=64, n_layers=2, vocab_size=97),
    "llada2": dict(vocab_size=64, n_layers=3),  # GQA, partial rotary, a dense layer then 8 experts top-2 + shared
    "sdar": dict(vocab_size=64, n_layers=3),  # GQA 4/2, QK-norm, full rotary
}


# Block-causal families whose block policy reads `unmasking` (SDAR's four rules).
UNMASKING_FAMILIES = ("sdar",)


def small_checkpoint(family: str) -> dict:
    return SMALL_CHECKPOINT.get(family, dict(vocab_size=64))


# A vanilla request's schedule on the family: LLaDA's fixed per-block schedule, else (Dream's)
# timesteps over half the generation.
def TIMESTEPS(G):
    return dict(steps=G // 2)


VANILLA_SCHEDULE = {"llada": lambda G: dict(block_length=16, threshold=None, steps=G)}

# The random config of the batch-invariance tests (tests/ops/test_batch_invariance.py).
INVARIANCE_SHAPE = {
    # 16 experts in 8 groups, 4 a token from 3 kept groups, multi-query attention
    "llada2": dict(
        vocab_size=64,
        d_model=32,
        n_heads=4,
        n_kv_heads=1,
        head_size=16,
        num_experts=16,
        expert_groups=8,
        expert_groups_kept=3,
        experts_per_token=4,
        max_sequence_length=256,
    ),
}


def invariance_shape(family: str) -> dict:
    return INVARIANCE_SHAPE.get(family, dict(d_model=64, n_layers=2, vocab_size=97, max_sequence_length=256))


# Option rows each policy's reference comparison decodes (over the family's defaults).
POLICY_CASES = {
    "vanilla": [dict(gen_length=16, block_length=8, steps=16, threshold=None), dict(gen_length=16, block_length=8)],
    "prefix": [dict(gen_length=32, block_length=8, threshold=0.8)],
    "dual": [dict(gen_length=32, block_length=8, threshold=0.8), dict(gen_length=16, block_length=16, threshold=0.5)],
    "blockbatch": [
        dict(gen_length=32, block_sizes=(4, 8, 16), threshold=0.8, refresh_tokens=8, sync_gap=4),
        dict(gen_length=32, block_sizes=(8, 32), threshold=0.9, stop_on_eos=False),
    ],
    "block": [
        dict(gen_length=24, block_length=8, threshold=0.95),
        dict(gen_length=24, block_length=8, steps=4, threshold=0.5, stop_on_eos=True),
        dict(gen_length=24, block_length=8, threshold=0.95, edit_threshold=0.5),
    ],
    "window": [
        dict(gen_length=32, steps=32, window_tokens=8, active_tokens=4, refresh_interval=8),
        dict(gen_length=32, steps=16, window_tokens=0, active_tokens=4, refresh_interval=4),
    ],
    "wavefront": [
        dict(gen_length=32, block_length=8, threshold=0.7, edit_threshold=0.5, max_active_blocks=2),
        dict(gen_length=40, block_length=8, threshold=0.9, edit_threshold=0.5, max_active_blocks=3, spawn_threshold=0),
        dict(gen_length=24, block_length=8, threshold=0.5, edit_threshold=0.9, max_active_blocks=4, max_post_steps=2),
    ],
}
# Where a family's cases of a policy differ (SDAR: no token editing, its unmasking rules instead; window on
# Dream: its sliding span and early_stop, a window at least the generation so that no span passes it).
POLICY_CASES_BY_FAMILY = {
    ("window", "dream"): [
        dict(gen_length=32, steps=32, window_tokens=32, active_tokens=32, refresh_interval=8, slide_window=False),
        dict(gen_length=32, steps=16, window_tokens=32, active_tokens=16, refresh_interval=4, early_stop=True),
    ],
    ("block", "sdar"): [
        dict(gen_length=24, block_length=8, threshold=0.95),
        dict(gen_length=24, block_length=8, steps=4, threshold=0.5, stop_on_eos=True),
        dict(gen_length=24, block_length=4, unmasking="static", steps=2),
        dict(gen_length=24, block_length=8, unmasking="entropy_bounded", entropy_bound=1.5),
    ],
}


# Options a policy refuses to leave unset (no default): wavefront repairs its drafts by editing.
REQUIRED_OPTIONS = {"wavefront": dict(edit_threshold=0.5)}


def policy_cases(policy: str, family: str) -> list[dict]:
    return POLICY_CASES_BY_FAMILY.get((policy, family), POLICY_CASES[policy])


# Options the family's decoders refuse: (DecodeOptions fields, a pattern of the message, the option
# the refusal names as the one to change).
REFUSED_OPTIONS = {
    "llada": [
        (
            dict(policy="vanilla", gen_length=32, alg="entropy"),
            "alg = 'entropy' is a sampler that the decoders of llada checkpoints do not implement",
            "alg",
        ),
        (dict(policy="dual", gen_length=32, top_k=4), "top_p / top_k", "top_k"),
        (dict(gen_length=16, edit_threshold=0.5), r"edit_threshold applies to policy 'block'", "edit_threshold"),
    ],
    "dream": [
        (dict(policy="blockbatch", gen_length=64, temperature=0.5), "temperature", "temperature"),
        (dict(policy="dual", gen_length=64, threshold=None, steps=2), "threshold", "threshold"),
        (dict(policy="blockbatch", gen_length=64, refresh_mode="divergence"), "refresh_mode", "refresh_mode"),
    ],
    "llada2": [
        (dict(policy="block", gen_length=16, temperature=0.5), "decodes greedily", "temperature"),
        (dict(policy="block", gen_length=16, factor=1.0), "leave factor None", "factor"),
        (dict(policy="block", gen_length=16, steps=0), "steps must be None", "steps"),
        (dict(policy="wavefront", gen_length=16), r"policy 'wavefront' needs edit_threshold", "edit_threshold"),
        (
            dict(policy="wavefront", gen_length=16, edit_threshold=0.5, temperature=0.5),
            "decodes greedily",
            "temperature",
        ),
    ],
}

# The stop_on_eos test's options per policy (gen_length 32 in blocks of 8), whether the policy ends
# the decode at the block holding the first EOS (else only its own exit rule), and what the canvas
# holds after that block: "eos" (filled) or "mask" (left undecoded; the text is cut at the EOS).
STOP_CASES = {
    "vanilla": (dict(gen_length=32, block_length=8, steps=32, threshold=None), True, "eos"),
    "prefix": (dict(gen_length=32, block_length=8, threshold=0.9), True, "eos"),
    "dual": (dict(gen_length=32, block_length=8, threshold=0.9), True, "eos"),
    "blockbatch": (dict(gen_length=32, block_sizes=(4, 8, 16), threshold=0.9), False, "eos"),
    "block": (dict(gen_length=32, block_length=8, steps=8, threshold=0.5), True, "mask"),
    "wavefront": (
        dict(gen_length=32, block_length=8, threshold=0.5, edit_threshold=0.5, max_active_blocks=3),
        True,
        "mask",
    ),
}
# (family, policy) pairs whose schedule has no blocks to stop at (Dream's vanilla: one block of timesteps).
NO_BLOCK_STOP = {("dream", "vanilla")}
