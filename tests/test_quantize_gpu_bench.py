"""bench/quantize_gpu_h200.py on the CPU (--tiny: the same code the H200 runs, a tiny model): its JSON
carries every summary key, and --max-seconds stops after a block and extrapolates."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SUMMARY_KEYS = ("gpu", "device", "model_shape", "recipe", "calibration", "quantize_seconds", "write_seconds",
                "peak_gpu_mem_gib", "peak_rss_gib", "block_seconds_median", "blocks_done", "extrapolated",
                "target_seconds", "target_met", "block_rel_err_mean", "command")


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, tiny_tokenizer):
    path = tmp_path_factory.mktemp("tokenizer")
    tiny_tokenizer.save_pretrained(path)
    return path


def run_bench(out: Path, tokenizer: Path, data: Path, *flags: str) -> dict:
    cmd = [sys.executable, str(REPO / "bench" / "quantize_gpu_h200.py"), "--tiny", "--out", str(out),
           "--tokenizer", str(tokenizer), "--data-dir", str(data), *flags]
    res = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return json.loads((out / "quantize_gpu_h200.json").read_text())


def test_tiny_run_writes_every_summary_key(tmp_path, tokenizer_dir, shared_data):
    result = run_bench(tmp_path / "out", tokenizer_dir, shared_data)
    s = result["summary"]
    assert set(SUMMARY_KEYS) <= set(s)
    assert s["device"] == "cpu" and s["peak_gpu_mem_gib"] is None and s["recipe"] == "w4a8kv4g128"
    assert s["model_shape"]["layers"] == 2 and s["blocks_done"] == 2 and s["extrapolated"] is False
    assert len(result["block_seconds"]) == 2 and s["block_seconds_median"] > 0
    assert 0 < s["quantize_seconds"] < s["target_seconds"] and s["target_met"] is True
    assert 1e-3 < s["block_rel_err_mean"] < 0.5
    assert not list(tmp_path.glob("out/*/")), "the checkpoint and artifact stay out of --out"


def test_max_seconds_stops_after_a_block_and_extrapolates(tmp_path, tokenizer_dir, shared_data):
    result = run_bench(tmp_path / "out", tokenizer_dir, shared_data, "--max-seconds", "0.001")
    s = result["summary"]
    assert s["extrapolated"] is True and s["blocks_done"] == 1 and s["block_rel_err_mean"] is None
    assert s["quantize_seconds"] == pytest.approx(result["measured_quantize_seconds"] + s["block_seconds_median"])
    assert result["extrapolation"]
