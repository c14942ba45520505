"""The exception handlers: every error leaves as an OpenAI-style JSON body (``guard.APIError``)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..guard import APIError
from .access import error_response


def install(app: FastAPI, metrics, routes_text: str) -> None:
    """Answer ``APIError`` (counting a ``/v1`` POST's status in ``metrics``), a route or method that
    does not exist (naming ``routes_text``) and a request the framework cannot validate."""

    @app.exception_handler(APIError)
    async def on_api_error(request: Request, e: APIError):
        if request.url.path.startswith("/v1/") and request.method == "POST":
            metrics.requests.labels(str(e.status)).inc()
        return error_response(e)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, e: StarletteHTTPException):
        text = {
            404: f"no route {request.method} {request.url.path} (routes: {routes_text})",
            405: f"method {request.method} not allowed on {request.url.path}",
        }.get(e.status_code, str(e.detail))
        return JSONResponse(APIError(e.status_code, text).body(), status_code=e.status_code)

    # Exceptions the routes let through are answered by guard.Guard (a 500 with an error id, logged
    # once): a handler for Exception here would run in Starlette's outermost middleware, which
    # re-raises it for uvicorn to log a second traceback.

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, e: RequestValidationError):
        return error_response(APIError(400, str(e)))
