"""Thin wrappers around the KV4 attention kernels (csrc/kv_rope_write.cu, csrc/attention_decode_kv4.cu,
csrc/kv4_read.cu),
the kernels over the fp16 artifact's pages (kv_rope_write.cu's fp16 write, csrc/attention_decode_fp16.cu)
and torch's flash-attention (variable lengths) for prefill. Contracts and layouts: attention_reference.py,
which holds a pure-torch twin of each function here.
"""

from __future__ import annotations

import itertools
import math
from functools import lru_cache

import torch
import torch.nn.functional as F

from qoq.runtime_cuda.attention_reference import PAGE_TOKENS
from qoq.runtime_cuda.build import load_extension
from qoq.runtime_cuda.devices import same_device
from qoq.runtime_cuda.split_counters import split_counters

SOURCES = ("attention_decode_kv4.cu", "attention_decode_fp16.cu", "kv_rope_write.cu", "kv4_read.cu",
           "attention_bindings.cu")
MAX_SPLITS = 64  # the kernel's combine step holds one weight per split in shared memory
SHORT_PAGES = 8
# the decode kernel's occupancy (its registers and shared memory); 3 with a k bias, which the plans ignore
CTAS_PER_SM = 4


def extension():
    return load_extension("qoq_attention", SOURCES)


@lru_cache(maxsize=None)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def split_plan(batch: int, num_kv_heads: int, max_seq_len: int, num_sms: int, num_splits: int | None = None):
    """-> (num_splits, pages_per_split). Without num_splits: a short sequence (<= SHORT_PAGES pages) is
    not split, its splits' merge costing more than they save; a longer one gets up to two (sequence, KV
    head, split) CTAs per SM where the batch alone gives fewer, at least 3 pages a split, or at least 32
    where the unsplit grid already fills half the SMs, rounded down to a power of two (at B1, 3 and 6
    splits time slower than 4). Fit to the split sweep of bench/attention_h200.py."""
    max_pages = max(1, math.ceil(max_seq_len / PAGE_TOKENS))
    if num_splits is None:
        ctas = batch * num_kv_heads
        if max_pages <= SHORT_PAGES:
            num_splits = 1
        else:
            min_pages = 3 if 2 * ctas <= num_sms else 32
            wanted = min(math.ceil(2 * num_sms / ctas), math.ceil(max_pages / min_pages))
            num_splits = 1 << (wanted.bit_length() - 1)
    num_splits = max(1, min(num_splits, MAX_SPLITS, max_pages))
    pages_per_split = math.ceil(max_pages / num_splits)
    return math.ceil(max_pages / pages_per_split), pages_per_split


def supported_stages(head_dim: int) -> tuple[int, ...]:
    """Ring slots per warp the decode kernel is built with: 3 fit shared memory only at head_dim 128."""
    return (2, 3) if head_dim == 128 else (2,)


def plan_stages(batch: int, num_kv_heads: int, num_splits: int, head_dim: int, num_sms: int) -> int:
    """Ring slots per warp of the decode kernel: three (head_dim 128 only; D = 64 chunks are twice the
    bytes) keep more copies in flight, which pays once the grid is two or more waves of CTAs, and in an
    unsplit grid of at most one CTA per SM (its 4 warps alone keep the SM's copies in flight); otherwise
    two start faster, the first burst of copies being smaller, and split CTAs have few chunks a warp
    (bench/attention_h200.py times both ring depths)."""
    ctas = batch * num_kv_heads * num_splits
    many = ctas >= 2 * CTAS_PER_SM * num_sms or (num_splits == 1 and ctas <= num_sms)
    return 3 if 3 in supported_stages(head_dim) and many else 2


def _check_head_dim(d: int) -> None:
    if d not in (64, 128):
        raise ValueError(f"head_dim {d} unsupported (64 or 128)")


def _check_group(hq: int, h_kv: int) -> None:
    """The decode kernels' GQA: query heads over KV heads, a whole group of 1..8."""
    if h_kv == 0 or hq % h_kv or hq // h_kv > 8:
        raise ValueError(f"{hq} query heads over {h_kv} KV heads: need a group size of 1..8")


def chunk_tokens(head_dim: int) -> int:
    """Tokens of one decode-kernel chunk (csrc/attention_decode_kv4.cu, Chunk::kTokens)."""
    return 16 * 256 // head_dim


