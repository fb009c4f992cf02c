"""16 concurrent streaming clients; clients that hang up mid-stream (streaming or not) abort their request
and free its pages."""

import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from serve_support import API_KEY, MODEL, pages_all_free, wait_for
from qoq.engine import SamplingParams

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")


def test_16_concurrent_streams(server, reference_engine):
    prompts = [f"The game {i}" for i in range(16)]
    before = server.metrics(API_KEY)
    # what each prompt alone gives (the engine is batch invariant: the same tokens in any batch)
    want = reference_engine.generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True))

    def run(prompt):
        with openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120) as c:
            chunks = list(c.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0,
                                               stream=True, extra_body={"ignore_eos": True}))
        return "".join(ch.choices[0].text for ch in chunks if ch.choices), chunks[-1].choices[0].finish_reason

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(run, prompts))
    assert [r[0] for r in results] == [w.text for w in want]
    assert all(r[1] == "length" for r in results)
    assert wait_for(lambda: pages_all_free(server), timeout=10)
    after = server.metrics(API_KEY)
    assert not [k for k in after if k.startswith('qoq_http_responses_total{code="5')]
    assert after['qoq_requests_total{status="length"}'] - before['qoq_requests_total{status="length"}'] == 16
    assert after["qoq_generation_tokens_total"] - before["qoq_generation_tokens_total"] == 16 * 24
    assert after["qoq_time_to_first_token_seconds_count"] - before["qoq_time_to_first_token_seconds_count"] == 16


def _aborts(server) -> float:
    return server.metrics(API_KEY)['qoq_requests_total{status="abort"}']


def _long_request(stream: bool) -> dict:
    # 700 tokens take seconds on the CPU: the client is gone long before the end
    return {"model": MODEL, "prompt": "The game", "max_tokens": 700, "ignore_eos": True, "stream": stream}


def test_disconnect_mid_stream_frees_pages(server):
    aborts = _aborts(server)
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.Client(timeout=30) as c:
        with c.stream("POST", server.url + "/v1/completions", json=_long_request(True), headers=headers) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            got = [next(lines) for _ in range(6)]  # a few events in: the request is running
            assert any(line.startswith("data: {") for line in got)
            used = server.metrics(API_KEY)["qoq_kv_pages_used"]
            assert used > 0
        # leaving the block closes the connection mid-stream
    assert wait_for(lambda: pages_all_free(server), timeout=10), server.metrics(API_KEY)
    assert _aborts(server) == aborts + 1


def test_disconnect_while_waiting_for_a_whole_response(server):
    aborts = _aborts(server)
    import json

    body = json.dumps(_long_request(False)).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  + f"Authorization: Bearer {API_KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        assert wait_for(lambda: server.metrics(API_KEY)["qoq_kv_pages_used"] > 0, timeout=10)
        time.sleep(0.1)
    assert wait_for(lambda: pages_all_free(server), timeout=10), server.metrics(API_KEY)
    assert _aborts(server) == aborts + 1
