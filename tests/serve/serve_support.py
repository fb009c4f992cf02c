"""Helpers for the server tests (a module of its own: `conftest` names clash across test folders)."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
PAGE_BYTES = 10240  # one tiny-model KV page: 2 layers x K,V x 2 heads x 64 tokens x (32/2 + 4) bytes
KV_PAGES = 13  # 12 usable (one is the scratch page): 768 tokens, under the 1024-token context
API_KEY = "sekret"
MODEL = "tiny"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, artifact: Path, log_path: Path, *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
        env.pop("QOQ_API_KEY", None)
        self.log = open(log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "qoq.cli", "serve", str(artifact), "--port",
                                      str(self.port), "--backend", "reference", *args],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        self._wait_healthy(timeout=120)

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}:\n{self.output()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server not healthy after {timeout} s:\n{self.output()}")

    def output(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")

    def metrics(self, api_key: str | None = None) -> dict[str, float]:
        """The unlabelled samples and counters of /metrics by name (labels kept in the name)."""
        req = urllib.request.Request(self.url + "/metrics")
        if api_key:
            req.add_header("Authorization", f"Bearer {api_key}")
        with urllib.request.urlopen(req, timeout=10) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()
        return self.proc.returncode


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
