"""Completions and chat completions: prompt ids (tokenizer, chat template), limits, SamplingParams, and the
response, whole or streamed as server-sent events."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from dataclasses import dataclass

from qoq.engine.block_manager import pages_for
from qoq.engine.params import SamplingParams
from qoq.engine.sequence import RequestOutput
from qoq.serve.engine_loop import EngineFailure, EngineLoop, RequestHandle
from qoq.serve.protocol import ApiError, ChatCompletionRequest, CompletionRequest

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat fills the context


@dataclass
class ServerState:
    engine_loop: EngineLoop
    model_name: str
    api_key: str | None = None
    draining: bool = False

    @property
    def engine(self):
        return self.engine_loop.engine


# -- prompts and limits ---------------------------------------------------------------------------
def chat_prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ApiError(400, "this model's tokenizer has no chat template: use /v1/completions")
    try:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    except Exception as e:  # noqa: BLE001 - the template rejected these messages (jinja raise_exception)
        raise ApiError(400, f"the chat template cannot render these messages: {e}", param="messages") from None
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


_TOKENIZER_LOCK = threading.Lock()  # HF fast tokenizers are not safe to call from several threads at once


def prompt_ids(state: ServerState, req) -> list[int]:
    """Runs in a worker thread (tokenizing a long prompt must not stall the event loop)."""
    with _TOKENIZER_LOCK:
        return _prompt_ids(state, req)


def _prompt_ids(state: ServerState, req) -> list[int]:
    engine = state.engine
    if isinstance(req, ChatCompletionRequest):
        return chat_prompt_ids(engine.tokenizer, [{"role": m.role, "content": m.text()} for m in req.messages])
    prompt = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if engine.tokenizer is None:
            raise ApiError(400, "this model has no tokenizer: send the prompt as token ids", param="prompt")
        try:
            return list(engine.encode(prompt))
        except Exception as e:  # noqa: BLE001 - e.g. lone surrogates the tokenizer cannot encode
            raise ApiError(400, f"the prompt cannot be tokenized: {e}", param="prompt") from None
    vocab = engine.runner.vocab_size
    bad = next((t for t in prompt if not 0 <= t < vocab), None)
    if bad is not None:
        raise ApiError(400, f"prompt token id {bad} is outside the vocabulary [0, {vocab})", param="prompt")
    return list(prompt)


def sampling_params(state: ServerState, req, num_prompt: int) -> SamplingParams:
    engine = state.engine
    max_len, kv_tokens = engine.max_model_len, engine.blocks.num_pages * 64
    if num_prompt == 0:
        raise ApiError(400, "the prompt is empty", param="prompt")
    if num_prompt >= max_len:
        raise ApiError(400, f"this model's maximum context length is {max_len} tokens, but the prompt has "
                            f"{num_prompt} tokens: shorten it", param="prompt", code="context_length_exceeded")
    if pages_for(num_prompt + 1) > engine.blocks.num_pages:
        raise ApiError(400, f"the prompt has {num_prompt} tokens; the server's KV cache budget can never hold "
                            f"more than {kv_tokens} tokens of one request", param="prompt",
                       code="context_length_exceeded")
    room = min(max_len, kv_tokens) - num_prompt
    max_tokens = req.max_tokens
    if max_tokens is None:
        max_tokens = min(room, DEFAULT_COMPLETION_MAX_TOKENS) if isinstance(req, CompletionRequest) else room
    elif num_prompt + max_tokens > max_len:
        raise ApiError(400, f"this model's maximum context length is {max_len} tokens, but {num_prompt + max_tokens}"
                            f" were requested ({num_prompt} in the prompt, {max_tokens} in the completion): "
                            "reduce the prompt or max_tokens", param="max_tokens", code="context_length_exceeded")
    elif pages_for(num_prompt + max_tokens) > engine.blocks.num_pages:
        raise ApiError(400, f"{num_prompt + max_tokens} tokens were requested ({num_prompt} in the prompt, "
                            f"{max_tokens} in the completion); the server's KV cache budget holds at most "
                            f"{kv_tokens} tokens of one request: reduce max_tokens", param="max_tokens")
    vocab = engine.runner.vocab_size
    stop_ids = list(req.stop_token_ids or [])
    if any(not 0 <= t < vocab for t in stop_ids):
        raise ApiError(400, f"stop_token_ids must be in [0, {vocab})", param="stop_token_ids")
    return SamplingParams(max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p,
                          top_k=max(req.top_k, 0), seed=req.seed, stop_token_ids=stop_ids, stop=req.stop_list(),
                          ignore_eos=req.ignore_eos)


# -- responses ------------------------------------------------------------------------------------
class _Shape:
    """What differs between the two endpoints' bodies."""

    def __init__(self, chat: bool, request_id: str, model: str):
        self.chat, self.id, self.model, self.created = chat, request_id, model, int(time.time())

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def whole(self, text: str, reason: str, usage: dict) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
        return {**self._head("chat.completion" if self.chat else "text_completion"), "choices": [choice],
                "usage": usage}

    def chunk(self, text: str | None, reason: str | None, role: bool = False) -> dict:
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
        return {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [choice]}

    def usage_chunk(self, usage: dict) -> dict:
        return {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [],
                "usage": usage}


