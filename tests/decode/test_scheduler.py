"""The step-wise scheduler (torch.classes.blockbatch.Scheduler, blockbatch.scheduler.BatchScheduler,
Engine.stream): requests added at any time decode together; each one's tokens and counters equal
its decode alone (float32, CPU, exact), its streamed tokens are a prefix of its result, cancel
takes it out within one step, and nothing is refused late or allocated past the budget."""

from __future__ import annotations

import os
import random
import re
import threading
import time

import pytest
import torch

from blockbatch import DecodeOptions, RequestError
from blockbatch.scheduler import RequestCancelled

from helpers.batching import small_engine, mixed_requests as _mixed_requests, same as _same


@pytest.fixture(scope="module", params=["llada", "dream"])
def engine(request, tmp_path_factory):
    return small_engine(tmp_path_factory.mktemp("sched-" + request.param), request.param, seed=4)


@pytest.fixture(scope="module")
def requests_and_alone(engine):
    reqs = _mixed_requests(
        random.Random(11), engine.config.vocab_size, engine.config.mask_token_id, 12, engine.config.family
    )
    return reqs, [engine.generate([p], o)[0] for p, o in reqs]


def _check_stream(request, generation, what):
    """Token events: consecutive offsets, together the stable prefix, a prefix of the result."""
    events = list(request.events(timeout=5))
    assert events[-1].kind == "finished", what
    offset = 0
    for ev in events[:-1]:
        assert ev.kind == "tokens" and ev.offset == offset and ev.tokens, what
        offset += len(ev.tokens)
    assert request.stable_ids == generation.raw_ids[: len(request.stable_ids)], f"{what}: streamed a changed token"
    return len(events) - 1


def test_requests_joining_mid_run_equal_their_decode_alone(engine, requests_and_alone):
    reqs, alone = requests_and_alone
    with engine.scheduler(max_batch=4, max_length=128) as sched:
        first = [sched.submit(torch.tensor(p), o, stream=True) for p, o in reqs[:5]]
        first[0].result(timeout=60)  # the rest join while the others run
        rest = [sched.submit(torch.tensor(p), o, stream=True) for p, o in reqs[5:]]
        handles = first + rest
        for i, (h, a) in enumerate(zip(handles, alone)):
            out = h.result(timeout=60)
            g = engine._generation(torch.tensor(reqs[i][0]), out)
            _same(g, a, f"{engine.config.family} request {i}")
        streamed = [_check_stream(h, a, f"request {i}") for i, (h, a) in enumerate(zip(handles, alone))]
        counters = sched.counters()
    assert sum(streamed) > len(handles), "the requests streamed no more than one chunk each"
    assert counters["request_forwards"] == sum(a.stats["nfe"] for a in alone)
    assert counters["packed_forwards"] < counters["request_forwards"]  # forwards were packed
    assert counters["running"] == counters["queued"] == counters["kv_rows_in_use"] == 0


def test_cancel_takes_a_request_out_within_one_step(engine, requests_and_alone):
    reqs, alone = requests_and_alone
    prompt = torch.tensor(reqs[0][0])
    long = (
        DecodeOptions(policy="vanilla", gen_length=64, block_length=64, threshold=None, steps=64)
        if engine.config.family == "llada"
        else DecodeOptions(policy="vanilla", gen_length=64, steps=64)
    )
    long_alone = engine.generate(prompt, long)[0].stats["nfe"]
    with engine.scheduler(max_batch=2, max_length=128) as sched:
        other = sched.submit(torch.tensor(reqs[1][0]), reqs[1][1])
        victim = sched.submit(prompt, long, stream=True)
        queued = sched.submit(prompt, long)  # max_batch 2: waits in the queue
        assert queued.cancel()
        with pytest.raises(RequestCancelled, match="before it started"):
            queued.result(timeout=10)
        next(victim.events(timeout=30))  # it has run some forwards
        assert victim.cancel()
        with pytest.raises(RequestCancelled, match="cancelled after"):
            victim.result(timeout=30)
        _same(engine._generation(torch.tensor(reqs[1][0]), other.result(timeout=60)), alone[1], "the neighbour")
        forwards = sched.counters()["request_forwards"]
        assert not victim.cancel()  # already over
    assert forwards < long_alone + alone[1].stats["nfe"]


