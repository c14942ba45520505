"""The float32 Dream reference decoders (blockbatch.reference.dream) against the authors' Dream code.

tests/fixtures/authors_dream_random.json holds what the BlockBatch authors' Dream decoders
(Laurence-Wu/BlockBatch dream/, commit recorded in the fixture) produced on a random Dream-shaped
checkpoint, run by tests/tools/record_authors_dream.py over our float32 reference model: vanilla
with every ``alg``, Fast-dLLM dual and prefix cache (block 32, threshold 0.9) and BlockBatch
(blocks 4..64, their Dream defaults, with and without ``stop_on_eos``). The checkpoint is rebuilt
here from the settings in tests/helpers/dream_cases.py; the reference must return the same canvas row,
token for token, and the same number of forwards.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from blockbatch.random_checkpoint import make_random_checkpoint
from blockbatch.loading import load_checkpoint
from blockbatch.reference.dream import dream_blockbatch, dream_cached, dream_vanilla, shift_rows
from blockbatch.reference.model import ReferenceModel

from helpers.dream_cases import CASES, CHECKPOINT, weights_digest

FIXTURE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "authors_dream_random.json"
)


@pytest.fixture(scope="module")
def fixture():
    with open(FIXTURE, encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def model(tmp_path_factory, fixture):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as recorded: the same matmul blocking on both sides
    folder = tmp_path_factory.mktemp("dream")
    make_random_checkpoint(folder, **CHECKPOINT, family="dream")
    ck = load_checkpoint(folder)
    assert fixture["checkpoint"] == CHECKPOINT
    assert weights_digest(ck.weights) == fixture["weights_sha256"], "the random Dream checkpoint changed"
    yield ReferenceModel.from_checkpoint(ck)
    torch.set_num_threads(threads)


def run_case(model, case):
    if case["policy"] == "vanilla":
        return dream_vanilla(
            model,
            case["prompt"],
            case["gen_length"],
            case["steps"],
            alg=case["alg"],
            alg_temp=case.get("alg_temp") or 0.0,
            eps=case.get("eps", 1e-3),
            seed=case.get("seed", 0),
            top_p=case.get("top_p"),
            top_k=case.get("top_k"),
        )
    if case["policy"] in ("dual", "prefix"):
        return dream_cached(
            model,
            case["prompt"],
            case["gen_length"],
            case["block_length"],
            case["threshold"],
            dual=case["policy"] == "dual",
            top_p=case.get("top_p"),
            top_k=case.get("top_k"),
        )
    return dream_blockbatch(
        model,
        case["prompt"],
        case["gen_length"],
        case["block_sizes"],
        threshold=case["threshold"],
        refresh_tokens=case["refresh_tokens"],
        sync_gap=case["sync_gap"],
        stop_on_eos=case["stop_on_eos"],
    )


def test_fixture_covers_the_cases(fixture):
    assert [c["name"] for c in fixture["cases"]] == [c["name"] for c in CASES]
    bb = [c for c in fixture["cases"] if c["policy"] == "blockbatch"]
    # the recorded BlockBatch runs exercise merges, syncs, refreshes and both exits
    assert sum(c["stats"]["merged_tokens"] for c in bb) > 0
    assert sum(c["stats"]["copied_tokens"] for c in bb) > 0
    assert sum(c["stats"]["nfe_refresh"] for c in bb) > 0
    assert {c["stats"]["exit_reason"] for c in bb} == {"eos_ready", "branch_complete"}


@pytest.mark.parametrize("index", range(len(CASES)), ids=[c["name"] for c in CASES])
def test_reference_matches_authors(model, fixture, index):
    want = fixture["cases"][index]
    got = run_case(model, want)
    assert got.tokens == want["tokens"], f"{want['name']}: tokens differ"
    assert got.nfe == want["nfe"], f"{want['name']}: NFE {got.nfe} != authors' {want['nfe']}"
    if want["policy"] == "blockbatch":
        s = want["stats"]
        assert (got.stats["nfe_init"], got.stats["nfe_block"], got.stats["nfe_refresh"]) == (
            s["nfe_init"],
            s["nfe_block"],
            s["nfe_refresh"],
        )
        assert got.stats["winner_block_size"] == s["final_block_size"]
        assert got.stats["exit_reason"] == s["exit_reason"]
        assert sum(b["merged"] for b in got.stats["branches"]) == s["merged_tokens"]
        assert sum(b["copied"] for b in got.stats["branches"]) == s["copied_tokens"]


def test_shift_rows():
    logits = torch.arange(12.0).view(4, 3)
    assert shift_rows(logits).tolist() == [[0, 1, 2], [0, 1, 2], [3, 4, 5], [6, 7, 8]]


def test_block_size_order_does_not_matter(model, fixture):
    case = next(c for c in fixture["cases"] if c["name"] == "blockbatch-eos-p12")
    shuffled = dict(case, block_sizes=[32, 4, 64, 16, 8])
    got = run_case(model, shuffled)
    assert (got.tokens, got.nfe) == (case["tokens"], case["nfe"])


def test_default_blockbatch_settings_are_the_authors_dream_defaults():
    import inspect

    defaults = {
        k: v.default
        for k, v in inspect.signature(dream_blockbatch).parameters.items()
        if v.default is not inspect.Parameter.empty
    }
    assert defaults == dict(
        block_sizes=(4, 8, 16, 32, 64),
        threshold=0.9,
        merge_gate=0.5,
        sync_gap=8,
        refresh_tokens=32,
        prob_floor=0.2,
        stop_on_eos=False,
        merge=True,
        sync=True,
        vocab_limit=None,
        sync_refresh=False,
        fold_rows=True,
        share_prompt_kv=False,
        commit_rows=False,
    )  # sync_refresh, share_prompt_kv: our variants, off; fold_rows: only the query-token accounting;
    # commit_rows: what the result records for logprobs, off
