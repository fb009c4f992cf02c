"""Progressive (§3.1) and per-channel (§3.2) W4 quantizers: hand-checked values and invariants."""

import pytest
import torch

from qoq.quant.weights import quantize_per_channel, quantize_progressive, quantize_weight


def adversarial_weights(k: int = 256) -> torch.Tensor:
    """Rows that stress the quantizers: [10, K]."""
    g = torch.Generator().manual_seed(1)
    rows = [
        torch.randn(k, generator=g),
        torch.randn(k, generator=g).index_fill(0, torch.tensor([7]), 1e3),  # one outlier
        torch.full((k,), 3.7),  # constant row
        torch.zeros(k),  # zero row
        torch.randn(k, generator=g) * 1e4,  # huge range
        torch.randn(k, generator=g) * 1e-8,  # below fp16 scale resolution
        torch.randn(k, generator=g) * 1e-5,  # subnormal fp16 scales
        torch.rand(k, generator=g) + 5.0,  # all positive, far from zero
        -torch.rand(k, generator=g) - 5.0,  # all negative
        torch.cat([torch.zeros(k - 1), torch.tensor([-2.0])]),  # one nonzero value
    ]
    return torch.stack(rows)


def test_progressive_matches_hand_computation():
    # s1 = 120/128/120 = 2^-7 exactly, so U = 128*W exactly; groups of 4
    u = torch.tensor([[0, 120, -120, 64, 10, 20, 30, 40, 0, 1, 2, 37.5]])
    qw = quantize_progressive(u / 128, group_size=4)
    assert qw.s1.dtype == torch.float16 and qw.s1.item() == 2.0**-7
    # group 0: s2 = 240/15 = 16, z = 120, codes round(7.5) = 8 and round(11.5) = 12 (half to even);
    # group 1: s2 = 2, z = -10; group 2: s2 = round(2.5) = 2, z = 0, codes round(0.5) = 0 and 18.75 -> 15
    assert qw.s2.tolist() == [[16, 2, 2]] and qw.z.tolist() == [[120, -10, 0]]
    assert qw.q.tolist() == [[8, 15, 0, 12, 0, 5, 10, 15, 0, 0, 1, 15]]
    assert qw.w8().tolist() == [[8, 120, -120, 72, 10, 20, 30, 40, 0, 0, 2, 30]]
    assert torch.equal(qw.dequantize(), qw.w8().float() / 128)


def test_per_channel_matches_hand_computation():
    w = torch.tensor([[-0.5, 0.0, 0.0625, 1.375]])  # range 1.875 = 15 * 0.125
    qw = quantize_per_channel(w)
    assert qw.s1.item() == 0.125 and qw.szero.item() == 0.5 and qw.group_size == -1
    assert qw.q.tolist() == [[0, 4, 4, 15]]  # (W+z)/s = 4.5 rounds to 4
    assert qw.dequantize().tolist() == [[-0.5, 0.0, 0.0, 1.375]]
    clipped = quantize_per_channel(w, clip_ratio=torch.tensor([0.5]))
    assert clipped.s1.item() == 0.0625 and clipped.szero.item() == 0.25
    assert clipped.q.tolist() == [[0, 4, 5, 15]]


@pytest.mark.parametrize("group_size", [128, 64])
@pytest.mark.parametrize("kind", ["random", "adversarial"])
def test_progressive_invariants(group_size, kind):
    w = torch.randn(64, 256) * 0.02 if kind == "random" else adversarial_weights()
    qw = quantize_progressive(w, group_size)
    w8 = qw.w8().long()
    assert qw.q.dtype == torch.uint8 and int(qw.q.max()) <= 15
    assert int(w8.min()) >= -128 and int(w8.max()) <= 127
    qs2 = qw.q.long() * qw.s2.repeat_interleave(group_size, 1).long()
    assert int(qs2.max()) <= 255
    assert 1 <= int(qw.s2.min()) and int(qw.s2.max()) <= 16  # P = 120 bounds s2 by 16
    assert torch.isfinite(qw.s1).all() and (qw.s1 > 0).all()
    w_hat = qw.dequantize()
    assert torch.isfinite(w_hat).all()
    # error in U units: <= s2/2 where the code is not clamped at 15, <= 8 anywhere (s2 rounding
    # down can push up to 7.5 + 0.5 units past 15*s2); plus the clamp of W/s1 to +-120
    s1 = qw.s1.float()[:, None]
    s2 = qw.s2.repeat_interleave(group_size, 1).float()
    u_clamp_err = ((w.abs() / s1 - 120).clamp_min(0)) * s1
    err = (w - w_hat).abs()
    slack = 1e-6 * w.abs() + 1e-30
    assert (err <= 8 * s1 + u_clamp_err + slack).all()
    inside = qw.q < 15
    assert (err[inside] <= (s2 / 2 * s1 + u_clamp_err + slack)[inside]).all()
    if kind == "random":  # clamping at 15 is rare on smooth weights
        assert inside.float().mean() > 0.95


def test_adversarial_rows_reconstruct_sensibly():
    w = adversarial_weights()
    qw = quantize_progressive(w, 128)
    w_hat = qw.dequantize()
    assert qw.s1[3].item() == 1.0 and torch.equal(w_hat[3], torch.zeros(256))  # zero row
    assert qw.s1[5].item() == 1.0 and w_hat[5].abs().max() == 0  # s1 underflows fp16 -> treated as zero
    assert torch.allclose(w_hat[2], w[2], rtol=1e-2)  # constant row
    assert (w_hat[4] - w[4]).abs().max() <= 8 * qw.s1[4].float()  # 1e4 range


@pytest.mark.parametrize("kind", ["random", "adversarial"])
def test_per_channel_invariants(kind):
    w = torch.randn(64, 256) * 0.02 if kind == "random" else adversarial_weights()
    qw = quantize_per_channel(w)
    assert qw.q.dtype == torch.uint8 and int(qw.q.max()) <= 15
    assert (qw.s1 > 0).all() and torch.isfinite(qw.s1).all() and torch.isfinite(qw.szero).all()
    w_hat = qw.dequantize()
    assert torch.isfinite(w_hat).all()
    # |W - Ŵ| <= s/2 plus the fp16 rounding of z (half an ulp of |z|) and fp32 slack
    s, z = qw.s1.float()[:, None], qw.szero.float()[:, None]
    bound = s / 2 + z.abs() * 2.0**-11 + 1e-6 * w.abs() + 1e-12
    assert ((w - w_hat).abs() <= bound).all()
    if kind == "adversarial":  # constant row: z = -min, q = 0, Ŵ = fp16(min)
        assert torch.equal(w_hat[2], w[2].half().float())


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match=r"K=100 .*group size 128"):
        quantize_weight(torch.randn(4, 100), 128)
    with pytest.raises(ValueError, match="NaN or inf"):
        quantize_weight(torch.tensor([[1.0, float("nan")]]), -1)
    with pytest.raises(ValueError, match="overflows fp16"):
        quantize_weight(torch.full((2, 128), 1e7), 128)
    with pytest.raises(ValueError, match="clip_ratio has 3 entries"):
        quantize_per_channel(torch.randn(4, 8), clip_ratio=torch.ones(3))
    with pytest.raises(ValueError, match="per channel"):
        quantize_per_channel(torch.randn(4, 8)).w8()
