"""BlockBatch against the authors' own code, with a periodic refresh that fires every block or so.

The fixture holds what the authors' LLaDA decoder (Laurence-Wu/BlockBatch,
``llada/generate_blockBatching_original_bulk.py``; float32, its bfloat16 casts removed) returned
on the shipped toy model for 300 held-out toy prompts at the settings of issue 23 (branches
{4, 16, 32, 64}, threshold 0.9, merge gate 0.7, sync gap 4, gen 64) and a refresh every 8, 4 and 16
tokens. ``tests/tools/record_authors_refresh.py`` recorded it (the authors' code is not a
dependency). Per prompt: the winner's tokens, the authors' NFE (the forwards the winning branch
took part in, ``nfe_paper`` here), the forwards actually executed, the winner's block size, the
early exit, and per branch the tokens decoded / merged / copied and its forwards.

The engine runs every prompt (with fold_rows, its default: refresh rows of identical canvases fed
once); the Python reference runs every 5th (it is slower).

Many of these prompts end with several branches EOS-ready in the same block step, with EOS
probabilities 1 - 1e-7 apart: the early exit's tie rule (ALGORITHMS.md, "early exit") decides
the winner in about one prompt in six.
"""

import pytest
import torch

from blockbatch.engine import Engine
from blockbatch.decoding import run_decode
from blockbatch.options import DecodeOptions
from blockbatch.reference.blockbatch import blockbatch_generate
from blockbatch.reference.model import ReferenceModel
from helpers.packing import load_fixture, unpack

REFERENCE_EVERY = 5


@pytest.fixture(scope="module")
def recorded():
    return load_fixture("authors_refresh_toy.json")


@pytest.fixture(scope="module")
def toy():
    engine = Engine.from_pretrained()
    return engine, ReferenceModel.from_checkpoint(engine.checkpoint)


def settings(recorded, refresh):
    s = recorded["settings"]
    return dict(
        block_sizes=tuple(s["block_sizes"]),
        threshold=s["threshold"],
        merge_gate=s["conf_threshold"],
        sync_gap=s["sync_threshold"],
        refresh_tokens=refresh,
        stop_on_eos=True,
    )


def runs(recorded, refresh):
    """The recorded runs of one setting as dicts (the fixture stores rows in run_fields order)."""
    return [dict(zip(recorded["run_fields"], row)) for row in recorded["runs"][str(refresh)]]


def authors_view(run):
    return dict(
        tokens=unpack(run["tokens"]),
        nfe=run["nfe"],
        forwards=run["forwards"],
        winner_block_size=run["winner_block_size"],
        early_exit=run["early_exit"],
        decoded=run["decoded"],
        merged=run["merged"],
        copied=run["copied"],
        branch_forwards=run["branch_forwards"],
    )


def mismatches(recorded, refresh, decode, every=1):
    """[(prompt index, {field: (authors, ours)})] over the recorded prompts."""
    out = []
    for i, (prompt, run) in enumerate(zip(recorded["prompts"], runs(recorded, refresh))):
        if i % every:
            continue
        ids = torch.tensor(unpack(prompt))
        expected, got = authors_view(run), decode(ids)
        diff = {k: (expected[k], got[k]) for k in expected if expected[k] != got[k]}
        if diff:
            out.append((i, diff))
    return out


REFRESH = [8, 4, 16]


@pytest.mark.parametrize("refresh", REFRESH)
def test_engine_matches_authors(recorded, toy, refresh):
    engine, _ = toy
    options = DecodeOptions(
        policy="blockbatch", gen_length=recorded["settings"]["gen_length"], **settings(recorded, refresh)
    )

    folded = []

    def decode(ids):
        out = run_decode(engine.model.obj, ids, options)  # fold_rows on (the default)
        s = out.stats
        folded.append(s["folded_rows"])
        br = s["branches"]
        return dict(
            tokens=out.tokens[len(ids) :].tolist(),
            nfe=s["nfe_paper"],
            forwards=[s["nfe_init"], s["nfe_block"], s["nfe_refresh"]],
            winner_block_size=s["winner_block_size"],
            early_exit=s["early_exit"],
            decoded=[b["committed"] + b["copied"] for b in br],
            merged=[b["merged"] for b in br],
            copied=[b["copied"] for b in br],
            branch_forwards=[b["forwards"] for b in br],
        )

    bad = mismatches(recorded, refresh, decode)
    assert not bad, f"{len(bad)} of {len(recorded['prompts'])} prompts differ, first: {bad[:3]}"
    assert sum(folded) > 0  # refresh rows were folded, and every prompt still equals the authors' run


@pytest.mark.parametrize("refresh", REFRESH)
def test_reference_matches_authors(recorded, toy, refresh):
    _, ref = toy
    G = recorded["settings"]["gen_length"]

    def decode(ids):
        r = blockbatch_generate(ref, ids, G, **settings(recorded, refresh))
        br = r.branches
        return dict(
            tokens=r.tokens[len(ids) :].tolist(),
            nfe=r.nfe_paper,
            forwards=[r.nfe_init, r.nfe_block, r.nfe_refresh],
            winner_block_size=r.winner_block_size,
            early_exit=r.early_exit,
            decoded=[b.decoded for b in br],
            merged=[b.merged for b in br],
            copied=[b.copied for b in br],
            branch_forwards=[b.forwards for b in br],
        )

    bad = mismatches(recorded, refresh, decode, every=REFERENCE_EVERY)
    assert not bad, f"{len(bad)} prompts differ, first: {bad[:3]}"


def test_fixture_exercises_refresh_and_early_exit(recorded):
    """Each setting has refreshes, EOS exits, syncs and merges, and EOS winners of several sizes."""
    for refresh in REFRESH:
        rs = runs(recorded, refresh)
        assert len(rs) == len(recorded["prompts"]) >= 300, refresh
        assert sum(r["forwards"][2] > 0 for r in rs) > len(rs) // 2, refresh  # most prompts see a refresh
        assert sum(r["early_exit"] for r in rs) > len(rs) // 4, refresh
        assert sum(sum(r["copied"]) for r in rs) > 0 and sum(sum(r["merged"]) for r in rs) > 0, refresh
        assert len({r["winner_block_size"] for r in rs if r["early_exit"]}) >= 3, refresh
