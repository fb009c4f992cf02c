"""Fused per-token row kernels on the GPU (csrc/quant_act.cu; docs/design.md §3.3, §3.5, §5).

The quantizers take fp16 activations [..., K] and return (qx int8 [..., K], s_x fp16 [..., 1],
sums [...] or None), where `sums` asks for the per-token sums a GEMM subtracts: "inputs", the fp32 sum
of the fp16 GEMM input before quantization (per-channel GEMMs, §3.2), or "codes", the int32 sum of qx
(per-group GEMMs on biased u8 weights). References with the same contracts: qoq.runtime_cuda.reference.
With tiles=True (at most 16 tokens, K a multiple of 32) qx comes as the 16-warp GEMVs' A-fragment tiles
[K/32, 32, 16] (reference.rows_to_tiles; gemm.tiles_for says when a GEMM takes them), its rows past the
tokens left unwritten.

rmsnorm_fp16 and silu_mul_fp16 are the same rows left in fp16 (the fp16 path's GEMM inputs). RMSNorm can
take the residual add of the block ahead (vLLM's fused_add_rms_norm): with `residual`, residual += x in
place, then the RMSNorm of that sum. enable_pdl (Hopper) launches an fp16 row kernel as a programmatic
dependent of the kernel ahead; it reads nothing before its wait (docs/design.md §5.5).
"""

from __future__ import annotations

import torch

from qoq.runtime_cuda.devices import same_device
from qoq.runtime_cuda.gemm import extension
from qoq.runtime_cuda.reference import TILE_ROWS, row_sums_code


def _rows(x: torch.Tensor, name: str, tiles: bool = False) -> torch.Tensor:
    """[..., K] -> [T, K] view whose rows start 16-byte aligned (copied if they do not); with `tiles`, at
    most 16 of them and K a multiple of 32."""
    if x.dtype != torch.float16 or not x.is_cuda:
        raise ValueError(f"{name} must be a CUDA fp16 tensor, got {x.dtype} on {x.device}")
    if x.shape[-1] % 8:
        raise ValueError(f"{name}: K={x.shape[-1]} must be a multiple of 8")
    rows = x.reshape(-1, x.shape[-1])  # [T, K], a view where the strides allow
    if tiles and (rows.shape[0] > TILE_ROWS or rows.shape[1] % 32):
        raise ValueError(f"{name}: tiled codes need at most {TILE_ROWS} tokens and K a multiple of 32, "
                         f"got {rows.shape[0]} x {rows.shape[1]}")
    if rows.stride(-1) != 1 or rows.stride(0) % 8 or rows.data_ptr() % 16:
        rows = rows.clone(memory_format=torch.contiguous_format)  # fresh, aligned rows
    return rows


def _unflatten(result, lead: torch.Size, sums: str | None, tiles: bool):
    qx, s_x, row_sums = result
    return (
        qx if tiles else qx.reshape(*lead, qx.shape[-1]),
        s_x.reshape(*lead, 1),
        row_sums.reshape(lead) if sums is not None else None,
    )


def quant_tokens(x: torch.Tensor, sums: str | None = None, tiles: bool = False):
    """§3.3 of x [..., K]."""
    result = extension().quant_tokens(_rows(x, "x", tiles), row_sums_code(sums), tiles)
    return _unflatten(result, x.shape[:-1], sums, tiles)


def _residual(residual: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor | None:
    """The residual as [T, K] rows: a view, since the kernel adds x to it in place."""
    if residual is None:
        return None
    if residual.shape != x.shape:
        raise ValueError(f"residual {tuple(residual.shape)} and x {tuple(x.shape)} must have one shape")
    if residual.dtype != torch.float16 or not residual.is_cuda:
        raise ValueError(f"residual must be a CUDA fp16 tensor, got {residual.dtype} on {residual.device}")
    same_device("x", x, residual=residual)
    try:
        rows = residual.view(-1, residual.shape[-1])
    except RuntimeError:
        rows = None
    if rows is None or rows.stride(-1) != 1 or rows.stride(0) % 8 or rows.data_ptr() % 16:
        raise ValueError("residual (updated in place) must have contiguous rows, 16-byte aligned, a row stride "
                         "a multiple of 8")
    return rows


def _rmsnorm_weight(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"RMSNorm weight must be [{x.shape[-1]}], got {tuple(weight.shape)}")
    same_device("x", x, weight=weight)
    return _rows(weight.half(), "weight")[0]


def rmsnorm_quant(x: torch.Tensor, weight: torch.Tensor, eps: float, sums: str | None = None, tiles: bool = False,
                  residual: torch.Tensor | None = None):
    """§3.5 RMSNorm of x [..., K] (fp32 math, fp16 result), or with `residual` of residual += x, then §3.3."""
    res, w, code = _residual(residual, x), _rmsnorm_weight(weight, x), row_sums_code(sums)
    result = extension().rmsnorm_quant(_rows(x, "x", tiles), w, float(eps), code, tiles, res)
    return _unflatten(result, x.shape[:-1], sums, tiles)


def silu_mul_quant(gate: torch.Tensor, up: torch.Tensor, sums: str | None = None, tiles: bool = False):
    """fp16(fp16(silu(gate)) · up) of gate, up [..., I] (e.g. the halves of a gate_up output), then §3.3."""
    if gate.shape != up.shape:
        raise ValueError(f"gate {tuple(gate.shape)} and up {tuple(up.shape)} must have one shape")
    same_device("gate", gate, up=up)
    result = extension().silu_mul_quant(_rows(gate, "gate", tiles), _rows(up, "up"), row_sums_code(sums), tiles)
    return _unflatten(result, gate.shape[:-1], sums, tiles)


def rmsnorm_fp16(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
                 enable_pdl: bool = False) -> torch.Tensor:
    """§3.5 RMSNorm of x [..., K], or with `residual` of residual += x (in place), fp32 math -> fp16 [..., K]."""
    res, w = _residual(residual, x), _rmsnorm_weight(weight, x)
    out = extension().rmsnorm_fp16(_rows(x, "x"), w, float(eps), res, enable_pdl)
    return out.reshape(x.shape)


def silu_mul_fp16(gate: torch.Tensor, up: torch.Tensor, enable_pdl: bool = False) -> torch.Tensor:
    """fp16(fp16(silu(gate)) · up) of gate, up [..., I] (e.g. the halves of a gate_up output) -> fp16 [..., I]."""
    if gate.shape != up.shape:
        raise ValueError(f"gate {tuple(gate.shape)} and up {tuple(up.shape)} must have one shape")
    same_device("gate", gate, up=up)
    return extension().silu_mul_fp16(_rows(gate, "gate"), _rows(up, "up"), enable_pdl).reshape(gate.shape)
