"""W4A16 (design §3.8): the asymmetric group quantizer's contract, GPTQ's fixed-grid rounding, per-group
clip ratios, and WeightOnlyLinear from memory and from artifact tensors."""

import pytest
import torch

from qoq.quant.asymmetric import quantize_asymmetric
from qoq.quant.weight_only_linear import WeightOnlyLinear, export_asymmetric


def test_codes_scales_zeros_follow_the_contract():
    w = torch.randn(32, 256) * 0.05
    qw = quantize_asymmetric(w, 128)
    wg = w.view(32, 2, 128)
    v_max, v_min = wg.amax(2).clamp_min(0), wg.amin(2).clamp_max(0)
    s = ((v_max - v_min) / 15).half()
    z = torch.round(-v_min / s.float()).clamp(0, 15)
    assert torch.equal(qw.scales, s) and torch.equal(qw.zeros, z.to(torch.uint8))
    q = (torch.round(wg / s.float()[..., None]) + z[..., None]).clamp(0, 15)
    assert torch.equal(qw.q, q.view(32, 256).to(torch.uint8))
    assert torch.equal(qw.dequantize(), ((q - z[..., None]) * s.float()[..., None]).view(32, 256))
    # GPTQ's rounding onto the fixed grid gives the same codes on the grid's own weight
    codes, w_hat = qw.round_onto(w[:, 100:140], torch.arange(100, 140))
    assert torch.equal(codes, qw.q[:, 100:140]) and torch.equal(w_hat, qw.dequantize()[:, 100:140])


def test_per_group_clip_ratios_shrink_their_group_only():
    w = torch.randn(8, 256)
    r = torch.ones(8, 2)
    r[3, 1] = 0.5
    clipped, plain = quantize_asymmetric(w, 128, r), quantize_asymmetric(w, 128)
    assert torch.equal(clipped.scales[:, 0], plain.scales[:, 0])
    assert clipped.scales[3, 1] < plain.scales[3, 1] and torch.equal(clipped.scales[:3], plain.scales[:3])
    with pytest.raises(ValueError, match=r"clip_ratio has shape \(8, 3\), expected \[8\] or \[8, 2\]"):
        quantize_asymmetric(w, 128, torch.ones(8, 3))


@pytest.mark.parametrize("group", [128, 64, -1])
def test_linear_from_memory_and_artifact_agree(group):
    g = torch.Generator().manual_seed(0)
    w, bias, x = torch.randn(64, 256, generator=g) * 0.05, torch.randn(64, generator=g).half(), torch.randn(3, 256)
    qw = quantize_asymmetric(w, group)
    tensors = export_asymmetric("p", qw, bias)
    assert tensors["p.qweight"].shape == (64, 128) and tensors["p.w_zeros"].dtype == torch.uint8

    class Fmt:
        group_size = group

    a, b = WeightOnlyLinear(qw, bias)(x), WeightOnlyLinear.from_tensors(tensors, "p", Fmt)(x)
    assert torch.equal(a, b)
    assert torch.allclose(a, x @ qw.dequantize().t() + bias.float(), atol=1e-5)
