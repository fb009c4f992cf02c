"""CPU checks of the fp16 path's kernel references (the contracts csrc/quant_act.cu's fp16 rows and
csrc/kv_rope_write.cu's fp16 write are held to on the GPU) against plain torch math: RMSNorm with the residual
add fused in (vLLM's fused_add_rms_norm), SiLU·mul, RoPE with the write of K and V to fp16 pages, and the
residual add of rmsnorm_quant's reference."""

import pytest
import torch

from qoq.runtime_cuda import attention_reference as ref
from qoq.runtime_cuda.reference import (
    reference_rmsnorm_quant,
    rmsnorm_fp16,
    silu_mul_fp16,
)


def test_rmsnorm_with_residual_by_hand():
    """r = [1, 2] + x = [2, 2] -> r = [3, 4]; rms = sqrt((9 + 16) / 2); weight [1, 2]."""
    r = torch.tensor([[1.0, 2.0]], dtype=torch.float16)
    x = torch.tensor([[2.0, 2.0]], dtype=torch.float16)
    out = rmsnorm_fp16(x, torch.tensor([1.0, 2.0], dtype=torch.float16), 0.0, residual=r)
    assert r.tolist() == [[3.0, 4.0]]
    rms = 12.5**0.5
    assert out.dtype == torch.float16
    assert out[0].float().tolist() == pytest.approx([3 / rms, 8 / rms], rel=1e-3)  # 0.8485, 2.2627


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_rmsnorm_residual_add_in_place_then_norm(dtype):
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(5, 96, generator=gen) * 3).to(dtype)
    r = (torch.randn(5, 96, generator=gen) * 3).to(dtype)
    w = (torch.rand(96, generator=gen) + 0.5).to(dtype)
    r_before = r.clone()
    out = rmsnorm_fp16(x, w, 1e-5, dtype, residual=r)
    s = (r_before.float() + x.float()).to(dtype)  # one rounding of the sum, as torch adds two tensors of dtype
    assert torch.equal(r, s)
    want = (s.float() / (s.float().pow(2).mean(-1, keepdim=True) + 1e-5).sqrt() * w.float()).to(dtype)
    torch.testing.assert_close(out, want, rtol=1e-3 if dtype == torch.float16 else 1e-6, atol=1e-6)
    assert torch.equal(out, rmsnorm_fp16(s, w, 1e-5, dtype))  # the fused add changes nothing else
    with pytest.raises(ValueError, match="must have one shape"):
        rmsnorm_fp16(x, w, 1e-5, dtype, residual=r[:3])


def test_rmsnorm_quant_reference_with_residual():
    gen = torch.Generator().manual_seed(1)
    x, r = (torch.randn(2, 4, 128, generator=gen) * 2).half().unbind(0)
    w = (torch.rand(128, generator=gen) + 0.5).half()
    s = r + x
    want = reference_rmsnorm_quant(s, w, 1e-5, "codes")
    got = reference_rmsnorm_quant(x, w, 1e-5, "codes", residual=r)
    assert torch.equal(r, s)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_silu_mul_by_hand_and_two_roundings():
    gate = torch.tensor([[0.0, 1.0, -2.0, 4.0]], dtype=torch.float16)
    up = torch.tensor([[5.0, 2.0, 1.0, -0.5]], dtype=torch.float16)
    out = silu_mul_fp16(gate, up)
    assert out.dtype == torch.float16
    # silu(g) = g / (1 + e^-g): 0, 0.7311, -0.2384, 3.9281
    assert out[0].float().tolist() == pytest.approx([0.0, 1.4621, -0.2384, -1.9640], rel=2e-3)
    gen = torch.Generator().manual_seed(2)
    gate_up = (torch.randn(7, 2 * 160, generator=gen) * 3).half()
    g, u = gate_up[:, :160], gate_up[:, 160:]
    silu = (g.float() / (1 + torch.exp(-g.float()))).half()  # F.silu on fp16 rounds its fp32 result once
    # within one fp16 rounding: exp's last fp32 bit may differ between torch's scalar and vector code
    torch.testing.assert_close(silu_mul_fp16(g, u), (silu.float() * u.float()).half(), rtol=1e-3, atol=1e-6)


def _rope_tables(max_pos: int, dim: int):
    inv_freq = 1.0 / 10000 ** (torch.arange(0, dim, 2).float() / dim)
    angles = torch.arange(max_pos).float()[:, None] * inv_freq
    return angles.cos(), angles.sin()


@pytest.mark.parametrize("pool_dtype", [torch.float16, torch.float32])
def test_rope_kv_write_fp16_rotates_q_and_k_and_writes_k_and_v(pool_dtype):
    gen = torch.Generator().manual_seed(3)
    t, hq, hkv, d = 6, 4, 2, 64
    cos, sin = _rope_tables(200, d)
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=gen).half()
    pos = torch.tensor([0, 5, 63, 64, 130, 199])
    slots = torch.tensor([3, 64, -1, 65, 0, 127])  # -1: a padding token, not cached
    k_pool = torch.full((2, 64, hkv, d), float("nan"), dtype=pool_dtype)
    v_pool = k_pool.clone()
    q = ref.rope_kv_write_fp16(qkv, pos, slots, cos, sin, k_pool, v_pool, hq, hkv)

    heads = qkv.view(t, hq + 2 * hkv, d).float()
    c, s = cos[pos][:, None], sin[pos][:, None]  # rotate-half: (x1, x2) -> (x1 c - x2 s, x2 c + x1 s)

    def rotated(x):
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1).half()

    assert q.shape == (t, hq, d) and q.dtype == torch.float16
    assert torch.equal(q, rotated(heads[:, :hq]))
    k, v = rotated(heads[:, hq : hq + hkv]), heads[:, hq + hkv :].half()
    flat_k, flat_v = k_pool.view(-1, hkv, d), v_pool.view(-1, hkv, d)
    written = slots[slots >= 0]
    assert torch.equal(flat_k[written], k[slots >= 0].to(pool_dtype))
    assert torch.equal(flat_v[written], v[slots >= 0].to(pool_dtype))
    untouched = torch.ones(128, dtype=torch.bool)
    untouched[written] = False
    assert flat_k[untouched].isnan().all() and flat_v[untouched].isnan().all()
