"""A step's prefill chunks: their rows, their contexts as slots, their cumulative lengths."""

import torch

from qoq.engine.batch import SeqChunk, StepInput
from qoq.engine.prefill_inputs import prefill_inputs


def _step(chunks):
    t = sum(c.num_tokens for c in chunks)
    return StepInput([0] * t, [0] * t, [0] * t, chunks)


def test_mixed_step_rows_and_context_slots():
    chunks = [SeqChunk(10, 1, [7]), SeqChunk(0, 70, [3, 9]), SeqChunk(130, 4, [2, 5, 8]), SeqChunk(40, 1, [1])]
    plan = prefill_inputs(_step(chunks), "cpu")
    assert plan.q_rows.tolist() == list(range(1, 71)) + list(range(71, 75))
    assert plan.q_lens == [70, 4] and plan.k_lens == [70, 134]
    assert plan.cu_q.tolist() == [0, 70, 74] and plan.cu_k.tolist() == [0, 70, 204]
    assert plan.cu_q.dtype == torch.int32 and plan.max_q == 70 and plan.max_k == 134
    expected = ([3 * 64 + i for i in range(64)] + [9 * 64 + i for i in range(6)]
                + [2 * 64 + i for i in range(64)] + [5 * 64 + i for i in range(64)] + [8 * 64 + i for i in range(6)])
    assert plan.context_slots.tolist() == expected
    assert plan.context_page.tolist() == [x // 64 for x in expected]
    assert plan.context_offset.tolist() == [x % 64 for x in expected]


def test_prefill_only_and_decode_only_steps():
    plan = prefill_inputs(_step([SeqChunk(0, 3, [4]), SeqChunk(0, 2, [6])]), "cpu")
    assert plan.q_rows is None and plan.context_slots.tolist() == [256, 257, 258, 384, 385]
    assert prefill_inputs(_step([SeqChunk(5, 1, [0]), SeqChunk(9, 1, [1])]), "cpu") is None
