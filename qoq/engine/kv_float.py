"""Unquantized paged KV (the fp16 artifact's cache): per layer, K and V pools of PAGE_TOKENS-token pages,
storage [num_layers, 2, num_pages, 64, H_kv, D] in fp16 (GPU) or fp32 (the CPU reference), written at the
tokens' slots. Same page ids and slots as the KV4 cache."""

from __future__ import annotations

import torch

from qoq.runtime_cuda.attention_reference import PAGE_TOKENS, write_kv_fp16


class FloatKVCache:
    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, budget_bytes: int,
                 dtype: torch.dtype = torch.float16, device="cuda"):
        elem = torch.empty((), dtype=dtype).element_size()
        per_page = 2 * num_layers * PAGE_TOKENS * num_kv_heads * head_dim * elem
        self.num_pages = budget_bytes // per_page
        if self.num_pages < 1:
            raise ValueError(f"budget of {budget_bytes} bytes holds no page ({per_page} bytes per page)")
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        self.storage = torch.zeros(num_layers, 2, self.num_pages, PAGE_TOKENS, num_kv_heads, head_dim,
                                   dtype=dtype, device=device)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        """k, v [T, H_kv, D] at slots int64 [T] (the reference runner; the CUDA runner writes its pages with
        RoPE in one kernel: rope_kv_write_fp16)."""
        for pool, x in zip(self.pools(layer), (k, v)):
            write_kv_fp16(pool, x, slots)

    def read(self, layer: int, page_ids: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first `length` tokens of a sequence -> k, v [H_kv, L, D]."""
        k, v = (self.storage[layer, i][page_ids].flatten(0, 1)[:length].transpose(0, 1) for i in (0, 1))
        return k, v

    def gather(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The tokens at `slots` int64 [T] -> k, v [T, H_kv, D]."""
        return tuple(self.storage[layer, i].view(-1, self.num_kv_heads, self.head_dim)[slots] for i in (0, 1))

    def pools(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's K and V pools [num_pages, 64, H_kv, D] (views; what decode attention reads)."""
        return self.storage[layer, 0], self.storage[layer, 1]
