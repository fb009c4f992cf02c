"""bench/e2e_h200.py end to end on the CPU (--tiny: tiny random artifacts, tiny lengths, the same code the
H200 runs): its JSON carries every summary key, a number or null with a reason."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SUMMARY_KEYS = ("gpu", "model_shape", "max_throughput_tok_s_w4a8kv4", "max_throughput_tok_s_fp16",
                "speedup_max_throughput_48gb", "speedup_max_throughput_full", "speedup_b1_decode",
                "fp16_b1_roofline_fraction", "host_overhead_fraction", "speedup_vs_fp8_max_throughput_48gb",
                "max_throughput_tok_s_fp8", "speedup_vs_fp8_max_throughput_full", "speedup_vs_fp8_b1_decode",
                "command")
NUMBERS = ("max_throughput_tok_s_w4a8kv4", "max_throughput_tok_s_fp16", "speedup_max_throughput_48gb",
           "speedup_max_throughput_full", "speedup_b1_decode", "fp16_b1_roofline_fraction",
           "max_throughput_tok_s_fp8", "speedup_vs_fp8_max_throughput_48gb", "speedup_vs_fp8_max_throughput_full",
           "speedup_vs_fp8_b1_decode")


def run_bench(out: Path, scratch: Path, *flags: str) -> dict:
    cmd = [sys.executable, str(REPO / "bench" / "e2e_h200.py"), "--out", str(out), "--scratch", str(scratch), *flags]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return json.loads((out / "e2e_h200.json").read_text())


def check_keys(summary: dict) -> None:
    for key in SUMMARY_KEYS:
        assert key in summary, key
        if summary[key] is None:
            assert summary["null_reasons"][key], key
        elif key not in ("gpu", "model_shape", "command"):
            assert isinstance(summary[key], float) and summary[key] > 0, (key, summary[key])


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("e2e_artifacts")


@pytest.fixture(scope="module")
def tiny_result(tmp_path_factory, scratch):
    out = tmp_path_factory.mktemp("e2e_tiny")
    return out, run_bench(out, scratch, "--tiny")


def test_tiny_run_has_every_summary_key_and_row(tiny_result):
    out, data = tiny_result
    s = data["summary"]
    check_keys(s)
    assert s["model_shape"] == "tiny" and "--tiny" in s["command"]
    for key in NUMBERS:
        assert s[key] is not None, (key, s["null_reasons"].get(key))
    assert "no CUDA graphs" in data["rows"][1]["host_overhead_reason"]  # the reference backend
    assert not [r for r in data["rows"] if "error" in r or "skipped" in r]
    for fmt in ("w4a8kv4", "fp16", "fp8"):
        rows = [r for r in data["rows"] if r["format"] == fmt]
        assert [r["batch"] for r in rows if r["kind"] == "sweep"] == [1, 2, 4]
        budgets = {r["budget"]: r for r in rows if r["kind"] == "max_throughput"}
        assert budgets["48gb"]["requests"] == 2 and budgets["full"]["requests"] == 4
        assert all(r["output_tokens"] == r["requests"] * 20 and not r["preemptions"] for r in budgets.values())
        assert [r for r in rows if r["kind"] == "ttft"][0]["ms"] > 0
    runs = {r["format"]: r for r in data["runs"]}
    assert runs["w4a8kv4"]["weight_bytes"] < runs["fp8"]["weight_bytes"] < runs["fp16"]["weight_bytes"]
    assert runs["fp8"]["artifact"] == runs["fp16"]["artifact"] and runs["fp8"]["reused"]  # quantized at load
    assert runs["fp8"]["backend"].startswith("cuda runner")  # the reference backend has no fp8 path


def test_fp8_weight_bytes_are_what_the_runner_keeps(tiny_result):
    """The 48 GB budget's fp8 weight bytes (from the manifest) against the loaded runner's tensors."""
    from bench.e2e_h200 import weight_bytes
    from qoq.engine import LLMEngine

    run = {r["format"]: r for r in tiny_result[1]["runs"]}["fp8"]
    runner = LLMEngine(run["artifact"], backend="cuda", device="cpu", ops="reference", kv_budget=1 << 20,
                       quantization="fp8").runner
    kept = sum(t.numel() * t.element_size() for t in (runner.embed_w, runner.norm_w, runner.head_w))
    for L in runner.layers:
        kept += sum(t.numel() * t.element_size() for t in (L.ln1, L.ln2))
        for lin in (L.qkv, L.o, L.gate_up, L.down):
            kept += lin.wq.numel() + lin.w_scale.numel() * 4 + (0 if lin.bias is None else 2 * lin.bias.numel())
    assert weight_bytes(Path(run["artifact"]), "fp8") == run["weight_bytes"] == kept


def test_cuda_runner_on_cpu_one_format_then_merge(tiny_result, scratch, tmp_path):
    data = run_bench(tmp_path / "cuda", scratch, "--tiny", "--tiny-cuda-runner", "--formats", "w4a8kv4")
    s = data["summary"]
    check_keys(s)
    assert data["runs"][0]["reused"]  # the artifact the first run built
    assert s["max_throughput_tok_s_w4a8kv4"] is not None and s["max_throughput_tok_s_fp16"] is None
    assert "not run" in s["null_reasons"]["speedup_max_throughput_48gb"]
    merged = run_bench(tmp_path / "merged", scratch, "--merge", str(tiny_result[0] / "e2e_h200.json"),
                       str(tmp_path / "cuda" / "e2e_h200.json"))
    check_keys(merged["summary"])
    assert len(merged["rows"]) == len(tiny_result[1]["rows"]) + len(data["rows"])
    assert " && " in merged["summary"]["command"]


def test_graph_capture_plan_uses_the_engines_graphs():
    """The GPU-only capture step against the real DecodeGraphs bucketing (capture itself stubbed)."""
    from types import SimpleNamespace

    from bench.e2e_h200 import GPU, capture_graphs
    from qoq.engine.cuda_graphs import DecodeGraphs

    graphs = DecodeGraphs.__new__(DecodeGraphs)  # no CUDA stream on the CPU
    graphs.batch_sizes, graphs.max_pages, graphs.graphs = (1, 2, 4, 8, 16, 32, 64, 128, 256), 64, {}
    captured = []
    graphs.capture = lambda batch, pages: captured.append((batch, pages))
    run = {}
    capture_graphs(SimpleNamespace(runner=SimpleNamespace(graphs=graphs)), GPU.options["graph_batch_sizes"], 145,
                   24, run)
    assert captured == [(b, 32) for b in (152, 144, 136, 128, 120, 112, 104, 96, 88, 80, 72, 64, 56, 48, 40, 32,
                                          24, 16, 8, 4, 2, 1)]
    assert graphs.bucket(145, 20) == (152, 32) and graphs.bucket(153, 20) is None  # eager past the top bucket
    assert "graph_capture_error" not in run and run["graph_capture_s"] >= 0
