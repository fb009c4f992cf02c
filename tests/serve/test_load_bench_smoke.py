"""bench/serve_h200.py on the CPU (--tiny: tiny random artifacts without a tokenizer, the reference backend,
two low rates; the same code the H200 runs): no error, no leaked KV page, every request's tokens accounted
for, the summary keys. Plus the rate search and the run statistics without a server."""

import json
import os
import subprocess
import sys

import pytest

from serve_support import REPO

pytest.importorskip("aiohttp")

SUMMARY_KEYS = ("gpu", "errors", "leaked_pages", "max_rate_w4a8kv4", "max_rate_fp16", "rate_ratio", "command",
                "slo_ttft_p99_s", "target_rate_ratio", "target_met", "null_reasons")


def test_tiny_load_test(tmp_path):
    from bench.serve_load import Workload, schedule

    out = tmp_path / "out"
    res = subprocess.run([sys.executable, str(REPO / "bench" / "serve_h200.py"), "--tiny", "--out", str(out),
                          # a generous bound: on busy shared cores, time must not cut the smoke run short
                          "--scratch", str(tmp_path / "scratch"), "--total-seconds", "600", "--startup-timeout",
                          "300"], capture_output=True, text=True, timeout=900,
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    data = json.loads((out / "serve_h200.json").read_text())
    s = data["summary"]
    assert all(key in s for key in SUMMARY_KEYS), sorted(s)
    assert s["errors"] == 0 and s["leaked_pages"] == 0
    # on the CPU both formats meet a 2 s TTFT at both tiny rates: the top of the grid, ratio 1
    assert s["max_rate_w4a8kv4"] == s["max_rate_fp16"] == 4.0 and s["rate_ratio"] == 1.0
    assert "lower bound" in s["max_rate_fp16_note"] and "--tiny" in s["command"] and "$OUT" in s["command"]
    workload = Workload(**data["workload"])
    assert workload.vocab_size == 49152 and workload.input_len == 32
    for name in ("w4a8kv4", "fp16"):
        fmt = data["formats"][name]
        assert fmt["server_exit_code"] == 0 and "error" not in fmt
        assert fmt["warmup"]["errors"] == 0 and fmt["warmup"]["leaked_pages"] == 0
        assert [r["rate"] for r in fmt["runs"]] == [2.0, 4.0]
        for row in fmt["runs"]:
            specs = schedule(workload, row["rate"], data["plan"]["duration"])
            assert row["requests"] == row["completed"] == len(specs) and row["cut"] == 0
            assert row["output_tokens"] == row["server_generated_tokens"] == sum(sp.output_len for sp in specs)
            assert row["leaked_pages"] == 0 and row["server_idle"] and row["server_errors"] == 0
            assert 0 < row["ttft_p50_ms"] <= row["ttft_p99_ms"] < 2000 and row["itl_p50_ms"] > 0
            assert row["sustainable"] and row["output_tok_s"] > 0
    if data["formats"]["fp16"]["runs"]:
        pytest.importorskip("matplotlib")
        assert (out / "serve_h200.png").stat().st_size > 0


def test_rate_search():
    from bench.serve_h200 import next_rate

    grid = (4.0, 8.0, 16.0, 32.0)
    assert next_rate({}, grid, 2) == (4.0, False)
    assert next_rate({4.0: True, 8.0: True}, grid, 2) == (16.0, False)
    assert next_rate({4.0: True, 8.0: True, 16.0: False}, grid, 2) == (11.31, True)  # geometric midpoint
    assert next_rate({4.0: True, 8.0: True, 16.0: False, 11.31: True}, grid, 1) == (13.45, True)
    assert next_rate({4.0: True, 8.0: True, 16.0: False}, grid, 0) is None
    assert next_rate({4.0: False}, grid, 2) == (2.0, True)  # the first rate fails: go down
    assert next_rate({4.0: False, 2.0: True}, grid, 1) == (2.83, True)
    assert next_rate({r: True for r in grid}, grid, 2) is None  # all sustainable: a lower bound


def test_run_stats_counts_cuts_and_errors():
    from bench.serve_load import Result, Workload, burst, percentile, run_stats, schedule

    assert percentile([3.0, 1.0, 2.0], 50) == 2.0 and percentile([float(i) for i in range(80)], 99) == 79.0
    ok = [Result(10, 4, start=0.0, end=1.0, ttft=0.1 * i, itl=[0.01] * 3, tokens=4, usage_tokens=4,
                 finish_reason="length") for i in range(1, 10)]
    cut = Result(10, 4, start=0.0, end=3.5, cut=True)  # cut before its first token: TTFT >= 3.5 s
    row = run_stats([*ok, cut], elapsed=4.0, slo_ttft_p99=2.0)
    assert (row["completed"], row["cut"], row["cut_before_first_token"], row["errors"]) == (9, 1, 1, 0)
    assert row["ttft_p99_ms"] == 3500.0 and row["ttft_p50_ms"] == 500.0 and not row["sustainable"]
    assert row["output_tokens"] == 36 and row["output_tok_s"] == 9.0 and row["itl_p99_ms"] == 10.0
    failed = Result(10, 4, start=0.0, end=0.2, error="HTTP 500: boom")
    row = run_stats([*ok, failed], elapsed=1.0, slo_ttft_p99=2.0)
    assert row["errors"] == 1 and row["error_examples"] == ["HTTP 500: boom"] and not row["sustainable"]
    assert run_stats(ok, elapsed=1.0, slo_ttft_p99=2.0)["sustainable"]
    w = Workload(input_len=100, output_len=20, range_ratio=0.5, vocab_size=1000, seed=3)
    a, b = schedule(w, 5.0, 10.0), schedule(w, 5.0, 10.0)
    assert [x.prompt for x in a] == [x.prompt for x in b] and [x.send_at for x in a] == [x.send_at for x in b]
    assert 25 <= len(a) <= 80 and all(50 <= len(x.prompt) <= 150 and 10 <= x.output_len <= 30 for x in a)
    assert all(max(x.prompt) < 1000 for x in a) and a[0].send_at == 0.0
    assert [x.send_at for x in a] == sorted(x.send_at for x in a) and a[-1].send_at < 10.0
    assert all(x.output_len <= 4 and x.send_at == 0.0 for x in burst(w, 6, 4))
    with pytest.raises(ValueError, match="range_ratio"):
        Workload(range_ratio=1.5)


def test_summary_of_partial_results():
    from bench.serve_summary import summarize

    run = {"rate": 4.0, "sustainable": True, "errors": 0, "server_errors": 0, "leaked_pages": 0,
           "output_tok_s": 900.0}
    result = {"gpu": "x", "slo_ttft_p99_s": 2.0, "workload": {}, "command": "c", "formats_asked": ["fp16"],
              "formats": {"fp16": {"runs": [run, {**run, "rate": 8.0, "sustainable": False, "server_errors": 2}],
                                   "warmup": {**run, "leaked_pages": 3}}}}
    s = summarize(result)
    assert s["max_rate_fp16"] == 4.0 and s["output_tok_s_at_max_fp16"] == 900.0
    assert s["max_rate_w4a8kv4"] is None and s["null_reasons"]["max_rate_w4a8kv4"] == "not asked (--formats)"
    assert s["rate_ratio"] is None and s["target_met"] is None and "rate_ratio" in s["null_reasons"]
    assert s["errors"] == 2 and s["leaked_pages"] == 3
    result["formats"]["fp16"]["error"] = "RuntimeError: the server exited with 1 before /health answered"
    s = summarize(result)
    assert s["max_rate_fp16"] is None and "server exited" in s["null_reasons"]["max_rate_fp16"] and s["errors"] == 3
