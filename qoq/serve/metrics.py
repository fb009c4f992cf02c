"""Prometheus text exposition (format 0.0.4), written by hand: counters, gauges, histograms.

The engine thread records (request finished, tokens, TTFT, inter-token latency, KV pages); the HTTP side
records response codes and renders. One lock guards everything.
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
               5.0, 10.0)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _num(v: float) -> str:
    if v == float("inf"):
        return "+Inf"
    return repr(float(v)) if isinstance(v, float) else str(v)


class Histogram:
    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...]):
        self.name, self.help, self.buckets = name, help_text, buckets
        self.counts = [0] * (len(buckets) + 1)  # the last: above every bound
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        total = 0
        for bound, n in zip(self.buckets + (float("inf"),), self.counts):
            total += n
            lines.append(f'{self.name}_bucket{{le="{_num(bound)}"}} {total}')
        lines += [f"{self.name}_sum {_num(self.sum)}", f"{self.name}_count {self.count}"]
        return lines


class Metrics:
    def __init__(self, model_name: str):
        self.model_name = model_name
        self.lock = threading.Lock()
        self.requests = Counter()  # finish status of admitted requests: stop, length, abort, error
        self.responses = Counter()  # HTTP status codes
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.ttft = Histogram("qoq_time_to_first_token_seconds", "Time from arrival to the first token.",
                              TTFT_BUCKETS)
        self.itl = Histogram("qoq_inter_token_latency_seconds", "Time between two tokens of a request.",
                             ITL_BUCKETS)
        self.e2e = Histogram("qoq_e2e_request_latency_seconds", "Time from arrival to the last token.",
                             E2E_BUCKETS)
        self.gauges = {"running": 0, "waiting": 0, "pages_used": 0, "pages_free": 0, "pages_total": 0}

    # -- recording ----------------------------------------------------------------------------
    def admitted(self, prompt_tokens: int) -> None:
        with self.lock:
            self.prompt_tokens += prompt_tokens

    def token(self, ttft: float | None = None, itl: float | None = None, n: int = 1) -> None:
        with self.lock:
            self.generation_tokens += n
            if ttft is not None:
                self.ttft.observe(ttft)
            if itl is not None:
                self.itl.observe(itl)

    def finished(self, status: str, e2e: float) -> None:
        with self.lock:
            self.requests[status] += 1
            self.e2e.observe(e2e)

    def response(self, code: int) -> None:
        with self.lock:
            self.responses[str(code)] += 1

    def set_gauges(self, **values: int) -> None:
        with self.lock:
            self.gauges.update(values)

    # -- exposition ----------------------------------------------------------------------------
    def render(self) -> str:
        with self.lock:
            lines: list[str] = []

            def metric(name, kind, help_text, samples):
                lines.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"])
                lines.extend(f"{name}{labels} {_num(v)}" for labels, v in samples)

            statuses = sorted(set(self.requests) | {"stop", "length", "abort", "error"})
            metric("qoq_requests_total", "counter", "Requests finished, by finish status.",
                   [(f'{{status="{s}"}}', self.requests[s]) for s in statuses])
            metric("qoq_http_responses_total", "counter", "HTTP responses, by status code.",
                   [(f'{{code="{c}"}}', n) for c, n in sorted(self.responses.items())])
            metric("qoq_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.",
                   [("", self.prompt_tokens)])
            metric("qoq_generation_tokens_total", "counter", "Generated tokens.", [("", self.generation_tokens)])
            g = self.gauges
            metric("qoq_requests_running", "gauge", "Requests in the running batch.", [("", g["running"])])
            metric("qoq_requests_waiting", "gauge", "Requests waiting for admission.", [("", g["waiting"])])
            metric("qoq_kv_pages_used", "gauge", "KV cache pages held by requests.", [("", g["pages_used"])])
            metric("qoq_kv_pages_free", "gauge", "KV cache pages free.", [("", g["pages_free"])])
            metric("qoq_kv_pages_total", "gauge", "KV cache pages requests may hold.", [("", g["pages_total"])])
            for h in (self.ttft, self.itl, self.e2e):
                lines.extend(h.render())
            return "\n".join(lines) + "\n"
