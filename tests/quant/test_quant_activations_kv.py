"""Per-token INT8 activations (§3.3) and per-head UINT4 KV (§3.4)."""

import pytest
import torch

from qoq.quant.activations import fake_quant_tokens, quantize_tokens
from qoq.quant.kv import dequantize_kv, fake_quant_kv, quantize_kv


def test_tokens_hand_computation_half_to_even():
    # abs max 127/64 -> s_x = 2^-6 exactly, so qx = 64*x: -0.5 -> 0, 1.5 -> 2, -2.5 -> -2
    x = torch.tensor([[127 / 64, -0.5 / 64, 1.5 / 64, -2.5 / 64]])
    qx, s_x = quantize_tokens(x)
    assert s_x.dtype == torch.float16 and s_x.shape == (1, 1) and s_x.item() == 2.0**-6
    assert qx.dtype == torch.int8 and qx.tolist() == [[127, 0, 2, -2]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_tokens_codes_and_error_bound(dtype):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(3, 7, 96, generator=g) * torch.logspace(-3, 3, 96)).to(dtype)
    qx, s_x = quantize_tokens(x)
    assert qx.shape == x.shape and s_x.shape == (3, 7, 1)
    assert int(qx.min()) >= -127 and int(qx.max()) <= 127
    assert int(qx.abs().amax(-1).min()) >= 126  # the token max uses the full range
    xf, s = x.float(), s_x.float()
    clamp_err = (xf.abs().amax(-1, keepdim=True) - 127 * s).clamp_min(0)
    x_hat = fake_quant_tokens(x)
    assert x_hat.dtype == dtype
    err = (xf - (qx.float() * s)).abs()
    assert (err <= s / 2 * (1 + 1e-6) + clamp_err).all()
    assert torch.equal(x_hat, (qx.float() * s).to(dtype))


def test_tokens_zero_and_tiny_tokens_give_no_nan():
    x = torch.stack([torch.zeros(32), torch.full((32,), 3e-7), torch.linspace(-1e-6, 1e-6, 32)])
    qx, s_x = quantize_tokens(x)
    assert (s_x > 0).all() and torch.isfinite(s_x).all()
    assert qx[0].eq(0).all()
    x_hat = fake_quant_tokens(x)
    assert torch.isfinite(x_hat).all() and (x_hat - x).abs().max() <= 2.0**-25


def test_kv_hand_computation():
    x = torch.tensor([-1.25, 0.0, 2.5, 0.125])  # range 3.75 -> scale 0.25, zero 5
    q, scale, zero = quantize_kv(x)
    assert scale.item() == 0.25 and zero.item() == 5.0 and scale.dtype == zero.dtype == torch.float16
    assert q.tolist() == [0, 5, 15, 6]  # 0.125/0.25 + 5 = 5.5 rounds to 6 (half to even)
    assert dequantize_kv(q, scale, zero, torch.float32).tolist() == [-1.25, 0.0, 2.5, 0.25]


def test_kv_random_bounds():
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(2, 4, 9, 64, generator=g) * 3).half()  # [B, H_kv, T, D]
    q, scale, zero = quantize_kv(x)
    assert q.dtype == torch.uint8 and int(q.max()) <= 15 and scale.shape == (2, 4, 9, 1)
    x_hat = fake_quant_kv(x)
    assert x_hat.dtype == torch.float16 and x_hat.shape == x.shape
    err = (x.float() - dequantize_kv(q, scale, zero, torch.float32)).abs()
    assert (err <= 0.51 * scale.float()).all()
    assert q.amin(-1).eq(0).all() and q.amax(-1).eq(15).all()  # every head uses the full range


def test_kv_constant_heads_are_exact():
    x = torch.tensor([[0.0] * 8, [-3.5] * 8, [1234.0] * 8, [1e-3] * 8]).half()  # max == min
    q, scale, zero = quantize_kv(x)
    assert scale.eq(1).all() and torch.equal(zero.squeeze(-1), -x[:, 0])
    x_hat = fake_quant_kv(x)
    assert torch.isfinite(x_hat).all() and torch.equal(x_hat, x)


def test_kv_ranges_below_fp16_resolution_give_no_nan():
    # fp32 heads: scale underflows fp16 (rows 0, 1) or the zero -min/scale overflows it (row 2)
    x = torch.tensor([[1.0, 1.0 + 1e-7, 1.0, 1.0], [0.0, 1e-9, 0.0, 0.0], [1.0, 1.0 + 2e-6, 1.0, 1.0]])
    q, scale, zero = quantize_kv(x)
    assert scale.eq(1).all() and torch.equal(zero.squeeze(-1), -x[:, 0].half())
    x_hat = dequantize_kv(q, scale, zero, torch.float32)
    x_range = x.amax(-1, keepdim=True) - x.amin(-1, keepdim=True)
    assert torch.isfinite(x_hat).all() and ((x_hat - x).abs() <= x_range).all()  # x̂ = min
