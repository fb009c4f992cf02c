"""The CUDA runner's data flow on the CPU: every kernel swapped for its pure-torch reference
(ops="reference"; fused qkv / gate_up weights, padded decode inputs, paged prefill). CUDA graphs and the
kernels themselves are tested on the GPU (test_engine_cuda.py)."""

import pytest

from qoq.engine import SamplingParams
from tests.engine.engine_support import PROMPTS, assert_same_until_near_tie
from tests.engine.engine_support import rel as _rel

CPU_CUDA_RUNNER = dict(backend="cuda", device="cpu", ops="reference", kv_budget=1 << 20, record_logits=True)


def test_fp16_path_matches_the_reference_engine(make_engine, tiny_fp16):
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    want = make_engine(tiny_fp16, record_logits=True).generate(PROMPTS[:3], params)
    got = make_engine(tiny_fp16, max_num_batched_tokens=32, **CPU_CUDA_RUNNER).generate(PROMPTS[:3], params)
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids
        assert max(_rel(a, b) for a, b in zip(g.logits, w.logits)) < 1e-2


def test_w4a8kv4_path_close_to_reference_and_batch_invariant(make_engine, tiny_w4):
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    want = make_engine(tiny_w4, record_logits=True).generate(PROMPTS[:3], params)
    engine = make_engine(tiny_w4, **CPU_CUDA_RUNNER)
    alone = [engine.generate([p], params)[0] for p in PROMPTS[:3]]
    batched = make_engine(tiny_w4, max_num_batched_tokens=24, **CPU_CUDA_RUNNER).generate(PROMPTS[:3], params)
    for a, b, w in zip(alone, batched, want):
        assert_same_until_near_tie(a, b, margin=0.05)
        # a decode in a mixed batch attends through the prefill path (SDPA on dequantized fp16 K/V), alone
        # through decode attention (fp32 math): fp16 roundings differ, and INT8 activation codes amplify them
        assert max(_rel(x, y) for x, y in zip(a.logits, b.logits)) < 5e-2
        assert _rel(a.logits[0], w.logits[0]) < 0.1  # fp16 activations vs the fp32 reference


def test_decode_inputs_pad_with_the_scratch_page(make_engine, tiny_w4):
    from qoq.engine.batch import SeqChunk, StepInput

    runner = make_engine(tiny_w4, **CPU_CUDA_RUNNER).runner
    step = StepInput([5, 6], [70, 3], [129, 3], [SeqChunk(70, 1, [2, 1]), SeqChunk(3, 1, [0])])
    ids, pos, slots, table, lens, max_len = runner.decode_inputs(step, batch=4, width=4)
    s = runner.scratch_page
    assert ids.tolist() == [5, 6, 0, 0] and pos.tolist() == [70, 3, 0, 0]
    assert slots.tolist() == [129, 3, s * 64, s * 64] and lens.tolist() == [71, 4, 1, 1]
    assert table.tolist() == [[2, 1, s, s], [0, s, s, s], [s] * 4, [s] * 4] and max_len == 256


def test_decode_inputs_refilled_by_a_smaller_step_pad_again():
    """A graph's static inputs are refilled every step: rows a larger step used are padding again, and the
    block manager's page rows (StepInput.page_table) give what the page lists give."""
    import numpy as np

    from qoq.engine.batch import SeqChunk, StepInput
    from qoq.engine.decode_inputs import DecodeInputs

    s = 9
    inputs = DecodeInputs(4, 4, s, "cpu")
    chunks = [SeqChunk(70, 1, [2, 1]), SeqChunk(3, 1, [0]), SeqChunk(130, 1, [3, 4, 5])]
    inputs.fill(StepInput([5, 6, 7], [70, 3, 130], [70, 3, 322], chunks))
    ids, pos, slots, table, lens = inputs.tensors
    assert ids.tolist() == [5, 6, 7, 0] and lens.tolist() == [71, 4, 131, 1]
    assert table.tolist() == [[2, 1, s, s], [0, s, s, s], [3, 4, 5, s], [s] * 4]
    inputs.fill(StepInput([8], [4], [4], [SeqChunk(4, 1, [0])], np.array([[0]], dtype=np.int32)))
    assert ids.tolist() == [8, 0, 0, 0] and pos.tolist() == [4, 0, 0, 0] and lens.tolist() == [5, 1, 1, 1]
    assert slots.tolist() == [4, s * 64, s * 64, s * 64]
    assert table.tolist() == [[0, s, s, s]] + [[s] * 4] * 3 and inputs.max_seq_len == 256


