"""W4A8 GEMM on the GPU from the artifact tensors of docs/design.md §4 (no repacking: the compute-order
qweight tiles are the mma.m16n8k32 B fragments the kernels read).

Per group (§3.1): Y = s_x · s1 · Σ_k qx·(q·s2 + s2_zeros); per channel (§3.2): Y = s_x · s · Σ_k qx·q − z·Σx.
Per group the wgmma and GEMV kernels multiply the biased u8 weights W8 + 128 and take 128·Σ_k qx off again:
the per-token code sums `qsum`, which the fused quantization kernels emit (sums="codes").

The activations qx come as rows, int8 [M, K], or, for the 16-warp GEMVs at M <= 16, as A-fragment tiles,
int8 [K/32, 32, 16] (reference.rows_to_tiles), which those kernels read straight into registers instead of
staging rows in shared memory; the quantization kernels write either (tiles=True), and `tiles_for` says
which layout a GEMM of M tokens takes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from qoq.runtime_cuda.build import load_extension
from qoq.runtime_cuda.devices import same_device
from qoq.runtime_cuda.reference import TILE_ROWS, tiles_to_rows

SOURCES = ("gemm_w4a8.cu", "quant_act.cu", "gemm_bindings.cpp")
# The kernels: split-K GEMVs (M <= 64; 8 or 16 warps per 32 columns; at M <= 16 the 16-warp ones read
# A-fragment tiles straight into registers, and rows are staged in shared memory, on Hopper by bulk copies
# shared by pairs of blocks from M = 4; "gemv16p" is persistent, one 16-warp block per SM for several column
# blocks, staging any rows once; per group the weights dequantize to biased u8) and tiled MMA kernels with 64-
# or 128-row blocks; the "w" tiled kernels use 4 warps with BM x 32 warp tiles, so each weight fragment is
# dequantized once per block; the "wg" kernels (Hopper only) use wgmma with the weights as the register
# operand, fed by tensor-map copies and pipelined (the next k-step dequantizes while this one's wgmmas run),
# named by block tile (channels x tokens), "k2" with two warpgroups splitting each block's K range (more loads
# and wgmmas in flight where the grid leaves warp slots empty). Grids below one wave split K: the tiled
# kernels add int32 partial sums atomically, the wgmma kernels run a tile's splits as a cluster whose blocks
# add them through distributed shared memory.
VARIANTS = {"gemv": 1, "gemv16": 6, "gemv16p": 11, "tiled64": 2, "tiled128": 3, "tiled128w": 4, "tiled64w": 5,
            "wg128x64": 7, "wg128x128": 8, "wg64x64": 9, "wg64x64k2": 10}
GEMV_MAX_M = 64
GEMV_GROUPS = (-1, 64, 128)  # the group sizes the GEMV kernels are compiled for (-1: per channel)
GEMVP_MAX_M = 16  # the persistent GEMV stages at most 16 activation rows
GEMVP_MAX_WEIGHT_BYTES = 1 << 32  # and addresses its packed weights (N * K / 2 bytes) with 32-bit offsets
# the kernels that take the code sums per group (biased u8 weights)
BIASED_IDS = {i for v, i in VARIANTS.items() if v.startswith(("wg", "gemv"))}
TILED_VARIANTS = ("gemv16", "gemv16p")  # the kernels that read A-fragment tiles


def tiles_for(m: int, group: int) -> bool:
    """Whether a GEMM of m tokens (auto_variant's pick) reads its activations as A-fragment tiles: at every
    M <= 16 the GEMVs are compiled for. Tiles go straight into registers with each run's weights, where
    staged rows wait on shared memory; tiles of fewer rows carry all 16 rows' bytes, so every M <= 16
    costs what M = 16 does, which is still less than staging a single row."""
    return 1 <= m <= TILE_ROWS and group in GEMV_GROUPS  # no tokens: rows, which the kernels skip


def extension():
    """The compiled module (built on first use, then cached by source hash)."""
    return load_extension("qoq_w4a8", SOURCES)


@lru_cache(maxsize=None)
def is_hopper(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device)[0] == 9


@lru_cache(maxsize=None)
def _multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


@dataclass(frozen=True)
class Routing:
    """auto_variant's thresholds, one field per regime boundary. Fit to the variant sweep of
    bench/gemm_h200.py on an H200 (bench/results/gemm_h200.json); re-run it before moving one."""

    long_k: int = 8192  # from this K a GEMM counts as long: many k-steps per block
    gemv_max_m: int = 32  # non-Hopper: the GEMV (rows) up to this M
    gemv_small_max_m: int = 64  # and up to this M where N and K are both at most
    gemv_small_max_nk: int = 4096  # this (too few tiled blocks to fill the GPU)
    pdl_gemv_max_m: int = 32  # Hopper: the GEMV up to this M only as a per-group programmatic dependent
    tiled128_waves: float = 1.9  # non-Hopper: 128-row blocks from this many waves of 128x128 tiles
    wg_wave: float = 0.9  # Hopper: 128x128 tiles considered from this fraction of one wave of them
    wg_full_tile_m: int = 512  # and from this M, whose 128-token tiles are full, read each weight tile least
    wg128x128_per_sm: int = 2  # resident blocks per SM (registers) of the 128x128 tile
    wg128x64_per_sm: int = 3  # and of the 128x64 one
    wg_split_weight_long_k: float = 0.8  # a 128x128 grid just under one wave splits in two: pays at long K
    wg_split_weight: float = 1.01  # and elsewhere does not (a tie in waves goes to 128x64)
    wg_half_empty_m: int = 32  # up to this M a 64-token tile is half empty, so 128x64 tiles from
    wg_half_empty_blocks: int = 96  # this many blocks


ROUTING = Routing()


def auto_variant(m: int, n: int, k: int, group: int, multiprocessors: int, hopper: bool = False,
                 pdl: bool = False, routing: Routing = ROUTING) -> str:
    """Kernel for an [M, K] x [K, N] product; `pdl`: launched as a programmatic dependent (w4a8_gemm's
    enable_pdl, Hopper). Where tiles_for(m, group), one that reads tiles."""
    r = routing
    gemv_ok = group in GEMV_GROUPS
    gemvp_ok = gemv_ok and n * k // 2 < GEMVP_MAX_WEIGHT_BYTES
    long_k = k >= r.long_k
    one_wave = n // 32 <= multiprocessors  # the GEMVs' 32-column blocks
    if tiles_for(m, group):
        # The persistent GEMV has no partly filled last wave; in one wave the plain one starts faster,
        # except per group at long K.
        return "gemv16p" if gemvp_ok and (not one_wave or (group != -1 and long_k)) else "gemv16"
    if hopper:
        # A programmatic dependent's GEMV overlaps the kernel ahead, which keeps it ahead of the wgmma
        # tiles per group in one wave at short K.
        if pdl and gemv_ok and group != -1 and m <= r.pdl_gemv_max_m and one_wave and not long_k:
            return "gemv"
        return _wgmma_variant(m, n, k, group, multiprocessors, r)
    if gemv_ok and (m <= r.gemv_max_m or (m <= r.gemv_small_max_m and n <= r.gemv_small_max_nk
                                          and k <= r.gemv_small_max_nk)):
        return "gemv"
    # Few waves: 64-row blocks (split K under one wave); beyond, 128-row blocks, dequantizing each
    # weight fragment once per block where dequantization costs most (per group).
    if _ceil(m, 128) * _ceil(n, 128) >= r.tiled128_waves * multiprocessors:
        return "tiled128" if group == -1 else "tiled128w"
    return "tiled64w"


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _wgmma_variant(m: int, n: int, k: int, group: int, multiprocessors: int, r: Routing) -> str:
    """The Hopper tile for M > 16. The kernels split K over clusters where a grid leaves SM slots empty
    (csrc/gemm_w4a8.cu, wgmma_splits)."""
    blocks128 = _ceil(m, 128) * _ceil(n, 128)  # 128x128 tiles
    blocks64 = _ceil(m, 64) * _ceil(n, 128)  # 128x64 tiles
    if blocks128 >= r.wg_wave * multiprocessors:
        if m >= r.wg_full_tile_m and blocks64 <= r.wg128x64_per_sm * multiprocessors:
            # Under one wave of either tile with full tiles: 128x128 blocks read each weight tile half as
            # often; per channel at short K the 64x64 tile's one-LOP3 dequantization is faster still.
            return "wg64x64" if group == -1 and k < r.long_k else "wg128x128"
        # Fewest waves, a 128x128 wave taking about as long as a 128x64 one.
        split = r.wg_split_weight_long_k if blocks128 < multiprocessors and k >= r.long_k else r.wg_split_weight
        waves128 = _ceil(blocks128, r.wg128x128_per_sm * multiprocessors) * split
        return "wg128x128" if waves128 < _ceil(blocks64, r.wg128x64_per_sm * multiprocessors) else "wg128x64"
    # Per channel, where 128x64 tiles would fill one to two blocks per SM, 64x64 tiles (4 per SM, split in
    # two), for their one-LOP3 dequantization.
    if group == -1 and multiprocessors <= blocks64 < 2 * multiprocessors:
        return "wg64x64"
    # Fewer tiles: 128x64 ones (split in two under one wave) where they give a wave of blocks, or at small
    # M from enough blocks, where a 64-token tile is half empty; else 64x64 tiles of two warpgroups.
    if blocks64 >= multiprocessors or (blocks64 >= r.wg_half_empty_blocks and m <= r.wg_half_empty_m):
        return "wg128x64"
    return "wg64x64k2"


def _variant_id(variant: str, qx: torch.Tensor, m: int, n: int, k: int, group: int, pdl: bool = False) -> int:
    tiled = qx.dim() == 3
    if variant == "auto":
        variant = auto_variant(m, n, k, group, _multiprocessors(qx.device), is_hopper(qx.device), pdl)
    if variant not in VARIANTS:
        raise ValueError(f"unknown GEMM variant {variant!r}; choose 'auto' or one of {sorted(VARIANTS)}")
    if tiled and variant not in TILED_VARIANTS:
        raise ValueError(f"the {variant} variant reads qx as rows [M, K]; tiled qx goes to "
                         f"{' or '.join(TILED_VARIANTS)}")
    if variant.startswith("gemv") and (m > GEMV_MAX_M or group not in GEMV_GROUPS):
        raise ValueError(f"the {variant} variant handles M <= {GEMV_MAX_M} and groups of 64 or 128, "
                         f"got M={m}, group={group}")
    if variant == "gemv16p" and m > GEMVP_MAX_M:
        raise ValueError(f"the gemv16p variant handles M <= {GEMVP_MAX_M}, got M={m}")
    if variant == "gemv16p" and n * k // 2 >= GEMVP_MAX_WEIGHT_BYTES:
        raise ValueError(f"the gemv16p variant handles packed weights below 4 GiB, got N={n} x K={k} (N*K/2 bytes)")
    if variant.startswith("wg") and not is_hopper(qx.device):
        raise ValueError(f"the {variant} variant (wgmma) needs a Hopper GPU (sm_90), "
                         f"got sm_{''.join(map(str, torch.cuda.get_device_capability(qx.device)))}")
    return VARIANTS[variant]


def _code_sums(qx: torch.Tensor, m: int, qsum: torch.Tensor | None, variant_id: int,
               group: int) -> torch.Tensor | None:
    """The int32 [M] code sums a per-group wgmma or GEMV kernel needs: `qsum` as given, or summed here (one
    more kernel) when the caller has none; None where the kernel does not read them."""
    if group == -1 or variant_id not in BIASED_IDS:
        return None
    if qsum is None:
        rows = tiles_to_rows(qx, m) if qx.dim() == 3 else qx
        return rows.sum(dim=1, dtype=torch.int32)
    _require(qsum, "qsum", torch.int32, (m,), qx)
    return qsum


def _require(t: torch.Tensor, name: str, dtype: torch.dtype, shape: tuple, qx: torch.Tensor | None = None) -> None:
    """What the kernels read: a contiguous, 16-byte aligned CUDA tensor of this dtype and shape (on qx's
    GPU, where given: the kernels run there)."""
    if not t.is_cuda or t.dtype != dtype:
        raise ValueError(f"{name} must be a CUDA {dtype} tensor, got {t.dtype} on {t.device}")
    if qx is not None:
        same_device("qx", qx, **{name: t})
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must be {list(shape)}, got {list(t.shape)}")
    if not t.is_contiguous() or t.data_ptr() % 16:
        raise ValueError(f"{name} must be contiguous and 16-byte aligned")


def _operands(qx: torch.Tensor, qweight: torch.Tensor, s2_scales, s2_zeros,
              m: int | None = None) -> tuple[torch.Tensor, int, int]:
    """Checks qx (rows [M, K], or with `m` tiles [K/32, 32, 16]), qweight and the per-group tables; returns
    qweight as int8, the group size (-1: none) and M."""
    tiled = qx.dim() == 3
    if qx.dim() not in (2, 3) or qx.dtype != torch.int8 or qweight.dim() != 2 or qweight.element_size() != 1:
        raise ValueError(f"need qx int8 [M, K] (or tiles [K/32, 32, 16]) and qweight int8 [N, K/2], got {qx.dtype} "
                         f"{tuple(qx.shape)} and {qweight.dtype} {tuple(qweight.shape)}")
    n, k = qweight.shape[0], qweight.shape[1] * 2
    if tiled:
        if m is None or not 1 <= m <= TILE_ROWS:
            raise ValueError(f"tiled qx needs its row count M (1..{TILE_ROWS}), got {m}")
        _require(qx, "qx", torch.int8, (k // 32, 32, 16))
    else:
        m = qx.shape[0]
        if qx.shape[1] != k:
            raise ValueError(f"qweight {tuple(qweight.shape)} does not match K={qx.shape[1]} of qx")
    if k % 32 or n % 32 or k == 0:
        raise ValueError(f"N and K must be multiples of 32 (K > 0), got N={n}, K={k}")
    qweight = qweight.view(torch.int8)
    if not tiled:
        _require(qx, "qx", torch.int8, (m, k))
    _require(qweight, "qweight", torch.int8, (n, k // 2), qx)
    if (s2_scales is None) != (s2_zeros is None):
        raise ValueError("per-group weights need both s2_scales and s2_zeros")
    if s2_scales is None:
        return qweight, -1, m
    groups = s2_scales.shape[0] if s2_scales.dim() == 2 else 0
    if groups == 0 or k % groups or (k // groups) % 64:
        raise ValueError(f"s2_scales must be [K/g, {n}] with g a multiple of 64, got {list(s2_scales.shape)}")
    _require(s2_scales, "s2_scales", torch.int8, (groups, n), qx)
    _require(s2_zeros, "s2_zeros", torch.int8, (groups, n), qx)
    return qweight, k // groups, m


def _check_scheme(s2_scales, s1_szeros, xsum) -> None:
    if s2_scales is None and s1_szeros is None:
        raise ValueError("give s2_scales/s2_zeros (per group) or s1_szeros (per channel)")
    if s2_scales is not None and s1_szeros is not None:
        raise ValueError("give per-group (s2) or per-channel (s1_szeros) terms, not both")
    if s1_szeros is not None and xsum is None:
        raise ValueError("per-channel weights need xsum, the per-token sums of the unquantized input")


def w4a8_gemm(
    qx: torch.Tensor,  # int8 [M, K], or A-fragment tiles [K/32, 32, 16] of M = len(s_x) rows
    s_x: torch.Tensor,  # fp16 [M] or [M, 1]
    qweight: torch.Tensor,  # int8 [N, K/2], packed
    s1_scales: torch.Tensor,  # fp16 [N]
    *,
    s2_scales: torch.Tensor | None = None,  # int8 [K/g, N], interleaved
    s2_zeros: torch.Tensor | None = None,  # int8 [K/g, N], interleaved -z
    s1_szeros: torch.Tensor | None = None,  # fp16 [N], per channel
    xsum: torch.Tensor | None = None,  # fp32 [M], per channel
    qsum: torch.Tensor | None = None,  # int32 [M] sums of qx's rows, per group (summed here if missing)
    bias: torch.Tensor | None = None,  # fp16 [N]
    out: torch.Tensor | None = None,  # fp16 [M, N] to write into
    variant: str = "auto",
    enable_pdl: bool = False,
) -> torch.Tensor:
    """fp16 [M, N] = the GEMM of docs/design.md §3.1 (per group) or §3.2 (per channel).

    enable_pdl (Hopper; the GEMV and wgmma kernels): launch as a programmatic dependent of the kernel
    ahead in the stream, so that this launch and its first weight loads overlap that kernel's end. The
    weights and scales are read before that kernel has finished, so it must not be one that writes them
    (CudaW4A8Linear sets it: the kernel ahead is its activation quantization)."""
    s_x = s_x.reshape(-1)
    qweight, group, m = _operands(qx, qweight, s2_scales, s2_zeros, s_x.numel() if qx.dim() == 3 else None)
    _check_scheme(s2_scales, s1_szeros, xsum)
    n, k = qweight.shape[0], qweight.shape[1] * 2
    vectors = [(s_x, "s_x", torch.float16, (m,)), (s1_scales, "s1_scales", torch.float16, (n,)),
               (s1_szeros, "s1_szeros", torch.float16, (n,)), (xsum, "xsum", torch.float32, (m,)),
               (bias, "bias", torch.float16, (n,)), (out, "out", torch.float16, (m, n))]
    for t, name, dtype, shape in vectors:
        if t is not None:
            _require(t, name, dtype, shape, qx)
    variant_id = _variant_id(variant, qx, m, n, k, group, enable_pdl)
    qsum = _code_sums(qx, m, qsum, variant_id, group)
    return extension().gemm(qx, s_x, qweight, s1_scales, s2_scales, s2_zeros, s1_szeros, xsum, qsum, bias, out,
                            variant_id, enable_pdl, m if qx.dim() == 3 else 0)


def w4a8_accumulators(
    qx: torch.Tensor,
    qweight: torch.Tensor,
    *,
    s2_scales: torch.Tensor | None = None,
    s2_zeros: torch.Tensor | None = None,
    qsum: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    variant: str = "auto",
    m: int | None = None,  # rows of a tiled qx
) -> torch.Tensor:
    """Debug entry: the kernel's raw int32 accumulators Σ_k qx·W8 (W8 = q per channel) [M, N]."""
    qweight, group, m = _operands(qx, qweight, s2_scales, s2_zeros, m)
    n, k = qweight.shape[0], qweight.shape[1] * 2
    if out is not None:
        _require(out, "out", torch.int32, (m, n), qx)
    variant_id = _variant_id(variant, qx, m, n, k, group)
    qsum = _code_sums(qx, m, qsum, variant_id, group)
    return extension().gemm_accumulators(qx, qweight, s2_scales, s2_zeros, qsum, out, variant_id,
                                         m if qx.dim() == 3 else 0)
