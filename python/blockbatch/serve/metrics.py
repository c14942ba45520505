"""The server's Prometheus metrics (``GET /metrics``): request outcomes, tokens, NFE and latency
histograms in a registry of the app's own, plus the scheduler's gauges and counters read at
scrape time."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class Metrics:
    """The server's Prometheus metrics, in a registry of its own (one per app)."""

    def __init__(self, scheduler_counters):
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "blockbatch_requests",
            "HTTP generation requests by outcome: the HTTP status of a "
            "refused or answered request, or cancelled (the client went away)",
            ["status"],
            registry=r,
        )
        self.generated_tokens = Counter("blockbatch_generated_tokens", "completion tokens returned", registry=r)
        self.prompt_tokens = Counter("blockbatch_prompt_tokens", "prompt tokens of finished requests", registry=r)
        self.nfe = Counter("blockbatch_nfe", "model forwards (NFE) of finished requests", registry=r)
        latency = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
        self.ttft = Histogram(
            "blockbatch_time_to_first_token_seconds",
            "from a request's arrival to its first stable tokens",
            buckets=latency,
            registry=r,
        )
        self.e2e = Histogram(
            "blockbatch_e2e_request_seconds",
            "from a request's arrival to its end (finished, failed or cancelled)",
            buckets=latency,
            registry=r,
        )
        self.step = Histogram(
            "blockbatch_step_seconds",
            "a finished request's decode time divided by its NFE: the mean time of one of its denoising steps",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
        r.register(_SchedulerCollector(scheduler_counters))

    def text(self) -> bytes:
        return generate_latest(self.registry)


class _SchedulerCollector:
    """Gauges and counters read from the scheduler at scrape time."""

    GAUGES = {
        "running": "requests decoding now",
        "queued": "requests waiting for a decode slot",
        "kv_rows_in_use": "KV pool rows held by running requests",
        "kv_pool_rows": "KV pool rows in all",
        "kv_pages_in_use": "KV pool pages held by running requests (a dense pool: rows)",
        "kv_pages": "KV pool pages in all (a dense pool: rows)",
        "prefix_cache_blocks": "complete prompt blocks held by the prefix cache",
        "prefix_cache_pages": "KV pool pages held by the prefix cache",
    }
    COUNTERS = {
        "packed_forwards": "packed forwards the scheduler ran (one per step and KV mode)",
        "request_forwards": "forwards of all requests (NFE, cancelled ones included)",
        "padded_forwards": "packed forwards padded to bucketed sizes (CUDA, BLOCKBATCH_CUDA_BATCHING=graphs)",
        "graph_replays": "padded forwards replayed from a CUDA graph (over padded_forwards: the hit rate)",
        "prefix_cache_hit_tokens": "prompt positions whose K/V were read from the prefix cache",
        "prefix_cache_evictions": "prefix-cache blocks evicted for pages",
    }

    def __init__(self, counters):
        self._counters = counters

    def describe(self):
        return []

    def collect(self):
        c = self._counters()
        if c is None:
            return
        for name, doc in self.GAUGES.items():
            yield GaugeMetricFamily(f"blockbatch_{name}", doc, value=c[name])
        for name, doc in self.COUNTERS.items():
            yield CounterMetricFamily(f"blockbatch_{name}", doc, value=c[name])
