"""Thin wrappers around the KV4 attention kernels (csrc/kv_rope_write.cu, csrc/attention_decode_kv4.cu)
and torch's flash-attention (variable lengths) for prefill. Contracts and layouts:
attention_reference.py, which holds a pure-torch twin of each function here.
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

SOURCES = ("attention_decode_kv4.cu", "kv_rope_write.cu", "attention_bindings.cu")
MAX_SPLITS = 64  # the kernel's combine step holds one weight per split in shared memory
SHORT_PAGES = 8
CTAS_PER_SM = 4  # the decode kernel's occupancy (its registers and shared memory)


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
) -> torch.Tensor:
    """q [B, Hq, D] fp16, pages [P, page_bytes] uint8, page_table int32 [B, >= ceil(max_seq_len/64)],
    seq_lens int32 [B] (each in 1..max_seq_len) -> [B, Hq, D] fp16. GQA group Hq/Hkv <= 8; D 64 or 128.
    num_splits / num_stages pin the launch (default: split_plan / plan_stages).

    enable_pdl (Hopper): launch as a programmatic dependent of the kernel ahead in the stream, copying
    the sequences' first chunks while it ends. That kernel may write q and each sequence's last token
    (the decode step's rope_kv4_write), but not the page table, seq_lens or any older token."""
    b, hq, d = q.shape
    if d not in (64, 128):
        raise ValueError(f"head_dim {d} unsupported (64 or 128)")
    h_kv = k_pages.shape[1] // (PAGE_TOKENS * (d // 2 + 4))
    if h_kv == 0 or hq % h_kv or hq // h_kv > 8:
        raise ValueError(f"{hq} query heads over {h_kv} KV heads: need a group size of 1..8")
    same_device("q", q, k_pages=k_pages, v_pages=v_pages, page_table=page_table, seq_lens=seq_lens)
    num_sms = _num_sms(q.device.index)  # a CUDA tensor's device always has its index
    splits, pages_per_split = split_plan(b, h_kv, max_seq_len, num_sms, num_splits)
    if num_stages is None:
        num_stages = plan_stages(b, h_kv, splits, d, num_sms)
    elif num_stages not in supported_stages(d):
        raise ValueError(f"num_stages {num_stages} unsupported for head_dim {d} (2, or 3 at head_dim 128)")
    out = torch.empty_like(q)
    group = hq // h_kv
    if splits > 1:
        part_o = torch.empty(b * h_kv * splits * group * d, dtype=torch.float32, device=q.device)
        part_ml = torch.empty(b * h_kv * splits * group * 2, dtype=torch.float32, device=q.device)
        counters = split_counters(q.device, b * h_kv)
    else:
        part_o = part_ml = torch.empty(0, dtype=torch.float32, device=q.device)
        counters = torch.empty(0, dtype=torch.int32, device=q.device)
    scale = 1 / math.sqrt(d) if scale is None else scale
    extension().decode_kv4(
        q, k_pages, v_pages, page_table, seq_lens, out, part_o, part_ml, counters,
        h_kv, splits, pages_per_split, num_stages, scale, enable_pdl,
    )
    return out


def rope_kv4_write(qkv, positions, slots, cos, sin, k_pages, v_pages, num_q_heads: int, num_kv_heads: int):
    """qkv [T, (Hq + 2 Hkv) * D] fp16, positions/slots int64 [T], cos/sin fp32 [max_pos, D/2] ->
    (q [T, Hq, D], k [T, Hkv, D]) after RoPE; K (post-RoPE) and V go to their pages as KV4."""
    same_device("qkv", qkv, positions=positions, slot_mapping=slots, cos=cos, sin=sin, k_pages=k_pages, v_pages=v_pages)
    t, width = qkv.shape
    d = width // (num_q_heads + 2 * num_kv_heads)
    q = torch.empty(t, num_q_heads, d, dtype=qkv.dtype, device=qkv.device)
    k = torch.empty(t, num_kv_heads, d, dtype=qkv.dtype, device=qkv.device)
    extension().rope_kv4_write(qkv, positions, slots, cos, sin, q, k, k_pages, v_pages)
    return q, k


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
