"""`qoq serve` as a child process on a free 127.0.0.1 port: what the server tests and the load test
(bench/serve_h200.py) talk to over HTTP.

    server = ServerProcess("out/art", Path("server.log"), ["--backend", "reference"])
    server.wait_healthy(120)
    ...  # server.url
    server.stop()   # SIGTERM: drains, exits 0
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape_metrics(base_url: str, api_key: str | None = None, timeout: float = 10.0) -> dict[str, float]:
    """GET /metrics -> its samples by name (labels kept in the name)."""
    req = urllib.request.Request(base_url + "/metrics")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


class ServerProcess:
    """`python -m qoq.cli serve ARTIFACT --port P ARGS`, stdout and stderr in log_path; the repository first
    on PYTHONPATH (what is there already stays: wheels carried to a machine), no inherited API key."""

    def __init__(self, artifact: str | Path, log_path: Path, args: list[str]):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}
        env.pop("QOQ_API_KEY", None)
        self.log = open(log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "qoq.cli", "serve", str(artifact), "--port",
                                      str(self.port), *args], stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     cwd=REPO)

    def wait_healthy(self, timeout: float) -> None:
        """Until /health answers 200; RuntimeError (with the server's output) if it exits or times out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode} before /health answered:\n"
                                   f"{self.output()[-4000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the server did not answer /health within {timeout:.0f} s:\n{self.output()[-4000:]}")

    def output(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM (the server drains, then exits 0), SIGKILL after `timeout` s; -> the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()
        return self.proc.returncode