def _usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


async def start(state: ServerState, req, request) -> tuple[RequestHandle, _Shape]:
    """Validate, tokenize and submit a request; ApiError for anything the client got wrong."""
    if state.draining or not state.engine_loop.accepting:
        raise ApiError(503, "the server is shutting down")
    if state.engine_loop.error is not None:
        raise ApiError(503, f"the engine failed: {state.engine_loop.error}")
    if req.model is not None and req.model != state.model_name:
        raise ApiError(404, f"the model '{req.model}' does not exist (this server serves '{state.model_name}')",
                       param="model", code="model_not_found")
    chat = isinstance(req, ChatCompletionRequest)
    ids = await asyncio.to_thread(prompt_ids, state, req)
    params = sampling_params(state, req, len(ids))
    if state.draining:
        raise ApiError(503, "the server is shutting down")
    request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
    handle = RequestHandle(request_id, ids, params)
    state.engine_loop.submit(handle)
    return handle, _Shape(chat, request_id, state.model_name)


async def _next(handle: RequestHandle, request, clock: list[float]) -> RequestOutput | EngineFailure | None:
    """The next output; None when the client went away (a non-streaming client that hung up). The
    connection is checked every half second whether or not outputs keep coming (clock[0]: last check)."""
    getter = asyncio.ensure_future(handle.queue.get())
    try:
        while True:
            done, _ = await asyncio.wait({getter}, timeout=max(0.0, clock[0] + 0.5 - time.monotonic()))
            if time.monotonic() >= clock[0] + 0.5 or not done:
                clock[0] = time.monotonic()
                if await request.is_disconnected():
                    return None
            if done:
                return getter.result()
    finally:
        getter.cancel()


async def whole_response(state: ServerState, handle: RequestHandle, shape: _Shape, request) -> dict:
    text, n, clock = [], 0, [time.monotonic()]
    try:
        while True:
            out = await _next(handle, request, clock)
            if out is None:
                raise ApiError(499, "client disconnected")
            if isinstance(out, EngineFailure):
                raise ApiError(out.status, str(out))
            text.append(out.text_delta)
            n += len(out.new_token_ids)
            if out.finished:
                handle.done = True
                return shape.whole("".join(text), out.finish_reason, _usage(len(handle.prompt_ids), n))
    finally:
        if not handle.done:
            state.engine_loop.abort(handle)


async def stream_response(state: ServerState, handle: RequestHandle, shape: _Shape, include_usage: bool):
    """SSE events; Starlette cancels this generator when the client disconnects: the finally aborts."""
    n = 0
    try:
        if shape.chat:
            yield _sse(shape.chunk(None, None, role=True))
        while True:
            out = await handle.queue.get()
            if isinstance(out, EngineFailure):
                handle.done = True
                yield _sse(ApiError(out.status, str(out)).body())
                break
            n += len(out.new_token_ids)
            # a chunk per token, even one whose text is held back (an incomplete UTF-8 sequence, a special
            # token, no tokenizer), as vLLM does: clients time tokens by chunks
            if out.new_token_ids or out.text_delta or out.finished:
                yield _sse(shape.chunk(out.text_delta, out.finish_reason if out.finished else None))
            if out.finished:
                handle.done = True
                break
        if include_usage:
            yield _sse(shape.usage_chunk(_usage(len(handle.prompt_ids), n)))
        yield _sse("[DONE]")
    finally:
        if not handle.done:
            state.engine_loop.abort(handle)
