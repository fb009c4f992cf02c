"""Pure-torch references of the paged-attention kernels, with the same contracts (docs/design.md §3.4,
§3.5, §5). They run on CPU in CI; GPU tests compare the CUDA kernels against them.

KV4 page layout (one layer, K or V, PAGE_TOKENS tokens): `[H_kv][64][D/2]` nibble codes (element d in
the low nibble when d is even), then fp16 scale `[H_kv][64]`, then fp16 zero `[H_kv][64]`.
A page pool is a uint8 tensor `[num_pages, page_bytes]`; a slot is `page * 64 + offset`.
The fp16 artifact's pools (decode_attention_fp16) are `[num_pages, 64, H_kv, D]` in the activations' dtype,
with the same page ids and slots.
"""

from __future__ import annotations

import math

import torch

from qoq.quant.kv import dequantize_kv, quantize_kv

PAGE_TOKENS = 64


def page_bytes(num_kv_heads: int, head_dim: int) -> int:
    """Bytes of one page: codes (D/2 per token and head) plus fp16 scale and zero."""
    if head_dim % 2:
        raise ValueError(f"head_dim must be even, got {head_dim}")
    return num_kv_heads * PAGE_TOKENS * (head_dim // 2 + 4)


def page_views(pages: torch.Tensor, num_kv_heads: int, head_dim: int):
    """pages [P, page_bytes] uint8 -> views codes [P, H, 64, D/2], scale [P, H, 64], zero [P, H, 64]."""
    if pages.dtype != torch.uint8 or pages.dim() != 2:
        raise ValueError(f"pages must be uint8 [P, page_bytes], got {pages.dtype} {tuple(pages.shape)}")
    if pages.shape[1] != page_bytes(num_kv_heads, head_dim):
        raise ValueError(
            f"page has {pages.shape[1]} bytes; {num_kv_heads} heads x head_dim {head_dim} need "
            f"{page_bytes(num_kv_heads, head_dim)}"
        )
    n, h = pages.shape[0], num_kv_heads
    code_bytes = h * PAGE_TOKENS * head_dim // 2
    codes = pages[:, :code_bytes].view(n, h, PAGE_TOKENS, head_dim // 2)
    scale = pages[:, code_bytes : code_bytes + 2 * h * PAGE_TOKENS].view(torch.float16).view(n, h, PAGE_TOKENS)
    zero = pages[:, code_bytes + 2 * h * PAGE_TOKENS :].view(torch.float16).view(n, h, PAGE_TOKENS)
    return codes, scale, zero


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """codes uint8 [..., D] in 0..15 -> bytes [..., D/2], element d in the low nibble when d is even."""
    return q[..., 0::2] | (q[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """bytes [..., D/2] -> codes uint8 [..., D]."""
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)


def write_kv4(pages: torch.Tensor, x: torch.Tensor, slots: torch.Tensor) -> None:
    """Quantize x [T, H_kv, D] per token and head (§3.4) and store it at slots [T] (< 0: skipped)."""
    t, h, d = x.shape
    codes, scale, zero = page_views(pages, h, d)
    keep = slots >= 0
    q, s, z = quantize_kv(x[keep])  # [T', H, D], [T', H, 1], [T', H, 1]
    page, off = slots[keep] // PAGE_TOKENS, slots[keep] % PAGE_TOKENS
    codes[page, :, off] = pack_nibbles(q)
    scale[page, :, off] = s[..., 0]
    zero[page, :, off] = z[..., 0]


def read_kv4(pages: torch.Tensor, page_ids: torch.Tensor, length: int, num_kv_heads: int, head_dim: int):
    """The first `length` tokens of a sequence stored in pages page_ids [n] ->
    (codes uint8 [H, L, D], scale fp16 [H, L, 1], zero fp16 [H, L, 1]), as quantize_kv returns them."""
    if length > len(page_ids) * PAGE_TOKENS:
        raise ValueError(f"length {length} exceeds the {len(page_ids)} pages given")
    codes, scale, zero = page_views(pages, num_kv_heads, head_dim)
    ids = page_ids.long()
    q = unpack_nibbles(codes[ids].transpose(0, 1).flatten(1, 2)[:, :length])  # [H, L, D]
    s = scale[ids].transpose(0, 1).flatten(1, 2)[:, :length, None]
    z = zero[ids].transpose(0, 1).flatten(1, 2)[:, :length, None]
    return q, s, z


def read_kv4_slots(pages: torch.Tensor, page: torch.Tensor, offset: torch.Tensor, num_kv_heads: int, head_dim: int):
    """The tokens at slots page * 64 + offset (int64 [T] each; any pages, any order) -> (codes uint8 [T, H, D],
    scale fp16 [T, H, 1], zero fp16 [T, H, 1]): read_kv4's values, token-major, in one gather per tensor."""
    codes, scale, zero = page_views(pages, num_kv_heads, head_dim)
    return unpack_nibbles(codes[page, :, offset]), scale[page, :, offset][..., None], zero[page, :, offset][..., None]


def apply_rope(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE: x [T, H, D], positions [T], cos/sin [max_pos, D/2] fp32 -> x's dtype.
    fp32 math, one rounding per op (the kernel matches it exactly): x1*c - x2*s, x2*c + x1*s."""
    half = x.shape[-1] // 2
    xf = x.float()
    c, s = cos[positions][:, None, :], sin[positions][:, None, :]  # [T, 1, D/2]
    x1, x2 = xf[..., :half], xf[..., half:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)


def rotated_k_bias(b: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """R(p)·b [T, Hkv, D] fp32: a k bias b [Hkv, D] kept outside the KV4 cache (design §3.4), rotated to each
    cached key's position."""
    return apply_rope(b.expand(positions.shape[0], *b.shape), positions, cos, sin)


def rope_kv4_write(qkv, positions, slots, cos, sin, k_pages, v_pages, num_q_heads: int, num_kv_heads: int):
    """qkv [T, (Hq + 2 Hkv) * D] fp16 -> (q [T, Hq, D], k [T, Hkv, D]) after RoPE; writes K (post-RoPE)
    and V to their pages at slots [T]."""
    q, k, v = _rope_qkv(qkv, positions, cos, sin, num_q_heads, num_kv_heads)
    write_kv4(k_pages, k, slots)
    write_kv4(v_pages, v, slots)
    return q, k


def _rope_qkv(qkv, positions, cos, sin, num_q_heads: int, num_kv_heads: int):
    """qkv [T, (Hq + 2 Hkv) * D] -> q [T, Hq, D] and k [T, Hkv, D] after RoPE, v [T, Hkv, D] as is."""
    t = qkv.shape[0]
    d = qkv.shape[1] // (num_q_heads + 2 * num_kv_heads)
    heads = qkv.view(t, num_q_heads + 2 * num_kv_heads, d)
    q = apply_rope(heads[:, :num_q_heads], positions, cos, sin)
    k = apply_rope(heads[:, num_q_heads : num_q_heads + num_kv_heads], positions, cos, sin)
    return q, k, heads[:, num_q_heads + num_kv_heads :]


def write_kv_fp16(pool: torch.Tensor, x: torch.Tensor, slots: torch.Tensor) -> None:
    """x [T, H_kv, D] into an fp16 artifact's pool [num_pages, 64, H_kv, D] at slots [T] (< 0: skipped), in
    the pool's dtype."""
    keep = slots >= 0
    pool.view(-1, *pool.shape[2:])[slots[keep]] = x[keep].to(pool.dtype)


def rope_kv_write_fp16(qkv, positions, slots, cos, sin, k_pool, v_pool, num_q_heads: int, num_kv_heads: int):
    """qkv [T, (Hq + 2 Hkv) * D] -> q [T, Hq, D] after RoPE; writes K (post-RoPE) and V to one layer's pools
    [num_pages, 64, Hkv, D] (FloatKVCache.pools) at slots [T]. q and K are rounded to qkv's dtype."""
    q, k, v = _rope_qkv(qkv, positions, cos, sin, num_q_heads, num_kv_heads)
    write_kv_fp16(k_pool, k, slots)
    write_kv_fp16(v_pool, v, slots)
    return q


def softmax_attention(q, k, v, scale: float, causal: bool) -> torch.Tensor:
    """fp32 attention, q [Hq, Tq, D], k/v [Hkv, Tk, D] (GQA: query head i uses KV head i // G)."""
    group = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(group, 0).float(), v.repeat_interleave(group, 0).float()
    scores = q.float() @ k.transpose(1, 2) * scale  # [Hq, Tq, Tk]
    if causal:
        tq, tk = scores.shape[1:]
        future = torch.ones(tq, tk, dtype=torch.bool, device=q.device).triu(tk - tq + 1)
        scores = scores.masked_fill(future, float("-inf"))
    return scores.softmax(-1) @ v


def decode_attention(q, k_pages, v_pages, page_table, seq_lens, scale: float | None = None,
                     k_bias: tuple | None = None) -> torch.Tensor:
    """q [B, Hq, D] fp16; page_table [B, max_pages]; seq_lens [B] -> [B, Hq, D] fp16: softmax attention
    over the dequantized KV4 pages of each sequence (fp32 math). k_bias (b [Hkv, D] fp32, cos, sin): the
    k bias kept outside the cache (design §3.4), R(p)·b added to each cached key at its position p."""
    b, _, d = q.shape
    h_kv = k_pages.shape[1] // (PAGE_TOKENS * (d // 2 + 4))
    scale = 1 / math.sqrt(d) if scale is None else scale
    out = torch.empty_like(q)
    for i in range(b):
        n = int(seq_lens[i])
        ids = page_table[i, : math.ceil(n / PAGE_TOKENS)]
        k = dequantize_kv(*read_kv4(k_pages, ids, n, h_kv, d), dtype=torch.float32)  # [Hkv, L, D]
        if k_bias is not None:  # a sequence's cached tokens sit at positions 0..n-1
            k = k + rotated_k_bias(k_bias[0], torch.arange(n, device=k.device), *k_bias[1:]).transpose(0, 1)
        v = dequantize_kv(*read_kv4(v_pages, ids, n, h_kv, d), dtype=torch.float32)
        out[i] = softmax_attention(q[i, :, None], k, v, scale, causal=False)[:, 0].to(q.dtype)
    return out


def decode_attention_fp16(q, k_pool, v_pool, page_table, seq_lens, scale: float | None = None) -> torch.Tensor:
    """q [B, Hq, D]; k_pool / v_pool [num_pages, 64, Hkv, D] (one layer of FloatKVCache); page_table [B, P];
    seq_lens [B] (1..P*64) -> [B, Hq, D] in q's dtype: exact softmax attention of each sequence over the
    first seq_lens tokens of its pages (fp32 math), the rest of the gathered pages masked out. Static
    shapes, no host synchronization."""
    b, hq, d = q.shape
    h_kv = k_pool.shape[2]
    scale = 1 / math.sqrt(d) if scale is None else scale
    ids = page_table.long()
    k = k_pool[ids].flatten(1, 2).float()  # [B, P*64, Hkv, D]
    v = v_pool[ids].flatten(1, 2).float()
    valid = torch.arange(k.shape[1], device=q.device)[None, :] < seq_lens.to(q.device).long()[:, None]  # [B, L]
    v = v.masked_fill(~valid[:, :, None, None], 0.0)  # what lies past a sequence (NaN too) must not meet p = 0
    qg = q.float().view(b, h_kv, hq // h_kv, d)  # query head i uses KV head i // G
    scores = torch.einsum("bhgd,blhd->bhgl", qg, k) * scale
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    out = torch.einsum("bhgl,blhd->bhgd", scores.softmax(-1), v)
    return out.reshape(b, hq, d).to(q.dtype)


def prefill_attention(q, k, v, cu_seqlens, scale: float | None = None) -> torch.Tensor:
    """Causal attention per sequence over packed tokens: q [T, Hq, D], k/v [T, Hkv, D] fp16,
    cu_seqlens [B + 1] -> [T, Hq, D] (fp32 math)."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    out = torch.empty_like(q)
    bounds = cu_seqlens.tolist()
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        o = softmax_attention(q[lo:hi].transpose(0, 1), k[lo:hi].transpose(0, 1), v[lo:hi].transpose(0, 1), scale, True)
        out[lo:hi] = o.transpose(0, 1).to(q.dtype)
    return out
