"""The load generator of bench/serve_h200.py, in the manner of vLLM's benchmarks/benchmark_serving.py:
Poisson arrivals at a request rate, random token-id prompts and output lengths from a seeded distribution
(vLLM's "random" dataset: lengths uniform in [len·(1-r), len·(1+r)]), streaming /v1/completions clients
(aiohttp), and per-run statistics.

    specs = schedule(Workload(), rate=8.0, duration=20.0)        # the same requests for every format
    results, elapsed = asyncio.run(run_load(url, model, specs, deadline=20.0 + 12.0))
    row = run_stats(results, elapsed, slo_ttft_p99=2.0)

Every request asks for `ignore_eos` and exactly its output length, greedy. The server sends one chunk per
token, so TTFT is send -> first chunk, inter-token latency the gaps between chunks, and a request is
correct only if its chunks, its usage and its length all agree. Requests still running at the deadline are
cut (the client disconnects; the server aborts them): not errors, but one cut before its first token
counts its time to the cut as its TTFT (a lower bound, over the SLO whenever drain >= the SLO).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field

import numpy as np

from qoq.serve.process import scrape_metrics


@dataclass(frozen=True)
class Workload:
    input_len: int = 1024
    output_len: int = 256
    range_ratio: float = 0.5  # lengths uniform in [len * (1 - r), len * (1 + r)]
    vocab_size: int = 32000
    seed: int = 0

    def __post_init__(self):
        if self.input_len < 1 or self.output_len < 1 or not 0 <= self.range_ratio < 1 or self.vocab_size < 1:
            raise ValueError(f"bad workload {self}: lengths >= 1, 0 <= range_ratio < 1, vocab_size >= 1")

    def lengths(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        def draw(mean: int) -> np.ndarray:
            lo, hi = max(1, int(mean * (1 - self.range_ratio))), max(1, int(mean * (1 + self.range_ratio)))
            return rng.integers(lo, hi + 1, size=n)

        return draw(self.input_len), draw(self.output_len)


@dataclass
class RequestSpec:
    prompt: list[int]
    output_len: int
    send_at: float  # seconds after the run's start


def _specs(workload: Workload, rng: np.random.Generator, send_at: list[float]) -> list[RequestSpec]:
    ins, outs = workload.lengths(rng, len(send_at))
    return [RequestSpec(rng.integers(0, workload.vocab_size, size=int(i)).tolist(), int(o), t)
            for i, o, t in zip(ins, outs, send_at)]


def schedule(workload: Workload, rate: float, duration: float) -> list[RequestSpec]:
    """Poisson arrivals (exponential gaps, mean 1/rate) from t = 0 for `duration` seconds. Seeded by the
    workload's seed and the rate alone, so every format sees the same requests at the same times."""
    if rate <= 0 or duration <= 0:
        raise ValueError(f"rate and duration must be > 0 (got {rate}, {duration})")
    rng = np.random.default_rng([workload.seed, int(round(rate * 1000))])
    times, t = [], 0.0
    while t < duration:
        times.append(t)
        t += rng.exponential(1.0 / rate)
    return _specs(workload, rng, times)


def burst(workload: Workload, n: int, max_output: int) -> list[RequestSpec]:
    """n requests at once (the warm-up), outputs capped at max_output tokens."""
    specs = _specs(workload, np.random.default_rng([workload.seed, 7]), [0.0] * n)
    for s in specs:
        s.output_len = min(s.output_len, max_output)
    return specs


@dataclass
class Result:
    prompt_len: int
    output_len: int
    start: float = 0.0  # perf_counter at send
    end: float = 0.0  # the last chunk, the failure, or the cut
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    tokens: int = 0  # chunks carrying a choice: one per token
    usage_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None
    cut: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and not self.cut


def _check(r: Result, done: bool) -> str | None:
    if not done:
        return "the stream ended without [DONE]"
    if r.finish_reason != "length":
        return f"finish_reason {r.finish_reason!r}, expected 'length' (ignore_eos)"
    if not r.tokens == r.usage_tokens == r.output_len:
        return f"{r.tokens} token chunks, usage {r.usage_tokens}, {r.output_len} asked"
    return None


