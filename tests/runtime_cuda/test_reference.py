"""CPU checks of the kernel references against the qoq.quant math they must reproduce."""

import pytest
import torch
import torch.nn.functional as F

from qoq.models.llama import RMSNorm
from qoq.quant.activations import quantize_tokens
from qoq.quant.linear import IntegerLinear, export_linear
from qoq.quant.weights import quantize_weight
from qoq.runtime_cuda.gemm import w4a8_gemm
from qoq.runtime_cuda.linear import CudaW4A8Linear
from qoq.runtime_cuda.reference import (
    reference_accumulators,
    reference_gemm,
    reference_quant,
    reference_rmsnorm_quant,
    reference_silu_mul_quant,
    rows_to_tiles,
    tiles_to_rows,
)

N, K, M = 64, 256, 5


def _artifact(group_size: int, seed: int = 0, bias: bool = True):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g)
    qw = quantize_weight(w, group_size)
    b = torch.randn(N, generator=g).half() if bias else None
    return qw, export_linear("layer", qw, b), b


def _args(tensors: dict) -> dict:
    names = ("s2_scales", "s2_zeros", "s1_szeros", "bias")
    return {k: tensors[f"layer.{k}"] for k in names if f"layer.{k}" in tensors}


@pytest.mark.parametrize("group_size", [128, 64, -1])
def test_reference_accumulators_are_exact(group_size):
    qw, tensors, _ = _artifact(group_size)
    qx = torch.randint(-127, 128, (M, K), dtype=torch.int8)
    args = {k: v for k, v in _args(tensors).items() if k.startswith("s2")}
    acc = reference_accumulators(qx, tensors["layer.qweight"], **args)
    w_int = qw.q.long() if group_size == -1 else qw.w8().long()  # [N, K]
    expected = (qx.long()[:, None, :] * w_int[None]).sum(-1)  # [M, N], int64 all the way
    assert acc.dtype == torch.int64
    assert torch.equal(acc, expected)


@pytest.mark.parametrize("group_size", [128, 64, -1])
def test_reference_gemm_matches_dequantized_matmul(group_size):
    qw, tensors, bias = _artifact(group_size, seed=1)
    x = torch.randn(M, K).half()
    qx, s_x, xsum = reference_quant(x, sums="inputs")
    y = reference_gemm(qx, s_x, tensors["layer.qweight"], tensors["layer.s1_scales"], xsum=xsum,
                       out_dtype=torch.float32, **_args(tensors))
    x_hat = qx.double() * s_x.double()  # [M, K]
    if group_size == -1:  # §3.2: codes times s, minus z times the sum of the unquantized x
        expected = x_hat @ (qw.q.double() * qw.s1.double()[:, None]).t() - xsum.double()[:, None] * qw.szero.double()
    else:
        expected = x_hat @ qw.dequantize(torch.float64).t()
    expected = expected + bias.double()
    rel = (y.double() - expected).norm() / expected.norm()
    assert rel < 1e-5


def test_reference_gemm_fp16_output_and_bad_input():
    _, tensors, _ = _artifact(128, seed=2, bias=False)
    qx, s_x, _ = reference_quant(torch.randn(M, K).half())
    y = reference_gemm(qx, s_x, tensors["layer.qweight"], tensors["layer.s1_scales"], **_args(tensors))
    assert y.dtype == torch.float16 and y.shape == (M, N)
    with pytest.raises(ValueError, match="per group"):
        reference_gemm(qx, s_x, tensors["layer.qweight"], tensors["layer.s1_scales"])


@pytest.mark.parametrize("group_size", [128, -1])
def test_reference_gemm_is_integer_linear_bit_for_bit(group_size):
    # The kernels' epilogue follows this order, which makes the `cuda` executor backend's logits
    # equal the `reference` backend's (bench/executor_cuda_check.py).
    _, tensors, _ = _artifact(group_size, seed=3)
    x = (torch.randn(M, K) * 2).half()
    qx, s_x, xsum = reference_quant(x, sums="inputs")
    y = reference_gemm(qx, s_x, tensors["layer.qweight"], tensors["layer.s1_scales"], xsum=xsum, **_args(tensors))
    expected = IntegerLinear.from_tensors(tensors, "layer")(x)
    if group_size == -1:  # per channel both subtract z·Σx, summed in different orders
        assert (y.float() - expected.float()).abs().max() <= 2e-3 * expected.float().abs().max()
    else:
        assert torch.equal(y, expected)


def test_gemm_checks_operands_in_python_before_building_the_extension():
    _, tensors, _ = _artifact(128, seed=4)
    qx, s_x, _ = reference_quant(torch.randn(M, K).half())
    with pytest.raises(ValueError, match="qx must be a CUDA"):
        w4a8_gemm(qx, s_x, tensors["layer.qweight"], tensors["layer.s1_scales"], **_args(tensors))


