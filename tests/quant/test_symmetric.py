"""Symmetric W4A4 / W8A8 (design §3.7): grouping, quantizers, the integer linear against its fake quant
and against exact integer math, artifact round trip, Atom's INT8 outlier channels."""

import pytest
import torch

from qoq.quant.symmetric import (
    Groups,
    fake_quant_token_groups,
    quantize_symmetric,
    quantize_token_groups,
)
from qoq.quant.symmetric_linear import SymmetricIntegerLinear, export_symmetric

FORMATS = {  # name -> (K, group_size, bits, outliers, act_clip)
    "atom-g64": (576, 64, 4, 128, 0.9),
    "atom-g128": (512, 128, 4, 128, 0.9),
    "quarot": (576, -1, 4, 0, 0.9),
    "w8a8": (2048, -1, 8, 0, 1.0),  # K > 1032: the per-channel INT8 sums need the chunked exact path
}


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def make(name, n=64, seed=0):
    k, group, bits, outliers, clip = FORMATS[name]
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    x = torch.randn(3, 7, k, generator=g)
    x[..., torch.randperm(k, generator=g)[:8]] *= 30  # outlier channels
    order = torch.randperm(k, generator=g) if outliers else None
    clip_ratio = torch.rand(n, generator=g) * 0.3 + 0.7
    qw = quantize_symmetric(w, group, bits, outliers, clip_ratio, order)
    bias = (torch.randn(n, generator=g) * 0.1).half()
    return w, x, qw, bias, clip


def test_groups_of_atom_on_smollm2_hidden():
    g = Groups(576, 64, 4, 128)
    assert g.count == 8 and g.bounds[-2:] == ((384, 448), (448, 576))
    assert g.qmax.tolist() == [7.0] * 7 + [127.0] and g.normal.tolist() == [True] * 7 + [False]
    assert Groups(576, -1, 4).bounds == ((0, 576),)
    with pytest.raises(ValueError, match="448 is not divisible by the group size 128"):
        Groups(576, 128, 4, 128)


def test_weight_codes_and_scales_follow_the_contract():
    w, _, qw, _, _ = make("atom-g64")
    wo = w[:, qw.order]
    assert qw.q.dtype == torch.int8 and qw.q[:, :448].min() >= -8 and qw.q[:, :448].max() <= 7
    # the outlier group: INT8, never clipped, scale = fp16(max|w| / 127)
    s8 = (wo[:, 448:].abs().amax(1) / 127).half()
    assert torch.equal(qw.scales[:, 7], s8)
    assert torch.equal(qw.q[:, 448:].float(), torch.round(wo[:, 448:] / s8.float()[:, None]).clamp(-128, 127))
    # dequantize() returns the input channels' own order
    assert torch.equal(qw.dequantize()[:, qw.order], qw.dequantize_ordered())
    assert rel_err(qw.dequantize(), w) < 0.2


def test_activation_groups_clip_the_int4_groups_only():
    x = torch.randn(5, 576)
    groups = Groups(576, 64, 4, 128)
    q, s = quantize_token_groups(x, groups, act_clip=0.9)
    amax = groups.abs_max(x)
    assert torch.equal(s[:, :7], (0.9 * amax[:, :7] / 7).half()) and torch.equal(s[:, 7], (amax[:, 7] / 127).half())
    assert q[:, :448].abs().max() == 8 or q[:, :448].max() == 7  # clipping saturates the INT4 range
    assert q[:, 448:].abs().max() <= 127
    assert torch.allclose(fake_quant_token_groups(x, groups, 0.9), q * s.float()[:, groups.column_group])


@pytest.mark.parametrize("name", list(FORMATS))
def test_integer_linear_matches_fake_quant_and_exact_integers(name):
    w, x, qw, bias, clip = make(name)
    lin = SymmetricIntegerLinear.from_weight(qw, bias, clip)
    y = lin(x)
    assert y.shape == (3, 7, 64)
    assert rel_err(y, lin.fake_forward(x)) < 1e-5
    # the same sums in float64 from the codes: the per-group integer accumulators are exact
    xo = x.reshape(-1, x.shape[-1])[:, qw.order] if qw.order is not None else x.reshape(-1, x.shape[-1])
    qx, s_x = quantize_token_groups(xo, qw.groups, clip)
    expect = sum((qx[:, lo:hi].double() @ qw.q[:, lo:hi].double().t()) * s_x[:, g : g + 1].double()
                 * qw.scales[:, g].double() for g, (lo, hi) in enumerate(qw.groups.bounds)) + bias.double()
    assert rel_err(y.reshape(-1, 64), expect) < 1e-6
    # and the quantized layer approximates the float one
    assert rel_err(y, x @ w.t() + bias.float()) < (0.1 if name == "w8a8" else 0.5)  # W8A8 carries clip ratios down to 0.7


@pytest.mark.parametrize("name", list(FORMATS))
def test_artifact_tensors_round_trip(name):
    _, x, qw, bias, clip = make(name)
    tensors = export_symmetric("p", qw, bias)
    bits = FORMATS[name][2]
    k = FORMATS[name][0]
    o = FORMATS[name][3]
    assert tensors["p.qweight"].shape == (64, (k - o) // 2 if bits == 4 else k)
    assert ("p.qweight_outliers" in tensors) == bool(o) and ("p.input_order" in tensors) == bool(o)

    class Fmt:
        weight_bits, group_size, outlier_channels, act_clip = bits, FORMATS[name][1], o, clip

    from_artifact = SymmetricIntegerLinear.from_tensors(tensors, "p", Fmt)
    assert torch.equal(from_artifact(x), SymmetricIntegerLinear.from_weight(qw, bias, clip)(x))


def test_outlier_channels_are_int8_in_the_linear():
    """With the order putting channels S last, a token whose mass sits on S keeps it at INT8 precision:
    the outlier group's codes use the full ±127 range."""
    k, n = 576, 32
    big = torch.tensor([3, 100, 200, 311] + list(range(400, 524)))  # 128 channels
    order = torch.cat([torch.tensor([c for c in range(k) if c not in set(big.tolist())]), big])
    w = torch.randn(n, k) * 0.05
    lin = SymmetricIntegerLinear.from_weight(quantize_symmetric(w, 64, 4, 128, None, order))
    x = torch.randn(4, k) * 0.1
    x[:, big] = torch.randn(4, 128) * 50
    qx, _ = quantize_token_groups(x[:, lin.order], lin.groups)
    assert set(lin.order[-128:].tolist()) == set(big.tolist())
    assert qx[:, 448:].abs().amax() == 127 and qx[:, :448].abs().amax() <= 8
    assert rel_err(lin(x), x @ w.t()) < 0.05  # the outliers dominate and are INT8
