"""Pure-torch references with exactly the contracts of the CUDA kernels (CPU or GPU).

GEMM: from the packed artifact tensors of docs/design.md §4, exact integer accumulation, fp32 epilogue; the
activations as rows [M, K] or, for the 16-warp GEMVs, as A-fragment tiles (rows_to_tiles).
Fused quantizers: the fp16 GEMM input (x, RMSNorm(x) or silu(gate)*up) quantized per token (§3.3),
plus, when asked, the per-token sums of that fp16 input ("inputs") or of the codes ("codes"); that fp16
input alone (rmsnorm_fp16, silu_mul_fp16) is what the fp16 path's row kernels compute.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from qoq.quant.activations import quantize_tokens
from qoq.quant.linear import IntegerLinear


def integer_weight(
    qweight: torch.Tensor, *, s2_scales: torch.Tensor | None = None, s2_zeros: torch.Tensor | None = None
) -> torch.Tensor:
    """int8 [N, K] weight the MMA sees: W8 = q·s2 + s2_zeros (per group) or the codes q (per channel)."""
    n = qweight.shape[0]
    ones = torch.ones(n, dtype=torch.float16, device=qweight.device)
    tensors = {"w.qweight": qweight, "w.s1_scales": ones}
    if s2_scales is not None:
        tensors.update({"w.s2_scales": s2_scales, "w.s2_zeros": s2_zeros})
    else:
        tensors["w.s1_szeros"] = ones
    return IntegerLinear.from_tensors(tensors, "w").weight


def accumulate(qx: torch.Tensor, w_int: torch.Tensor) -> torch.Tensor:
    """Exact Σ_k qx[m,k]·w_int[n,k] as int64 [M, N]: float64 sums of integers below 2^53 are exact."""
    if qx.shape[1] * 127 * 128 >= 2**53:
        raise ValueError(f"K={qx.shape[1]} is too long for exact float64 accumulation")
    return (qx.double() @ w_int.double().t()).to(torch.int64)


def reference_accumulators(qx: torch.Tensor, qweight: torch.Tensor, *, s2_scales=None, s2_zeros=None) -> torch.Tensor:
    """Exact Σ_k qx[m,k]·W8[n,k] as int64 [M, N] (W8 = q per channel)."""
    return accumulate(qx, integer_weight(qweight, s2_scales=s2_scales, s2_zeros=s2_zeros))


def epilogue(
    acc: torch.Tensor,  # integer [M, N]
    s_x: torch.Tensor,  # fp16 [M] or [M, 1]
    s1_scales: torch.Tensor,  # fp16 [N]
    *,
    s1_szeros: torch.Tensor | None = None,
    xsum: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.float16,
) -> torch.Tensor:
    """fp32 (acc·s_x)·s1 (§3.1), minus z·Σx per channel (§3.2), plus bias: IntegerLinear's order."""
    y = acc.float() * s_x.reshape(-1, 1).float() * s1_scales.float()
    if s1_szeros is not None:
        if xsum is None:
            raise ValueError("per-channel weights need xsum, the per-token sums of the unquantized input")
        y = y - xsum.reshape(-1, 1).float() * s1_szeros.float()
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype)


def reference_gemm(
    qx: torch.Tensor,  # int8 [M, K]
    s_x: torch.Tensor,  # fp16 [M] or [M, 1]
    qweight: torch.Tensor,  # int8 [N, K/2]
    s1_scales: torch.Tensor,  # fp16 [N]
    *,
    s2_scales: torch.Tensor | None = None,
    s2_zeros: torch.Tensor | None = None,
    s1_szeros: torch.Tensor | None = None,
    xsum: torch.Tensor | None = None,  # fp32 [M]
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.float16,
) -> torch.Tensor:
    """[M, N] = s_x·s1·acc (§3.1) or s_x·s·acc − z·Σx (§3.2), + bias; epilogue in fp32."""
    if (s1_szeros is None) == (s2_scales is None):
        raise ValueError("give s2_scales/s2_zeros (per group) or s1_szeros with xsum (per channel)")
    acc = reference_accumulators(qx, qweight, s2_scales=s2_scales, s2_zeros=s2_zeros)  # [M, N]
    return epilogue(acc, s_x, s1_scales, s1_szeros=s1_szeros, xsum=xsum, bias=bias, out_dtype=out_dtype)


TILE_ROWS = 16  # rows of an A-fragment tile: the mma.m16n8k32 A operand


