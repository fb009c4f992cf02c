"""Decode-attention inputs for the GPU tests: KV4 page pools holding random sequences (built on the CPU from
a seed, so every device gets the same bytes)."""

import torch

from qoq.runtime_cuda import attention_reference as ref


def decode_inputs(lens: list[int], hkv: int, dim: int, group: int, device: str, seed: int = 0):
    """-> q [B, hkv*group, dim], k_pool, v_pool, page_table [B, pages], seq_lens [B], all on `device`: the
    sequences' pages shuffled over pools of garbage bytes, each sequence's K/V written as KV4."""
    gen = torch.Generator().manual_seed(seed)
    pages = [(n + 63) // 64 for n in lens]
    total = sum(pages) + 3
    pools = [torch.randint(0, 256, (total, ref.page_bytes(hkv, dim)), dtype=torch.uint8, generator=gen) for _ in range(2)]
    perm = torch.randperm(total, generator=gen)
    table = torch.zeros(len(lens), max(pages), dtype=torch.int32)
    start = 0
    for i, (n, p) in enumerate(zip(lens, pages)):
        ids = perm[start : start + p]
        start += p
        table[i, :p] = ids.int()
        slots = (ids[:, None] * 64 + torch.arange(64)).flatten()[:n]
        for pool in pools:
            ref.write_kv4(pool, torch.randn(n, hkv, dim, generator=gen).half(), slots)
    q = torch.randn(len(lens), hkv * group, dim, generator=gen).half()
    return [x.to(device) for x in (q, *pools, table, torch.tensor(lens, dtype=torch.int32))]
