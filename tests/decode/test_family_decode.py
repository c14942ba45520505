"""Decoding over the registries: every family (``blockbatch.families.REGISTRY``) x every policy
(``blockbatch.policies.REGISTRY``, the C++ policy table's twin).

- each policy a family decodes with (its ``POLICIES``) equals the policy's float32 reference entry for
  that family (``policies.reference``, what ``bench --compare-reference`` runs), tokens and NFE, on a
  small random checkpoint of the family and per-policy option rows;
- each policy it does not decode is refused before the decode, naming the policies that do;
- the options its decoders refuse (per-family rows, tests/helpers/families.py) are refused naming the option;
- a request that sets nothing decodes with the family's defaults (``DEFAULT_OPTIONS``).

The family-specific parity tests (the authors' recorded fixtures, the reference grids over each
family's shapes) stay in test_<family>_native.py / test_decode.py.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from blockbatch import DecodeOptions, Engine, bench, families, policies
from blockbatch.errors import RequestError
from blockbatch.random_checkpoint import make_random_checkpoint
from helpers import families as data

PAIRS = [(f, p) for f in data.names() for p in families.get(f).POLICIES]
REFUSED = [(f, p) for f in data.names() for p in policies.REGISTRY if p not in families.get(f).POLICIES]
PROMPTS = ([5], [3, 9, 27, 1, 44, 2, 8, 8, 19])


@pytest.mark.parametrize("family,policy", PAIRS, ids=[f"{f}-{p}" for f, p in PAIRS])
def test_each_policy_equals_its_reference(engines, family, policy):
    engine, ref = engines(family)
    mask = engine.config.mask_token_id
    for prompt in PROMPTS:
        prompt = [t if t != mask else 0 for t in prompt]
        for overrides in data.policy_cases(policy, family):
            o = engine.default_options(policy=policy, **overrides)
            g = engine.generate([prompt], o)[0]
            row, nfe = policies.reference(ref, torch.tensor(prompt), o, family, engine.checkpoint.proposal_vocab)
            what = f"{family} {policy} {overrides} prompt {prompt}"
            assert row.tolist() == prompt + g.raw_ids, what
            assert g.stats["nfe"] == nfe, what


@pytest.mark.parametrize("family,policy", REFUSED, ids=[f"{p}-on-{f}" for f, p in REFUSED])
def test_policies_the_family_does_not_decode_say_why(engines, family, policy):
    engine, _ = engines(family)
    with pytest.raises(RequestError, match=data.policy_refusal(policy, family)) as e:
        engine.generate([[1, 2, 3]], DecodeOptions(policy=policy, gen_length=32))
    assert (e.value.kind, e.value.param) == ("unsupported", "policy")


OPTIONS = data.rows(data.REFUSED_OPTIONS)


@pytest.mark.parametrize("family,options,match,param", OPTIONS, ids=data.ids(OPTIONS))
def test_refused_options_name_the_option(engines, family, options, match, param):
    engine, _ = engines(family)
    with pytest.raises(RequestError, match=match) as e:
        engine.generate([[1, 2, 3]], DecodeOptions(**options))
    assert e.value.param == param


@pytest.mark.parametrize("family", data.names())
def test_a_request_setting_nothing_gets_the_familys_defaults(engines, family):
    engine, _ = engines(family)
    defaults = families.get(family).DEFAULT_OPTIONS
    o = engine.default_options()
    for field in dataclasses.fields(DecodeOptions):
        want = defaults.get(field.name, getattr(DecodeOptions(), field.name))
        assert getattr(o, field.name) == want, field.name
    assert o.policy in families.get(family).POLICIES
    out = engine.generate([[1, 2, 3]], engine.default_options(gen_length=16, block_length=8))[0]
    assert out.stats["policy"] == o.policy and out.stats["nfe"] >= 1


STOPS = [(f, p) for f, p in PAIRS if p in data.STOP_CASES]


@pytest.mark.parametrize("family,policy", STOPS, ids=[f"{f}-{p}" for f, p in STOPS])
def test_stop_on_eos_ends_the_decode_as_the_reference_does(tmp_path, family, policy):
    """A token the model writes in the second block made the EOS id (the same weights): with
    stop_on_eos the decode equals the policy's reference (tokens, NFE), takes no more forwards than
    without it, and where the policy stops at the block holding the first EOS, fewer, the rest of
    the canvas EOS (or, where the policy leaves it undecoded, masks)."""
    overrides, stops_at_block, rest = data.STOP_CASES[policy]
    stops_at_block = stops_at_block and (family, policy) not in data.NO_BLOCK_STOP
    shape = dict(seed=4, logit_scale=4.0, family=family, **data.small_checkpoint(family))
    prompt = [5, 6, 7]
    make_random_checkpoint(tmp_path / "free", **shape)
    engine = Engine.from_pretrained(tmp_path / "free")
    free = engine.generate([prompt], engine.default_options(policy=policy, stop_on_eos=False, **overrides))[0]
    eos = free.raw_ids[9]
    make_random_checkpoint(tmp_path / "eos", eos_token_id=eos, **shape)
    engine = Engine.from_pretrained(tmp_path / "eos")
    o = engine.default_options(policy=policy, stop_on_eos=True, **overrides)
    g = engine.generate([prompt], o)[0]
    row, nfe = policies.reference(
        bench.reference_model(engine.checkpoint), torch.tensor(prompt), o, family, engine.checkpoint.proposal_vocab
    )
    assert row.tolist() == prompt + g.raw_ids and g.stats["nfe"] == nfe
    assert eos in g.raw_ids and g.stats["nfe"] <= free.stats["nfe"]
    if stops_at_block:
        B, lp, first = o.block_length, len(prompt), g.raw_ids.index(eos)
        aligned = policies.get(policy).BLOCKS_ALIGNED_AT_ZERO
        end = ((lp + first) // B + 1) * B - lp if aligned else (first // B + 1) * B
        assert end < o.gen_length and g.stats["nfe"] < free.stats["nfe"]
        fill = eos if rest == "eos" else engine.config.mask_token_id
        assert all(t == fill for t in g.raw_ids[end:]), (end, g.raw_ids)