def test_tiles_place_each_code_in_its_mma_fragment():
    """rows_to_tiles is the PTX mma.m16n8k32 A-fragment layout: lane 4g + t holds a0..a3 = row g at
    k 4t..4t+3, row g + 8 there, row g at k 16+4t..19+4t, row g + 8 there (four int8 per 32-bit word)."""
    m, k = 13, 96
    qx = torch.randint(-127, 128, (m, k), dtype=torch.int8)
    tiles = rows_to_tiles(qx)  # [K/32, 32 lanes, 16 bytes]
    assert tiles.shape == (k // 32, 32, 16)
    for lane in range(32):
        g, t = divmod(lane, 4)
        for word, (row, k_at) in enumerate([(g, 4 * t), (g + 8, 4 * t), (g, 16 + 4 * t), (g + 8, 16 + 4 * t)]):
            got = tiles[:, lane, 4 * word:4 * word + 4]  # [K/32, 4]
            want = torch.zeros(k // 32, 4, dtype=torch.int8)
            if row < m:
                want = qx[row].view(k // 32, 32)[:, k_at:k_at + 4]
            assert torch.equal(got, want), (lane, word)
    assert torch.equal(tiles_to_rows(tiles, m), qx)
    # the products an mma over the fragments sums are those of qx @ w.T
    w = torch.randint(-128, 128, (8, k), dtype=torch.int8)
    a = tiles.view(k // 32, 8, 4, 2, 2, 4)  # [tile, g, t, k half, row half, byte]
    b = w.view(8, k // 32, 2, 4, 4)  # [n, tile, k half, t, byte]
    acc = torch.einsum("xgthrb,nxhtb->rgn", a.long(), b.long()).reshape(16, 8)
    assert torch.equal(acc[:m], qx.long() @ w.long().T) and not acc[m:].any()


def test_tiles_reject_what_they_cannot_hold():
    with pytest.raises(ValueError, match="at most 16 rows"):
        rows_to_tiles(torch.zeros(17, 64, dtype=torch.int8))
    with pytest.raises(ValueError, match="multiple of 32"):
        rows_to_tiles(torch.zeros(4, 48, dtype=torch.int8))
    with pytest.raises(ValueError, match="need tiles"):
        tiles_to_rows(torch.zeros(2, 32, 8, dtype=torch.int8), 4)


def test_reference_quant_is_quantize_tokens_plus_sum():
    x = (torch.randn(3, 7, K) * 4).half()
    qx, s_x, xsum = reference_quant(x, sums="inputs")
    q_expected, s_expected = quantize_tokens(x)
    assert torch.equal(qx, q_expected) and torch.equal(s_x, s_expected)
    assert s_x.shape == (3, 7, 1) and xsum.shape == (3, 7)
    assert torch.allclose(xsum, x.float().sum(-1), rtol=1e-6, atol=1e-4)
    assert reference_quant(x)[2] is None
    _, _, qsum = reference_quant(x, sums="codes")  # what per-group wgmma GEMMs take off again
    assert qsum.dtype == torch.int32 and torch.equal(qsum, qx.long().sum(-1).int())
    with pytest.raises(ValueError, match="unknown sums 'x'"):
        reference_quant(x, sums="x")


def test_reference_rmsnorm_quant_is_rmsnorm_then_quantize():
    x = (torch.randn(4, K) * 3).half()
    norm = RMSNorm(K, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_((torch.rand(K) + 0.5).half().float())  # fp16-exact, as stored
    qx, s_x, xsum = reference_rmsnorm_quant(x, norm.weight.detach().half(), 1e-5, sums="inputs")
    y = norm(x).detach()  # fp16, as the fp16 model computes it
    q_expected, s_expected = quantize_tokens(y)
    assert torch.equal(qx, q_expected) and torch.equal(s_x, s_expected)
    assert torch.allclose(xsum, y.float().sum(-1), rtol=1e-6, atol=1e-3)


def test_reference_silu_mul_quant_is_the_mlp_product_then_quantize():
    gate, up = (torch.randn(2, 3, K) * 2).half(), (torch.randn(2, 3, K) * 2).half()
    qx, s_x, xsum = reference_silu_mul_quant(gate, up, sums="inputs")
    y = F.silu(gate) * up  # fp16 [2, 3, K]
    q_expected, s_expected = quantize_tokens(y)
    assert torch.equal(qx, q_expected) and torch.equal(s_x, s_expected)
    assert torch.allclose(xsum, y.float().sum(-1), rtol=1e-6, atol=1e-3)


@pytest.mark.parametrize("group_size", [128, -1])
def test_cuda_linear_from_tensors_reads_the_artifact(group_size):
    _, tensors, _ = _artifact(group_size, seed=3)
    lin = CudaW4A8Linear.from_tensors(tensors, "layer")
    assert (lin.in_features, lin.out_features, lin.group_size) == (K, N, group_size)
    assert lin.per_channel == (group_size == -1)
    assert torch.equal(lin.qweight, tensors["layer.qweight"])


def test_cuda_linear_rejects_bad_tensors():
    _, tensors, _ = _artifact(64, seed=4)
    with pytest.raises(KeyError, match="qweight"):
        CudaW4A8Linear.from_tensors({}, "layer")
    bad = dict(tensors, **{"layer.s2_scales": tensors["layer.s2_scales"][:, :32]})
    with pytest.raises(ValueError, match="s2_scales"):
        CudaW4A8Linear.from_tensors(bad, "layer")
    both = dict(tensors, **{"layer.s1_szeros": torch.zeros(N, dtype=torch.float16)})
    with pytest.raises(ValueError, match="exactly one"):
        CudaW4A8Linear.from_tensors(both, "layer")
