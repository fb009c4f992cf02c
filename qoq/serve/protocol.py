"""The OpenAI request bodies we accept (pydantic, strict: no type coercion, unknown fields refused), the
OpenAI error body, and body parsing that turns every client mistake into an ApiError (a 4xx)."""

from __future__ import annotations

import json
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

MAX_BODY_BYTES = 32 << 20
INT64 = 2**63

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               405: "invalid_request_error", 413: "invalid_request_error", 503: "service_unavailable_error"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        kind = ERROR_TYPES.get(self.status, "internal_server_error" if self.status >= 500 else "invalid_request_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's; accepted, usage comes once at the end


class _Sampling(_Strict):
    """Fields shared by both endpoints. OpenAI's ranges; top_k and ignore_eos are vLLM's extensions."""

    model: Optional[str] = None
    max_tokens: Optional[int] = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1)  # 0 or -1: off
    seed: Optional[int] = Field(None, ge=-INT64, lt=2 * INT64)
    stop: Union[str, list[str], None] = None
    stop_token_ids: Optional[list[int]] = None
    ignore_eos: bool = False
    n: int = 1
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    user: Optional[str] = None
    # OpenAI fields we do not implement: accepted only at their neutral values
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Optional[dict[str, float]] = None

    def unsupported(self) -> list[tuple[str, str]]:
        """(field, why) for requests asking for what the engine cannot do."""
        bad = []
        if self.n != 1:
            bad.append(("n", f"n must be 1 (got {self.n}): one choice per request"))
        if self.presence_penalty or self.frequency_penalty:
            bad.append(("presence_penalty" if self.presence_penalty else "frequency_penalty",
                         "presence and frequency penalties are not supported"))
        if self.logit_bias:
            bad.append(("logit_bias", "logit_bias is not supported"))
        stops = self.stop_list()
        if any(not s for s in stops):
            bad.append(("stop", "stop strings must be non-empty"))
        if len(stops) > 16:
            bad.append(("stop", f"at most 16 stop strings (got {len(stops)})"))
        if self.max_tokens is not None and self.max_tokens < 1:
            bad.append(("max_tokens", f"max_tokens must be at least 1 (got {self.max_tokens})"))
        return bad

    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Sampling):
    prompt: Union[str, list[int], list[str], list[list[int]]]
    echo: bool = False
    logprobs: Optional[int] = None
    best_of: Optional[int] = None
    suffix: Optional[str] = None

    def unsupported(self) -> list[tuple[str, str]]:
        bad = super().unsupported()
        if self.echo:
            bad.append(("echo", "echo is not supported"))
        if self.logprobs:
            bad.append(("logprobs", "logprobs are not supported"))
        if self.best_of not in (None, 1):
            bad.append(("best_of", "best_of must be 1"))
        if self.suffix:
            bad.append(("suffix", "suffix is not supported"))
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], (str, list)):
            if len(self.prompt) != 1:
                bad.append(("prompt", f"one prompt per request (got a batch of {len(self.prompt)})"))
        return bad


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[TextPart], None] = None
    name: Optional[str] = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(p.text for p in self.content)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[int] = None
    logprobs: bool = False
    top_logprobs: Optional[int] = None

    def unsupported(self) -> list[tuple[str, str]]:
        if self.max_tokens is None:
            self.max_tokens = self.max_completion_tokens
        bad = super().unsupported()
        if self.logprobs or self.top_logprobs:
            bad.append(("logprobs", "logprobs are not supported"))
        return bad


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def parse_body(body: bytes, model: type[_Sampling]) -> _Sampling:
    """Bytes of a request body -> a validated request, or ApiError(400) naming the problem."""
    try:
        data = json.loads(body, parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise ApiError(400, "the request body is not valid UTF-8") from None
    except (ValueError, RecursionError) as e:
        raise ApiError(400, f"malformed JSON in the request body: {e}") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"the request body must be a JSON object, not {type(data).__name__}")
    try:
        req = model.model_validate(data)
    except ValidationError as e:
        raise ApiError(400, *validation_message(e)) from None
    bad = req.unsupported()
    if bad:
        raise ApiError(400, bad[0][1], param=bad[0][0])
    return req


def validation_message(e: ValidationError) -> tuple[str, str | None]:
    err = e.errors(include_url=False)[0]
    loc = [str(x) for x in err["loc"] if not (isinstance(x, str) and ("[" in x or x in ("str", "int")))]
    param = ".".join(loc) or None
    if err["type"] == "extra_forbidden":
        return f"unknown parameter '{param}'", param
    if err["type"] == "missing":
        return f"missing required parameter '{param}'", param
    return f"invalid value for '{param}': {err['msg']}", param
