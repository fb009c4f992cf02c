"""Helpers for the server tests (a module of its own: `conftest` names clash across test folders)."""

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

from qoq.serve.process import REPO, ServerProcess, scrape_metrics  # noqa: F401 (REPO: for the tests)

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
PAGE_BYTES = 10240  # one tiny-model KV page: 2 layers x K,V x 2 heads x 64 tokens x (32/2 + 4) bytes
KV_PAGES = 13  # 12 usable (one is the scratch page): 768 tokens, under the 1024-token context
API_KEY = "sekret"
MODEL = "tiny"


class Server(ServerProcess):
    """The server on the reference backend, healthy on return."""

    def __init__(self, artifact: Path, log_path: Path, *args: str):
        super().__init__(artifact, log_path, ["--backend", "reference", *args])
        self.wait_healthy(timeout=120)

    def metrics(self, api_key: str | None = None) -> dict[str, float]:
        return scrape_metrics(self.url, api_key)


def wait_for(predicate, timeout: float = 20.0, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()


def pages_all_free(srv: Server) -> bool:
    m = srv.metrics(API_KEY)
    return (m["qoq_kv_pages_used"] == 0 and m["qoq_kv_pages_free"] == m["qoq_kv_pages_total"]
            and m["qoq_requests_running"] == 0 and m["qoq_requests_waiting"] == 0)


def post(srv: Server, path: str, body, key: str | None = API_KEY, timeout: float = 60.0):
    """(status, parsed JSON) for a POST of a dict (sent as JSON) or of raw bytes."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(srv.url + path, data=data, method="POST",
                                 headers={"Content-Type": "application/json"})
    if key is not None:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
