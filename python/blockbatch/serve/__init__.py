"""Serving: the OpenAI-compatible HTTP server and its Ray Serve replicas.

- ``protocol``: the request and response format (request fields checked one by one, pydantic
  response models);
- ``app``: the FastAPI app and its routes (``create_app``), and ``serve``, which runs it on uvicorn
  with a draining shutdown;
- ``jobs``: the bridge from the routes to the continuous-batching scheduler; ``metrics``: the
  Prometheus metrics;
- ``replicas`` and ``router``: ``blockbatch serve --replicas N`` on Ray Serve (Ray is imported
  only when that runs).
"""

from ..guard import APIError
from .app import DEFAULT_DRAIN_TIMEOUT_S, create_app, default_model_name, serve
from .jobs import DEFAULT_MAX_BATCH, DEFAULT_MAX_QUEUE
from .protocol import check_preset

__all__ = ["APIError", "DEFAULT_DRAIN_TIMEOUT_S", "DEFAULT_MAX_BATCH", "DEFAULT_MAX_QUEUE", "check_preset",
           "create_app", "default_model_name", "serve"]
