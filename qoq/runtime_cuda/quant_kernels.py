"""Fused per-token activation quantization on the GPU (docs/design.md §3.3, §3.5, §5).

Each function takes fp16 activations [..., K] and returns (qx int8 [..., K], s_x fp16 [..., 1],
sums [...] or None), where `sums` asks for the per-token sums a GEMM subtracts: "inputs", the fp32 sum
of the fp16 GEMM input before quantization (per-channel GEMMs, §3.2), or "codes", the int32 sum of qx
(per-group GEMMs on biased u8 weights). References with the same contracts: qoq.runtime_cuda.reference.
With tiles=True (at most 16 tokens, K a multiple of 32) qx comes as the 16-warp GEMVs' A-fragment tiles
[K/32, 32, 16] (reference.rows_to_tiles; gemm.tiles_for says when a GEMM takes them), its rows past the
tokens left unwritten.
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


def rmsnorm_quant(x: torch.Tensor, weight: torch.Tensor, eps: float, sums: str | None = None, tiles: bool = False):
    """§3.5 RMSNorm of x [..., K] (fp32 math, fp16 result), then §3.3."""
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"RMSNorm weight must be [{x.shape[-1]}], got {tuple(weight.shape)}")
    same_device("x", x, weight=weight)
    code = row_sums_code(sums)
    result = extension().rmsnorm_quant(_rows(x, "x", tiles), _rows(weight.half(), "weight")[0], float(eps), code, tiles)
    return _unflatten(result, x.shape[:-1], sums, tiles)


def silu_mul_quant(gate: torch.Tensor, up: torch.Tensor, sums: str | None = None, tiles: bool = False):
    """fp16(fp16(silu(gate)) · up) of gate, up [..., I] (e.g. the halves of a gate_up output), then §3.3."""
    if gate.shape != up.shape:
        raise ValueError(f"gate {tuple(gate.shape)} and up {tuple(up.shape)} must have one shape")
    same_device("gate", gate, up=up)
    result = extension().silu_mul_quant(_rows(gate, "gate", tiles), _rows(up, "up"), row_sums_code(sums), tiles)
    return _unflatten(result, gate.shape[:-1], sums, tiles)
