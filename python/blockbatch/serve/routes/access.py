"""What the routes share: the served app's state (``Served``), the API key check, the body's
``model`` check and the JSON error response."""

from __future__ import annotations

import dataclasses
import hmac

from fastapi import Request
from fastapi.responses import JSONResponse

from ..guard import APIError
from ..jobs import ServerState
from ..protocol import bad, parse_json_body


@dataclasses.dataclass(frozen=True)
class Served:
    """One app's state: the scheduler's bridge and settings (``state``) and the decode options a
    request on this model's family gets where it sets none (``families.default_options``: LLaDA2's
    policy 'block')."""

    state: ServerState
    family_defaults: dict


def served(request: Request) -> Served:
    return request.app.state.served


def error_response(e: APIError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


def authorize(request: Request, state: ServerState) -> None:
    key = state.settings.api_key
    if key is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        token.strip().encode("latin-1", "replace"), key.encode("latin-1")
    ):
        raise APIError(
            401,
            ("wrong API key" if header else "missing API key") + ": send Authorization: Bearer "
            "<key> with the server's key (blockbatch serve --api-key)",
            code="invalid_api_key",
        )


async def read_body(request: Request, state: ServerState) -> dict:
    body = parse_json_body(await request.body())  # guard.Guard has read it, within its limits
    model = body.get("model")
    if not isinstance(model, str):
        raise bad("model", f"required: a string (this server serves {state.settings.served_model_name!r})")
    if model != state.settings.served_model_name:
        raise APIError(
            404,
            f"the model {str(model)[:100]!r} does not exist; this server serves {state.settings.served_model_name!r}",
            param="model",
            code="model_not_found",
        )
    return body