def test_refusals_name_what_is_wrong(engine, requests_and_alone):
    reqs, _ = requests_and_alone
    prompt = torch.tensor(reqs[0][0])
    with engine.scheduler(max_batch=2, max_length=40, kv_budget_bytes=0) as sched:
        with pytest.raises(RequestError, match=r"needs \d+ positions but this scheduler's max_length is 40") as e:
            sched.submit(prompt, DecodeOptions(policy="dual", gen_length=64, block_length=16))
        assert (e.value.kind, e.value.param) == ("context_length", "gen_length")
        with pytest.raises(RequestError, match="mask id") as e:
            sched.submit(
                torch.tensor([engine.config.mask_token_id]),
                DecodeOptions(policy="dual", gen_length=16, block_length=16),
            )
        assert (e.value.kind, e.value.param) == ("invalid_prompt", "prompt_ids")
        with pytest.raises(TypeError, match="options must be a DecodeOptions"):
            sched.submit(prompt, {"policy": "dual"})
        row = sched.counters()["kv_row_bytes"]
    # dense rows (the paged pool's refusals: test_paged_pool.py)
    with engine.scheduler(max_batch=2, max_length=40, kv_budget_bytes=2 * row, kv_page_len=0) as sched:
        with pytest.raises(
            RequestError, match=r"needs 3 KV rows of \d+ positions \(3 rows of 40 positions\) but the KV budget holds 2"
        ) as e:
            sched.submit(prompt, DecodeOptions(policy="blockbatch", gen_length=16, block_sizes=(4, 8, 16)))
        assert (e.value.kind, e.value.param) == ("kv_budget", "block_sizes")
        # two rows: two dual requests at once at most, a third waits for rows and still finishes
        hs = [sched.submit(prompt, DecodeOptions(policy="dual", gen_length=16, block_length=8)) for _ in range(3)]
        assert [h.result(timeout=60).tokens.tolist() for h in hs].count(hs[0].result().tokens.tolist()) == 3
    with pytest.raises(ValueError, match="holds no KV row"):
        engine.scheduler(max_batch=1, max_length=40, kv_budget_bytes=row - 1)
    with pytest.raises(ValueError, match="max_batch must be an integer >= 1"):
        engine.scheduler(max_batch=0)
    sched.close()
    with pytest.raises(RuntimeError, match="closed"):
        sched.submit(prompt, DecodeOptions(policy="dual", gen_length=16, block_length=8))


def test_close_ends_every_request_and_deadlines_raise_timeout(engine, requests_and_alone):
    reqs, _ = requests_and_alone
    sched = engine.scheduler(max_batch=2, max_length=128)
    slow = (
        DecodeOptions(policy="vanilla", gen_length=64, steps=64, threshold=None, block_length=64)
        if engine.config.family == "llada"
        else DecodeOptions(policy="vanilla", gen_length=64, steps=64)
    )
    hs = [sched.submit(torch.tensor(p), slow) for p, _ in reqs[:6]]
    late = sched.submit(torch.tensor(reqs[0][0]), slow.replace(timeout_s=1e-6))
    t0 = time.perf_counter()
    sched.close()
    assert time.perf_counter() - t0 < 30
    kinds = []
    for h in hs + [late]:
        assert h.done
        try:
            h.result(timeout=0)
            kinds.append("finished")
        except RequestCancelled:
            kinds.append("cancelled")
        except TimeoutError:
            kinds.append("timeout")
    assert "cancelled" in kinds, kinds
    # the final event says why by kind, as the exception's class does
    finals = [list(h.events(timeout=0))[-1] for h in hs + [late]]
    assert [{"finished": "", "cancelled": "cancelled", "timeout": "timeout"}[k] for k in kinds] == [
        ev.error_kind for ev in finals
    ]
    with engine.scheduler(max_batch=1, max_length=128) as sched:
        h = sched.submit(torch.tensor(reqs[0][0]), slow.replace(timeout_s=1e-6))
        with pytest.raises(TimeoutError, match="deadline exceeded"):
            h.result(timeout=30)
        assert [ev.error_kind for ev in h.events(timeout=0)][-1] == "timeout"


