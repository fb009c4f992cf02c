"""The FastAPI app: routes, API-key check, OpenAI-style errors, response-code counting.

    app = build_app(state)   # state: ServerState (serving.py) around a started-on-startup EngineLoop
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from qoq.serve import serving
from qoq.serve.metrics import CONTENT_TYPE
from qoq.serve.protocol import MAX_BODY_BYTES, ApiError, ChatCompletionRequest, CompletionRequest, parse_body
from qoq.serve.serving import ServerState

log = logging.getLogger("qoq.serve")


class _Stream(StreamingResponse):
    """A streamed completion that aborts its request however the response ends (even before the first
    event: a generator never started never runs its finally)."""

    def __init__(self, content, on_close):
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


class CountResponses:
    """Outermost ASGI wrapper: counts every response's status code (500s from Starlette's error page too)."""

    def __init__(self, app, metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def counting_send(message):
            if message["type"] == "http.response.start":
                self.metrics.response(message["status"])
            await send(message)

        await self.app(scope, receive, counting_send)


async def read_body(request: Request) -> bytes:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise ApiError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                raise ApiError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes")
    except ClientDisconnect:
        raise ApiError(499, "the client disconnected while sending the body") from None
    return bytes(body)


def error_response(request: Request, err: ApiError) -> JSONResponse:
    log.info("request %s %s: %d %s", request.method, request.url.path, err.status, err.message)
    return JSONResponse(err.body(), status_code=err.status)


def build_app(state: ServerState, metrics) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app):
        state.engine_loop.start(asyncio.get_running_loop())
        yield
        state.engine_loop.stop()

    app = FastAPI(title="qoq", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    def check_key(request: Request) -> None:
        if state.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), state.api_key.encode()):
            raise ApiError(401, "missing or incorrect API key (send 'Authorization: Bearer KEY')",
                           code="invalid_api_key")

    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError):
        return error_response(request, err)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException):
        return error_response(request, ApiError(err.status_code, str(err.detail)))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, err: RequestValidationError):
        return error_response(request, ApiError(400, str(err)))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, err: Exception):
        log.exception("request %s %s failed", request.method, request.url.path)
        return JSONResponse(ApiError(500, f"internal error: {type(err).__name__}").body(), status_code=500)

    @app.get("/health")
    async def health():
        loop = state.engine_loop
        if loop.error is not None:
            raise ApiError(503, f"the engine failed: {loop.error}")
        if state.draining or not loop.accepting:
            raise ApiError(503, "the server is shutting down")
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models(request: Request):
        check_key(request)
        card = {"id": state.model_name, "object": "model", "created": int(time.time()), "owned_by": "qoq",
                "root": str(state.engine.artifact_dir), "max_model_len": state.engine.max_model_len}
        return {"object": "list", "data": [card]}

    @app.get("/metrics")
    async def metrics_text(request: Request):
        check_key(request)
        return PlainTextResponse(metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def generate(request: Request, kind):
        check_key(request)
        req = parse_body(await read_body(request), kind)
        handle, shape = await serving.start(state, req, request)

        def on_close():
            if not handle.done:
                state.engine_loop.abort(handle)

        if req.stream:
            return _Stream(serving.stream_response(state, handle, shape, req.include_usage), on_close)
        try:
            return await serving.whole_response(state, handle, shape, request)
        finally:
            on_close()

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, CompletionRequest)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(request, ChatCompletionRequest)

    return app
