"""CPU tests of the KV4 paged-attention references and the page bookkeeping (run in CI)."""

import math

import pytest
import torch
import torch.nn.functional as F

from qoq.quant.kv import dequantize_kv, quantize_kv
from qoq.runtime_cuda import attention_reference as ref
from qoq.runtime_cuda.kv_cache import KV4Cache, KV4Format, PageTable


def _pool(num_pages, heads, dim, gen):
    """A page pool full of random bytes: unwritten slots hold garbage, as on a GPU."""
    return torch.randint(0, 256, (num_pages, ref.page_bytes(heads, dim)), dtype=torch.uint8, generator=gen)


def _filled_sequence(length, heads, dim, gen, flat_tokens=()):
    """K or V of one sequence [H, L, D], stored through a shuffled page list; returns (x, pool, page_ids)."""
    x = torch.randn(length, heads, dim, generator=gen).half()
    for t in flat_tokens:
        x[t, 0] = 0.375  # max == min for head 0
    n_pages = math.ceil(length / ref.PAGE_TOKENS)
    pool = _pool(n_pages + 3, heads, dim, gen)
    page_ids = torch.randperm(n_pages + 3, generator=gen)[:n_pages]
    slots = torch.tensor([int(page_ids[t // 64]) * 64 + t % 64 for t in range(length)])
    ref.write_kv4(pool, x, slots)
    return x.transpose(0, 1), pool, page_ids


def test_nibble_order():
    assert ref.pack_nibbles(torch.tensor([1, 2, 15, 0], dtype=torch.uint8)).tolist() == [0x21, 0x0F]
    codes = torch.randint(0, 16, (5, 128), dtype=torch.uint8)
    assert torch.equal(ref.unpack_nibbles(ref.pack_nibbles(codes)), codes)


@pytest.mark.parametrize("length,dim", [(1, 64), (64, 128), (65, 64), (200, 128)])
def test_page_round_trip_equals_quantize(length, dim):
    gen = torch.Generator().manual_seed(length)
    x, pool, page_ids = _filled_sequence(length, 3, dim, gen, flat_tokens=[0, length - 1])
    q, s, z = ref.read_kv4(pool, page_ids, length, 3, dim)
    q_ref, s_ref, z_ref = quantize_kv(x)
    assert torch.equal(q, q_ref) and torch.equal(s, s_ref) and torch.equal(z, z_ref)
    x_hat = dequantize_kv(q, s, z, dtype=torch.float32)
    assert torch.equal(x_hat, dequantize_kv(q_ref, s_ref, z_ref, dtype=torch.float32))
    # max == min: scale 1, x̂ is the value itself
    assert x_hat[0, 0].eq(0.375).all() and x_hat[0, -1].eq(0.375).all()
    assert s[0, 0].item() == 1.0


@pytest.mark.parametrize("group,dim", [(1, 64), (3, 128), (4, 64), (8, 128)])
def test_decode_reference_equals_softmax_over_dequantized(group, dim):
    gen = torch.Generator().manual_seed(group * dim)
    h_kv, lens = 2, [1, 63, 64, 65, 130]
    n_pages = sum(math.ceil(n / 64) for n in lens) + 2
    k_pool, v_pool = _pool(n_pages, h_kv, dim, gen), _pool(n_pages, h_kv, dim, gen)
    table = PageTable(n_pages)
    q = torch.randn(len(lens), h_kv * group, dim, generator=gen).half()
    expected = []
    for i, n in enumerate(lens):
        slots = torch.tensor(table.alloc(i, n))
        k = torch.randn(n, h_kv, dim, generator=gen).half()
        v = torch.randn(n, h_kv, dim, generator=gen).half()
        ref.write_kv4(k_pool, k, slots)
        ref.write_kv4(v_pool, v, slots)
        k_hat = dequantize_kv(*quantize_kv(k), dtype=torch.float32).transpose(0, 1)  # [Hkv, L, D]
        v_hat = dequantize_kv(*quantize_kv(v), dtype=torch.float32).transpose(0, 1)
        o = F.scaled_dot_product_attention(
            q[i, :, None].float(), k_hat.repeat_interleave(group, 0), v_hat.repeat_interleave(group, 0)
        )
        expected.append(o[:, 0])
    page_table, seq_lens = table.block_table(list(range(len(lens))))
    out = ref.decode_attention(q, k_pool, v_pool, page_table, seq_lens)
    expected = torch.stack(expected)
    assert out.dtype == torch.float16
    assert ((out.float() - expected).norm() / expected.norm()).item() < 1e-3


@pytest.mark.parametrize("group,dim", [(1, 64), (3, 128), (4, 64), (7, 128), (8, 64)])
def test_decode_fp16_reference_equals_dense_attention(group, dim):
    """Sequences written through FloatKVCache.write at shuffled slots, NaN everywhere else in the pools
    (unwritten slots, padded page-table columns): decode_attention_fp16 over the layer's pools equals
    softmax attention over each sequence's dense K/V."""
    from qoq.engine.kv_float import FloatKVCache

    gen = torch.Generator().manual_seed(group * dim)
    h_kv, lens, layer = 2, [1, 63, 64, 65, 200], 1
    pages = [math.ceil(n / 64) for n in lens]
    cache = FloatKVCache(2, h_kv, dim, (sum(pages) + 3) * 2 * 2 * 64 * h_kv * dim * 2, torch.float16, "cpu")
    cache.storage.fill_(float("nan"))
    perm = torch.randperm(cache.num_pages, generator=gen)
    table = torch.full((len(lens), max(pages) + 1), int(perm[-1]), dtype=torch.int32)  # a spare column of NaN
    q = torch.randn(len(lens), h_kv * group, dim, generator=gen).half()
    expected, start = [], 0
    for i, (n, p) in enumerate(zip(lens, pages)):
        ids = perm[start : start + p]
        start += p
        table[i, :p] = ids.int()
        slots = (ids[:, None] * 64 + torch.arange(64)).flatten()[:n]
        k = torch.randn(n, h_kv, dim, generator=gen).half()
        v = torch.randn(n, h_kv, dim, generator=gen).half()
        cache.write(layer, k, v, slots)
        kd, vd = (x.float().transpose(0, 1).repeat_interleave(group, 0) for x in (k, v))  # [Hq, L, D]
        expected.append(F.scaled_dot_product_attention(q[i, :, None].float(), kd, vd)[:, 0])
    out = ref.decode_attention_fp16(q, *cache.pools(layer), table, torch.tensor(lens, dtype=torch.int32))
    expected = torch.stack(expected)
    assert out.dtype == torch.float16 and out.isfinite().all()
    assert ((out.float() - expected).norm() / expected.norm()).item() < 1e-3


def test_rope_reference_matches_hf_rotate_half():
    gen = torch.Generator().manual_seed(0)
    t, h, d = 7, 3, 64
    inv_freq = 1.0 / 10000 ** (torch.arange(0, d, 2).float() / d)
    angles = torch.arange(100).float()[:, None] * inv_freq  # [P, D/2]
    cos, sin = angles.cos(), angles.sin()
    x = torch.randn(t, h, d, generator=gen).half()
    pos = torch.randint(0, 100, (t,), generator=gen)
    cos_full, sin_full = torch.cat([cos, cos], -1)[pos, None], torch.cat([sin, sin], -1)[pos, None]
    rotated = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1).float()
    hf = (x.float() * cos_full + rotated * sin_full).half()
    out = ref.apply_rope(x, pos, cos, sin)
    assert ((out.float() - hf.float()).abs() <= 1e-3 * hf.float().abs() + 1e-3).all()
    assert not torch.equal(out, x)


def test_rope_kv4_write_stores_post_rope_k_and_raw_v():
    gen = torch.Generator().manual_seed(1)
    t, hq, hkv, d = 5, 4, 2, 64
    angles = torch.arange(16).float()[:, None] * torch.rand(d // 2, generator=gen)
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=gen).half()
    pos, slots = torch.arange(t), torch.tensor([3, 64, 65, -1, 0])  # -1: not cached
    k_pool, v_pool = _pool(2, hkv, d, gen), _pool(2, hkv, d, gen)
    q, k = ref.rope_kv4_write(qkv, pos, slots, angles.cos(), angles.sin(), k_pool, v_pool, hq, hkv)
    assert q.shape == (t, hq, d) and k.shape == (t, hkv, d)
    page_ids = torch.tensor([0, 1])
    kq, ks, kz = ref.read_kv4(k_pool, page_ids, 128, hkv, d)
    vq, vs, vz = ref.read_kv4(v_pool, page_ids, 128, hkv, d)
    v = qkv.view(t, hq + 2 * hkv, d)[:, hq + hkv :]
    for tok, slot in [(0, 3), (1, 64), (4, 0)]:
        assert torch.equal(kq[:, slot], quantize_kv(k[tok])[0])
        assert torch.equal(vs[:, slot], quantize_kv(v[tok])[1])
        assert torch.equal(vz[:, slot], quantize_kv(v[tok])[2])


def test_prefill_reference_is_causal_per_sequence():
    gen = torch.Generator().manual_seed(2)
    lens, hq, hkv, d = [3, 9], 4, 2, 64
    q = torch.randn(sum(lens), hq, d, generator=gen).half()
    k = torch.randn(sum(lens), hkv, d, generator=gen).half()
    v = torch.randn(sum(lens), hkv, d, generator=gen).half()
    out = ref.prefill_attention(q, k, v, torch.tensor([0, 3, 12]))
    for lo, hi in [(0, 3), (3, 12)]:
        e = F.scaled_dot_product_attention(
            q[lo:hi].transpose(0, 1).float(),
            k[lo:hi].transpose(0, 1).float().repeat_interleave(2, 0),
            v[lo:hi].transpose(0, 1).float().repeat_interleave(2, 0),
            is_causal=True,
        ).transpose(0, 1)
        assert ((out[lo:hi].float() - e).norm() / e.norm()).item() < 1e-3


def test_byte_budget_to_pages():
    fmt = KV4Format(num_layers=32, num_kv_heads=8, head_dim=128)
    assert fmt.page_bytes == 8 * 64 * (64 + 4) == 34816
    assert fmt.bytes_per_token == 2 * 32 * 8 * 68 == 34816
    assert fmt.pages_for_budget(1 << 30) == (1 << 30) // (2 * 32 * 34816) == 481
    cache = KV4Cache(KV4Format(2, 3, 64), budget_bytes=10 * 2 * 2 * ref.page_bytes(3, 64) + 5, device="cpu")
    assert cache.storage.shape == (2, 2, 10, 3 * 64 * 36)
    assert cache.k_pages(1).shape == (10, 6912) and cache.table.free_pages == 10
    with pytest.raises(ValueError, match="holds no page"):
        KV4Cache(KV4Format(2, 3, 64), budget_bytes=100, device="cpu")


def test_page_table_alloc_append_free():
    table = PageTable(3)
    assert table.alloc(7, 65) == list(range(65))  # pages 0 and 1
    assert table.append(7) == [65]
    assert table.alloc(8, 1) == [128]  # page 2
    with pytest.raises(MemoryError, match="needs 1 more pages"):
        table.append(7, 63)
    assert table.seq_len(7) == 66 and table.free_pages == 0
    table.free(7)
    assert table.free_pages == 2 and table.alloc(9, 64) == list(range(64))
    page_table, lens = table.block_table([8, 9])
    assert page_table.tolist() == [[2], [0]] and lens.tolist() == [1, 64]
    assert page_table.dtype == torch.int32


def test_bad_page_shape_is_named():
    with pytest.raises(ValueError, match="page has 100 bytes"):
        ref.page_views(torch.zeros(2, 100, dtype=torch.uint8), 3, 64)


def test_decode_launch_plans():
    """split_plan / plan_stages (qoq/runtime_cuda/attention.py): the launch shapes the H200 sweeps chose."""
    from qoq.runtime_cuda.attention import plan_stages, split_plan

    sms = 132
    assert split_plan(64, 32, 1536, sms) == (1, 24)  # 2048 CTAs: no split
    assert split_plan(1, 8, 4096, sms) == (16, 4)  # B=1: up to two CTAs per SM, >= 3 pages each, a power of 2
    assert split_plan(1, 32, 1536, sms) == (8, 3)
    assert split_plan(1, 8, 300, sms) == (1, 5)  # a short sequence is not split
    assert split_plan(16, 8, 1536, sms) == (1, 24)  # 128 CTAs fill half the SMs: splits need >= 32 pages
    assert split_plan(16, 8, 4096, sms) == (2, 32)
    # three ring slots once the grid is two or more waves of 4 CTAs per SM, or unsplit at <= 1 CTA per SM
    assert plan_stages(64, 32, 1, 128, sms) == 3  # Llama-2-7B B=64: 2048 CTAs
    assert plan_stages(64, 8, 1, 128, sms) == 2  # Llama-3-8B B=64: 512 CTAs, one wave
    assert plan_stages(16, 8, 1, 128, sms) == 3  # Llama-3-8B B=16: 128 CTAs, unsplit
    assert plan_stages(1, 8, 16, 128, sms) == 2  # B=1, split 16 ways: 128 CTAs
    assert plan_stages(1, 32, 8, 128, sms) == 2  # B=1, split 8 ways: 256 CTAs
    assert plan_stages(256, 32, 1, 64, sms) == 2  # head_dim 64: two slots only


def test_read_kv4_slots_is_read_kv4_token_major():
    gen = torch.Generator().manual_seed(11)
    hkv, dim, n_pages = 3, 64, 6
    pages = torch.randint(0, 256, (n_pages, ref.page_bytes(hkv, dim)), dtype=torch.uint8, generator=gen)
    page_ids, length = torch.tensor([4, 1, 5]), 150
    codes, scale, zero = ref.read_kv4(pages, page_ids, length, hkv, dim)
    slots = (page_ids[:, None] * 64 + torch.arange(64)).flatten()[:length]
    c2, s2, z2 = ref.read_kv4_slots(pages, slots // 64, slots % 64, hkv, dim)
    assert c2.shape == (length, hkv, dim) and s2.shape == (length, hkv, 1)
    bits = lambda x: x.contiguous().view(torch.int16)  # random bytes: some fp16 are NaN
    assert torch.equal(c2, codes.transpose(0, 1)) and torch.equal(bits(s2), bits(scale.transpose(0, 1)))
    assert torch.equal(bits(z2), bits(zero.transpose(0, 1)))
