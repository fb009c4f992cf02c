"""Paged KV4 cache: page pools per layer for K and V, sized from a byte budget, and page tables per
sequence (docs/design.md §5; page layout in attention_reference.py).

Every layer uses the same page ids: a sequence's page table indexes all layers' pools.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qoq.runtime_cuda.attention_reference import PAGE_TOKENS, page_bytes


def pages_for(num_tokens: int) -> int:
    """Pages that hold num_tokens tokens of one sequence."""
    return -(-num_tokens // PAGE_TOKENS)


@dataclass(frozen=True)
class KV4Format:
    num_layers: int
    num_kv_heads: int
    head_dim: int

    @property
    def page_bytes(self) -> int:
        """One page of one layer, K or V."""
        return page_bytes(self.num_kv_heads, self.head_dim)

    @property
    def bytes_per_token(self) -> int:
        """K and V of every layer: D/2 code bytes + fp16 scale + fp16 zero per KV head."""
        return 2 * self.num_layers * self.num_kv_heads * (self.head_dim // 2 + 4)

    def pages_for_budget(self, budget_bytes: int) -> int:
        """Whole pages (all layers, K and V) that fit in budget_bytes."""
        return budget_bytes // (2 * self.num_layers * self.page_bytes)


class PageTable:
    """Free-page list and per-sequence page lists; hands out slots (page * 64 + offset)."""

    def __init__(self, num_pages: int):
        self.num_pages = num_pages
        self._free = list(range(num_pages - 1, -1, -1))  # pop() hands out low ids first
        self._pages: dict[int, list[int]] = {}
        self._lens: dict[int, int] = {}

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def seq_len(self, seq_id: int) -> int:
        return self._lens[seq_id]

    def pages(self, seq_id: int) -> list[int]:
        return list(self._pages[seq_id])

    def alloc(self, seq_id: int, num_tokens: int) -> list[int]:
        """Start a sequence of num_tokens tokens; returns their slots."""
        if seq_id in self._pages:
            raise ValueError(f"sequence {seq_id} already has pages; free it first")
        self._pages[seq_id], self._lens[seq_id] = [], 0
        return self.append(seq_id, num_tokens)

    def append(self, seq_id: int, num_tokens: int = 1) -> list[int]:
        """Grow a sequence by num_tokens; returns the new tokens' slots. Raises when pages run out
        (nothing is allocated then)."""
        pages = self._pages.get(seq_id)
        if pages is None:
            raise KeyError(f"unknown sequence {seq_id}")
        start = self._lens[seq_id]
        if num_tokens == 1:  # a decode step: one slot, a new page every PAGE_TOKENS tokens
            page, offset = divmod(start, PAGE_TOKENS)
            if page == len(pages):
                if not self._free:
                    raise MemoryError(f"sequence {seq_id} needs 1 more page, 0 free")
                pages.append(self._free.pop())
            self._lens[seq_id] = start + 1
            return [pages[page] * PAGE_TOKENS + offset]
        needed = pages_for(start + num_tokens) - len(pages)
        if needed > len(self._free):
            raise MemoryError(f"sequence {seq_id} needs {needed} more pages, {len(self._free)} free")
        pages.extend(self._free.pop() for _ in range(needed))
        self._lens[seq_id] = start + num_tokens
        return [pages[t // PAGE_TOKENS] * PAGE_TOKENS + t % PAGE_TOKENS for t in range(start, start + num_tokens)]

    def free(self, seq_id: int) -> None:
        self._free.extend(reversed(self._pages.pop(seq_id)))
        del self._lens[seq_id]

    def block_table(self, seq_ids: list[int], device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (page_table int32 [B, max_pages] (unused entries 0), seq_lens int32 [B])."""
        width = max(1, max(len(self._pages[s]) for s in seq_ids))
        table = torch.zeros(len(seq_ids), width, dtype=torch.int32)
        for row, s in enumerate(seq_ids):
            table[row, : len(self._pages[s])] = torch.tensor(self._pages[s], dtype=torch.int32)
        lens = torch.tensor([self._lens[s] for s in seq_ids], dtype=torch.int32)
        return table.to(device), lens.to(device)


class KV4Cache:
    """Page pools for every layer, K and V: storage uint8 [num_layers, 2, num_pages, page_bytes]."""

    def __init__(self, fmt: KV4Format, budget_bytes: int, device="cuda"):
        num_pages = fmt.pages_for_budget(budget_bytes)
        if num_pages < 1:
            raise ValueError(
                f"budget of {budget_bytes} bytes holds no page ({2 * fmt.num_layers * fmt.page_bytes} bytes "
                "per page across layers, K and V)"
            )
        self.format = fmt
        self.storage = torch.empty(fmt.num_layers, 2, num_pages, fmt.page_bytes, dtype=torch.uint8, device=device)
        self.table = PageTable(num_pages)

    @property
    def num_pages(self) -> int:
        return self.storage.shape[2]

    def k_pages(self, layer: int) -> torch.Tensor:
        return self.storage[layer, 0]

    def v_pages(self, layer: int) -> torch.Tensor:
        return self.storage[layer, 1]
