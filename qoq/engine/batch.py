"""StepInput: one forward's tokens, flattened over the scheduled sequences (what every runner reads)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SeqChunk:
    start: int  # position of the chunk's first token (= tokens already cached)
    num_tokens: int
    pages: list[int]  # the sequence's pages, covering start + num_tokens tokens

    @property
    def context_len(self) -> int:
        return self.start + self.num_tokens


@dataclass
class StepInput:
    token_ids: list[int]  # [T], the chunks back to back
    positions: list[int]  # [T]
    slots: list[int]  # [T] page * 64 + offset of each token's K/V
    chunks: list[SeqChunk]  # one per sequence, in token order

    @property
    def is_decode(self) -> bool:
        """Every sequence feeds one token: the CUDA runner's graph path."""
        return all(c.num_tokens == 1 for c in self.chunks)

    @property
    def last_rows(self) -> list[int]:
        """Index of each sequence's last token in the flat batch (its logits row)."""
        rows, end = [], 0
        for c in self.chunks:
            end += c.num_tokens
            rows.append(end - 1)
        return rows


def build_step_input(scheduled, blocks) -> StepInput:
    ids, positions, slots, chunks = [], [], [], []
    for s in scheduled:
        all_ids = s.seq.all_ids
        ids += all_ids[s.start : s.start + s.num_tokens]
        positions += range(s.start, s.start + s.num_tokens)
        slots += s.slots
        chunks.append(SeqChunk(s.start, s.num_tokens, blocks.pages(s.seq.seq_id)))
    return StepInput(ids, positions, slots, chunks)
