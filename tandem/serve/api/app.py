"""The FastAPI app: OpenAI's completion routes, SSE streaming, health, metrics, errors.

Words used here:
- *limits*: `ApiLimits`: the model names clients may use, the context size (prompt +
  completion tokens), the largest and the default `max_tokens`.
- *question*: the user's own text (a completion's prompt; a chat's last user message),
  which dragon and rapid put into their own prompts.

Every error a client can cause is a 4xx with OpenAI's error body naming the problem; a
generation that fails is a 500 with a one-line message (the traceback goes to the log only).

*API key*: when the app has one, the `/v1/...` routes need `Authorization: Bearer KEY`
(compared in constant time); without it or with another key they answer 401
`invalid_api_key`. `/health` and `/metrics` stay open (probes and scrapers; they reveal no
text).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import time
from dataclasses import dataclass

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tandem.serve.api.backends import GenParams
from tandem.serve.api.engine import Engine, Job, tandem_info
from tandem.serve.api.schemas import (
    ApiError,
    ChatRequest,
    CompletionRequest,
    chunk,
    completion_id,
    full_response,
    parse_body,
    sse,
    usage,
)
from tandem.serve.metrics import CONTENT_TYPE

log = logging.getLogger("tandem.serve.api")
MAX_BODY_BYTES = 8 << 20
_DONE = object()


@dataclass(frozen=True, kw_only=True)
class ApiLimits:
    model_names: tuple[str, ...]  # the first is the one /v1/models lists
    max_context: int = 4096
    max_tokens: int = 1024
    default_max_tokens: int = 256


def render_chat(tokenizer, messages) -> list[int]:
    """Chat messages -> prompt ids with the tokenizer's chat template."""
    turns = [(m.role, m.text()) for m in messages]
    hf = getattr(tokenizer, "hf", None)
    if hf is not None and len(turns) > 2:
        text = hf.apply_chat_template(
            [{"role": r, "content": c} for r, c in turns], tokenize=False,
            add_generation_prompt=True,
        )  # fmt: skip
        return tokenizer.encode(text)
    system = "\n".join(c for r, c in turns if r in ("system", "developer")) or None
    rest = [(r, c) for r, c in turns if r not in ("system", "developer")]
    if len(rest) == 1:
        return tokenizer.chat_prompt(rest[0][1], system=system)
    history = "\n".join(f"{r}: {c}" for r, c in rest[:-1])  # no template for turns: inline
    return tokenizer.chat_prompt(f"{history}\n{rest[-1][1]}", system=system)


def prompt_of(kind: str, request, tokenizer, vocab_size: int) -> tuple[list[int], str]:
    """(prompt ids, question text) of a request, or a 400."""
    if kind == "chat":
        if not request.messages:
            raise ApiError(400, "`messages` is empty", param="messages")
        users = [m.text() for m in request.messages if m.role == "user"]
        if not any(text.strip() for text in users):
            raise ApiError(400, "`messages` holds no user message with text", param="messages")
        return render_chat(tokenizer, request.messages), users[-1]
    prompt = request.prompt
    if isinstance(prompt, list) and prompt and all(isinstance(x, int) for x in prompt):
        if any(not 0 <= x < vocab_size for x in prompt):
            raise ApiError(
                400, f"`prompt`: token ids must be in 0..{vocab_size - 1}", param="prompt"
            )
        return list(prompt), tokenizer.decode(list(prompt))
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise ApiError(400, "`prompt`: exactly one prompt per request", param="prompt")
        prompt = prompt[0]
    if not prompt:
        raise ApiError(400, "`prompt` is empty", param="prompt")
    return tokenizer.encode(prompt), prompt


def job_of(kind: str, request, engine: Engine, limits: ApiLimits) -> Job:
    """Check a parsed request against the limits; build its job."""
    if request.model not in limits.model_names:
        raise ApiError(
            404, f"model `{request.model}` does not exist; this server serves "
            f"`{limits.model_names[0]}`", param="model", code="model_not_found",
        )  # fmt: skip
    if request.n != 1:
        raise ApiError(400, f"`n` must be 1 (got {request.n})", param="n")
    if engine.backend.needs_context and not request.tandem_context:
        raise ApiError(
            400, f"{engine.mode} mode needs `tandem_context`: the device's local text for this "
            "request", param="tandem_context",
        )  # fmt: skip
    lm = engine.backend.lm
    ids, question = prompt_of(kind, request, lm.tokenizer, lm.vocab_size)
    if len(ids) >= limits.max_context:
        raise ApiError(
            400, f"the prompt is {len(ids)} tokens; the maximum context is {limits.max_context}",
            param="prompt" if kind == "completion" else "messages", code="context_length_exceeded",
        )  # fmt: skip
    asked = request.max_tokens if request.max_tokens is not None else request.max_completion_tokens
    room = limits.max_context - len(ids)
    if asked is None:
        asked = min(limits.default_max_tokens, room)
    elif asked <= 0:
        raise ApiError(400, f"`max_tokens` must be >= 1 (got {asked})", param="max_tokens")
    elif asked > limits.max_tokens:
        raise ApiError(
            400, f"`max_tokens` is {asked}; this server allows at most {limits.max_tokens}",
            param="max_tokens",
        )  # fmt: skip
    elif asked > room:
        raise ApiError(
            400, f"{len(ids)} prompt tokens + {asked} max_tokens exceed the maximum context of "
            f"{limits.max_context}", param="max_tokens", code="context_length_exceeded",
        )  # fmt: skip
    params = GenParams(
        max_tokens=asked,
        temperature=request.temperature,
        top_p=request.top_p,
        seed=request.seed if request.seed is not None else secrets.randbits(31),
        question=question,
        context=request.tandem_context,
    )
    return Job(prompt_ids=ids, params=params, stops=request.stops())


