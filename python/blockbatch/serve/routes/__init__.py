"""The server's routes, one module per job, each an ``APIRouter`` that ``serve.app.create_app``
includes: ``generation`` (``POST /v1/completions``, ``POST /v1/chat/completions``: admission,
waiting and streaming), ``status`` (``GET /v1/models``, ``GET /health``, ``GET /metrics``), and
``errors`` (the exception handlers: every error as an OpenAI-style JSON body). ``access`` holds
what the routes share: the app's ``Served`` (its ``ServerState`` and the family's default
options), the API key check and the body's ``model`` check. A route reads the app it serves from
``request.app.state.served``: nothing is captured at build time."""

from __future__ import annotations

from . import access, errors, generation, status

ROUTERS = (generation.router, status.router)
ROUTES_TEXT = "POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health, GET /metrics"

__all__ = ["ROUTERS", "ROUTES_TEXT", "access", "errors"]
