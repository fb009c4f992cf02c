"""Malformed and hostile requests: each gets the right 4xx and an OpenAI error body naming the problem;
the server stays healthy, answers 0 5xx, and leaks no page."""

import json
import urllib.request

import pytest

from serve_support import API_KEY, MODEL, pages_all_free, post, wait_for

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
MSGS = [{"role": "user", "content": "hi"}]


def comp(**kw):
    return {"model": MODEL, "prompt": "The game", "max_tokens": 4, **kw}


CASES = [
    # (id, path, body, status, words the message must contain)
    ("bad-json", COMP, b'{"prompt": "The game", "max_tokens": ', 400, "malformed JSON"),
    ("not-utf8", COMP, b'{"prompt": "\xff\xfe\xfa"}', 400, "UTF-8"),
    ("not-an-object", COMP, b'["The game"]', 400, "JSON object"),
    ("nan", COMP, b'{"prompt": "x", "temperature": NaN}', 400, "NaN"),
    ("deep-nesting", COMP, b"[" * 100_000, 400, "malformed JSON"),
    ("temperature-type", COMP, comp(temperature="hot"), 400, "temperature"),
    ("max-tokens-type", COMP, comp(max_tokens="10"), 400, "max_tokens"),
    ("stream-type", COMP, comp(stream="yes"), 400, "stream"),
    ("prompt-type", COMP, comp(prompt={"text": "x"}), 400, "prompt"),
    ("huge-max-tokens", COMP, comp(max_tokens=10**9), 400, "maximum context length"),
    ("max-tokens-zero", COMP, comp(max_tokens=0), 400, "max_tokens"),
    ("max-tokens-negative", COMP, comp(max_tokens=-5), 400, "max_tokens"),
    ("max-tokens-over-kv-budget", COMP, comp(max_tokens=900), 400, "KV cache budget"),
    ("100k-token-prompt", COMP, comp(prompt=" the" * 100_000), 400, "maximum context length"),
    ("prompt-over-kv-budget", COMP, comp(prompt=[5] * 800), 400, "KV cache budget"),
    ("empty-prompt", COMP, comp(prompt=""), 400, "empty"),
    ("token-out-of-vocab", COMP, comp(prompt=[1, 10**6]), 400, "vocabulary"),
    ("batched-prompts", COMP, comp(prompt=["a", "b"]), 400, "one prompt"),
    ("negative-temperature", COMP, comp(temperature=-0.5), 400, "temperature"),
    ("temperature-too-high", COMP, comp(temperature=5), 400, "temperature"),
    ("top-p-zero", COMP, comp(top_p=0), 400, "top_p"),
    ("top-k-negative", COMP, comp(top_k=-2), 400, "top_k"),
    ("seed-overflow", COMP, comp(seed=2**70), 400, "seed"),
    ("n-2", COMP, comp(n=2), 400, "n must be 1"),
    ("empty-stop", COMP, comp(stop=[""]), 400, "stop"),
    ("logprobs", COMP, comp(logprobs=5), 400, "logprobs"),
    ("unknown-field", COMP, comp(frobnicate=True), 400, "unknown parameter 'frobnicate'"),
    ("wrong-model", COMP, comp(model="gpt-4"), 404, "does not exist"),
    ("missing-prompt", COMP, {"model": MODEL}, 400, "prompt"),
    ("missing-messages", CHAT, {"model": MODEL}, 400, "messages"),
    ("empty-messages", CHAT, {"model": MODEL, "messages": []}, 400, "messages"),
    ("bad-role", CHAT, {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, 400, "role"),
    ("chat-unknown-field", CHAT, {"model": MODEL, "messages": MSGS, "tools": []}, 400, "unknown parameter 'tools'"),
    ("chat-image-part", CHAT, {"model": MODEL, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]}, 400, "messages"),
]


@pytest.mark.parametrize("path,body,status,words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_request(server, path, body, status, words):
    code, data = post(server, path, body)
    assert code == status, data
    err = data["error"]
    assert words in err["message"], err
    assert err["type"] == ("not_found_error" if status == 404 else "invalid_request_error")


@pytest.mark.parametrize("key", [None, "wrong", ""])
def test_api_key_required(server, key):
    code, data = post(server, COMP, comp(), key=key)
    assert code == 401 and data["error"]["code"] == "invalid_api_key"
    req = urllib.request.Request(server.url + "/v1/models")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 401


def test_wrong_method_and_path(server):
    for method, path, status in [("GET", COMP, 405), ("POST", "/v1/nothing", 404)]:
        req = urllib.request.Request(server.url + path, method=method, data=b"{}" if method == "POST" else None,
                                     headers={"Authorization": f"Bearer {API_KEY}"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == status and "error" in json.loads(e.value.read())


def test_still_healthy_after_all_of_them(server):
    """Runs after the hostile requests above (file order): the server answers, nothing leaked, no 5xx."""
    with urllib.request.urlopen(server.url + "/health", timeout=10) as r:
        assert r.status == 200
    code, data = post(server, COMP, comp(max_tokens=3))
    assert code == 200 and data["usage"]["completion_tokens"] <= 3
    assert wait_for(lambda: pages_all_free(server), timeout=10)
    metrics = server.metrics(API_KEY)
    assert metrics['qoq_http_responses_total{code="400"}'] >= len([c for c in CASES if c[3] == 400])
    assert not [k for k in metrics if k.startswith('qoq_http_responses_total{code="5')]
