"""Request bodies (validated, with errors that name the field) and OpenAI-shaped replies.

Words used here:
- *API error*: `ApiError(status, message, param=..., code=...)`; rendered as OpenAI's body
  `{"error": {"message", "type", "param", "code"}}`. 4xx are `invalid_request_error`.
- *chunk*: one server-sent event of a stream (`chat.completion.chunk` / `text_completion`).
- Unknown fields are accepted and ignored (clients send many); `tandem_context` is ours
  (rapid mode: the device's local text).
"""

from __future__ import annotations

import json
import time

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code=None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {
            "error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}
        }


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    n: int = 1
    stream: bool = False
    stop: str | list[str] | None = None
    seed: int | None = None
    user: str | None = None
    tandem_context: str | None = None

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(_Request):
    prompt: str | list[str] | list[int]
    echo: bool = False


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: str
    content: str | list[dict] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(str(part.get("text", "")) for part in self.content)
        return self.content or ""


class ChatRequest(_Request):
    messages: list[ChatMessage]


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def _field_path(loc: tuple) -> str:
    """`messages.0.role` from a pydantic location, without union member tags (`list[int]`)."""
    parts = [str(p) for p in loc]
    kept = [
        p for p in parts if "[" not in p and p not in _TYPE_TAGS and not p.startswith("function")
    ]
    return ".".join(kept)


def _describe(exc: ValidationError) -> tuple[str, str]:
    errors = exc.errors()
    error = errors[0]
    loc = _field_path(error["loc"])
    if error["type"] == "missing":
        return loc, f"`{loc}` is required"
    if sum(_field_path(e["loc"]) == loc for e in errors) > 1:  # no member of a union fits
        return loc, f"`{loc}`: wrong type ({type(error['input']).__name__})"
    msg = error["msg"]
    msg = msg[0].lower() + msg[1:] if msg else error["type"]
    return loc, f"`{loc}`: {msg.replace('input should be', 'must be')}"


def parse_body(raw: bytes, model: type[BaseModel]) -> BaseModel:
    """JSON bytes -> a request model, or a 400 ApiError naming the problem."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"malformed JSON body: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        param, message = _describe(exc)
        raise ApiError(400, message, param=param or None) from None


def completion_id(kind: str) -> str:
    return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{time.time_ns():x}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def full_response(kind: str, *, id: str, model: str, text: str, finish: str, usage: dict,
                  tandem: dict) -> dict:  # fmt: skip
    """A non-streamed `chat.completion` or `text_completion`."""
    if kind == "chat":
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": finish,
            "logprobs": None,
        }
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
        obj = "text_completion"
    return {
        "id": id,
        "object": obj,
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage,
        "tandem": tandem,
    }


def chunk(kind: str, *, id: str, model: str, text: str | None = None, role: bool = False,
          finish: str | None = None, usage: dict | None = None,
          tandem: dict | None = None) -> dict:  # fmt: skip
    """One streamed chunk; the last one carries finish_reason, usage and `tandem`."""
    if kind == "chat":
        delta: dict = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
        obj = "text_completion"
    body = {"id": id, "object": obj, "created": int(time.time()), "model": model,
            "choices": [choice]}  # fmt: skip
    if usage is not None:
        body["usage"] = usage
    if tandem is not None:
        body["tandem"] = tandem
    return body


def sse(data: dict | str) -> bytes:
    """One server-sent event (`data: ...` and a blank line)."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()
