"""``GET /v1/models`` (the one served model), ``GET /health`` (503 while draining) and
``GET /metrics`` (Prometheus text format)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from ..responses import ModelCard, ModelList
from .access import authorize, served

router = APIRouter()


@router.get("/v1/models")
async def models(request: Request):
    state = served(request).state
    authorize(request, state)
    card = ModelCard(
        id=state.settings.served_model_name,
        object="model",
        created=state.created,
        owned_by="blockbatch",
        max_model_len=state.settings.max_length,
    )
    return ModelList(object="list", data=[card]).model_dump()


@router.get("/health")
async def health(request: Request):
    state = served(request).state
    if state.draining:
        return JSONResponse({"status": "draining", "requests": len(state.jobs)}, status_code=503)
    return {"status": "ok", "requests": len(state.jobs)}


@router.get("/metrics")
async def prometheus(request: Request):
    return Response(served(request).state.metrics.text(), media_type=CONTENT_TYPE_LATEST)
