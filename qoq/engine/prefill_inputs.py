"""What every layer's prefill attention of a step shares, built once per step.

A step's prefill chunks (more than one token) attend, in one varlen call, over their sequences' cached
tokens read back from the pages: `context_slots` lists each chunk's context (its first `context_len`
tokens, the chunk's own just written) as slots, chunk after chunk; `q_rows` the chunks' rows of the
step's flat batch (None when every row is a prefill row). Chunks of one token are decodes: they go
through decode attention as in decode steps, so that a sequence's numbers do not depend on its batch.
A chunk's queries are the last `q_len` of its `k_len` keys (causal, aligned bottom right).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from qoq.engine.batch import StepInput
from qoq.runtime_cuda.attention_reference import PAGE_TOKENS

_OFFSETS = np.arange(PAGE_TOKENS, dtype=np.int64)


@dataclass
class PrefillInputs:
    q_rows: torch.Tensor | None  # int64 [Tq] on the device
    context_slots: torch.Tensor  # int64 [Tk] on the device
    context_page: torch.Tensor  # int64 [Tk]: context_slots // 64, context_slots % 64 (the KV4 pages' gather,
    context_offset: torch.Tensor  # once a step rather than once a layer)
    q_lens: list[int]
    k_lens: list[int]
    cu_q: torch.Tensor  # int32 [n + 1] on the device: cumulative q_lens
    cu_k: torch.Tensor  # int32 [n + 1]: cumulative k_lens

    @cached_property
    def context_positions(self) -> torch.Tensor:
        """int64 [Tk]: each context token's position (0..k_len-1 per chunk), for the k bias kept outside the
        KV4 cache; built on first use, once a step for every layer."""
        starts = torch.repeat_interleave(self.cu_k[:-1].long(), torch.tensor(self.k_lens, device=self.cu_k.device))
        return torch.arange(self.context_slots.shape[0], device=self.cu_k.device) - starts

    @property
    def max_q(self) -> int:
        return max(self.q_lens)

    @property
    def max_k(self) -> int:
        return max(self.k_lens)


def prefill_inputs(step: StepInput, device) -> PrefillInputs | None:
    """None when the step has no chunk of more than one token."""
    rows, slots, q_lens, k_lens = [], [], [], []
    end = 0
    for c in step.chunks:
        if c.num_tokens > 1:
            ctx = c.context_len
            pages = np.asarray(c.pages[: -(-ctx // PAGE_TOKENS)], dtype=np.int64)
            slots.append((pages[:, None] * PAGE_TOKENS + _OFFSETS).ravel()[:ctx])
            rows.append(np.arange(end, end + c.num_tokens, dtype=np.int64))
            q_lens.append(c.num_tokens)
            k_lens.append(ctx)
        end += c.num_tokens
    if not q_lens:
        return None
    cu = np.zeros((2, len(q_lens) + 1), dtype=np.int32)
    np.cumsum(q_lens, out=cu[0, 1:])
    np.cumsum(k_lens, out=cu[1, 1:])
    dev = torch.device(device)
    to_dev = lambda a: torch.from_numpy(a).to(dev, non_blocking=True)
    q_rows = None if sum(q_lens) == end else to_dev(np.concatenate(rows))
    cu_dev = to_dev(cu)
    context = to_dev(np.concatenate(slots))
    return PrefillInputs(q_rows, context, context // PAGE_TOKENS, context % PAGE_TOKENS, q_lens, k_lens, cu_dev[0],
                         cu_dev[1])
