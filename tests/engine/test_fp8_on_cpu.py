"""The CUDA runner's fp8 path (`quantization="fp8"`: W8A8 e4m3 linears quantized at load from the fp16
artifact) on the CPU: Fp8Linear's torch reference (the numbers torch._scaled_mm computes) and the engine
against the fp16 engine. torch._scaled_mm itself is tested on the GPU (test_fp8_cuda.py)."""

import pytest
import torch

from qoq.engine import SamplingParams
from qoq.engine.fp8_linear import E4M3_MAX, Fp8Linear, fp8_weight_bytes, quantize_rows, reference_scaled_mm
from tests.engine.engine_support import PROMPTS, assert_same_until_near_tie
from tests.engine.engine_support import rel as _rel

CPU_CUDA_RUNNER = dict(backend="cuda", device="cpu", ops="reference", kv_budget=1 << 20, record_logits=True)


def test_quantize_rows_scales_each_row_to_the_e4m3_range():
    rows = torch.tensor([1e-3, 0.1, 1.0, 30.0, 0.0], dtype=torch.float16)
    x = torch.randn(5, 64, dtype=torch.float16) * rows[:, None]
    q, s = quantize_rows(x)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (5, 1) and s.dtype == torch.float32
    assert torch.equal(q.float().abs().amax(1)[:4], torch.full((4,), E4M3_MAX))  # each row's absmax -> 448
    assert not q[4].float().any() and not q.float().isnan().any()  # a zero row: zero codes, no NaN
    back = q.float() * s
    # e4m3 keeps 3 mantissa bits: relative rounding error <= 2^-4 for normal codes
    err = ((back - x.float()).abs() / x.float().abs().clamp_min(1e-30))[:4]
    assert err[x.float().abs()[:4] > s[:4] * 2**-6].max() <= 2**-4


def test_fp8_linear_reference_is_the_scaled_product_of_the_codes():
    torch.manual_seed(0)
    w, b, x = torch.randn(48, 64).half() * 0.05, torch.randn(48).half(), torch.randn(7, 64).half()
    lin = Fp8Linear.from_fp16(w, b, kernel=False)
    assert lin.wq.shape == (48, 64) and lin.w_scale.shape == (1, 48) and lin.w_scale.is_contiguous()
    assert lin.weight_bytes == fp8_weight_bytes(48, 64) == 48 * 64 + 4 * 48
    y = lin(x)
    xq, sx = quantize_rows(x)
    exact = (xq.double() @ lin.wq.double().t()) * sx.double() * lin.w_scale.double() + b.double()
    assert y.dtype == torch.float16 and y.shape == (7, 48)
    assert (y.double() - exact).abs().max() <= 2**-10 * exact.abs().max()  # fp16 rounding of the same sum
    assert torch.equal(y, reference_scaled_mm(xq, sx, lin.wq, lin.w_scale, lin.bias))
    assert _rel(y.float(), torch.nn.functional.linear(x.float(), w.float(), b.float())) < 0.05
    assert lin(x[None]).shape == (1, 7, 48)  # leading dims kept


@pytest.mark.parametrize("m", [1, 3, 17])
def test_reference_is_what_torch_scaled_mm_computes(m):
    """The very call Fp8Linear makes on the GPU, on torch's CPU _scaled_mm: same layout, scales, bias."""
    torch.manual_seed(m)
    lin = Fp8Linear.from_fp16((torch.randn(48, 64) * 0.05).half(), torch.randn(48).half(), kernel=False)
    xq, sx = quantize_rows(torch.randn(m, 64).half())
    got = torch._scaled_mm(xq, lin.wq.t(), scale_a=sx, scale_b=lin.w_scale, bias=lin.bias, out_dtype=torch.float16)
    want = reference_scaled_mm(xq, sx, lin.wq, lin.w_scale, lin.bias)
    assert (got.float() - want.float()).abs().max() <= 2**-10 * want.float().abs().max()


def test_fp8_engine_close_to_fp16_engine(make_engine, tiny_fp16):
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    fp16 = make_engine(tiny_fp16, max_num_batched_tokens=32, **CPU_CUDA_RUNNER)
    fp8 = make_engine(tiny_fp16, max_num_batched_tokens=32, quantization="fp8", **CPU_CUDA_RUNNER)
    assert all(isinstance(lin, Fp8Linear) and not lin.kernel
               for L in fp8.runner.layers for lin in (L.qkv, L.o, L.gate_up, L.down))
    want, got = fp16.generate(PROMPTS, params), fp8.generate(PROMPTS, params)
    for w, g in zip(want, got):
        # the tiny random model's logits are flat (std ~0.2) and fp8 moves them by ~6% relative (up to
        # ~0.05 absolute): tokens agree until a top-2 gap under 0.1; logits agree up to there
        n = assert_same_until_near_tie(w, g, margin=0.1)
        assert max(_rel(a, b) for a, b in list(zip(g.logits, w.logits))[: n + 1]) < 0.1
    # teacher-forced over a longer sequence (chunked prefill over the pages): close at every position
    ids = PROMPTS[1] + PROMPTS[3]
    a, b = fp8.prompt_logits(ids, chunk_tokens=32), fp16.prompt_logits(ids, chunk_tokens=32)
    assert a.shape == b.shape == (len(ids), fp16.runner.vocab_size)
    assert max(_rel(x, y) for x, y in zip(a, b)) < 0.1
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.8


def test_fp8_option_errors(make_engine, tiny_fp16, tiny_w4):
    with pytest.raises(ValueError, match="unknown quantization 'int8'"):
        make_engine(tiny_fp16, quantization="int8", **CPU_CUDA_RUNNER)
    with pytest.raises(ValueError, match="already holds W4A8 weights"):
        make_engine(tiny_w4, quantization="fp8", **CPU_CUDA_RUNNER)
    with pytest.raises(ValueError, match="cuda backend only"):
        make_engine(tiny_fp16, quantization="fp8")
    with pytest.raises(ValueError, match="CUDA tensor"):
        Fp8Linear.from_fp16(torch.zeros(16, 16, dtype=torch.float16), kernel=True)
