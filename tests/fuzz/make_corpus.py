"""Write the seed corpora of fuzz_loaders.py: small well-formed and malformed inputs.

    python tests/fuzz/make_corpus.py     # rewrites tests/fuzz/corpus/{header,config}/

Deterministic; each file is a few hundred bytes. The names say what each input exercises.
"""

from __future__ import annotations

import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

TOY_CONFIG = {
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


def st(header, data: bytes = b"", length: int | None = None) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


def f32(name: str, shape: list[int], begin: int) -> dict:
    n = 4
    for s in shape:
        n *= s
    return {name: {"dtype": "F32", "shape": shape, "data_offsets": [begin, begin + n]}}


HEADERS = {
    "valid_one_tensor": st(f32("w", [2, 2], 0), bytes(16)),
    "valid_two_tensors_metadata": st(
        {"__metadata__": {"format": "pt"}, **f32("a", [3], 0), **f32("b", [1, 2], 12)}, bytes(20)
    ),
    "valid_empty_tensor": st(f32("z", [0, 5], 0)),
    "empty_file": b"",
    "short_prefix": b"\x05\x00\x00",
    "length_past_end": st(f32("w", [2], 0), bytes(8), length=10**6),
    "length_huge": st(b"{}", length=2**63),
    "header_not_json": st(b"{not json"),
    "header_not_utf8": st(b'{"\xff": 1}'),
    "header_array": st([1, 2, 3]),
    "header_nested_deep": st(b"[" * 2000 + b"]" * 2000),
    "header_bigint": st(b'{"w": {"dtype": "F32", "shape": [' + b"9" * 5000 + b'], "data_offsets": [0, 4]}}'),
    "header_duplicate_name": st(
        b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
        b'"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}',
        bytes(8),
    ),
    "unknown_dtype": st({"w": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}}, bytes(16)),
    "shape_negative": st({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, bytes(4)),
    "shape_float": st({"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}}, bytes(4)),
    "shape_bool": st({"w": {"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}}, bytes(4)),
    "shape_overflow_u64": st({"w": {"dtype": "F32", "shape": [2**32, 2**32], "data_offsets": [0, 0]}}),
    "offsets_reversed": st({"w": {"dtype": "U8", "shape": [1], "data_offsets": [1, 0]}}, bytes(1)),
    "offsets_one": st({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0]}}, bytes(1)),
    "offsets_nan": st(b'{"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, NaN]}}', bytes(1)),
    "span_mismatch": st(f32("w", [2], 0) | {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 7]}}, bytes(7)),
    "past_end": st(f32("w", [4], 0), bytes(8)),
    "gap": st({**f32("a", [1], 0), **f32("b", [1], 8)}, bytes(12)),
    "overlap": st({**f32("a", [2], 0), **f32("b", [2], 4)}, bytes(12)),
    "trailing_bytes": st(f32("w", [1], 0), bytes(9)),
    "extra_key": st({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "x": 1}}, bytes(4)),
    "metadata_not_object": st({"__metadata__": [1]}),
    "metadata_not_strings": st({"__metadata__": {"a": 1}}),
}


def config(**changes) -> bytes:
    c = dict(TOY_CONFIG)
    for k, v in changes.items():
        if v is _DROP:
            c.pop(k, None)
        else:
            c[k] = v
    return json.dumps(c).encode()


_DROP = object()

CONFIGS = {
    "valid_toy": config(),
    "valid_eos_list_tied": config(eos_token_id=[19, 18], weight_tying=True),
    "valid_mlp_ratio": config(mlp_hidden_size=_DROP, mlp_ratio=3),
    "n_layers_1e8": config(n_layers=10**8),
    "n_layers_float": config(n_layers=1e8),
    "max_seq_1e12": config(max_sequence_length=10**12),
    "rope_table_too_big": config(max_sequence_length=2**20, d_model=2**12, n_heads=1, n_kv_heads=1),
    "weight_tying_string": config(weight_tying="false"),
    "weight_tying_int": config(weight_tying=0),
    "rope_theta_string": config(rope_theta="abc"),
    "rope_theta_bigint": config(rope_theta=10**400),
    "rms_eps_infinity": b'{"model_type": "llada", "rms_norm_eps": Infinity, "d_model": 128}',
    "rms_eps_nan": config().replace(b'"rms_norm_eps": 1e-05', b'"rms_norm_eps": NaN'),
    "mask_equals_eos": config(eos_token_id=20),
    "mask_outside_vocab": config(mask_token_id=21),
    "eos_empty_list": config(eos_token_id=[]),
    "eos_list_of_str": config(eos_token_id=["x"]),
    "pad_bool": config(pad_token_id=True),
    "heads_not_dividing": config(n_heads=3),
    "kv_heads_zero": config(n_kv_heads=0),
    "odd_head_dim": config(d_model=12, n_heads=4, n_kv_heads=4),
    "embedding_smaller": config(embedding_size=3),
    "model_type_list": config(model_type=["llada"]),
    "missing_model_type": config(model_type=_DROP),
    "missing_d_model": config(d_model=_DROP),
    "mlp_ratio_string": config(mlp_hidden_size=_DROP, mlp_ratio="3"),
    "mlp_ratio_huge": config(mlp_hidden_size=_DROP, mlp_ratio=1e300),
    "duplicate_key": config().replace(b'"d_model": 128', b'"d_model": 128, "d_model": 64'),
    "not_utf8": config() + b"\xff",
    "bom": b"\xef\xbb\xbf" + config(),
    "top_level_array": b"[1, 2]",
    "top_level_null": b"null",
    "truncated": config()[:40],
    "deep_nesting": b'{"d_model": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    "int_5000_digits": b'{"model_type": "llada", "d_model": ' + b"7" * 5000 + b"}",
}


def main() -> None:
    for kind, items in (("header", HEADERS), ("config", CONFIGS)):
        folder = os.path.join(HERE, "corpus", kind)
        os.makedirs(folder, exist_ok=True)
        for old in os.listdir(folder):
            os.remove(os.path.join(folder, old))
        for name, data in items.items():
            with open(os.path.join(folder, name), "wb") as f:
                f.write(data)
    print(f"wrote {len(HEADERS)} header and {len(CONFIGS)} config inputs under {os.path.join(HERE, 'corpus')}")


if __name__ == "__main__":
    main()
