"""The fp16 paged decode-attention kernel (csrc/attention_decode_fp16.cu) against its pure-torch reference
(attention_reference.decode_attention_fp16): ragged batches of 1..64 sequences of 1..4096 tokens, GQA
groups 1..8, head_dim 64 and 128, every launch shape, and replays of a captured CUDA graph. The pools are
random bits (NaN and Inf included) wherever no sequence wrote, as a reused page may be. The argument
checks run on the CPU too.

    PYTHONPATH=$PWD python -m pytest -q -p no:cacheprovider tests/runtime_cuda/test_attention_fp16_cuda.py
"""

import math

import pytest
import torch

from qoq.runtime_cuda import attention
from qoq.runtime_cuda import attention_reference as ref

EDGE_LENS = [4096, 1, 64, 65, 63, 128, 2]  # a batch starts with these (as many as fit), then random lengths
LAUNCHES = [(None, None), (1, 2), (1, 3), (5, 2), (64, 3)]  # (num_splits, num_stages); None: the planned one


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _lens(batch: int, seed: int, edges: bool = True) -> list[int]:
    rand = torch.randint(1, 4097, (batch,), generator=torch.Generator().manual_seed(seed)).tolist()
    return EDGE_LENS[:batch] + rand[len(EDGE_LENS) :] if edges else rand


def _garbage_pools(num_pages: int, hkv: int, dim: int, gen: torch.Generator):
    """K and V pools [num_pages, 64, hkv, dim] of random fp16 bit patterns."""
    def pool():
        bits = torch.randint(-(1 << 15), 1 << 15, (num_pages, 64, hkv, dim), generator=gen, device="cuda",
                             dtype=torch.int32)
        return bits.to(torch.int16).view(torch.float16)

    return pool(), pool()


def _write_sequences(k_pool, v_pool, lens, page_ids, width, spare_page, gen):
    """Each sequence's K/V (random normal) at its pages, taken in order from page_ids; -> page_table int32
    [B, width] (columns past a sequence: spare_page, which holds garbage), seq_lens int32 [B]."""
    hkv, dim = k_pool.shape[2:]
    table = torch.full((len(lens), width), spare_page, dtype=torch.int32, device="cuda")
    slots, start = [], 0
    for i, n in enumerate(lens):
        p = math.ceil(n / 64)
        ids = page_ids[start : start + p]
        start += p
        table[i, :p] = ids.int()
        slots.append((ids[:, None] * 64 + torch.arange(64, device="cuda")).flatten()[:n])
    slots = torch.cat(slots)
    for pool in (k_pool, v_pool):
        pool.view(-1, hkv, dim)[slots] = (torch.randn(len(slots), hkv, dim, device="cuda", generator=gen) * 2).half()
    return table, torch.tensor(lens, dtype=torch.int32, device="cuda")