def check_api_key(authorization: str | None, api_key: str) -> None:
    """A 401 unless the `Authorization` header is `Bearer <api_key>` (constant-time compare)."""
    scheme, _, given = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        raise ApiError(
            401, "missing API key: send the header `Authorization: Bearer KEY`",
            code="invalid_api_key",
        )  # fmt: skip
    if not hmac.compare_digest(given.strip().encode(), api_key.encode()):
        raise ApiError(401, "invalid API key", code="invalid_api_key")


def create_app(
    engine: Engine, limits: ApiLimits, *, cloud: str | None = None, api_key: str | None = None
) -> FastAPI:
    """The app; with `api_key`, the `/v1/...` routes need `Authorization: Bearer <api_key>`."""
    app = FastAPI(title="tandem device", docs_url=None, redoc_url=None)
    app.state.engine, app.state.limits = engine, limits
    served = limits.model_names[0]

    async def authorized(request: Request) -> None:
        if api_key:
            check_api_key(request.headers.get("authorization"), api_key)

    keyed = [Depends(authorized)]

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        engine.refuse(
            endpoint=request.url.path, status=exc.status, reason=exc.code or "invalid_request",
            message=exc.message,
        )  # fmt: skip
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        error = ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}")
        return await api_error(request, error)

    async def read(request: Request, model) -> object:
        raw = await request.body()
        if len(raw) > MAX_BODY_BYTES:
            raise ApiError(413, f"the body is over {MAX_BODY_BYTES} bytes")
        return parse_body(raw, model)

    async def complete(kind: str, request: Request):
        body = await read(request, ChatRequest if kind == "chat" else CompletionRequest)
        job = job_of(kind, body, engine, limits)
        if body.stream:
            return StreamingResponse(stream(kind, job, request.url.path),
                                     media_type="text/event-stream")  # fmt: skip
        future = engine.submit(job)
        try:
            outcome = await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            job.cancelled.set()
            raise
        except Exception as exc:  # the backend failed: one line to the client, trace to the log
            log.exception("request %s failed", job.id)
            engine.fail(endpoint=request.url.path, job=job, message=str(exc))
            error = ApiError(500, f"generation failed: {' '.join(str(exc).split())}")
            return JSONResponse(error.body(), status_code=500)
        engine.account(job, outcome, endpoint=request.url.path)
        return full_response(
            kind, id=completion_id(kind), model=served, text=outcome.text,
            finish=outcome.finish_reason,
            usage=usage(len(job.prompt_ids), outcome.completion_tokens),
            tandem=tandem_info(engine.mode, outcome),
        )  # fmt: skip

    async def stream(kind: str, job: Job, endpoint: str):
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def put(item) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the server's loop is gone
                job.cancelled.set()

        job.sink = put
        id = completion_id(kind)
        finished = False
        try:
            future = engine.submit(job)
            future.add_done_callback(lambda _: put(_DONE))
            yield sse(chunk(kind, id=id, model=served, text="", role=True))
            while (item := await queue.get()) is not _DONE:
                yield sse(chunk(kind, id=id, model=served, text=item))
            try:
                outcome = future.result()
            except Exception as exc:
                log.exception("request %s failed", job.id)
                engine.fail(endpoint=endpoint, job=job, message=str(exc))
                message = f"generation failed: {' '.join(str(exc).split())}"
                yield sse(ApiError(500, message).body())
                yield sse("[DONE]")
                finished = True
                return
            engine.account(job, outcome, endpoint=endpoint)
            finished = True
            yield sse(
                chunk(
                    kind, id=id, model=served, finish=outcome.finish_reason,
                    usage=usage(len(job.prompt_ids), outcome.completion_tokens),
                    tandem=tandem_info(engine.mode, outcome),
                )
            )  # fmt: skip
            yield sse("[DONE]")
        finally:
            job.cancelled.set()  # the client left mid-stream: stop at the next token
            if not finished:
                engine.log(id=job.id, endpoint=endpoint, mode=engine.mode, status=499,
                           error="the client closed the stream")  # fmt: skip

    @app.post("/v1/completions", dependencies=keyed)
    async def completions(request: Request):
        return await complete("completion", request)

    @app.post("/v1/chat/completions", dependencies=keyed)
    async def chat_completions(request: Request):
        return await complete("chat", request)

    @app.get("/v1/models", dependencies=keyed)
    async def models():
        return {
            "object": "list",
            "data": [{"id": served, "object": "model", "created": int(time.time()),
                      "owned_by": "tandem"}],
        }  # fmt: skip

    @app.get("/health")
    async def health():
        reachable = await engine.backend.cloud_reachable()
        if reachable is not None:
            engine.metrics.set("cloud_reachable", 1.0 if reachable else 0.0)
        return {
            "status": "ok",
            "mode": engine.mode,
            "model": served,
            "cloud": None if reachable is None else {"address": cloud, "reachable": reachable},
            "queue_depth": int(engine.metrics.value("queue_depth")),
        }

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(engine.metrics.render(), media_type=CONTENT_TYPE)

    return app