def test_engine_stream_yields_each_result_as_it_finishes(engine, requests_and_alone):
    reqs, alone = requests_and_alone
    prompts, opts = [p for p, _ in reqs], [o for _, o in reqs]
    bad = [engine.config.vocab_size + 1]
    seen, blocks = {}, 0
    for item in engine.stream(prompts + [bad], opts + [opts[0]], max_batch=5, blocks=True):
        if item.generation is not None:
            seen[item.index] = item.generation
        elif item.error is not None:
            assert item.index == len(prompts) and "vocabulary" in str(item.error)
            seen[item.index] = None
        else:
            blocks += 1
            assert item.new_ids
    assert sorted(seen) == list(range(len(prompts) + 1))
    for i, a in enumerate(alone):
        _same(seen[i], a, f"stream request {i}")
    assert blocks > 0
    # closing the generator early cancels the rest; the engine stays usable
    gen = engine.stream(prompts, opts, max_batch=2)
    first = next(gen)
    gen.close()
    assert first.done
    _same(engine.generate([prompts[0]], opts[0])[0], alone[0], "after an early close")


def test_step_runs_on_one_driver_thread_without_the_gil(engine, requests_and_alone):
    """step() releases the GIL: Python threads run while the scheduler decodes."""
    reqs, _ = requests_and_alone
    ticks = []
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.001)

    t = threading.Thread(target=spin)
    t.start()
    with engine.scheduler(max_batch=4, max_length=128) as sched:
        hs = [sched.submit(torch.tensor(p), o) for p, o in reqs]
        t0 = time.perf_counter()
        for h in hs:
            h.result(timeout=120)
        elapsed = time.perf_counter() - t0
    stop.set()
    t.join()
    assert len(ticks) > 100 * elapsed, (len(ticks), elapsed)  # ~900 per second when the GIL is free


