"""Pieces of the server without a server: lazy imports, the missing-extra message, Prometheus text,
chat templates, request parsing."""

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from serve_support import REPO


def test_cli_imports_without_fastapi():
    code = "import sys; sys.modules['fastapi'] = sys.modules['uvicorn'] = None; import qoq.cli; print('ok')"
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def test_serve_without_the_extra_says_what_to_install(monkeypatch, tmp_path):
    from qoq.cli import app

    monkeypatch.setitem(sys.modules, "fastapi", None)
    res = CliRunner().invoke(app, ["serve", str(tmp_path)])
    assert res.exit_code == 1 and "qoq[serve]" in res.stderr


def test_serve_passes_quantization_to_the_engine(tmp_path):
    from qoq.cli import app

    res = CliRunner().invoke(app, ["serve", str(tmp_path), "--backend", "reference", "--quantization", "fp8"])
    assert res.exit_code == 1 and "quantization='fp8' runs on the cuda backend only" in res.stderr
    res = CliRunner().invoke(app, ["serve", str(tmp_path), "--backend", "cuda", "--quantization", "fp4"])
    assert res.exit_code == 1 and "unknown quantization 'fp4'" in res.stderr


def test_prometheus_text():
    from qoq.serve.metrics import Metrics

    m = Metrics("tiny")
    m.admitted(5)
    m.token(ttft=0.03)
    m.token(itl=0.004)
    m.token(itl=2.0)
    m.finished("length", 0.5)
    m.response(200)
    m.set_gauges(running=1, waiting=2, pages_used=3, pages_free=9, pages_total=12)
    lines = m.render().splitlines()
    assert 'qoq_requests_total{status="length"} 1' in lines and 'qoq_requests_total{status="abort"} 0' in lines
    assert 'qoq_http_responses_total{code="200"} 1' in lines
    assert "qoq_prompt_tokens_total 5" in lines and "qoq_generation_tokens_total 3" in lines
    assert "qoq_kv_pages_used 3" in lines and "qoq_kv_pages_free 9" in lines and "qoq_requests_waiting 2" in lines
    assert "# TYPE qoq_inter_token_latency_seconds histogram" in lines
    assert 'qoq_inter_token_latency_seconds_bucket{le="0.005"} 1' in lines  # cumulative
    assert 'qoq_inter_token_latency_seconds_bucket{le="1.0"} 1' in lines
    assert 'qoq_inter_token_latency_seconds_bucket{le="+Inf"} 2' in lines
    assert "qoq_inter_token_latency_seconds_count 2" in lines
    assert 'qoq_time_to_first_token_seconds_bucket{le="0.04"} 1' in lines


def test_chat_without_template_is_a_400(tiny_tokenizer):
    from qoq.serve.protocol import ApiError
    from qoq.serve.serving import chat_prompt_ids

    with pytest.raises(ApiError) as e:
        chat_prompt_ids(tiny_tokenizer, [{"role": "user", "content": "hi"}])
    assert e.value.status == 400 and "chat template" in e.value.message


def test_parse_body_defaults():
    from qoq.serve.protocol import ChatCompletionRequest, CompletionRequest, parse_body

    req = parse_body(b'{"prompt": [1, 2], "stop": "x", "stream": true, "stream_options": {"include_usage": true}}',
                     CompletionRequest)
    assert req.prompt == [1, 2] and req.stop_list() == ["x"] and req.include_usage and req.temperature == 1.0
    chat = parse_body(b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, '
                      b'{"type": "text", "text": "b"}]}], "max_completion_tokens": 7}', ChatCompletionRequest)
    assert chat.messages[0].text() == "ab" and chat.max_tokens == 7


def test_engine_loop_step_failure(chat_artifact):
    """A step that raises fails its requests (500), frees their pages, and marks the engine dead (503)."""
    import asyncio

    from qoq.engine import LLMEngine, SamplingParams
    from qoq.serve.engine_loop import EngineFailure, EngineLoop, RequestHandle
    from qoq.serve.metrics import Metrics

    engine = LLMEngine(chat_artifact, backend="reference")
    metrics = Metrics("tiny")
    loop = EngineLoop(engine, metrics)
    real_step = engine.step

    def failing_step():
        real_step()  # the request holds pages now
        raise RuntimeError("device fault")

    async def run():
        loop.start(asyncio.get_running_loop())
        try:
            first = RequestHandle("a", [5, 6, 7], SamplingParams(max_tokens=2))
            loop.submit(first)
            outs = [await asyncio.wait_for(first.queue.get(), 30) for _ in range(2)]
            engine.step = failing_step
            failed = RequestHandle("b", [5, 6, 7], SamplingParams(max_tokens=2))
            loop.submit(failed)
            err = await asyncio.wait_for(failed.queue.get(), 30)
            late = RequestHandle("c", [5], SamplingParams(max_tokens=2))
            loop.submit(late)
            return outs, err, await asyncio.wait_for(late.queue.get(), 30)
        finally:
            loop.stop()

    outs, err, late = asyncio.run(run())
    assert outs[-1].finished and outs[-1].finish_reason == "length"
    assert isinstance(err, EngineFailure) and err.status == 500 and "device fault" in str(err)
    assert isinstance(late, EngineFailure) and late.status == 503
    assert loop.error is not None and loop.num_active == 0
    assert metrics.requests["error"] == 1 and metrics.requests["length"] == 1
    assert engine.blocks.num_free_pages == engine.blocks.num_pages