async def send(session, url: str, model: str, spec: RequestSpec, r: Result) -> None:
    body = {"model": model, "prompt": spec.prompt, "max_tokens": spec.output_len, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    r.start = last = time.perf_counter()
    done = False
    try:
        async with session.post(url, json=body) as resp:
            if resp.status != 200:
                r.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                return
            async for line in resp.content:  # server-sent events, one `data: ...` line each
                if not line.startswith(b"data: "):
                    continue
                data = line[6:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    r.error = f"error event: {chunk['error'].get('message')}"[:300]
                    return
                if chunk.get("choices"):
                    now = time.perf_counter()
                    if r.ttft is None:
                        r.ttft = now - r.start
                    else:
                        r.itl.append(now - last)
                    last = now
                    r.tokens += 1
                    r.finish_reason = chunk["choices"][0].get("finish_reason") or r.finish_reason
                elif chunk.get("usage"):
                    r.usage_tokens = chunk["usage"]["completion_tokens"]
        r.error = _check(r, done)
    except asyncio.CancelledError:
        r.cut = True
        raise
    except Exception as e:  # noqa: BLE001 - a refused connection, a reset, bad JSON: this request failed
        r.error = f"{type(e).__name__}: {e}"[:300]
    finally:
        r.end = time.perf_counter() if r.cut or r.error else last


async def run_load(base_url: str, model: str, specs: list[RequestSpec], deadline: float) -> tuple[list[Result], float]:
    """Send each spec at its send_at (seconds after the start); cut what still runs `deadline` seconds after
    the start. Returns the results (spec order) and the elapsed time, start to the last chunk or cut."""
    import aiohttp

    url = base_url + "/v1/completions"
    results = [Result(len(s.prompt), s.output_len) for s in specs]
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
    # a connection per request (as vLLM's client, a session per request): a kept-alive one could be sent on
    # just as the server closes it idle, a failure that is not the server's
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start = time.perf_counter()
        tasks = []
        for spec, r in zip(specs, results):
            delay = start + spec.send_at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(send(session, url, model, spec, r)))
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, start + deadline - time.perf_counter()))
        for t in pending:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    ends = [r.end for r in results if r.end]
    return results, (max(ends) if ends else time.perf_counter()) - start


def percentile(values: list[float], p: float) -> float | None:
    """Nearest rank (no interpolation): p99 of 80 values is the largest."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)]


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1000, 2)


def run_stats(results: list[Result], elapsed: float, slo_ttft_p99: float) -> dict:
    """vLLM's serving metrics for one run, plus errors, cuts and whether the run met the TTFT SLO."""
    good = [r for r in results if r.error is None]
    ttft = [r.ttft if r.ttft is not None else r.end - r.start for r in good]  # cut before its first token
    itl = [g for r in good for g in r.itl]
    done = [r for r in good if not r.cut]
    tokens = sum(r.tokens for r in good)
    errors = [r.error for r in results if r.error is not None]
    p99 = percentile(ttft, 99)
    row = {
        "requests": len(results), "completed": len(done), "cut": sum(r.cut for r in results),
        "cut_before_first_token": sum(r.cut and r.ttft is None for r in results), "errors": len(errors),
        "error_examples": sorted(set(errors))[:3], "elapsed_s": round(elapsed, 3),
        "prompt_tokens": sum(r.prompt_len for r in results), "output_tokens": tokens,
        "output_tok_s": round(tokens / elapsed, 1) if elapsed > 0 else None,
        "request_throughput": round(len(done) / elapsed, 3) if elapsed > 0 else None,
        "ttft_p50_ms": _ms(percentile(ttft, 50)), "ttft_p99_ms": _ms(p99),
        "itl_p50_ms": _ms(percentile(itl, 50)), "itl_p99_ms": _ms(percentile(itl, 99)),
        "e2e_p50_ms": _ms(percentile([r.end - r.start for r in done], 50)),
        "e2e_p99_ms": _ms(percentile([r.end - r.start for r in done], 99)),
    }
    row["sustainable"] = bool(not errors and good and p99 is not None and p99 < slo_ttft_p99)
    return row


def settle(base_url: str, timeout: float = 15.0) -> dict[str, float]:
    """Wait until the server is idle with every KV page free; the last /metrics sample either way."""
    end = time.monotonic() + timeout
    while True:
        m = scrape_metrics(base_url)
        idle = m["qoq_requests_running"] == 0 and m["qoq_requests_waiting"] == 0
        if (idle and m["qoq_kv_pages_used"] == 0 and m["qoq_kv_pages_free"] == m["qoq_kv_pages_total"]) \
                or time.monotonic() > end:
            return m
        time.sleep(0.1)
