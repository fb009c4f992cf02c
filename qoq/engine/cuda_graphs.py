"""CUDA graphs of the decode forward, one per (batch bucket, page bucket), captured on first use.

A graph replays `CudaRunner.decode_forward` over static buffers: token ids, positions, slots [bs], page
table int32 [bs, pages], seq_lens [bs]; a step of B <= bs sequences fills the first B rows and pads
the rest with dummy sequences (token 0 at position 0, one token long) whose slot and page table point
at the scratch page. Page buckets are powers of two up to the longest sequence the runner allows; the
decode kernel's split plan is fixed by the bucket's length (max_seq_len = pages * 64). Every bucket is
run eagerly on the capture stream before its capture (torch's recipe; it also makes the split counters
decode attention needs, which cannot be made inside a capture). All graphs share one memory pool;
logits are copied out of the graph's buffer before the next replay.
"""

from __future__ import annotations

import math

import torch

from qoq.engine.batch import StepInput
from qoq.runtime_cuda.attention_reference import PAGE_TOKENS


class DecodeGraphs:
    def __init__(self, runner, batch_sizes: tuple[int, ...]):
        self.runner = runner
        self.batch_sizes = tuple(sorted(batch_sizes))
        self.max_pages = math.ceil(runner.max_model_len / PAGE_TOKENS)
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, tuple, torch.Tensor]] = {}
        self.pool = None
        self.stream = torch.cuda.Stream(runner.device)

    def bucket(self, batch: int, pages: int) -> tuple[int, int] | None:
        sizes = [b for b in self.batch_sizes if b >= batch]
        if not sizes:
            return None
        return sizes[0], min(1 << max(0, pages - 1).bit_length(), self.max_pages)

    def run(self, step: StepInput) -> torch.Tensor | None:
        """Logits fp32 [B, V] of a decode step by graph replay, or None where no bucket fits."""
        key = self.bucket(len(step.chunks), max(len(c.pages) for c in step.chunks))
        if key is None:
            return None
        if key not in self.graphs:
            self.capture(*key)
        graph, buffers, logits = self.graphs[key]
        fresh = self.runner.decode_inputs(step, *key)
        for buf, value in zip(buffers, fresh[:5]):
            buf.copy_(value, non_blocking=True)
        graph.replay()
        return logits[: len(step.chunks)].float()  # a copy: the next replay may reuse the pool

    def capture(self, batch: int, pages: int) -> None:
        r = self.runner
        dev = r.device
        scratch_slot = r.scratch_page * PAGE_TOKENS
        buffers = (
            torch.zeros(batch, dtype=torch.int64, device=dev),  # token ids
            torch.zeros(batch, dtype=torch.int64, device=dev),  # positions
            torch.full((batch,), scratch_slot, dtype=torch.int64, device=dev),  # slots
            torch.full((batch, pages), r.scratch_page, dtype=torch.int32, device=dev),  # page table
            torch.ones(batch, dtype=torch.int32, device=dev),  # seq_lens
        )
        max_seq_len = pages * PAGE_TOKENS
        self.stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(self.stream), torch.inference_mode():
            for _ in range(2):  # warm-up: lazy inits, kernel builds, split counters on this stream
                r.decode_forward(*buffers, max_seq_len)
            self.stream.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
                logits = r.decode_forward(*buffers, max_seq_len)
        torch.cuda.current_stream(dev).wait_stream(self.stream)
        self.pool = graph.pool()
        self.graphs[(batch, pages)] = (graph, buffers, logits)

    def capture_all(self, pages: int = 1) -> None:
        """Capture every batch bucket at one page bucket up front (largest first: its pool serves the rest)."""
        for b in reversed(self.batch_sizes):
            if (b, pages) not in self.graphs:
                self.capture(b, pages)
