"""The decode forward's input tensors, packed so that one host-to-device copy moves them all.

ids, positions, slots int64 [batch]; seq_lens int32 [batch]; page table int32 [batch, pages]: views of
one byte buffer on the runner's device, filled through a host twin (pinned on a CUDA device) with
numpy, then copied in one non-blocking copy. Rows past the step's sequences are padding: token 0 at
position 0, one token long, its slot and pages the scratch page (what the decode graphs replay over).
"""

from __future__ import annotations

import numpy as np
import torch

from qoq.runtime_cuda.attention_reference import PAGE_TOKENS


class DecodeInputs:
    def __init__(self, batch: int, pages: int, scratch_page: int, device):
        device = torch.device(device)
        self.batch, self.pages, self.scratch_page = batch, pages, scratch_page
        wide, narrow = 3 * batch, batch + batch * pages  # int64 and int32 elements; the int64 ones first
        self.device_bytes = torch.empty(8 * wide + 4 * narrow, dtype=torch.uint8, device=device)
        self.host_bytes = (self.device_bytes if device.type == "cpu"
                           else torch.empty(self.device_bytes.shape, dtype=torch.uint8, pin_memory=True))
        d64, d32 = self.device_bytes[: 8 * wide].view(torch.int64), self.device_bytes[8 * wide :].view(torch.int32)
        # decode_forward's argument order
        self.tensors = (d64[:batch], d64[batch : 2 * batch], d64[2 * batch :], d32[batch:].view(batch, pages),
                        d32[:batch])
        host = self.host_bytes.numpy()
        h64, h32 = host[: 8 * wide].view(np.int64), host[8 * wide :].view(np.int32)
        self.ids, self.positions, self.slots = h64[:batch], h64[batch : 2 * batch], h64[2 * batch :]
        self.seq_lens, self.table = h32[:batch], h32[batch:].reshape(batch, pages)
        self._copied = None  # CUDA event recorded after the last copy out of the host twin
        self._filled = batch  # rows that may hold a sequence (the rest is padding)
        self.pad(0)
        if self.host_bytes is not self.device_bytes:
            self.device_bytes.copy_(self.host_bytes)  # all padding until the first fill

    @property
    def max_seq_len(self) -> int:
        return self.pages * PAGE_TOKENS

    def pad(self, n: int) -> None:
        """Rows n.. as padding."""
        self._filled = n
        self.ids[n:] = 0
        self.positions[n:] = 0
        self.slots[n:] = self.scratch_page * PAGE_TOKENS
        self.seq_lens[n:] = 1
        self.table[n:] = self.scratch_page

    def fill(self, step) -> None:
        """A decode StepInput (one token per sequence) into the host twin, then one copy to the device."""
        n = len(step.chunks)
        if n > self.batch:
            raise ValueError(f"a decode step of {n} sequences does not fit {self.batch} rows")
        if self._copied is not None:
            self._copied.synchronize()  # the last copy has read the host twin (done at the step's sync)
        self.ids[:n] = step.token_ids
        self.positions[:n] = step.positions
        self.slots[:n] = step.slots
        self.seq_lens[:n] = self.positions[:n] + 1  # one token per sequence: its position + 1 tokens
        if n < self._filled:  # rows a larger step left: padding again
            self.pad(n)
        self._filled = n
        table = step.page_table
        if table is None:  # a StepInput made without the block manager's rows: from the page lists
            self.table[:n] = self.scratch_page
            for r, c in enumerate(step.chunks):
                self.table[r, : len(c.pages)] = c.pages
        else:
            w = table.shape[1]
            self.table[:n, :w] = table
            self.table[:n, w:] = self.scratch_page
        if self.host_bytes is not self.device_bytes:
            self.device_bytes.copy_(self.host_bytes, non_blocking=True)
            if self._copied is None:
                self._copied = torch.cuda.Event()
            self._copied.record(torch.cuda.current_stream(self.device_bytes.device))
