"""Page accounting for the paged KV cache: PAGE_TOKENS-token pages shared by all layers (a sequence's page
ids index every layer's K and V pools), handed out by runtime_cuda.kv_cache.PageTable.

The last page of the pool is never handed out: it is the scratch page the CUDA runner's padded decode
slots write to (and read from).
"""

from __future__ import annotations

from qoq.runtime_cuda.kv_cache import PageTable, pages_for

__all__ = ["BlockManager", "pages_for"]


class BlockManager:
    def __init__(self, num_pages: int):
        if num_pages < 2:
            raise ValueError(f"the KV budget holds {num_pages} page(s); the engine needs at least 2 "
                             "(one is the padding scratch page)")
        self.num_pages = num_pages - 1  # pages sequences may hold
        self.scratch_page = num_pages - 1
        self.table = PageTable(self.num_pages)

    @property
    def num_free_pages(self) -> int:
        return self.table.free_pages

    def has(self, seq_id: int) -> bool:
        return seq_id in self.table._pages

    def num_tokens(self, seq_id: int) -> int:
        return self.table.seq_len(seq_id) if self.has(seq_id) else 0

    def pages_needed(self, seq_id: int, num_tokens: int) -> int:
        """New pages a sequence needs to grow by num_tokens."""
        if not self.has(seq_id):
            return pages_for(num_tokens)
        held = len(self.table._pages[seq_id])
        return max(0, pages_for(self.table.seq_len(seq_id) + num_tokens) - held)

    def can_allocate(self, seq_id: int, num_tokens: int) -> bool:
        return self.pages_needed(seq_id, num_tokens) <= self.num_free_pages

    def allocate(self, seq_id: int, num_tokens: int) -> list[int]:
        """Start (or grow) a sequence by num_tokens; returns their slots (page * 64 + offset)."""
        if not self.has(seq_id):
            return self.table.alloc(seq_id, num_tokens)
        return self.table.append(seq_id, num_tokens)

    def append_slot(self, seq_id: int) -> int:
        """One more token (a decode step); returns its slot."""
        return self.table.append(seq_id, 1)[0]

    def pages(self, seq_id: int) -> list[int]:
        return self.table.pages(seq_id)

    def free(self, seq_id: int) -> None:
        if self.has(seq_id):
            self.table.free(seq_id)
