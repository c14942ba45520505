"""Serving: the OpenAI-compatible HTTP server and its Ray Serve replicas.

- ``protocol``: the request format, read and checked field by field; ``responses``: the response
  bodies (pydantic models);
- ``app``: the FastAPI app and its routes (``create_app``), and ``serve``, which runs it on uvicorn
  with a draining shutdown;
- ``jobs``: the bridge from the routes to the continuous-batching scheduler; ``metrics``: the
  Prometheus metrics;
- ``guard`` (the ASGI middleware every request meets first, the OpenAI-shaped ``APIError``) and
  ``http`` (uvicorn's h11 protocol with the server's limits);
- ``replicas`` and ``router``: ``blockbatch serve --replicas N`` on Ray Serve (Ray is imported
  only when that runs).

The names below are imported on first use, so ``blockbatch.serve.guard`` (which the command line
uses to check its flags) loads without FastAPI.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "APIError": "guard",
    "DEFAULT_DRAIN_TIMEOUT_S": "app",
    "DEFAULT_MAX_BATCH": "jobs",
    "DEFAULT_MAX_QUEUE": "jobs",
    "check_preset": "protocol",
    "create_app": "app",
    "default_model_name": "app",
    "serve": "app",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
