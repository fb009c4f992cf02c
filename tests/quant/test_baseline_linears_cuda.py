"""The baseline formats' linears on a GPU: SymmetricIntegerLinear's per-group torch._int_mm sums give the
CPU reference's numbers; WeightOnlyLinear's fp16 GEMM stays within fp16 rounding of it."""

import pytest
import torch

from qoq.quant.asymmetric import quantize_asymmetric
from qoq.quant.symmetric_linear import SymmetricIntegerLinear
from qoq.quant.weight_only_linear import WeightOnlyLinear
from tests.quant.test_symmetric import FORMATS, make, rel_err

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("rows", [5, 64])  # M <= 16: fp64 sums; M > 16: INT8 tensor cores
@pytest.mark.parametrize("name", list(FORMATS))
def test_symmetric_linear_on_gpu_is_the_cpu_reference(name, rows):
    _, x, qw, bias, clip = make(name)
    x = x.reshape(-1, x.shape[-1]).repeat(4, 1)[:rows]
    lin = SymmetricIntegerLinear.from_weight(qw, bias, clip)
    cpu = lin(x)
    gpu = lin.to("cuda")(x.cuda()).cpu()
    assert rel_err(gpu, cpu) < 1e-6
    half = lin(x.cuda().half()).float().cpu()  # fp16 activations: same codes up to rounding flips
    assert rel_err(half, cpu) < 5e-2


@pytest.mark.parametrize("group", [128, 64])
def test_weight_only_linear_fp16_on_gpu(group):
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(256, 512, generator=g) * 0.05, torch.randn(64, 512, generator=g)
    lin = WeightOnlyLinear(quantize_asymmetric(w, group))
    cpu = lin(x)
    gpu = lin.to("cuda")(x.cuda().half()).float().cpu()
    assert rel_err(gpu, cpu) < 5e-3  # fp16 weights and activations, cuBLAS fp16 GEMM
