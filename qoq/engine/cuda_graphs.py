"""CUDA graphs of the decode forward, one per (batch bucket, page bucket), captured on first use.

A graph replays `CudaRunner.decode_forward` over static inputs (decode_inputs.py: token ids, positions,
slots [bs], page table int32 [bs, pages], seq_lens [bs], views of one device buffer that one copy fills);
a step of B <= bs sequences fills the first B rows and pads the rest with dummy sequences (token 0 at
position 0, one token long) whose slot and page table point at the scratch page. Page buckets are powers
of two up to the longest sequence the runner allows; the decode kernel's split plan is fixed by the
bucket's length (max_seq_len = pages * 64). Every bucket is run eagerly on the capture stream before its
capture (torch's recipe; it also makes the split counters decode attention needs, which cannot be made
inside a capture). All graphs share one memory pool; logits are copied out of the graph's buffer before
the next replay.
"""

from __future__ import annotations

import bisect
import math

import torch

from qoq.engine.batch import StepInput
from qoq.engine.decode_inputs import DecodeInputs
from qoq.runtime_cuda.attention_reference import PAGE_TOKENS


class DecodeGraphs:
    def __init__(self, runner, batch_sizes: tuple[int, ...]):
        self.runner = runner
        self.batch_sizes = tuple(sorted(batch_sizes))
        self.max_pages = math.ceil(runner.max_model_len / PAGE_TOKENS)
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, DecodeInputs, torch.Tensor]] = {}
        self.pool = None
        self.stream = None  # the capture stream, made at the first capture

    def bucket(self, batch: int, pages: int) -> tuple[int, int] | None:
        i = bisect.bisect_left(self.batch_sizes, batch)
        if i == len(self.batch_sizes):
            return None
        return self.batch_sizes[i], min(1 << max(0, pages - 1).bit_length(), self.max_pages)

    def run(self, step: StepInput) -> torch.Tensor | None:
        """Logits fp32 [B, V] of a decode step by graph replay, or None where no bucket fits."""
        n = len(step.chunks)
        pages = step.page_table.shape[1] if step.page_table is not None else max(len(c.pages) for c in step.chunks)
        key = self.bucket(n, pages)
        if key is None:
            return None
        entry = self.graphs.get(key)
        if entry is None:
            self.capture(*key)
            entry = self.graphs[key]
        graph, inputs, logits = entry
        inputs.fill(step)  # one copy into the graph's static inputs
        graph.replay()
        return logits[:n].float()  # a copy: the next replay may reuse the pool

    def static_inputs(self, batch: int, pages: int) -> DecodeInputs:
        return DecodeInputs(batch, pages, self.runner.scratch_page, self.runner.device)

    def capture(self, batch: int, pages: int) -> None:
        r = self.runner
        dev = r.device
        if self.stream is None:
            self.stream = torch.cuda.Stream(dev)
        inputs = self.static_inputs(batch, pages)
        buffers, max_seq_len = inputs.tensors, inputs.max_seq_len
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
        self.graphs[(batch, pages)] = (graph, inputs, logits)

    def page_buckets(self) -> list[int]:
        return sorted({self.bucket(1, p)[1] for p in range(1, self.max_pages + 1)})

    def capture_every(self, max_batch: int) -> int:
        """Capture every (batch bucket, page bucket) a decode step of up to `max_batch` sequences can
        meet, largest first; -> graphs captured. A server does this before it serves: a bucket met for the
        first time mid-serving stalls every running request for its capture (two eager forwards and the
        capture itself)."""
        top = self.bucket(min(max_batch, self.batch_sizes[-1]), 1)[0]
        n, pages = 0, self.page_buckets()[::-1]
        for b in reversed([b for b in self.batch_sizes if b <= top]):
            for p in pages:
                if (b, p) not in self.graphs:
                    self.capture(b, p)
                    n += 1
        return n

    def capture_all(self, pages: int = 1) -> None:
        """Capture every batch bucket at one page bucket up front (largest first: its pool serves the rest)."""
        for b in reversed(self.batch_sizes):
            if (b, pages) not in self.graphs:
                self.capture(b, pages)
