"""StepInput: one forward's tokens, flattened over the scheduled sequences (what every runner reads)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(slots=True)
class SeqChunk:
    start: int  # position of the chunk's first token (= tokens already cached)
    num_tokens: int
    pages: list[int]  # the sequence's pages, covering start + num_tokens (the block manager's own list: read only)

    @property
    def context_len(self) -> int:
        return self.start + self.num_tokens


@dataclass
class StepInput:
    token_ids: list[int]  # [T], the chunks back to back
    positions: list[int]  # [T]
    slots: list[int]  # [T] page * 64 + offset of each token's K/V
    chunks: list[SeqChunk]  # one per sequence, in token order
    # int32 [len(chunks), max pages]: each chunk's pages as a row, the scratch page past its last (from the
    # block manager's rows; None: runners build it from the chunks' page lists)
    page_table: np.ndarray | None = None
    is_decode: bool = field(init=False)  # every sequence feeds one token: the CUDA runner's graph path

    def __post_init__(self):
        self.is_decode = all(c.num_tokens == 1 for c in self.chunks)

    @property
    def last_rows(self) -> list[int]:
        """Index of each sequence's last token in the flat batch (its logits row)."""
        rows, end = [], 0
        for c in self.chunks:
            end += c.num_tokens
            rows.append(end - 1)
        return rows


def build_step_input(scheduled, blocks) -> StepInput:
    """The scheduler's ScheduledSeqs (SeqChunks themselves) -> the step's flat batch."""
    ids, positions, slots, rows = [], [], [], []
    row_of = blocks.rows
    for s in scheduled:
        seq, start, n = s.seq, s.start, s.num_tokens
        if n == 1:
            ids.append(seq.token(start))
            positions.append(start)
        else:
            ids += seq.tokens(start, start + n)
            positions += range(start, start + n)
        slots += s.slots
        rows.append(row_of[seq.seq_id])
    return StepInput(ids, positions, slots, scheduled, blocks.page_table(rows))
