"""W4A8 GEMM on the GPU from the artifact tensors of DESIGN §4 (no repacking: the compute-order
qweight tiles are the mma.m16n8k32 B fragments the kernels read).

Per group (§3.1): Y = s_x · s1 · Σ_k qx·(q·s2 + s2_zeros); per channel (§3.2): Y = s_x · s · Σ_k qx·q − z·Σx.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from qoq.runtime_cuda.build import load_extension

SOURCES = ("gemm_w4a8.cu", "quant_act.cu")
# The kernels: split-K GEMV (M <= 64) and tiled MMA kernels with 64- or 128-row blocks.
VARIANTS = {"gemv": 1, "tiled64": 2, "tiled128": 3}


def extension():
    """The compiled module (built on first use, then cached by source hash)."""
    return load_extension("qoq_w4a8", SOURCES)


@lru_cache(maxsize=None)
def _multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def auto_variant(m: int, n: int, group: int, multiprocessors: int) -> str:
    """Kernel for an [M, K] x [K, N] product (chosen from bench/gemm_h200.py's variant sweep)."""
    gemv_ok = group in (-1, 64, 128)  # the GEMV kernel is compiled for these group sizes
    if gemv_ok and (m <= 32 or (m <= 64 and n <= 8192)):
        return "gemv"
    # 128-row blocks dequantize each weight fragment for twice the rows, which pays once the grid
    # fills the GPU; per channel, whose dequantization is cheap, only from about two waves on.
    blocks128 = -(-m // 128) * -(-n // 128)
    waves_needed = 1.9 if group == -1 else 0.7
    return "tiled128" if blocks128 >= waves_needed * multiprocessors else "tiled64"


def _variant_id(variant: str, qx: torch.Tensor, n: int, s2_scales: torch.Tensor | None) -> int:
    if variant == "auto":
        group = -1 if s2_scales is None else qx.shape[1] // max(s2_scales.shape[0], 1)
        variant = auto_variant(qx.shape[0], n, group, _multiprocessors(qx.device))
    if variant not in VARIANTS:
        raise ValueError(f"unknown GEMM variant {variant!r}; choose 'auto' or one of {sorted(VARIANTS)}")
    return VARIANTS[variant]


def _check_operands(qx: torch.Tensor, qweight: torch.Tensor) -> None:
    if qx.dim() != 2 or qx.dtype != torch.int8 or qweight.dim() != 2 or qweight.element_size() != 1:
        raise ValueError(f"need qx int8 [M, K] and qweight int8 [N, K/2], got {qx.dtype} {tuple(qx.shape)} "
                         f"and {qweight.dtype} {tuple(qweight.shape)}")
    if qweight.shape[1] * 2 != qx.shape[1]:
        raise ValueError(f"qweight {tuple(qweight.shape)} does not match K={qx.shape[1]} of qx")
    if qx.shape[1] % 32 or qweight.shape[0] % 32:
        raise ValueError(f"N and K must be multiples of 32, got N={qweight.shape[0]}, K={qx.shape[1]}")


def _check_scheme(s2_scales, s2_zeros, s1_szeros, xsum) -> None:
    if (s2_scales is None) != (s2_zeros is None):
        raise ValueError("per-group weights need both s2_scales and s2_zeros")
    if s2_scales is None and s1_szeros is None:
        raise ValueError("give s2_scales/s2_zeros (per group) or s1_szeros (per channel)")
    if s1_szeros is not None and xsum is None:
        raise ValueError("per-channel weights need xsum, the per-token sums of the unquantized input")


def w4a8_gemm(
    qx: torch.Tensor,  # int8 [M, K]
    s_x: torch.Tensor,  # fp16 [M] or [M, 1]
    qweight: torch.Tensor,  # int8 [N, K/2], packed
    s1_scales: torch.Tensor,  # fp16 [N]
    *,
    s2_scales: torch.Tensor | None = None,  # int8 [K/g, N], interleaved
    s2_zeros: torch.Tensor | None = None,  # int8 [K/g, N], interleaved -z
    s1_szeros: torch.Tensor | None = None,  # fp16 [N], per channel
    xsum: torch.Tensor | None = None,  # fp32 [M], per channel
    bias: torch.Tensor | None = None,  # fp16 [N]
    out: torch.Tensor | None = None,  # fp16 [M, N] to write into
    variant: str = "auto",
) -> torch.Tensor:
    """fp16 [M, N] = the GEMM of DESIGN §3.1 (per group) or §3.2 (per channel)."""
    _check_operands(qx, qweight)
    _check_scheme(s2_scales, s2_zeros, s1_szeros, xsum)
    return extension().gemm(
        qx, s_x.reshape(-1), qweight, s1_scales, s2_scales, s2_zeros, s1_szeros, xsum, bias, out,
        _variant_id(variant, qx, qweight.shape[0], s2_scales),
    )


def w4a8_accumulators(
    qx: torch.Tensor,
    qweight: torch.Tensor,
    *,
    s2_scales: torch.Tensor | None = None,
    s2_zeros: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    variant: str = "auto",
) -> torch.Tensor:
    """Debug entry: the kernel's raw int32 accumulators Σ_k qx·W8 (W8 = q per channel) [M, N]."""
    _check_operands(qx, qweight)
    if (s2_scales is None) != (s2_zeros is None):
        raise ValueError("per-group weights need both s2_scales and s2_zeros")
    variant_id = _variant_id(variant, qx, qweight.shape[0], s2_scales)
    return extension().gemm_accumulators(qx, qweight, s2_scales, s2_zeros, out, variant_id)