def _case(lens, hkv, group, dim, seed):
    """-> q, k_pool, v_pool, page_table, seq_lens: the sequences at shuffled pages of garbage pools."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    pages = sum(math.ceil(n / 64) for n in lens)
    k_pool, v_pool = _garbage_pools(pages + 2, hkv, dim, gen)
    perm = torch.randperm(pages + 2, device="cuda", generator=gen)
    table, seq_lens = _write_sequences(k_pool, v_pool, lens, perm, math.ceil(max(lens) / 64), int(perm[-1]), gen)
    q = torch.randn(len(lens), hkv * group, dim, device="cuda", generator=gen).half()
    return q, k_pool, v_pool, table, seq_lens


def _poison(like: torch.Tensor) -> None:
    """Free a NaN-filled block of like's size into the caching allocator, which most likely hands it to the
    next output of that size: an element the kernel does not write then fails the comparison."""
    torch.full_like(like, float("nan"))


@pytest.mark.cuda
@pytest.mark.parametrize("dim", [64, 128])
@pytest.mark.parametrize("group", [1, 3, 4, 7, 8])
def test_decode_fp16_matches_reference(group, dim):
    hkv = 2
    for batch in (1, 5, 64):
        lens = _lens(batch, seed=batch * 100 + group * 10 + dim)
        q, k_pool, v_pool, table, seq_lens = _case(lens, hkv, group, dim, seed=batch + group + dim)
        expected = ref.decode_attention_fp16(q, k_pool, v_pool, table, seq_lens)
        assert expected.isfinite().all()
        outs = []  # kept alive: no output block is reused by the next call
        for splits, stages in LAUNCHES:
            _poison(q)
            outs.append(attention.decode_attention_fp16(q, k_pool, v_pool, table, seq_lens, max(lens),
                                                        num_splits=splits, num_stages=stages))
            out = outs[-1]
            assert out.isfinite().all() and _rel(out, expected) < 1e-3, (batch, splits, stages, lens[:8])


@pytest.mark.cuda
@pytest.mark.parametrize("group,dim", [(4, 128), (7, 64), (1, 128)])
def test_decode_fp16_graph_replays_match_reference(group, dim):
    """Captured once at a 4096-token bucket (the split plan fixed by it), replayed over fresh q, page tables and
    ragged lengths written into the static buffers; split and unsplit launches, 1 to 64 sequences."""
    hkv, bucket, fillings = 2, 4096, 3
    width = bucket // 64
    for batch, splits in ((1, None), (8, None), (64, None), (8, 1)):
        gen = torch.Generator(device="cuda").manual_seed(batch * group + dim)
        num_pages = fillings * batch * width + 1
        k_pool, v_pool = _garbage_pools(num_pages, hkv, dim, gen)
        perm = torch.randperm(num_pages - 1, device="cuda", generator=gen)
        spare = num_pages - 1
        cases = []
        for f in range(fillings):
            lens = _lens(batch, seed=batch * 10 + f + dim, edges=f == 0)
            ids = perm[f * batch * width : (f + 1) * batch * width]
            table, seq_lens = _write_sequences(k_pool, v_pool, lens, ids, width, spare, gen)
            q = torch.randn(batch, hkv * group, dim, device="cuda", generator=gen).half()
            cases.append((q, table, seq_lens))
        q_s, table_s, lens_s = (x.clone() for x in cases[0])
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            # eager first, on the capture stream: makes this stream's split counters outside the capture
            attention.decode_attention_fp16(q_s, k_pool, v_pool, table_s, lens_s, bucket, num_splits=splits)
            stream.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                out = attention.decode_attention_fp16(q_s, k_pool, v_pool, table_s, lens_s, bucket, num_splits=splits)
        torch.cuda.current_stream().wait_stream(stream)
        for f in (1, 2, 0, 1):
            q, table, seq_lens = cases[f]
            q_s.copy_(q)
            table_s.copy_(table)
            lens_s.copy_(seq_lens)
            out.fill_(float("nan"))
            graph.replay()
            expected = ref.decode_attention_fp16(q, k_pool, v_pool, table, seq_lens)
            assert out.isfinite().all() and _rel(out, expected) < 1e-3, (batch, splits, f)


@pytest.mark.cuda
def test_decode_fp16_rejects_unsupported_stages():
    q, k_pool, v_pool, table, seq_lens = _case([5], 2, 2, 64, seed=0)
    with pytest.raises(ValueError, match="num_stages 4 unsupported"):
        attention.decode_attention_fp16(q, k_pool, v_pool, table, seq_lens, 5, num_stages=4)


def _cpu_args(hq=4, hkv=2, dim=64, pool_dtype=torch.float16):
    q = torch.zeros(1, hq, dim, dtype=torch.float16)
    pool = torch.zeros(2, 64, hkv, dim, dtype=pool_dtype)
    return q, pool, pool, torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32)


@pytest.mark.parametrize("args,message", [
    (_cpu_args(dim=96), "head_dim 96 unsupported"),
    (_cpu_args(hq=18), "group size of 1..8"),
    (_cpu_args(pool_dtype=torch.float32), r"k_pool must be fp16 \[num_pages, 64, Hkv, 64\]"),
    ((torch.zeros(1, 4, 64), *_cpu_args()[1:]), "q must be fp16"),
    ((*_cpu_args()[:3], torch.zeros(1, 1, dtype=torch.int64), torch.ones(1, dtype=torch.int32)),
     "page_table must be int32"),
])
def test_decode_fp16_rejects_bad_arguments(args, message):
    with pytest.raises(ValueError, match=message):
        attention.decode_attention_fp16(*args, 64)
