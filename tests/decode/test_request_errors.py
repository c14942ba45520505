"""Refusals by kind, results by table: every way into the engine (DecodeOptions, Engine.generate,
decode_batch, the scheduler) raises a request the engine refuses as ``RequestError`` with the same
kind and argument (csrc/decode/refused.h; the ERROR_KINDS table), and a decode's stats have exactly
the keys of the STATS table (contract.py), typed as it says."""

from __future__ import annotations

import typing

import pytest
import torch

from blockbatch import DecodeOptions, RequestError, contract
from blockbatch.options_fields import DecodeStats

from helpers.batching import small_engine


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    return {f: small_engine(tmp_path_factory.mktemp("errors-" + f), f, seed=3) for f in ("llada", "llada2")}


# options -> (kind, param) on construction: no model needed
OPTION_REFUSALS = [
    (dict(gen_length=0), "invalid_option", "gen_length"),
    (dict(threshold=1.5), "invalid_option", "threshold"),
    (dict(policy="blockbatch", gen_length=32, block_sizes=(4, 4)), "unsupported", "block_sizes"),
    (dict(policy="blockbatch", gen_length=32, block_sizes=(5,)), "unsupported", "block_sizes"),
    (dict(policy="dual", gen_length=32, block_length=5), "unsupported", "block_length"),
    (dict(policy="dual", gen_length=32, edit_threshold=0.9), "unsupported", "edit_threshold"),
    (dict(policy="block", gen_length=32, temperature=0.5), "unsupported", "temperature"),
    (dict(gen_length=2**70), "invalid_option", "gen_length"),  # Python's int64 check
]


@pytest.mark.parametrize("kwargs,kind,param", OPTION_REFUSALS, ids=[str(k) for k, _, _ in OPTION_REFUSALS])
def test_options_refused_on_construction_carry_kind_and_param(kwargs, kind, param):
    with pytest.raises(RequestError) as e:
        DecodeOptions(**kwargs)
    assert (e.value.kind, e.value.param) == (kind, param), str(e.value)
    assert param in str(e.value)  # the message still names it for people
    assert kind in contract.ERROR_KIND_NAMES


def test_a_wrong_type_names_the_option_as_data():
    with pytest.raises(TypeError) as e:
        DecodeOptions(threshold="high")
    assert getattr(e.value, "param", None) == "threshold"


def _requests(engines):
    """(engine, prompt, options, kind, param): refusals that need the model or the prompt."""
    llada, llada2 = engines["llada"], engines["llada2"]
    mask = llada.config.mask_token_id
    limit = llada.config.max_sequence_length
    dual = DecodeOptions(policy="dual", gen_length=32, block_length=32)
    return [
        (llada, [1, 2], DecodeOptions(policy="block", gen_length=32, block_length=32), "unsupported", "policy"),
        (llada2, [1, 2], dual, "unsupported", "policy"),
        (llada, [1, mask], dual, "invalid_prompt", "prompt_ids"),
        (llada, [1, 10**6], dual, "invalid_prompt", "prompt_ids"),
        (llada, [1, 2], DecodeOptions(policy="vanilla", gen_length=limit, steps=limit), "context_length", "gen_length"),
    ]


def test_every_entry_point_refuses_with_the_same_kind_and_param(engines):
    for engine, prompt, options, kind, param in _requests(engines):
        what = f"{engine.config.family} {options.policy} {prompt}"
        with pytest.raises(RequestError) as alone:
            engine.generate([prompt], options)
        with pytest.raises(RequestError) as batched:
            engine.generate([prompt, [1, 2, 3]], options, max_batch=2)
        with engine.scheduler(max_batch=1, max_length=engine.config.max_sequence_length) as s:
            with pytest.raises(RequestError) as scheduled:
                s.submit(torch.tensor(prompt), options)
        for e in (alone, batched, scheduled):
            assert (e.value.kind, e.value.param) == (kind, param), (what, str(e.value))


def test_a_refusal_is_read_once_and_never_given_to_another_error(engines):
    with pytest.raises(RequestError):
        DecodeOptions(gen_length=0)
    assert tuple(torch.ops.blockbatch.last_refusal()) == ("", "", "")  # taken by the first
    # a plain ValueError of an op (not a refusal) stays a plain ValueError
    with pytest.raises(ValueError) as e:
        engines["llada"].generate(torch.zeros(2, 2, 2, dtype=torch.long))
    assert not isinstance(e.value, RequestError)


def test_stats_have_the_keys_and_types_of_the_stats_table(engines):
    assert list(torch.ops.blockbatch.decode_stat_names()) == [s.name for s in contract.NATIVE_STATS]
    assert set(typing.get_type_hints(DecodeStats)) == set(contract.STAT_NAMES)
    py = {"int": int, "float": float, "bool": bool, "str": str, "int[]": list, "branches": list}
    cases = [
        (engines["llada"], DecodeOptions(policy="blockbatch", gen_length=16, block_sizes=(4, 8))),
        (engines["llada"], DecodeOptions(policy="vanilla", gen_length=16, steps=16, threshold=None, block_length=16)),
        (engines["llada2"], DecodeOptions(policy="block", gen_length=16, block_length=8)),
    ]
    for engine, options in cases:
        stats = engine.generate([[1, 2, 3]], options)[0].stats
        assert list(stats) == list(contract.STAT_NAMES), options.policy
        for s in contract.STATS:
            assert type(stats[s.name]) is py[s.type], (options.policy, s.name, stats[s.name])
        assert all(set(b) == set(contract.BRANCH_FIELDS) for b in stats["branches"])
        assert stats["steps"] == len(stats["committed_per_step"]) == len(stats["query_tokens_per_step"])
