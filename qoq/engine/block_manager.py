"""Page accounting for the paged KV cache: PAGE_TOKENS-token pages shared by all layers (a sequence's page
ids index every layer's K and V pools), handed out by runtime_cuda.kv_cache.PageTable.

The last page of the pool is never handed out: it is the scratch page the CUDA runner's padded decode
slots write to (and read from).

Beside the page lists, every sequence holding pages owns a row of `page_rows`, an int32 array that
mirrors its pages (the scratch page beyond them), written as pages are added. A step's page table is
then one gather of rows (`page_table`), not a tensor built from every sequence's list at every step.
"""

from __future__ import annotations

import numpy as np

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
        self.page_lists = self.table._pages  # seq id -> its page list (the PageTable's own: read only)
        self.rows: dict[int, int] = {}  # seq id -> its row of page_rows
        self._free_rows: list[int] = []
        self.page_rows = np.full((8, 8), self.scratch_page, dtype=np.int32)  # grows by doubling
        self.row_pages = np.zeros(8, dtype=np.int32)  # pages each row holds

    @property
    def num_free_pages(self) -> int:
        return self.table.free_pages

    def has(self, seq_id: int) -> bool:
        return seq_id in self.page_lists

    def num_tokens(self, seq_id: int) -> int:
        return self.table.seq_len(seq_id) if self.has(seq_id) else 0

    def pages_needed(self, seq_id: int, num_tokens: int) -> int:
        """New pages a sequence needs to grow by num_tokens."""
        if not self.has(seq_id):
            return pages_for(num_tokens)
        held = len(self.page_lists[seq_id])
        return max(0, pages_for(self.table.seq_len(seq_id) + num_tokens) - held)

    def can_allocate(self, seq_id: int, num_tokens: int) -> bool:
        return self.pages_needed(seq_id, num_tokens) <= self.num_free_pages

    def allocate(self, seq_id: int, num_tokens: int) -> list[int]:
        """Start (or grow) a sequence by num_tokens; returns their slots (page * 64 + offset)."""
        pages = self.page_lists.get(seq_id)
        if pages is None:
            self.rows[seq_id] = self._take_row()  # first: free() releases it if alloc raises
            slots = self.table.alloc(seq_id, num_tokens)
            self._mirror(seq_id, 0)
            return slots
        held = len(pages)
        slots = self.table.append(seq_id, num_tokens)
        if len(pages) != held:
            self._mirror(seq_id, held)
        return slots

    def grow(self, seq_id: int, num_tokens: int) -> list[int] | None:
        """Grow a sequence that holds pages by num_tokens: their slots, or None (and nothing allocated)
        when too few pages are free."""
        pages = self.page_lists[seq_id]
        held = len(pages)
        try:
            slots = self.table.append(seq_id, num_tokens)
        except MemoryError:
            return None
        if len(pages) != held:
            self._mirror(seq_id, held)
        return slots

    def append_slot(self, seq_id: int) -> int:
        """One more token (a decode step); returns its slot."""
        return self.allocate(seq_id, 1)[0]

    def pages(self, seq_id: int) -> list[int]:
        return self.table.pages(seq_id)

    def page_table(self, rows: list[int]) -> np.ndarray:
        """int32 [len(rows), most pages any of them holds]: those rows' pages, the scratch page past each
        one's last."""
        rows = np.asarray(rows, dtype=np.intp)
        width = int(self.row_pages[rows].max()) if len(rows) else 0
        return self.page_rows[rows, :width]

    def free(self, seq_id: int) -> None:
        if self.has(seq_id):
            held = len(self.page_lists[seq_id])
            self.table.free(seq_id)
            row = self.rows.pop(seq_id)
            self.page_rows[row, :held] = self.scratch_page
            self.row_pages[row] = 0
            self._free_rows.append(row)

    def _take_row(self) -> int:
        if self._free_rows:
            return self._free_rows.pop()
        row = len(self.rows)  # every row below is held
        if row == self.page_rows.shape[0]:
            self.page_rows = self._grown(2 * row, self.page_rows.shape[1])
            self.row_pages = np.concatenate([self.row_pages, np.zeros_like(self.row_pages)])
        return row

    def _mirror(self, seq_id: int, held: int) -> None:
        """Copy a sequence's pages from index `held` on into its row."""
        pages = self.page_lists[seq_id]
        if len(pages) > self.page_rows.shape[1]:
            self.page_rows = self._grown(self.page_rows.shape[0], max(len(pages), 2 * self.page_rows.shape[1]))
        row = self.rows[seq_id]
        if len(pages) - held == 1:
            self.page_rows[row, held] = pages[held]
        else:
            self.page_rows[row, held : len(pages)] = pages[held:]
        self.row_pages[row] = len(pages)

    def _grown(self, rows: int, width: int) -> np.ndarray:
        grown = np.full((rows, width), self.scratch_page, dtype=np.int32)
        old = self.page_rows
        grown[: old.shape[0], : old.shape[1]] = old
        return grown
