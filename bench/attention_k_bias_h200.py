"""What keeping the k bias outside the KV4 cache (design §3.4) costs decode attention, at Qwen2.5-Coder shapes.

  PYTHONPATH=. python bench/attention_k_bias_h200.py --out $OUT

For the 1.5B (12 / 2 heads, D 128) and the 0.5B (14 / 2, D 64), batch x length: decode_attention over KV4 pages
without and with k_bias (attention_decode_k_bias.cuh), launched as the engine launches it (planned splits and
ring depth, enable_pdl), next to decode_attention_fp16 over fp16 pages (the fp16 artifact's path, whose cache
holds the bias). Timing as bench/attention_h200.py's: CUDA-graph replays over rotating input sets (> 3x L2),
median of REPS. Before timing, each shape's bias launch is checked against attention_reference.decode_attention.
Writes attention_k_bias_h200.json (summary on top).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.attention_h200 import decode_sets, fp16_paged_sets, graph_ms, rel_err, rope_tables  # noqa: E402
from qoq.runtime_cuda import attention  # noqa: E402
from qoq.runtime_cuda import attention_reference as ref  # noqa: E402

MODELS = {"qwen2.5-coder-1.5b": (12, 2, 128), "qwen2.5-coder-0.5b": (14, 2, 64)}  # (Hq, Hkv, D)
SHAPES = [(1, 2048), (16, 2048), (64, 512), (64, 2048), (256, 1024)]  # (batch, length)
MAX_POS = 4096


def k_bias(hkv: int, dim: int, cos, sin) -> tuple:
    b = torch.randn(hkv, dim, device="cuda") * 2
    b[:, dim // 2 - 1], b[:, dim - 1], b[:, 2] = 150.0, -150.0, 60.0  # Qwen2.5-like channels
    return b, cos, sin, attention.rope_fragments(cos, sin, dim)


def row_for(model: str, batch: int, length: int) -> dict:
    hq, hkv, dim = MODELS[model]
    cos, sin = rope_tables(MAX_POS, dim)
    bias = k_bias(hkv, dim, cos, sin)
    seq_lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
    sets = decode_sets(hq, hkv, dim, batch, length)
    q, kp, vp, table = sets[0]
    want = ref.decode_attention(q, kp, vp, table, seq_lens, k_bias=bias[:3])
    got = attention.decode_attention(q, kp, vp, table, seq_lens, length, enable_pdl=True, k_bias=bias)
    row = {"model": model, "batch": batch, "length": length, "rel_err_vs_reference": rel_err(got, want)}
    for key, kb in (("kv4_ms", None), ("kv4_k_bias_ms", bias)):
        row[key] = graph_ms([lambda s=s: attention.decode_attention(*s, seq_lens, length, enable_pdl=True, k_bias=kb)
                             for s in sets])
    del sets
    sets = fp16_paged_sets(hq, hkv, dim, batch, length)
    row["fp16_paged_ms"] = graph_ms([lambda s=s: attention.decode_attention_fp16(*s, seq_lens, length) for s in sets])
    row["k_bias_cost"] = row["kv4_k_bias_ms"] / row["kv4_ms"]
    row["k_bias_speedup_vs_fp16_paged"] = row["fp16_paged_ms"] / row["kv4_k_bias_ms"]
    print(json.dumps(row), flush=True)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--command", default="PYTHONPATH=. python bench/attention_k_bias_h200.py --out $OUT")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    attention.extension()
    rows = [row_for(m, b, n) for m in MODELS for b, n in SHAPES]
    summary = {
        "gpu": torch.cuda.get_device_name(),
        "max_rel_err_vs_reference": max(r["rel_err_vs_reference"] for r in rows),
        "k_bias_cost_max": max(r["k_bias_cost"] for r in rows),
        "k_bias_cost_median": sorted(r["k_bias_cost"] for r in rows)[len(rows) // 2],
        "k_bias_speedup_vs_fp16_paged_min": min(r["k_bias_speedup_vs_fp16_paged"] for r in rows),
        "seconds": round(time.time() - start, 1),
    }
    result = {"summary": summary, "command": args.command, "rows": rows}
    (args.out / "attention_k_bias_h200.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
