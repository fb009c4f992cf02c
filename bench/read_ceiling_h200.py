"""How fast can a kernel that only reads N bytes run, in the timing the H200 benchmarks use?

The M <= 16 GEMM target (3.0x FP16) and the attention bandwidth target (0.70 of ~4.3 TB/s) are both
about streaming a few to a few hundred MB once. This script times a read-only kernel (16-byte
non-caching loads, four in flight per thread per step, grid swept over 1-8 blocks per SM) over exactly
those byte counts, with bench/timing.py's CUDA-graph timing over rotating buffers (> 3x L2), next to
F.linear FP16 at M = 1 on the same shapes. fp16_us / read_us bounds the speedup of any W4 kernel that
reads its INT4 weights once (scales excluded).

    python bench/read_ceiling_h200.py --out $OUT      # -> $OUT/read_ceiling_h200.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.timing import n_sets, time_graph

CUDA_SRC = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

__device__ __forceinline__ uint4 load_nc(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// XOR of every word; one store only if it equals a value random data almost never gives (keeps the loads).
__global__ void read_kernel(const uint4* __restrict__ p, long long n16, unsigned* out) {
  unsigned acc = 0;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    const uint4 a = load_nc(p + i), b = load_nc(p + i + stride), c = load_nc(p + i + 2 * stride),
                d = load_nc(p + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n16; i += stride) {
    const uint4 a = load_nc(p + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == 0x9e3779b9u) out[0] = acc;
}

void read_bytes(torch::Tensor buf, torch::Tensor out, int64_t blocks, int64_t threads) {
  read_kernel<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const uint4*>(buf.data_ptr()), buf.numel() / 16, reinterpret_cast<unsigned*>(out.data_ptr()));
}
"""

# (name, bytes, fp16 F.linear shape (N, K) at M = 1 or None)
TARGETS = [
    ("llama2-7b o_proj int4", 4096 * 4096 // 2, (4096, 4096)),
    ("llama2-7b down_proj int4", 4096 * 11008 // 2, (4096, 11008)),
    ("llama2-7b qkv_proj int4", 12288 * 4096 // 2, (12288, 4096)),
    ("llama2-7b gate_up_proj int4", 22016 * 4096 // 2, (22016, 4096)),
    ("kv4 llama3-8b B64 L512", 64 * 512 * 8 * 2 * (64 + 4), None),
    ("kv4 llama3-8b B256 L512", 256 * 512 * 8 * 2 * (64 + 4), None),
    ("kv4 llama2-7b B64 L1536", 64 * 1536 * 32 * 2 * (64 + 4), None),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from torch.utils.cpp_extension import load_inline

    ext = load_inline("qoq_read_ceiling", cpp_sources="void read_bytes(torch::Tensor, torch::Tensor, int64_t, int64_t);",
                      cuda_sources=CUDA_SRC, functions=["read_bytes"], extra_cuda_cflags=["-O3"])
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = torch.zeros(1, dtype=torch.int32, device="cuda")
    ones = [torch.zeros(1, device="cuda") for _ in range(8)]
    floor_us = time_graph([lambda t=t: t.add_(1) for t in ones])
    rows = []
    for name, nbytes, linear in TARGETS:
        bufs = [torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device="cuda") for _ in range(n_sets(nbytes, 64))]
        sweep = {}
        for per_sm in (1, 2, 4, 8):
            for threads in (256, 512, 1024):
                if per_sm * threads > 2048:
                    continue
                calls = [lambda b=b, n=per_sm * sms, t=threads: ext.read_bytes(b, out, n, t) for b in bufs]
                sweep[f"{per_sm}x{threads}"] = round(time_graph(calls), 3)
        best = min(sweep, key=sweep.get)
        row = dict(name=name, bytes=nbytes, read_us=sweep[best], read_tbps=round(nbytes / sweep[best] / 1e6, 3),
                   best_grid=best, sweep=sweep)
        del bufs
        if linear is not None:
            n, k = linear
            sets = n_sets(n * k * 2, 64)
            ws = [torch.randn(n, k, device="cuda", dtype=torch.float16) for _ in range(sets)]
            xs = [torch.randn(1, k, device="cuda", dtype=torch.float16) for _ in range(sets)]
            row["fp16_linear_m1_us"] = round(time_graph([lambda x=x, w=w: F.linear(x, w) for x, w in zip(xs, ws)]), 3)
            row["max_speedup_vs_fp16"] = round(row["fp16_linear_m1_us"] / row["read_us"], 3)
            del ws, xs
        torch.cuda.empty_cache()
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = dict(command="python bench/read_ceiling_h200.py --out $OUT", gpu=torch.cuda.get_device_name(),
                  torch=torch.__version__, kernel_floor_us=round(floor_us, 3), rows=rows)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "read_ceiling_h200.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
