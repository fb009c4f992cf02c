"""CUDA KV4 attention kernels against their pure-torch references, on fresh random data."""

import math

import pytest
import torch

from qoq.runtime_cuda import attention
from qoq.runtime_cuda import attention_reference as ref

pytestmark = pytest.mark.cuda


def _rope_tables(max_pos, dim, device):
    inv_freq = 1.0 / 500000 ** (torch.arange(0, dim, 2, device=device).float() / dim)
    angles = torch.arange(max_pos, device=device).float()[:, None] * inv_freq  # [P, D/2]
    return angles.cos(), angles.sin()


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("hq,hkv,dim", [(8, 8, 64), (12, 4, 128), (16, 4, 64), (32, 4, 128)])
def test_rope_kv4_write_matches_reference(hq, hkv, dim):
    gen = torch.Generator(device="cuda").manual_seed(hq * dim)
    t, n_pages = 300, 8
    qkv = torch.randn(t, (hq + 2 * hkv) * dim, device="cuda", generator=gen).half() * 3
    heads = qkv.view(t, -1, dim)
    heads[0, hq] = 0  # K head 0 of token 0: zero before and after RoPE (max == min)
    heads[1, hq + hkv] = -0.75  # V head 0 of token 1: constant
    positions = torch.randint(0, 8192, (t,), device="cuda", generator=gen)
    slots = torch.randperm(n_pages * 64, device="cuda", generator=gen)[:t]
    slots[5] = -1  # a padding token: not cached
    cos, sin = _rope_tables(8192, dim, "cuda")
    pools = [torch.randint(0, 256, (n_pages, ref.page_bytes(hkv, dim)), device="cuda", dtype=torch.uint8, generator=gen) for _ in range(2)]
    ref_pools = [p.clone() for p in pools]
    q, k = attention.rope_kv4_write(qkv, positions, slots, cos, sin, *pools, hq, hkv)
    q_ref, k_ref = ref.rope_kv4_write(qkv, positions, slots, cos, sin, *ref_pools, hq, hkv)
    assert torch.equal(q, q_ref) and torch.equal(k, k_ref)
    for pool, ref_pool in zip(pools, ref_pools):
        codes, scale, zero = ref.page_views(pool, hkv, dim)
        codes_ref, scale_ref, zero_ref = ref.page_views(ref_pool, hkv, dim)
        # exact; unwritten slots hold the same garbage, NaNs included (a flat head's zero may be ±0)
        torch.testing.assert_close(scale, scale_ref, rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(zero, zero_ref, rtol=0, atol=0, equal_nan=True)
        diff = (ref.unpack_nibbles(codes).int() - ref.unpack_nibbles(codes_ref).int()).abs()
        assert diff.max().item() <= 1 and diff.float().mean().item() <= 1e-3


def _random_cache(lens, hkv, dim, gen):
    """Pools of garbage with the sequences' K/V written at shuffled pages -> (pools, page_table, seq_lens)."""
    n_pages = [math.ceil(n / 64) for n in lens]
    total = sum(n_pages) + 3
    pools = [torch.randint(0, 256, (total, ref.page_bytes(hkv, dim)), device="cuda", dtype=torch.uint8, generator=gen) for _ in range(2)]
    perm = torch.randperm(total, device="cuda", generator=gen)
    table = torch.zeros(len(lens), max(n_pages), dtype=torch.int32, device="cuda")
    start = 0
    for i, (n, p) in enumerate(zip(lens, n_pages)):
        ids = perm[start : start + p]
        start += p
        table[i, :p] = ids.int()
        slots = (ids[:, None] * 64 + torch.arange(64, device="cuda")).flatten()[:n]
        for pool in pools:
            x = torch.randn(n, hkv, dim, device="cuda", generator=gen).half()
            x[0, 0] = 1.5  # max == min
            ref.write_kv4(pool, x, slots)
    return pools, table, torch.tensor(lens, dtype=torch.int32, device="cuda")


@pytest.mark.parametrize("group,dim", [(1, 128), (3, 64), (4, 128), (8, 64), (8, 128)])
def test_decode_attention_matches_reference(group, dim):
    gen = torch.Generator(device="cuda").manual_seed(group * 1000 + dim)
    hkv = 2
    lens = [1, 64, 65, 4096] + torch.randint(1, 4097, (4,), generator=gen, device="cuda").tolist()
    (k_pool, v_pool), table, seq_lens = _random_cache(lens, hkv, dim, gen)
    q = torch.randn(len(lens), hkv * group, dim, device="cuda", generator=gen).half()
    expected = ref.decode_attention(q, k_pool, v_pool, table, seq_lens)
    for splits, stages in [(None, None), (1, 2), (7, 2), (64, 2)] + ([(1, 3), (7, 3)] if dim == 128 else []):
        out = attention.decode_attention(q, k_pool, v_pool, table, seq_lens, max(lens), num_splits=splits, num_stages=stages)
        assert _rel(out, expected) < 1e-3, f"num_splits={splits} num_stages={stages}"


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                    reason="programmatic dependent launch runs on Hopper only")
@pytest.mark.parametrize("group,dim", [(4, 128), (8, 64)])
def test_pdl_decode_reads_the_token_the_write_just_ahead_made(group, dim):
    """enable_pdl: each decode step's attention starts while rope_kv4_write (which lets its dependents
    launch at once) writes q and the step's new token; the attention copies only older chunks before
    its wait. Six steps queued with no sync give what the plain launches give, split or not."""
    gen = torch.Generator(device="cuda").manual_seed(group + dim)
    hkv, steps = 2, 6
    hq = hkv * group
    lens0 = [1, 60, 63, 127, 500, 1000]  # new tokens cross page and chunk boundaries
    final = [n + steps for n in lens0]
    pools, table, _ = _random_cache(final, hkv, dim, gen)
    cos, sin = _rope_tables(2048, dim, "cuda")
    qkv = [torch.randn(len(lens0), (hq + 2 * hkv) * dim, device="cuda", generator=gen).half() for _ in range(steps)]
    positions = [torch.tensor([n + i for n in lens0], device="cuda") for i in range(steps)]
    slots = [table[torch.arange(len(lens0), device="cuda"), pos // 64].long() * 64 + pos % 64 for pos in positions]
    lens = [(pos + 1).int() for pos in positions]
    for splits, stages in [(None, None), (4, 2)] + ([(1, 3)] if dim == 128 else []):

        def decode(pdl: bool) -> list[torch.Tensor]:
            k_pool, v_pool = (p.clone() for p in pools)
            outs = []
            for i in range(steps):
                q, _ = attention.rope_kv4_write(qkv[i], positions[i], slots[i], cos, sin, k_pool, v_pool, hq, hkv)
                outs.append(attention.decode_attention(q, k_pool, v_pool, table, lens[i], max(final),
                                                       num_splits=splits, num_stages=stages, enable_pdl=pdl))
            return outs

        with_pdl = decode(True)
        torch.cuda.synchronize()
        for i, (out, plain) in enumerate(zip(with_pdl, decode(False))):
            assert torch.equal(out, plain), (splits, stages, i)


@pytest.mark.parametrize("dim", [64, 128])
def test_decode_attention_large_v_scales_stay_finite(dim):
    """V rows spanning thousands (KV4 scales > 255) while the scores climb by 7 log2 units from one of a
    warp's chunks to its next: a running max left stale by up to 8 would give p up to 2^7 and
    fp16(p) * scale = inf, so those lanes must rescale exactly."""
    gen = torch.Generator(device="cuda").manual_seed(dim)
    hkv, group, n = 1, 4, 2048
    pools = [torch.zeros(n // 64, ref.page_bytes(hkv, dim), dtype=torch.uint8, device="cuda") for _ in range(2)]
    slots = torch.arange(n, device="cuda")
    climb = 7 / 128 / math.log2(math.e) / math.sqrt(dim)  # per token, so that q . k * D^-1/2 rises 7 log2 units / 128
    k = (torch.arange(n, device="cuda").float() * climb)[:, None, None].expand(n, hkv, dim).half()
    v = (torch.randn(n, hkv, dim, device="cuda", generator=gen) * 4000).half()
    ref.write_kv4(pools[0], k, slots)
    ref.write_kv4(pools[1], v, slots)
    assert ref.page_views(pools[1], hkv, dim)[1].float().min().item() > 255  # every V scale is large
    q = torch.ones(1, hkv * group, dim, device="cuda").half()
    table = torch.arange(n // 64, dtype=torch.int32, device="cuda")[None]
    seq_lens = torch.tensor([n], dtype=torch.int32, device="cuda")
    expected = ref.decode_attention(q, *pools, table, seq_lens)
    for splits, stages in [(None, None), (1, 2)] + ([(1, 3)] if dim == 128 else []):
        out = attention.decode_attention(q, *pools, table, seq_lens, n, num_splits=splits, num_stages=stages)
        assert out.isfinite().all() and _rel(out, expected) < 1e-3, f"num_splits={splits} num_stages={stages}"


def _qwen_like_k_bias(hkv, dim, gen, big):
    """b [Hkv, D] fp32: N(0, 2) with Qwen2.5-like channels (±big at the lowest-frequency pair, 0.4 big at a
    high-frequency one)."""
    b = torch.randn(hkv, dim, device="cuda", generator=gen) * 2
    b[:, dim // 2 - 1], b[:, dim - 1], b[:, 2] = big, -big, 0.4 * big
    return b


@pytest.mark.parametrize("group,dim", [(1, 128), (6, 128), (7, 64), (8, 64)])
def test_decode_attention_with_k_bias_matches_reference(group, dim):
    """The k bias kept outside the cache (attention_decode_k_bias.cuh): every split and ring depth, PDL on and
    off, against the reference adding R(p)·b to the dequantized keys in fp32. Bias scores of hundreds (Qwen2.5's
    ±150 channels) cost what fp16 keys cost: the bound is looser there (tests/runtime_cuda/test_k_bias_fragments.py
    replays the arithmetic)."""
    gen = torch.Generator(device="cuda").manual_seed(group * 100 + dim)
    hkv = 2
    lens = [1, 31, 33, 64, 65, 4096] + torch.randint(1, 4097, (3,), generator=gen, device="cuda").tolist()
    (k_pool, v_pool), table, seq_lens = _random_cache(lens, hkv, dim, gen)
    q = torch.randn(len(lens), hkv * group, dim, device="cuda", generator=gen).half()
    cos, sin = _rope_tables(4096, dim, "cuda")
    frags = attention.rope_fragments(cos, sin, dim)
    for big, bound in ((20.0, 2e-3), (150.0, 8e-3)):
        b = _qwen_like_k_bias(hkv, dim, gen, big)
        expected = ref.decode_attention(q, k_pool, v_pool, table, seq_lens, k_bias=(b, cos, sin))
        without = ref.decode_attention(q, k_pool, v_pool, table, seq_lens)
        assert _rel(without, expected) > 0.05  # the bias matters
        for splits, stages in [(None, None), (1, 2), (7, 2), (64, 2)] + ([(1, 3), (7, 3)] if dim == 128 else []):
            for pdl in (False, True):
                out = attention.decode_attention(q, k_pool, v_pool, table, seq_lens, max(lens), num_splits=splits,
                                                 num_stages=stages, enable_pdl=pdl, k_bias=(b, cos, sin, frags))
                assert _rel(out, expected) < bound, (big, splits, stages, pdl, _rel(out, expected))


def test_decode_attention_k_bias_in_a_cuda_graph_follows_new_tokens():
    """Captured once, replayed over growing sequences: the bias follows each replay's lengths and positions."""
    gen = torch.Generator(device="cuda").manual_seed(7)
    hkv, group, dim = 2, 6, 128
    final = [40, 700, 2000]
    (k_pool, v_pool), table, _ = _random_cache(final, hkv, dim, gen)
    cos, sin = _rope_tables(2048, dim, "cuda")
    b = _qwen_like_k_bias(hkv, dim, gen, 20.0)
    k_bias = (b, cos, sin, attention.rope_fragments(cos, sin, dim))
    q = torch.randn(len(final), hkv * group, dim, device="cuda", generator=gen).half()
    seq_lens = torch.tensor([n - 5 for n in final], dtype=torch.int32, device="cuda")
    attention.decode_attention(q, k_pool, v_pool, table, seq_lens, 2048, k_bias=k_bias, enable_pdl=True)  # warm-up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attention.decode_attention(q, k_pool, v_pool, table, seq_lens, 2048, k_bias=k_bias, enable_pdl=True)
    for step in range(5):
        seq_lens.copy_(torch.tensor([n - 4 + step for n in final], dtype=torch.int32))
        graph.replay()
        expected = ref.decode_attention(q, k_pool, v_pool, table, seq_lens, k_bias=k_bias[:3])
        assert _rel(out, expected) < 2e-3, step


def test_decode_attention_rejects_a_bad_k_bias():
    q = torch.randn(1, 2, 64, device="cuda").half()
    pool = torch.zeros(1, ref.page_bytes(2, 64), dtype=torch.uint8, device="cuda")
    one = torch.ones(1, 1, dtype=torch.int32, device="cuda")
    cos, sin = _rope_tables(64, 64, "cuda")
    b = torch.zeros(2, 64, device="cuda")
    with pytest.raises(ValueError, match=r"k_bias b must be contiguous fp32 \[2, 64\]"):
        attention.decode_attention(q, pool, pool, one, one[0], 1, k_bias=(b.half(), cos, sin))
    with pytest.raises(ValueError, match="cover max_seq_len 100"):
        attention.decode_attention(q, pool, pool, one, one[0], 100, k_bias=(b, cos, sin))


def test_decode_attention_rejects_unsupported_stages():
    q = torch.randn(1, 2, 64, device="cuda").half()
    pool = torch.zeros(1, ref.page_bytes(2, 64), dtype=torch.uint8, device="cuda")
    one = torch.ones(1, 1, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="num_stages 3 unsupported for head_dim 64"):
        attention.decode_attention(q, pool, pool, one, one[0], 1, num_stages=3)


def test_decode_attention_rejects_large_groups():
    q = torch.randn(1, 32, 64, device="cuda").half()
    pool = torch.zeros(1, ref.page_bytes(2, 64), dtype=torch.uint8, device="cuda")
    one = torch.ones(1, 1, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="group size"):
        attention.decode_attention(q, pool, pool, one, one[0], 1)


@pytest.mark.parametrize("lens", [[1, 100, 300], [64, 64, 64]])  # ragged (flash varlen), uniform (SDPA)
def test_prefill_attention_matches_reference(lens):
    gen = torch.Generator(device="cuda").manual_seed(3)
    hq, hkv, dim = 8, 2, 128
    t = sum(lens)
    q = torch.randn(t, hq, dim, device="cuda", generator=gen).half()
    k = torch.randn(t, hkv, dim, device="cuda", generator=gen).half()
    v = torch.randn(t, hkv, dim, device="cuda", generator=gen).half()
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda")
    out = attention.prefill_attention(q, k, v, lens)
    assert _rel(out, ref.prefill_attention(q, k, v, cu)) < 1e-3


def test_chunk_attention_aligns_queries_bottom_right():
    """Prefill chunks with cached context (q_len < k_len) and fresh prompts (q_len == k_len) in one call,
    against the per-chunk SDPA under the explicit bottom-right mask (the CPU runner's reference)."""
    from qoq.engine.cuda_ops import ReferenceOps
    from qoq.engine.prefill_inputs import PrefillInputs

    gen = torch.Generator(device="cuda").manual_seed(5)
    hq, hkv, dim = 12, 2, 128
    q_lens, k_lens = [37, 200, 5, 64], [37, 700, 69, 64]
    q = torch.randn(sum(q_lens), hq, dim, device="cuda", generator=gen).half()
    k = torch.randn(sum(k_lens), hkv, dim, device="cuda", generator=gen).half()
    v = torch.randn(sum(k_lens), hkv, dim, device="cuda", generator=gen).half()
    cum = lambda xs: torch.tensor([0, *torch.tensor(xs).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    none = torch.empty(0, dtype=torch.int64)  # chunk_attention reads only the lengths
    plan = PrefillInputs(None, none, none, none, q_lens, k_lens, cum(q_lens), cum(k_lens))
    out = attention.chunk_attention(q, k, v, plan.cu_q, plan.cu_k, plan.max_q, plan.max_k)
    expected = ReferenceOps(torch.float32).chunk_attention(q.float(), k.float(), v.float(), plan)
    assert _rel(out, expected) < 2e-3


@pytest.mark.parametrize("hkv,dim", [(2, 128), (4, 64), (8, 128), (1, 64)])
def test_read_kv4_slots_matches_reference(hkv, dim):
    """Slots in any order over pages of garbage (NaN and inf scales included), after a RoPE write ahead
    in the stream: equal, bit for bit, to the reference read + dequantize_kv."""
    from qoq.quant.kv import dequantize_kv

    gen = torch.Generator(device="cuda").manual_seed(hkv * dim)
    n_pages, t = 9, 333
    pools = [torch.randint(0, 256, (n_pages, ref.page_bytes(hkv, dim)), device="cuda", dtype=torch.uint8,
                           generator=gen) for _ in range(2)]
    hq = 2 * hkv
    qkv = torch.randn(100, (hq + 2 * hkv) * dim, device="cuda", generator=gen).half()
    cos, sin = _rope_tables(4096, dim, "cuda")
    written = torch.randperm(n_pages * 64, device="cuda", generator=gen)[:100]
    attention.rope_kv4_write(qkv, torch.arange(100, device="cuda"), written, cos, sin, *pools, hq, hkv)
    slots = torch.cat([written, torch.randint(0, n_pages * 64, (t - 100,), device="cuda", generator=gen)])
    page, offset = slots // 64, slots % 64
    k, v = attention.read_kv4_slots(*pools, page, offset, hkv, dim)
    for out, pool in zip((k, v), pools):
        expected = dequantize_kv(*ref.read_kv4_slots(pool, page, offset, hkv, dim), dtype=torch.float16)
        torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)
    empty = torch.empty(0, dtype=torch.int64, device="cuda")
    assert attention.read_kv4_slots(*pools, empty, empty, hkv, dim)[0].shape == (0, hkv, dim)
