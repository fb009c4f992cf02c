"""A random artifact without a tokenizer (what the load test serves): prompts as token ids (a list, or a
one-element list of lists), one streamed chunk per generated token although no text can be decoded, usage
and finish_reason as with text; a text prompt is a 400 saying to send ids."""

import json

import pytest

from serve_support import Server, pages_all_free, post, wait_for

httpx = pytest.importorskip("httpx")

MODEL = "tokenless"


@pytest.fixture(scope="module")
def tokenless(tmp_path_factory):
    from qoq.export.random_artifact import write_random_artifact

    art = write_random_artifact(tmp_path_factory.mktemp("tokenless") / "w4", "tiny", "w4a8kv4g128", tokenizer=None)
    srv = Server(art, tmp_path_factory.mktemp("tokenless_log") / "server.log", "--served-model-name", MODEL,
                 "--kv-budget", str(16 << 20))
    yield srv
    srv.stop()


def stream(srv, body: dict) -> list[dict]:
    events = []
    with httpx.Client(timeout=60) as c, c.stream("POST", srv.url + "/v1/completions", json=body) as r:
        assert r.status_code == 200, r.read()
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


@pytest.mark.parametrize("prompt", [[5, 17, 300, 49151], [[5, 17, 300, 49151]]])
def test_streamed_token_ids_one_chunk_per_token(tokenless, prompt):
    chunks = stream(tokenless, {"model": MODEL, "prompt": prompt, "max_tokens": 9, "temperature": 0,
                                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
    tokens = [c for c in chunks if c["choices"]]
    assert len(tokens) == 9 and all(c["choices"][0]["text"] == "" for c in tokens)
    assert [c["choices"][0]["finish_reason"] for c in tokens] == [None] * 8 + ["length"]
    assert chunks[-1]["usage"] == {"prompt_tokens": 4, "completion_tokens": 9, "total_tokens": 13}
    assert wait_for(lambda: pages_all_free(tokenless), timeout=10)


def test_whole_token_id_completion_and_text_refused(tokenless):
    code, data = post(tokenless, "/v1/completions", {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 5,
                                                     "ignore_eos": True}, key=None)
    assert code == 200 and data["choices"][0]["text"] == "" and data["choices"][0]["finish_reason"] == "length"
    assert data["usage"]["completion_tokens"] == 5
    code, data = post(tokenless, "/v1/completions", {"model": MODEL, "prompt": "hello", "max_tokens": 5}, key=None)
    assert code == 400 and "send the prompt as token ids" in data["error"]["message"]
    code, data = post(tokenless, "/v1/completions", {"model": MODEL, "prompt": [49152], "max_tokens": 5}, key=None)
    assert code == 400 and "outside the vocabulary" in data["error"]["message"]