def test_kv_report_matches_the_pool_the_scheduler_allocates(engine):
    c = engine.config
    dual = DecodeOptions(policy="dual", gen_length=32, block_length=16)
    bb = DecodeOptions(policy="blockbatch", gen_length=32, block_sizes=(8, 16, 32))
    r = engine.kv_report(dual, 32, 10 * 2**20)
    row = c.n_layers * 2 * c.n_kv_heads * 64 * (c.d_model // c.n_heads) * 4  # float32
    assert (r["positions"], r["rows"], r["row_bytes"]) == (64, 1, row)
    assert r["largest_batch"] == 10 * 2**20 // row
    rb = engine.kv_report(bb, 32, 10 * 2**20)
    assert rb["rows"] == 3 and rb["bytes_per_request"] == 3 * row and rb["largest_batch"] == 10 * 2**20 // (3 * row)
    assert (
        engine.kv_report(DecodeOptions(policy="vanilla", gen_length=32, steps=32, threshold=None), 8, 1)[
            "largest_batch"
        ]
        == -1
    )
    # a scheduler with exactly that budget holds that many requests at once
    with engine.scheduler(max_batch=8, max_length=64, kv_budget_bytes=2 * rb["bytes_per_request"]) as sched:
        assert sched.counters()["kv_pool_rows"] == 6 and sched.counters()["kv_row_bytes"] == row
    with pytest.raises(ValueError, match="prompt_length must be an integer >= 1"):
        engine.kv_report(dual, 0, 1)


@pytest.fixture(scope="module")
def toy():
    from blockbatch import Engine

    return Engine.from_pretrained()


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def test_kv_pool_memory_grows_with_the_rows_used(toy):
    """The pool is allocated uninitialised and each row range zeroed when handed out: a scheduler
    sized for 500 requests (5.9 GiB of KV on the toy) takes next to nothing until requests come,
    and its requests decode as alone (zeroed rows, nothing of an earlier request read)."""
    if "libasan" in os.environ.get("LD_PRELOAD", ""):
        pytest.skip("under .ci/sanitize ASan's allocator and shadow memory decide the resident size")
    before = _rss()
    with toy.scheduler(max_batch=500, adaptive=False) as sched:
        grown = _rss() - before
        k = sched.counters()
        pool = k["kv_pool_rows"] * k["kv_row_bytes"]
        assert pool > 5 * 2**30
        assert grown < pool // 8, (grown, pool)  # measured: ~5 MiB of 5.9 GiB
        opts = [
            DecodeOptions(policy="dual", gen_length=64, block_length=16),
            DecodeOptions(policy="blockbatch", gen_length=64, block_sizes=(8, 16, 32)),
        ]
        prompts = ["72-2=__-3=__-3=__...............?", "9-2=__-1=__...........?"]
        for round_ in range(2):  # the second round reuses rows the first wrote
            hs = [sched.submit(toy.encode(p), o) for p in prompts for o in opts]
            outs = [h.result(timeout=120) for h in hs]
            alone = [toy.generate(p, o)[0] for p in prompts for o in opts]
            for out, a, (ids, what) in zip(
                outs, alone, [(toy.encode(p), f"{p} {o.policy}") for p in prompts for o in opts]
            ):
                _same(toy._generation(ids, out), a, f"round {round_}: {what}")


@pytest.mark.parametrize("make", ["engine.scheduler", "BatchScheduler", "check_pool", "generate"])
def test_a_pool_larger_than_memory_is_refused_up_front(toy, make):
    """A KV pool the machine cannot hold is one ValueError naming what sized it and the GiB,
    before any allocation or worker thread (was: an allocator error, or a million threads)."""
    from blockbatch.scheduler import BatchScheduler, check_pool

    def build(max_batch, kv_budget_bytes):
        if make == "engine.scheduler":
            return toy.scheduler(max_batch=max_batch, kv_budget_bytes=kv_budget_bytes, adaptive=False)
        if make == "BatchScheduler":
            return BatchScheduler(toy.model.obj, max_batch, 512, kv_budget_bytes, step_curve=None)
        if make == "check_pool":
            return check_pool(toy.model.obj, max_batch, 512, kv_budget_bytes)
        return toy.generate(["1+1", "2+2"], max_batch=min(max_batch, 2), kv_budget_bytes=kv_budget_bytes)

    with pytest.raises(
        ValueError,
        match=r"the KV pool would take \d+ rows of \d+ bytes \(max_length = \d+ "
        r"positions\), 1024\.\d\d GiB, but cpu has [\d.]+ GiB: kv_budget_bytes = "
        r"1099511\d+ \(1024\.00 GiB\) asks for it; lower kv_budget_bytes",
    ):
        build(8, 2**40)
    if make != "generate":  # generate sizes its pool by its requests, not by max_batch
        t0 = time.perf_counter()
        with pytest.raises(
            ValueError,
            match=r"11718\.75 GiB, .*kv_budget_bytes = 0 sizes it for max_batch = "
            r"1000000 requests of 6 KV rows each; lower max_batch or max_length",
        ):
            build(1_000_000, 0)
        assert time.perf_counter() - t0 < 5


def test_check_pool_is_the_pool_the_scheduler_takes(toy):
    from blockbatch.scheduler import check_pool

    for max_batch, max_length, budget in ((500, 512, 0), (4, 128, 0), (8, 256, 10 * 2**20)):
        report = check_pool(toy.model.obj, max_batch, max_length, budget)
        with toy.scheduler(max_batch=max_batch, max_length=max_length, kv_budget_bytes=budget, adaptive=False) as s:
            k = s.counters()
        assert (report["kv_pool_rows"], report["kv_row_bytes"]) == (k["kv_pool_rows"], k["kv_row_bytes"])
        assert report["kv_pool_bytes"] == k["kv_pool_rows"] * k["kv_row_bytes"]
    with pytest.raises(ValueError, match=r"max_length must be in \[2, 512\] .*max_sequence_length\), got 513"):
        check_pool(toy.model.obj, 8, 513, 0)
    with pytest.raises(ValueError, match=r"kv_budget_bytes = 100 holds no KV row"):
        check_pool(toy.model.obj, 8, 512, 100)


def test_stream_a_request_longer_than_the_model_is_its_own_error_item(toy):
    """A request needing more positions than the model has is an error item naming it, its
    prompt length, gen_length and max_sequence_length; the others decode (was: the whole call
    failed with the KV pool's 'length = 515 must be in [1, 512]')."""
    D = DecodeOptions
    items = list(toy.stream(["1+1"] * 3, [D(), D(gen_length=512), D()]))
    errors = {i.index: i.error for i in items if i.error is not None}
    assert set(errors) == {1} and isinstance(errors[1], ValueError)
    n = toy.encode("1+1").numel()
    assert str(errors[1]) == (
        f"prompts[1]: its prompt ({n} tokens) plus gen_length (512) needs {n + 512} positions "
        f"but the model's max_sequence_length is 512 (shorten the prompt or gen_length)"
    )
    alone = toy.generate("1+1", D())[0]
    assert sorted(i.index for i in items if i.generation is not None) == [0, 2]
    for i in items:
        if i.generation is not None:
            _same(i.generation, alone, f"stream item {i.index}")
    assert [i.error is not None for i in toy.stream(["1+1"], D(gen_length=512))] == [True]
    # a bad prompt is its item too; generate raises for the whole call, naming the request
    items = list(toy.stream([[3, 4], [3, 10**30], "1+1"], D(gen_length=32)))
    assert {i.index: str(i.error) for i in items if i.error} == {
        1: "prompts[1][1] = 1000000000000000000000000000000 is outside the vocabulary [0, 21)"
    }
    for max_batch in (1, 2):
        with pytest.raises(ValueError, match=r"^prompts\[1\]: its prompt \(\d+ tokens\) plus gen_length \(512\)"):
            toy.generate(["1+1"] * 3, [D(), D(gen_length=512), D()], max_batch=max_batch)


_BAD_INTS = [
    (True, TypeError, "got bool True"),
    (1.5, TypeError, "got float 1.5"),
    (10**30, ValueError, "got 1000000000000000000000000000000"),
    (-1, ValueError, "got -1"),
]


@pytest.mark.parametrize("value,error,got", _BAD_INTS + [(2**63, ValueError, "got 9223372036854775808")])
@pytest.mark.parametrize("argument", ["kv_budget_bytes", "max_batch"])
@pytest.mark.parametrize("call", ["generate", "stream", "scheduler", "kv_report", "BatchScheduler", "check_pool"])
def test_int_arguments_are_checked_before_the_cpp_call(toy, call, argument, value, error, got):
    """Every int argument: an int (not a bool) in its range below 2**63, or an error naming it
    and the range (was: a bool taken as 0 / 1, a torch schema dump, an int64 overflow)."""
    from blockbatch.scheduler import BatchScheduler, check_pool

    if call == "kv_report" and argument == "max_batch":
        argument = "prompt_length"
    if argument == "max_batch" and value == -1:
        value, got = 0, "got 0"
    kw = {argument: value}
    calls = {
        "generate": lambda: toy.generate(["1+1", "2+2"], **kw),
        "stream": lambda: list(toy.stream(["1+1", "2+2"], **kw)),
        "scheduler": lambda: toy.scheduler(adaptive=False, **kw),
        "kv_report": lambda: toy.kv_report(DecodeOptions(), **{"prompt_length": 3, "kv_budget_bytes": 0, **kw}),
        "BatchScheduler": lambda: BatchScheduler(toy.model.obj, max_length=128, step_curve=None, **kw),
        "check_pool": lambda: check_pool(toy.model.obj, **{"max_batch": 8, "max_length": 128, **kw}),
    }
    low = {"kv_budget_bytes": 0, "max_batch": 1, "prompt_length": 1}[argument]
    with pytest.raises(error, match=rf"^{argument} must be an integer >= {low}\b.*{re.escape(got)}$"):
        calls[call]()


def test_max_length_and_token_ids_are_checked_by_name(toy):
    from blockbatch.scheduler import BatchScheduler

    with pytest.raises(ValueError, match=r"^max_length must be an integer in \[2, 512\], got 513$"):
        toy.scheduler(max_length=513)
    with pytest.raises(TypeError, match=r"^max_length must be an integer >= 2 .*got bool True$"):
        BatchScheduler(toy.model.obj, max_length=True, step_curve=None)
    with pytest.raises(ValueError, match=r"^max_length must be an integer >= 2 .*got 9223372036854775808$"):
        BatchScheduler(toy.model.obj, max_length=2**63, step_curve=None)
    with pytest.raises(
        ValueError,
        match=r"^prompt\[3\] = 1000000000000000000000000000000 is outside the vocabulary "
        r"\[0, 21\)$",
    ):
        toy.encode([1, 2, 3, 10**30])
    with pytest.raises(ValueError, match=r"^prompts\[1\]\[3\] = 21 is outside the vocabulary \[0, 21\)$"):
        toy.generate([[1, 2], [1, 2, 3, 21]])
    with pytest.raises(ValueError, match=r"^prompt\[0\] = -4 is outside the vocabulary"):
        toy.encode(torch.tensor([-4, 1]))
    with pytest.raises(TypeError, match=r"^prompt must be a str, a list of token ids or a 1-D int64 tensor, got dict"):
        toy.encode({"ids": [1, 2]})