def rope_fragments(cos: torch.Tensor, sin: torch.Tensor, head_dim: int) -> torch.Tensor:
    """The RoPE of a decode chunk's relative positions t = 0..chunk_tokens-1 as the k-bias mma's A fragments
    (csrc/attention_decode_k_bias.cuh): int32 [blocks, D/16 k-steps, 32 lanes, 4 words], each word a half2
    (cos, sin)(t θ_i) with, for lane 4 grp + quad, word w of k-step s in block blk: t = 16 blk + 2 grp + (w & 1)
    (the kernel's token order in a block) and pair i = quad D/8 + 2 s + (w >> 1). cos/sin [max_pos, D/2]
    fp32; rows past max_pos (never a cached key's position) are zero."""
    tokens, half = chunk_tokens(head_dim), head_dim // 2
    z = torch.zeros(tokens, half, 2, dtype=torch.float16, device=cos.device)
    rows = min(tokens, cos.shape[0])
    z[:rows, :, 0], z[:rows, :, 1] = cos[:rows], sin[:rows]
    blk, s, grp, quad, w = torch.meshgrid(*(torch.arange(n, device=cos.device) for n in
                                            (tokens // 16, head_dim // 16, 8, 4, 4)), indexing="ij")
    frag = z[16 * blk + 2 * grp + (w & 1), quad * (head_dim // 8) + 2 * s + (w >> 1)]  # [..., 8, 4, 4, 2]
    return frag.reshape(tokens // 16, head_dim // 16, 32, 4, 2).contiguous().view(torch.int32)[..., 0]


def _check_k_bias(k_bias, q: torch.Tensor, h_kv: int, max_seq_len: int) -> tuple:
    """k_bias (b, cos, sin[, fragments]) checked -> (b, cos, sin, fragments)."""
    if not isinstance(k_bias, (tuple, list)) or len(k_bias) not in (3, 4):
        raise ValueError("k_bias must be (b, cos, sin) or (b, cos, sin, rope_fragments(cos, sin, head_dim))")
    b, cos, sin = k_bias[:3]
    d = q.shape[-1]
    if b.dtype != torch.float32 or b.shape != (h_kv, d) or not b.is_contiguous():
        raise ValueError(f"k_bias b must be contiguous fp32 [{h_kv}, {d}], got {b.dtype} {tuple(b.shape)}")
    for name, x in (("cos", cos), ("sin", sin)):
        if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != d // 2 or not x.is_contiguous():
            raise ValueError(f"k_bias {name} must be contiguous fp32 [max_pos, {d // 2}], got {x.dtype} "
                             f"{tuple(x.shape)}")
    if cos.shape != sin.shape or cos.shape[0] < max_seq_len:
        raise ValueError(f"k_bias cos/sin {tuple(cos.shape)}, {tuple(sin.shape)} must be alike and cover "
                         f"max_seq_len {max_seq_len} positions")
    frags = k_bias[3] if len(k_bias) == 4 else rope_fragments(cos, sin, d)
    if frags.dtype != torch.int32 or frags.numel() != chunk_tokens(d) * d // 2 or not frags.is_contiguous():
        raise ValueError("k_bias fragments must be rope_fragments(cos, sin, head_dim)")
    same_device("q", q, k_bias=b, cos=cos, sin=sin, rope_fragments=frags)
    return b, cos, sin, frags


def decode_attention(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    scale: float | None = None,
    num_splits: int | None = None,
    num_stages: int | None = None,
    enable_pdl: bool = False,
    k_bias: tuple | None = None,
) -> torch.Tensor:
    """q [B, Hq, D] fp16, pages [P, page_bytes] uint8, page_table int32 [B, >= ceil(max_seq_len/64)],
    seq_lens int32 [B] (each in 1..max_seq_len) -> [B, Hq, D] fp16. GQA group Hq/Hkv <= 8; D 64 or 128.
    num_splits / num_stages pin the launch (default: split_plan / plan_stages).

    enable_pdl (Hopper): launch as a programmatic dependent of the kernel ahead in the stream, copying
    the sequences' first chunks while it ends. That kernel may write q and each sequence's last token
    (the decode step's rope_kv4_write), but not the page table, seq_lens or any older token.

    k_bias (b [Hkv, D] fp32, cos, sin [max_pos, D/2] fp32[, rope_fragments(cos, sin, D)]): the k bias kept
    outside the cache (design §3.4), R(p)·b added to each cached key at its position p (0..seq_len-1), as
    attention_reference.decode_attention does. Pass the fragments made once to keep them out of each call
    (and out of a CUDA graph)."""
    b, hq, d = q.shape
    _check_head_dim(d)
    h_kv = k_pages.shape[1] // (PAGE_TOKENS * (d // 2 + 4))
    _check_group(hq, h_kv)
    same_device("q", q, k_pages=k_pages, v_pages=v_pages, page_table=page_table, seq_lens=seq_lens)
    bias_args = (None,) * 4 if k_bias is None else _check_k_bias(k_bias, q, h_kv, max_seq_len)
    num_sms = _num_sms(q.device.index)  # a CUDA tensor's device always has its index
    splits, pages_per_split = split_plan(b, h_kv, max_seq_len, num_sms, num_splits)
    if num_stages is None:
        num_stages = plan_stages(b, h_kv, splits, d, num_sms)
    elif num_stages not in supported_stages(d):
        raise ValueError(f"num_stages {num_stages} unsupported for head_dim {d} (2, or 3 at head_dim 128)")
    out = torch.empty_like(q)
    part_o, part_ml, counters = _split_workspaces(q, h_kv, splits)
    scale = 1 / math.sqrt(d) if scale is None else scale
    extension().decode_kv4(
        q, k_pages, v_pages, page_table, seq_lens, out, part_o, part_ml, counters,
        h_kv, splits, pages_per_split, num_stages, scale, enable_pdl, *bias_args,
    )
    return out


def _split_workspaces(q: torch.Tensor, h_kv: int, splits: int):
    """-> (part_o, part_ml, counters) of a decode launch: each split's partial output and softmax state,
    and the counters the last split merges by; empty for an unsplit launch."""
    b, hq, d = q.shape
    if splits == 1:
        empty = torch.empty(0, dtype=torch.float32, device=q.device)
        return empty, empty, torch.empty(0, dtype=torch.int32, device=q.device)
    part_o = torch.empty(b * splits * hq * d, dtype=torch.float32, device=q.device)
    part_ml = torch.empty(b * splits * hq * 2, dtype=torch.float32, device=q.device)
    return part_o, part_ml, split_counters(q.device, b * h_kv)


def plan_stages_fp16(batch: int, num_kv_heads: int, num_splits: int, num_sms: int) -> int:
    """Ring slots per warp of the fp16 decode kernel (8 KB of K and V per chunk; two slots fit three CTAs
    per SM, three slots two). Two slots keep one chunk per warp in flight, which covers the memory latency
    once several CTAs share an SM; a grid of at most one CTA per SM gets three, its four warps alone having
    to keep the SM's copies in flight (the bench/attention_h200.py rows time both)."""
    return 3 if batch * num_kv_heads * num_splits <= num_sms else 2


def _check_fp16_pools(k_pool: torch.Tensor, v_pool: torch.Tensor, num_kv_heads: int | None, d: int) -> None:
    """One layer's fp16 pools [num_pages, 64, Hkv, D] (FloatKVCache.pools): dtype, shape, contiguity, alike."""
    heads = "Hkv" if num_kv_heads is None else num_kv_heads
    for name, pool in (("k_pool", k_pool), ("v_pool", v_pool)):
        if (pool.dtype != torch.float16 or pool.dim() != 4 or pool.shape[1] != PAGE_TOKENS or pool.shape[3] != d
                or num_kv_heads not in (None, pool.shape[2])):
            raise ValueError(f"{name} must be fp16 [num_pages, {PAGE_TOKENS}, {heads}, {d}], got {pool.dtype} "
                             f"{tuple(pool.shape)}")
        if not pool.is_contiguous():
            raise ValueError(f"{name} must be contiguous (one layer's pool of FloatKVCache.storage)")
    if k_pool.shape != v_pool.shape:
        raise ValueError(f"k_pool {tuple(k_pool.shape)} and v_pool {tuple(v_pool.shape)} differ in shape")


def decode_attention_fp16(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    scale: float | None = None,
    num_splits: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """Decode attention over the fp16 artifact's pages: q [B, Hq, D] fp16, k_pool / v_pool one layer's
    pools [num_pages, 64, Hkv, D] fp16 (qoq.engine.kv_float.FloatKVCache.pools), page_table int32
    [B, >= ceil(max_seq_len/64)], seq_lens int32 [B] (each in 1..max_seq_len) -> [B, Hq, D] fp16.
    GQA group Hq/Hkv <= 8; D 64 or 128. The launch depends on shapes and max_seq_len only (CUDA graphs);
    num_splits / num_stages (2 or 3) pin it (default: split_plan / plan_stages_fp16). Plain launch."""
    if q.dim() != 3 or q.dtype != torch.float16:
        raise ValueError(f"q must be fp16 [B, Hq, D], got {q.dtype} {tuple(q.shape)}")
    q = q.contiguous()
    b, hq, d = q.shape
    _check_head_dim(d)
    _check_fp16_pools(k_pool, v_pool, None, d)
    h_kv = k_pool.shape[2]
    _check_group(hq, h_kv)
    if page_table.dtype != torch.int32 or page_table.dim() != 2 or page_table.shape[0] != b \
            or seq_lens.dtype != torch.int32 or seq_lens.shape != (b,):
        raise ValueError(f"page_table must be int32 [{b}, P] and seq_lens int32 [{b}], got {page_table.dtype} "
                         f"{tuple(page_table.shape)} and {seq_lens.dtype} {tuple(seq_lens.shape)}")
    if max_seq_len < 1:
        raise ValueError(f"max_seq_len must be >= 1, got {max_seq_len}")
    same_device("q", q, k_pool=k_pool, v_pool=v_pool, page_table=page_table, seq_lens=seq_lens)
    num_sms = _num_sms(q.device.index)
    splits, pages_per_split = split_plan(b, h_kv, max_seq_len, num_sms, num_splits)
    if num_stages is None:
        num_stages = plan_stages_fp16(b, h_kv, splits, num_sms)
    elif num_stages not in (2, 3):
        raise ValueError(f"num_stages {num_stages} unsupported (2 or 3)")
    out = torch.empty_like(q)
    part_o, part_ml, counters = _split_workspaces(q, h_kv, splits)
    scale = 1 / math.sqrt(d) if scale is None else scale
    extension().decode_fp16(q, k_pool, v_pool, page_table.contiguous(), seq_lens.contiguous(), out,
                            part_o, part_ml, counters, splits, pages_per_split, num_stages, scale)
    return out


def _qkv_rows(qkv: torch.Tensor, num_q_heads: int, num_kv_heads: int) -> tuple[torch.Tensor, int]:
    """qkv checked -> (qkv with 16-byte aligned rows, copied if it has none; head_dim)."""
    if qkv.dim() != 2 or qkv.dtype != torch.float16:
        raise ValueError(f"qkv must be fp16 [T, (Hq + 2 Hkv) * D], got {qkv.dtype} {tuple(qkv.shape)}")
    heads = num_q_heads + 2 * num_kv_heads
    if num_kv_heads < 1 or num_q_heads < 1 or qkv.shape[1] % heads:
        raise ValueError(f"qkv width {qkv.shape[1]} is not a multiple of Hq + 2 Hkv = {heads}")
    d = qkv.shape[1] // heads
    _check_head_dim(d)
    if qkv.stride(1) != 1 or qkv.stride(0) % 8 or qkv.data_ptr() % 16:
        qkv = qkv.clone(memory_format=torch.contiguous_format)
    return qkv, d


def rope_kv4_write(qkv, positions, slots, cos, sin, k_pages, v_pages, num_q_heads: int, num_kv_heads: int):
    """qkv [T, (Hq + 2 Hkv) * D] fp16, positions/slots int64 [T], cos/sin fp32 [max_pos, D/2] ->
    (q [T, Hq, D], k [T, Hkv, D]) after RoPE; K (post-RoPE) and V go to their pages as KV4."""
    same_device("qkv", qkv, positions=positions, slot_mapping=slots, cos=cos, sin=sin, k_pages=k_pages, v_pages=v_pages)
    qkv, d = _qkv_rows(qkv, num_q_heads, num_kv_heads)
    t = qkv.shape[0]
    q = torch.empty(t, num_q_heads, d, dtype=qkv.dtype, device=qkv.device)
    k = torch.empty(t, num_kv_heads, d, dtype=qkv.dtype, device=qkv.device)
    extension().rope_kv4_write(qkv, positions, slots, cos, sin, q, k, k_pages, v_pages)
    return q, k


def rope_kv_write_fp16(qkv, positions, slots, cos, sin, k_pool, v_pool, num_q_heads: int, num_kv_heads: int,
                       enable_pdl: bool = False) -> torch.Tensor:
    """The fp16 path's RoPE and KV write in one kernel (csrc/kv_rope_write.cu, the KV4 write's structure):
    qkv [T, (Hq + 2 Hkv) * D] fp16, positions/slots int64 [T], cos/sin fp32 [max_pos, D/2], k_pool / v_pool
    one layer's pools [num_pages, 64, Hkv, D] fp16 (qoq.engine.kv_float.FloatKVCache.pools) -> q [T, Hq, D]
    after RoPE; K (post-RoPE) and V written to the pools at slots (< 0: skipped). Reference:
    attention_reference.rope_kv_write_fp16. enable_pdl (Hopper): a programmatic dependent of the kernel ahead
    (the qkv GEMM), reading nothing before its wait."""
    qkv, d = _qkv_rows(qkv, num_q_heads, num_kv_heads)
    t = qkv.shape[0]
    _check_fp16_pools(k_pool, v_pool, num_kv_heads, d)
    for name, x in (("positions", positions), ("slots", slots)):
        if x.dtype != torch.int64 or x.shape != (t,):
            raise ValueError(f"{name} must be int64 [{t}], got {x.dtype} {tuple(x.shape)}")
    for name, x in (("cos", cos), ("sin", sin)):
        if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != d // 2 or not x.is_contiguous():
            raise ValueError(f"{name} must be contiguous fp32 [max_pos, {d // 2}], got {x.dtype} {tuple(x.shape)}")
    same_device("qkv", qkv, positions=positions, slot_mapping=slots, cos=cos, sin=sin, k_pool=k_pool, v_pool=v_pool)
    q = torch.empty(t, num_q_heads, d, dtype=qkv.dtype, device=qkv.device)
    extension().rope_kv_write_fp16(qkv, positions.contiguous(), slots.contiguous(), cos, sin, q, k_pool, v_pool,
                                   enable_pdl)
    return q


def read_kv4_slots(k_pages, v_pages, page, offset, num_kv_heads: int, head_dim: int):
    """One layer's K and V at slots page * 64 + offset (int64 [T] each, any pages and order) -> k, v
    [T, Hkv, D] fp16, dequantized (csrc/kv4_read.cu, one launch for both): the values of
    attention_reference.read_kv4_slots followed by qoq.quant.kv.dequantize_kv, bit for bit."""
    same_device("k_pages", k_pages, v_pages=v_pages, page=page, offset=offset)
    if page.dtype != torch.int64 or offset.dtype != torch.int64 or page.shape != offset.shape or page.dim() != 1:
        raise ValueError(f"page and offset must be int64 [T], got {page.dtype} {tuple(page.shape)} and "
                         f"{offset.dtype} {tuple(offset.shape)}")
    if head_dim % 8:
        raise ValueError(f"head_dim must be a multiple of 8, got {head_dim}")
    t = page.shape[0]
    k = torch.empty(t, num_kv_heads, head_dim, dtype=torch.float16, device=k_pages.device)
    v = torch.empty_like(k)
    extension().kv4_read(k_pages, v_pages, page.contiguous(), offset.contiguous(), k, v)
    return k, v


def prefill_attention(q, k, v, seq_lens: list[int], scale: float | None = None) -> torch.Tensor:
    """Causal attention over packed prompts: q [T, Hq, D], k/v [T, Hkv, D] fp16, T = sum(seq_lens).
    An honest wrapper around torch's kernels, whichever measured faster on H200: prompts of one
    length go through F.scaled_dot_product_attention (cuDNN/flash, [B, H, L, D] views, no copy);
    ragged batches through flash-attention's variable-length kernel (GQA native, no padding)."""
    t, hq, d = q.shape
    if sum(seq_lens) != t:
        raise ValueError(f"seq_lens sum to {sum(seq_lens)}, q has {t} tokens")
    if len(set(seq_lens)) == 1:
        b, n = len(seq_lens), seq_lens[0]
        qb, kb, vb = (x.view(b, n, x.shape[1], d).transpose(1, 2) for x in (q, k, v))
        out = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, scale=scale, enable_gqa=k.shape[1] != hq)
        return out.transpose(1, 2).reshape(t, hq, d)
    cu = torch.tensor([0, *itertools.accumulate(seq_lens)], dtype=torch.int32).to(q.device, non_blocking=True)
    n = max(seq_lens)
    return torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, n, n, 0.0, True, False, scale=scale)[0]


def chunk_attention(q, k, v, cu_q: torch.Tensor, cu_k: torch.Tensor, max_q: int, max_k: int,
                    scale: float | None = None) -> torch.Tensor:
    """Causal attention of packed prefill chunks over their packed contexts: q [Tq, Hq, D], k/v [Tk, Hkv, D]
    fp16, cu_q/cu_k int32 [n + 1] on the device; chunk i's q_len queries are the last of its k_len keys
    (the mask aligned bottom right, as flash-attention does when the lengths differ) -> [Tq, Hq, D].
    torch's flash-attention variable-length kernel: GQA native, no padding, one launch for the step."""
    same_device("q", q, k=k, v=v, cu_q=cu_q, cu_k=cu_k)
    return torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, max_q, max_k, 0.0, True, False,
                                                   scale=scale)[0]
