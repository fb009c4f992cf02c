"""Continuous batching: which sequences run this step, and how many of their tokens.

Each step has a token budget (max_num_batched_tokens) and a sequence cap (max_num_seqs). Running
sequences go first, oldest first: a decode takes one token, an unfinished prefill its next chunk (as
much of the rest as the budget allows: chunked prefill). When a running sequence needs a page and none is
free, the newest running sequence is preempted: its pages are freed and it goes back to the head of the
waiting queue, its generated tokens kept, to be re-prefilled later. Then waiting sequences are admitted in
arrival order (FCFS: the head is never skipped, so nothing starves) while pages, budget and cap allow.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from qoq.engine.batch import SeqChunk
from qoq.engine.block_manager import BlockManager
from qoq.engine.sequence import Sequence, Status


@dataclass(slots=True)
class ScheduledSeq(SeqChunk):
    """A sequence's chunk of this step (start, num_tokens, pages: what the runner reads), and what the
    engine needs besides."""

    seq: Sequence
    slots: list[int]
    samples: bool  # this chunk reaches the sequence's end: its last logits give the next token


class Scheduler:
    def __init__(self, blocks: BlockManager, max_num_seqs: int = 256, max_num_batched_tokens: int = 2048):
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order: the newest last
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def preempt(self, seq: Sequence) -> None:
        self.blocks.free(seq.seq_id)
        self.running.remove(seq)
        seq.status, seq.num_computed = Status.WAITING, 0
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)  # it arrived before everything still waiting

    def finish(self, seq: Sequence, reason: str) -> None:
        """Drop a sequence (finished or aborted) and free its pages."""
        self.blocks.free(seq.seq_id)
        if seq.status is Status.RUNNING:  # exactly the sequences in self.running
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.status, seq.finish_reason = Status.FINISHED, reason

    def schedule(self) -> list[ScheduledSeq]:
        budget = self.max_num_batched_tokens
        blocks = self.blocks
        pages = blocks.page_lists
        out: list[ScheduledSeq] = []
        preempted = False
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not Status.RUNNING:  # preempted below to make room for an older one
                continue
            start, end = seq.num_computed, len(seq)
            n = min(end - start, budget)
            slots = blocks.grow(seq.seq_id, n)
            while slots is None:
                victim = self.running[-1]
                self.preempt(victim)
                preempted = True
                if victim is seq:
                    break
                slots = blocks.grow(seq.seq_id, n)
            if slots is None:
                continue
            out.append(ScheduledSeq(start, n, pages[seq.seq_id], seq, slots, start + n == end))
            budget -= n
        while self.waiting and budget > 0 and not preempted and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            start, end = seq.num_computed, len(seq)
            n = min(end - start, budget)
            if not blocks.can_allocate(seq.seq_id, n):
                break
            self.waiting.popleft()
            seq.status = Status.RUNNING
            self.running.append(seq)
            slots = blocks.allocate(seq.seq_id, n)
            out.append(ScheduledSeq(start, n, pages[seq.seq_id], seq, slots, start + n == end))
            budget -= n
        return out

    def update(self, scheduled: list[ScheduledSeq]) -> None:
        """After the forward: the scheduled tokens are in the cache."""
        for s in scheduled:
            s.seq.num_computed = s.start + s.num_tokens
