"""SIGTERM drains: new requests get 503 while running ones finish (or, past --drain-timeout, end with
finish_reason "abort"); then the process exits 0."""

import json
import signal
import urllib.error
import urllib.request

import pytest

from serve_support import Server, post, wait_for

httpx = pytest.importorskip("httpx")


def _health(server) -> int:
    try:
        with urllib.request.urlopen(server.url + "/health", timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _sigterm_mid_stream(server, max_tokens: int, check_503: bool):
    """Stream a long completion, SIGTERM the server after a few events (and check that a new request gets a
    503 meanwhile); returns the stream's events."""
    body = {"prompt": "The game", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    events = []
    with httpx.Client(timeout=60) as c, c.stream("POST", server.url + "/v1/completions", json=body) as r:
        lines = r.iter_lines()
        while len(events) < 3:
            line = next(lines)
            if line.startswith("data: "):
                events.append(line[6:])
        server.proc.send_signal(signal.SIGTERM)
        if check_503:
            assert wait_for(lambda: _health(server) == 503, timeout=10)
            code, data = post(server, "/v1/completions", {"prompt": "x", "max_tokens": 2}, key=None)
            assert code == 503 and "shutting down" in data["error"]["message"]
        events += [line[6:] for line in lines if line.startswith("data: ")]
    return events


def _finish(events):
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    return chunks[-1]["choices"][0]["finish_reason"]


def test_sigterm_lets_running_requests_finish(chat_artifact, tmp_path):
    server = Server(chat_artifact, tmp_path / "server.log", "--drain-timeout", "60")
    try:
        events = _sigterm_mid_stream(server, 300, check_503=True)
        assert _finish(events) == "length"
        assert server.proc.wait(timeout=30) == 0
        assert "status=length" in server.output() and "completion_tokens=300" in server.output()
    finally:
        server.stop()


def test_sigterm_aborts_what_outlives_the_drain_timeout(chat_artifact, tmp_path):
    server = Server(chat_artifact, tmp_path / "server.log", "--drain-timeout", "0.3")
    try:
        # (the 503 window is only the 0.3 s wait here: not checked)
        events = _sigterm_mid_stream(server, 1000, check_503=False)
        assert _finish(events) == "abort"
        assert server.proc.wait(timeout=30) == 0
        assert "drain timeout: aborting 1 request(s)" in server.output()
    finally:
        server.stop()