def rows_to_tiles(qx: torch.Tensor) -> torch.Tensor:
    """int8 [M <= 16, K] -> A-fragment tiles [K/32, 32, 16] (csrc/gemm_w4a8_params.h GemmParams::tiled):
    per 32 k, lane l = 4g + t holds the words row g at k 4t..4t+3, row g + 8 there, row g at k 16+4t..19+4t,
    row g + 8 there, so one 16-byte load a lane gives a warp the whole mma A operand. Rows M..15 are zero
    here; the GEMM never stores them, so the quantization kernels leave them as they are."""
    m, k = qx.shape
    if m > TILE_ROWS or k % 32:
        raise ValueError(f"tiles hold at most {TILE_ROWS} rows of K a multiple of 32, got {m} x {k}")
    rows = torch.zeros(TILE_ROWS, k, dtype=qx.dtype, device=qx.device)
    rows[:m] = qx
    # row = 8 r8 + g, k = 32 tile + 16 h + 4 t + byte  ->  [tile][g][t][h][r8][byte]
    return rows.view(2, 8, k // 32, 2, 4, 4).permute(2, 1, 4, 3, 0, 5).reshape(k // 32, 32, 16)


def tiles_to_rows(tiles: torch.Tensor, m: int) -> torch.Tensor:
    """rows_to_tiles undone: the first m rows [m, K] of A-fragment tiles [K/32, 32, 16]."""
    if tiles.dim() != 3 or tuple(tiles.shape[1:]) != (32, 16) or not 0 <= m <= TILE_ROWS:
        raise ValueError(f"need tiles [K/32, 32, 16] and m <= {TILE_ROWS}, got {tuple(tiles.shape)} and m={m}")
    k_tiles = tiles.shape[0]
    rows = tiles.reshape(k_tiles, 8, 4, 2, 2, 4).permute(4, 1, 0, 3, 2, 5).reshape(TILE_ROWS, k_tiles * 32)
    return rows[:m]


ROW_SUMS = (None, "inputs", "codes")  # the `sums` choices; index = csrc/quant_act.cuh's RowSums


def row_sums_code(sums: str | None) -> int:
    """`sums` checked, as its RowSums code."""
    if sums not in ROW_SUMS:
        raise ValueError(f"unknown sums {sums!r}; choose None, 'inputs' or 'codes'")
    return ROW_SUMS.index(sums)


def _quantize_with_sums(y: torch.Tensor, sums: str | None):
    row_sums_code(sums)
    qx, s_x = quantize_tokens(y)
    if sums == "inputs":
        return qx, s_x, y.float().sum(dim=-1)
    return qx, s_x, qx.sum(dim=-1, dtype=torch.int32) if sums == "codes" else None


def reference_quant(x: torch.Tensor, sums: str | None = None):
    """§3.3 of fp16 x [..., K] -> (qx, s_x [..., 1], sums [...] or None): fp32 sums of x ("inputs")
    or int32 sums of qx ("codes")."""
    return _quantize_with_sums(x, sums)


def rmsnorm_fp16(x: torch.Tensor, weight: torch.Tensor, eps: float, dtype: torch.dtype = torch.float16,
                 residual: torch.Tensor | None = None) -> torch.Tensor:
    """§3.5 RMSNorm in fp32, rounded to fp16: the GEMM input rmsnorm_quant quantizes. `dtype` float32 keeps
    the fp32 values (the executor's RMSNorm; the CUDA runner's data flow without its fp16 roundings).
    With `residual` (x's shape): residual += x in place first, rounded to residual's dtype, and the RMSNorm
    is of that sum (vLLM's fused_add_rms_norm: the residual add of the block ahead fused into the norm)."""
    if residual is not None:
        if residual.shape != x.shape:
            raise ValueError(f"residual {tuple(residual.shape)} and x {tuple(x.shape)} must have one shape")
        x = residual.add_(x)
    x32 = x.float()
    inv_rms = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)  # [..., 1]
    return (x32 * inv_rms * weight.float()).to(dtype)


def silu_mul_fp16(gate: torch.Tensor, up: torch.Tensor, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """fp16(fp16(silu(gate)) · up), as an fp16 MLP computes it: the GEMM input silu_mul_quant quantizes
    (`dtype` float32: the executor's fp32 MLP product)."""
    return F.silu(gate.to(dtype)) * up.to(dtype)


def reference_rmsnorm_quant(x: torch.Tensor, weight: torch.Tensor, eps: float, sums: str | None = None,
                            dtype: torch.dtype = torch.float16, residual: torch.Tensor | None = None):
    """rmsnorm_fp16 (with `residual`: of residual += x, in place), then §3.3 (the kernel: `dtype` float16)."""
    return _quantize_with_sums(rmsnorm_fp16(x, weight, eps, dtype, residual), sums)


def reference_silu_mul_quant(gate: torch.Tensor, up: torch.Tensor, sums: str | None = None,
                             dtype: torch.dtype = torch.float16):
    """silu_mul_fp16, then §3.3 (the kernel: `dtype` float16)."""
    return _quantize_with_sums(silu_mul_fp16(gate, up, dtype), sums)
