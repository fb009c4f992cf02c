"""The decode kernel's k-bias term (csrc/attention_decode_k_bias.cuh) replayed lane by lane in torch on the CPU:
rope_fragments' layout, KBiasTerm's per-lane W, per-chunk rotation and fp16 roundings, and the m16n8k16 mma's
fragment layout together must give q·R(p)·b at every position of a chunk, in the kernel's token order."""

import math

import pytest
import torch

from qoq.runtime_cuda.attention import chunk_tokens, rope_fragments
from qoq.runtime_cuda.attention_reference import rotated_k_bias


def _tables(max_pos: int, d: int):
    inv_freq = 1.0 / 1e6 ** (torch.arange(0, d, 2).float() / d)
    angles = torch.arange(max_pos).float()[:, None] * inv_freq
    return angles.cos(), angles.sin()


def _half2(x: torch.Tensor) -> torch.Tensor:
    """int32 words -> [..., 2] fp32 (low half first), as the kernel's half2 registers."""
    return x.contiguous().view(torch.float16).view(*x.shape, 2).float()


def _kernel_bias(q: torch.Tensor, b: torch.Tensor, cos, sin, frags: torch.Tensor, p0: int) -> torch.Tensor:
    """q [G <= 8, D], b [D] -> [chunk_tokens, G] in score units, computed as the kernel's 32 lanes do."""
    g_count, d = q.shape
    pairs, steps, blocks = d // 8, d // 16, chunk_tokens(d) // 16
    half = d // 2
    out = torch.zeros(chunk_tokens(d), 8, dtype=torch.float64)
    # per lane (grp, quad): W for pairs i = quad * D/8 + j, scaled by 2^e of its head
    w = torch.zeros(8, 4, pairs, 2)
    unit = torch.ones(8)
    for grp in range(g_count):
        i = torch.arange(4)[:, None] * pairs + torch.arange(pairs)  # [quad, j]
        q1, q2, b1, b2 = q[grp, i], q[grp, i + half], b[i], b[i + half]
        w[grp, ..., 0], w[grp, ..., 1] = q1 * b1 + q2 * b2, q1 * b2 - q2 * b1
        exp2_max = math.frexp(w[grp].abs().max().item())[1]
        w[grp] *= 2.0 ** (14 - exp2_max)
        unit[grp] = 2.0 ** (exp2_max - 14)
    for s in range(steps):
        B = torch.zeros(16, 8)  # [k, n]
        for grp in range(8):
            for quad in range(4):
                for r in range(2):  # b0: k = 2 quad + {0, 1}; b1: k = 2 quad + 8 + {0, 1}
                    j = 2 * s + r
                    c, sn = cos[p0, quad * pairs + j], sin[p0, quad * pairs + j]
                    re, im = w[grp, quad, j]
                    val = torch.tensor([re * c - im * sn, -(re * sn + im * c)]).half().float()
                    B[2 * quad + 8 * r : 2 * quad + 8 * r + 2, grp] = val
        for blk in range(blocks):
            A = torch.zeros(16, 16)  # [row, k]: a0 (grp, 2quad..), a1 (grp+8, 2quad..), a2 (grp, 2quad+8..), a3
            for lane in range(32):
                grp, quad = lane >> 2, lane & 3
                a = _half2(frags[blk, s, lane])
                A[grp, 2 * quad : 2 * quad + 2] = a[0]
                A[grp + 8, 2 * quad : 2 * quad + 2] = a[1]
                A[grp, 2 * quad + 8 : 2 * quad + 10] = a[2]
                A[grp + 8, 2 * quad + 8 : 2 * quad + 10] = a[3]
            C = (A.double() @ B.double())  # C row grp -> token 2 grp, row grp + 8 -> token 2 grp + 1
            tokens = 16 * blk + torch.cat([2 * torch.arange(8), 2 * torch.arange(8) + 1])
            out[tokens] += C
    return (out * unit.double())[:, :g_count]


@pytest.mark.parametrize("d,group,p0", [(128, 6, 0), (128, 7, 4096), (64, 8, 192), (64, 1, 31 * 64)])
def test_kernel_bias_term_matches_rotated_bias(d, group, p0):
    gen = torch.Generator().manual_seed(d + group + p0)
    cos, sin = _tables(p0 + chunk_tokens(d), d)
    q = torch.randn(group, d, generator=gen).half().float() * 4
    b = torch.randn(d, generator=gen) * 3
    b[d // 2 - 1], b[d - 1], b[2] = 150.0, -150.0, 60.0  # Qwen2.5-like channels
    frags = rope_fragments(cos, sin, d)
    assert frags.shape == (chunk_tokens(d) // 16, d // 16, 32, 4) and frags.dtype == torch.int32
    got = _kernel_bias(q, b, cos, sin, frags, p0)
    positions = torch.arange(p0, p0 + chunk_tokens(d))
    want = (rotated_k_bias(b[None], positions, cos, sin)[:, 0].double() @ q.double().T)  # [T, G]
    # fp16 C and fp16 cos/sin: the error of fp16 keys (docs/engine.md)
    assert (got - want).abs().max() < 2e-3 * (q.abs() @ b.abs()).max()
    assert (got - want).abs().max() > 0  # the roundings are there: this is the kernel's arithmetic, not fp64


def test_rope_fragments_zero_past_the_table():
    cos, sin = _tables(5, 64)
    frags = rope_fragments(cos, sin, 64)
    # lane 0, word 0 of block 0, step 0: t = 0, pair 0 -> (cos 0, sin 0) = (1, 0)
    assert _half2(frags[0, 0, 0])[0].tolist() == [1.0, 0.0]
    # block 3 holds t = 48..63, all past max_pos 5
    assert (frags[3] == 0).all()
