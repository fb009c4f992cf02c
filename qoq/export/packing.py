"""qweight packing in compute-order 32x32 tiles and the s2 interleave (docs/design.md §4).

Two forms of the same packing: the reshape/permute form (what runtimes implement) and the
closed-form index formula (what the kernels read); tests check they agree byte for byte.
"""

from __future__ import annotations

import torch

# Q.reshape(N/32, 2, 2, 8, K/32, 2, 4, 4): axes (n0, a, b, c, k0, d, e, f) with
# row n = 32*n0 + 16*a + 8*b + c and column k = 32*k0 + 16*d + 4*e + f.
_TILE_SHAPE = (2, 2, 8)  # (a, b, c) inside a 32-row block
_TILE_COLS = (2, 4, 4)  # (d, e, f) inside a 32-column block
_PACK_ORDER = (0, 4, 3, 6, 5, 2, 7, 1)  # -> (n0, k0, c, e, d, b, f, a)
_UNPACK_ORDER = (0, 7, 5, 2, 1, 4, 3, 6)  # inverse permutation of _PACK_ORDER


def _check_tile_shape(n: int, k: int) -> None:
    if n % 32 or k % 32:
        raise ValueError(f"qweight packing needs N and K multiples of 32, got N={n}, K={k}")


def _check_codes(q: torch.Tensor) -> None:
    if q.dim() != 2 or q.dtype != torch.uint8:
        raise ValueError(f"expected uint8 codes [N, K], got {q.dtype} {tuple(q.shape)}")
    _check_tile_shape(*q.shape)
    if q.numel() and int(q.max()) > 15:
        raise ValueError(f"4-bit codes must be in 0..15, found {int(q.max())}")


def pack_qweight(q: torch.Tensor) -> torch.Tensor:
    """uint8 codes [N, K] in 0..15 -> int8 bytes [N, K/2] (reshape/permute form)."""
    _check_codes(q)
    n, k = q.shape
    tiles = q.reshape(n // 32, *_TILE_SHAPE, k // 32, *_TILE_COLS).permute(_PACK_ORDER)
    packed = tiles[..., 0] | (tiles[..., 1] << 4)  # [N/32, K/32, 8, 4, 2, 2, 4] uint8
    return packed.reshape(n, k // 2).view(torch.int8)


def _closed_form_sources(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For every byte p of the packed tensor: (row of its low nibble, column)."""
    p = torch.arange(n * k // 2)
    tile, r = p // 512, p % 512
    n0, k0 = tile // (k // 32), tile % (k // 32)
    lane, w = r // 16, r % 16  # byte = tile*512 + (4c+e)*16 + 8d + 4b + f
    c, e = lane // 4, lane % 4
    d, b, f = w // 8, (w // 4) % 2, w % 4
    return 32 * n0 + 8 * b + c, 32 * k0 + 16 * d + 4 * e + f


def pack_qweight_closed_form(q: torch.Tensor) -> torch.Tensor:
    """Same bytes as pack_qweight, from the closed-form index formula of docs/design.md §4."""
    _check_codes(q)
    n, k = q.shape
    row_lo, col = _closed_form_sources(n, k)
    packed = q[row_lo, col] | (q[row_lo + 16, col] << 4)  # [N*K/2] uint8
    return packed.reshape(n, k // 2).view(torch.int8)


def unpack_qweight(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """int8 bytes [N, K/2] -> uint8 codes [N, K]; the inverse of pack_qweight."""
    _check_tile_shape(n, k)
    if tuple(packed.shape) != (n, k // 2) or packed.element_size() != 1:
        raise ValueError(
            f"packed qweight must be 1-byte [{n}, {k // 2}], got {packed.dtype} {tuple(packed.shape)}"
        )
    b = packed.contiguous().view(torch.uint8).reshape(n // 32, k // 32, 8, 4, 2, 2, 4)
    nibbles = torch.stack((b & 15, b >> 4), dim=-1)  # [..., a] axes (n0, k0, c, e, d, b, f, a)
    return nibbles.permute(_UNPACK_ORDER).reshape(n, k).contiguous()


def interleave_s2(x: torch.Tensor) -> torch.Tensor:
    """Logical [N, K/g] -> stored [K/g, N]: stored column 32*n0 + 4c + j holds row 32*n0 + 8j + c."""
    n, groups = x.shape
    if n % 32:
        raise ValueError(f"s2 interleave needs N a multiple of 32, got N={n}")
    by_j_c = x.t().reshape(groups, n // 32, 4, 8)  # axes (group, n0, j, c)
    return by_j_c.transpose(2, 3).reshape(groups, n).contiguous()


def deinterleave_s2(x: torch.Tensor) -> torch.Tensor:
    """Stored [K/g, N] -> logical [N, K/g]; the inverse of interleave_s2."""
    groups, n = x.shape
    if n % 32:
        raise ValueError(f"s2 interleave needs N a multiple of 32, got N={n}")
    by_c_j = x.reshape(groups, n // 32, 8, 4)  # axes (group, n0, c, j)
    return by_c_j.transpose(2, 3).reshape(groups, n).t().contiguous()
