"""Run the kernels behind the missed speed targets once each, for Nsight Compute to profile.

    ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section Occupancy \
        -k regex:'gemv|decode' python bench/profile_kernels.py [--only gemv|decode] > $OUT/ncu.txt

GEMV (M = 1, g128) at Llama-2-7B o_proj and gate_up shapes; KV4 decode attention at Llama-2-7B
B=64 L=1536 and Llama-3-8B B=64 L=512 / B=1 L=512 (random pages, shuffled page table).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from qoq.quant.linear import export_linear  # noqa: E402
from qoq.quant.weights import quantize_weight  # noqa: E402
from qoq.runtime_cuda import attention  # noqa: E402
from qoq.runtime_cuda import attention_reference as ref  # noqa: E402
from qoq.runtime_cuda.gemm import w4a8_gemm  # noqa: E402

GEMV_SHAPES = [(4096, 4096), (22016, 4096)]  # (N, K)
DECODE = [("llama2-7b", 32, 32, 64, 1536), ("llama3-8b", 32, 8, 64, 512), ("llama3-8b", 32, 8, 1, 512)]


def gemv(n: int, k: int) -> None:
    t = export_linear("w", quantize_weight(torch.randn(n, k, device="cuda"), 128))
    qx = torch.randint(-127, 128, (1, k), dtype=torch.int8, device="cuda")
    s_x = torch.ones(1, dtype=torch.float16, device="cuda")
    w4a8_gemm(qx, s_x, t["w.qweight"], t["w.s1_scales"], s2_scales=t["w.s2_scales"], s2_zeros=t["w.s2_zeros"])


def decode(hq: int, hkv: int, batch: int, length: int, dim: int = 128) -> None:
    pages = math.ceil(length / 64)
    pools = []
    for _ in range(2):
        pool = torch.randint(0, 256, (batch * pages, ref.page_bytes(hkv, dim)), dtype=torch.uint8, device="cuda")
        _, scale, zero = ref.page_views(pool, hkv, dim)
        scale.fill_(0.05)
        zero.fill_(7.0)
        pools.append(pool)
    table = torch.randperm(batch * pages, device="cuda").int().view(batch, pages)
    lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
    q = torch.randn(batch, hq, dim, device="cuda").half()
    attention.decode_attention(q, *pools, table, lens, length)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=("gemv", "decode"), help="run one kernel family (skips the other's build)")
    only = ap.parse_args().only
    if only != "decode":
        for n, k in GEMV_SHAPES:
            gemv(n, k)
    if only != "gemv":
        for _, hq, hkv, batch, length in DECODE:
            decode(hq, hkv, batch, length)
    torch.cuda.synchronize()
    print("ran", only or "all")


if __name__ == "__main__":
    main()
