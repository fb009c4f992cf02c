"""IntegerLinear from a QuantizedWeight vs from exported artifact tensors, vs float math; exact accumulators."""

import pytest
import torch

from qoq.export.packing import interleave_s2, pack_qweight
from qoq.quant.activations import quantize_tokens
from qoq.quant.linear import IntegerLinear, export_linear
from qoq.quant.weights import quantize_weight

N, K = 64, 256


def make(group_size: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g) * 0.05
    bias = (torch.randn(N, generator=g) * 0.1).half()
    x = torch.randn(2, 5, K, generator=g) + 0.3  # nonzero mean: Σx matters for per channel
    return quantize_weight(w, group_size), bias, x


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("group_size", [128, 64, -1])
def test_in_memory_and_artifact_linears_agree(group_size):
    qw, bias, x = make(group_size)
    tensors = export_linear("model.layers.0.mlp.up_proj", qw, bias)
    from_artifact = IntegerLinear.from_tensors(tensors, "model.layers.0.mlp.up_proj")
    in_memory = IntegerLinear.from_quantized(qw, bias)
    y_mem, y_art = in_memory(x), from_artifact(x)
    assert y_art.shape == (2, 5, N) and y_art.dtype == torch.float32
    assert torch.equal(y_mem, y_art)  # packing, interleave and -z storage lose nothing
    qx, s_x = quantize_tokens(x)
    x_hat = qx.float() * s_x.float()
    if group_size == -1:  # §3.2: the zero meets Σx of the unquantized x
        y_float = x_hat @ (qw.q.float() * qw.s1.float()[:, None]).t() - x.sum(-1, keepdim=True) * qw.szero.float()
    else:
        y_float = x_hat @ qw.dequantize().t()
    assert rel_err(y_art, y_float + bias.float()) < 1e-5
    y_fp = x @ qw.dequantize().t() + bias.float()  # A8 moves it away from W4A16, not far
    assert 1e-5 < rel_err(y_art, y_fp) < 0.05


@pytest.mark.parametrize("group_size", [128, 64, -1])
def test_integer_accumulator_is_exact(group_size):
    qw, bias, x = make(group_size, seed=1)
    integer = IntegerLinear.from_tensors(export_linear("lin", qw, bias), "lin")
    weight = qw.q.long() if group_size == -1 else qw.w8().long()
    qx, _ = quantize_tokens(x.reshape(-1, K))
    assert torch.equal(integer.accumulate(qx), qx.long() @ weight.t())


def test_accumulator_exact_beyond_fp32_integers():
    # |acc| = 127 * 128 * 2048 > 2^24: fp32 accumulation would round, float64 does not
    weight = torch.full((32, 2048), -128, dtype=torch.int8)
    weight[0, 0] = 127
    lin = IntegerLinear(weight, torch.ones(32).half())
    qx = torch.full((3, 2048), 127, dtype=torch.int8)
    ref = qx.long() @ weight.long().t()
    assert int(ref.abs().max()) > 2**24 and torch.equal(lin.accumulate(qx), ref)


def test_per_channel_uses_sum_of_unquantized_x():
    qw, _, x = make(-1, seed=2)
    y = IntegerLinear.from_quantized(qw)(x)
    qx, s_x = quantize_tokens(x)
    dequant_both = (qx.float() * s_x.float()) @ qw.dequantize().t()  # uses Σx̂, which the runtime never sees
    assert rel_err(y, dequant_both) > 1e-5


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_output_dtype_follows_input(dtype):
    qw, bias, x = make(128, seed=4)
    integer = IntegerLinear.from_tensors(export_linear("l", qw, bias), "l")
    y = integer(x.to(dtype))
    assert y.dtype == dtype and y.shape == (2, 5, N)
    assert rel_err(y, integer(x)) < 1e-2


def test_export_linear_tensors_follow_the_artifact_contract():
    qw, bias, _ = make(64, seed=5)
    t = export_linear("p", qw, bias)
    assert set(t) == {"p.qweight", "p.s1_scales", "p.s2_scales", "p.s2_zeros", "p.bias"}
    assert t["p.qweight"].dtype == torch.int8 and t["p.qweight"].shape == (N, K // 2)
    assert torch.equal(t["p.qweight"], pack_qweight(qw.q))
    assert t["p.s1_scales"].dtype == torch.float16 and t["p.bias"].dtype == torch.float16
    assert t["p.s2_scales"].dtype == torch.int8 and t["p.s2_scales"].shape == (K // 64, N)
    assert torch.equal(t["p.s2_zeros"], interleave_s2(-qw.z).to(torch.int8))  # stores -z
    per_channel = export_linear("p", quantize_weight(torch.randn(N, K), -1))
    assert set(per_channel) == {"p.qweight", "p.s1_scales", "p.s1_szeros"}


def test_from_tensors_names_a_missing_tensor():
    qw, _, _ = make(128)
    tensors = export_linear("a.b", qw)
    del tensors["a.b.s2_zeros"]
    with pytest.raises(KeyError, match=r"a\.b\.s2_zeros"):
        IntegerLinear.from_tensors(tensors, "a.b")


@pytest.mark.cuda
@pytest.mark.parametrize("m", [4, 64])
def test_cuda_int_mm_path_matches_cpu(m):
    qw, bias, _ = make(128, seed=6)
    integer = IntegerLinear.from_tensors(export_linear("l", qw, bias), "l")
    x = torch.randn(m, K, generator=torch.Generator().manual_seed(7))
    qx, _ = quantize_tokens(x)
    ref, y_cpu = integer.accumulate(qx), integer(x.half()).float()
    gpu = integer.cuda()  # moves the module in place
    assert torch.equal(gpu.accumulate(qx.cuda()).cpu().long(), ref)
    assert rel_err(gpu(x.cuda().half()).float().cpu(), y_cpu) < 1e-3