@pytest.mark.parametrize("pages,expected", [(1, 1), (2, 2), (3, 4), (5, 8)])
def test_graph_buckets(pages, expected):

    from qoq.engine.cuda_graphs import DecodeGraphs

    graphs = DecodeGraphs.__new__(DecodeGraphs)
    graphs.batch_sizes, graphs.max_pages = (1, 2, 4, 8), 6
    assert graphs.bucket(3, pages) == (4, min(expected, 6))
    assert graphs.bucket(9, pages) is None


def test_capture_every_covers_each_bucket_a_step_can_meet():
    from qoq.engine.cuda_graphs import DecodeGraphs

    graphs = DecodeGraphs.__new__(DecodeGraphs)
    graphs.batch_sizes, graphs.max_pages, graphs.graphs = (1, 2, 4, 8, 16), 6, {}
    captured = []
    graphs.capture = lambda b, p: (captured.append((b, p)), graphs.graphs.__setitem__((b, p), None))
    assert graphs.page_buckets() == [1, 2, 4, 6]
    assert graphs.capture_every(max_batch=3) == 12 and captured[0] == (4, 6)  # largest first
    assert set(captured) == {(b, p) for b in (1, 2, 4) for p in (1, 2, 4, 6)}
    assert graphs.capture_every(max_batch=3) == 0
    for b in (1, 2, 4):  # every step of up to 3 sequences at up to 6 pages replays a captured graph
        for p in range(1, 7):
            assert graphs.bucket(min(b, 3), p) in graphs.graphs


@pytest.mark.parametrize("kind", ["fp16", "w4"])
def test_residual_adds_fused_into_the_norms(make_engine, tiny_fp16, tiny_w4, kind, monkeypatch):
    """Per forward of the 2-layer model: 2 x 2 norms before the linears and the final norm; every one but the
    first block's adds the sublayer output ahead to the residual (no separate add). The fp16 path runs RoPE
    with its page write and SiLU·mul as one op each per layer."""
    from qoq.engine.cuda_ops import ReferenceOps

    calls = []

    def record(name, residual_at):
        original = getattr(ReferenceOps, name)

        def wrapped(self, *args):
            calls.append((name, residual_at is not None and len(args) > residual_at and args[residual_at] is not None))
            return original(self, *args)

        monkeypatch.setattr(ReferenceOps, name, wrapped)

    for name, residual_at in [("rmsnorm_fp16", 3), ("rmsnorm_quant", 5), ("rope_kv_write_fp16", None),
                              ("silu_mul_fp16", None), ("silu_mul_quant", None)]:
        record(name, residual_at)
    engine = make_engine(tiny_fp16 if kind == "fp16" else tiny_w4, **CPU_CUDA_RUNNER)
    engine.generate([PROMPTS[0]], SamplingParams(max_tokens=2, ignore_eos=True))  # a prefill and a decode
    norm = "rmsnorm_fp16" if kind == "fp16" else "rmsnorm_quant"
    per_forward = [(norm, False), (norm, True), (norm, True), (norm, True), ("rmsnorm_fp16", True)]
    norms = [c for c in calls if c[0].startswith("rmsnorm")]
    assert norms == per_forward * 2
    others = sorted(c[0] for c in calls if not c[0].startswith("rmsnorm"))
    if kind == "fp16":
        assert others == ["rope_kv_write_fp16"] * 4 + ["silu_mul_fp16"] * 4
    else:
        assert others == ["silu_mul_quant"] * 4


def test_k_bias_outside_the_cache_on_reference_ops_matches_the_reference_engine(make_engine, tiny_qwen_k_bias):
    """The k bias kept outside the KV4 cache (design §3.4): the fused qkv leaves it out of the pages, and
    decode and prefill attention add R(p)·b back at each cached key's position. Alone (decode attention)
    and batched (prefill chunks over read-back pages, mixed steps) it follows the reference engine."""
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    want = make_engine(tiny_qwen_k_bias, record_logits=True).generate(PROMPTS[:3], params)
    engine = make_engine(tiny_qwen_k_bias, **CPU_CUDA_RUNNER)
    runner = engine.runner
    assert runner.k_bias[0] is not None and runner.k_bias[0].abs().max() == 150.0
    q_width, k_width = runner.hq * runner.d, runner.hkv * runner.d
    assert not runner.layers[0].qkv.bias[q_width : q_width + k_width].any()  # no k bias into the pages
    alone = [engine.generate([p], params)[0] for p in PROMPTS[:3]]
    batched = make_engine(tiny_qwen_k_bias, max_num_batched_tokens=24, **CPU_CUDA_RUNNER).generate(PROMPTS[:3], params)
    for a, b, w in zip(alone, batched, want):
        assert_same_until_near_tie(a, w, margin=0.05)
        assert_same_until_near_tie(b, w, margin=0.05)
        assert _rel(a.logits[0], w.logits[0]) < 0.1  # fp16 activations vs the fp32 reference
