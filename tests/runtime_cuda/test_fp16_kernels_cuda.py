"""The fp16 path's kernels against their pure-torch references: rmsnorm_fp16 with and without the fused residual
add and silu_mul_fp16 (csrc/quant_act.cu's rows left in fp16), rope_kv_write_fp16 (csrc/kv_rope_write.cu's fp16
page write), and rmsnorm_quant's residual add; eagerly and replayed in CUDA graphs, launched as programmatic
dependents (a no-op before Hopper; tests/runtime_cuda/test_pdl_sequences.py runs them after busy work). The
argument checks run on the CPU too.

    PYTHONPATH=$PWD python -m pytest -q -p no:cacheprovider tests/runtime_cuda/test_fp16_kernels_cuda.py
"""

import pytest
import torch

from qoq.runtime_cuda import attention, quant_kernels
from qoq.runtime_cuda import attention_reference as ref
from qoq.runtime_cuda.reference import (
    reference_rmsnorm_quant,
    rmsnorm_fp16,
    silu_mul_fp16,
    tiles_to_rows,
)

DEV = "cuda"


def _within_one_rounding(out: torch.Tensor, want: torch.Tensor, rounding: int = 1) -> None:
    """fp16 results that differ from the reference by at most `rounding` fp16 roundings (the kernels sum and
    divide in another order than torch, or take __expf), and in few elements."""
    assert out.dtype == torch.float16 and out.shape == want.shape and out.isfinite().all()
    diff = (out.float() - want.float()).abs()
    ulp = want.float().abs() * 2.0**-10 + 2.0**-24
    assert (diff <= rounding * ulp).all(), f"max diff {diff.max().item():.3g}"
    assert (diff > 0).float().mean().item() < 0.02


def _rows(t: int, k: int, seed: int, scale: float = 2.0) -> torch.Tensor:
    gen = torch.Generator(device=DEV).manual_seed(seed)
    x = (torch.randn(t, k, device=DEV, generator=gen) * scale).half()
    x[:, :4] *= 30  # a few massive channels, as in real residual streams
    return x


# K: head_dim-sized, Llama widths, and 28672 (the row buffer needs > 48 KB of shared memory)
@pytest.mark.cuda
@pytest.mark.parametrize("k", [64, 4096, 5120, 28672])
@pytest.mark.parametrize("t", [1, 7, 300])
def test_rmsnorm_fp16_matches_reference(t, k):
    x, w = _rows(t, k, seed=t + k), (torch.rand(k, device=DEV) + 0.5).half()
    _within_one_rounding(quant_kernels.rmsnorm_fp16(x, w, 1e-5, enable_pdl=True), rmsnorm_fp16(x, w, 1e-5))
    r = _rows(t, k, seed=t * k, scale=8.0)
    r_ref = r.clone()
    out = quant_kernels.rmsnorm_fp16(x, w, 1e-5, residual=r, enable_pdl=True)
    want = rmsnorm_fp16(x, w, 1e-5, residual=r_ref)
    assert torch.equal(r, r_ref)  # the residual sum is one fp16 rounding in both
    _within_one_rounding(out, want)


@pytest.mark.cuda
def test_rmsnorm_fp16_leading_dims_and_a_strided_input():
    x = _rows(2 * 9, 2 * 768, seed=1).view(2, 9, 2 * 768)[..., :768]  # row stride 1536
    w = (torch.rand(768, device=DEV) + 0.5).half()
    r = _rows(18, 768, seed=2).view(2, 9, 768)
    r_ref = r.clone()
    out = quant_kernels.rmsnorm_fp16(x, w, 1e-6, residual=r)
    assert out.shape == (2, 9, 768)
    _within_one_rounding(out, rmsnorm_fp16(x, w, 1e-6, residual=r_ref))
    assert torch.equal(r, r_ref)


@pytest.mark.cuda
@pytest.mark.parametrize("inter", [256, 11008, 14336])
@pytest.mark.parametrize("t", [1, 5, 300])
def test_silu_mul_fp16_on_the_halves_of_a_gate_up_output(t, inter):
    gate_up = _rows(t, 2 * inter, seed=t + inter, scale=3.0)
    gate, up = gate_up[:, :inter], gate_up[:, inter:]  # strided views, as the runner passes them
    # two roundings (silu, then the product) that __expf may each move by one
    _within_one_rounding(quant_kernels.silu_mul_fp16(gate, up, enable_pdl=True), silu_mul_fp16(gate, up), 2)


def _rope_tables(max_pos: int, dim: int):
    inv_freq = 1.0 / 500000 ** (torch.arange(0, dim, 2, device=DEV).float() / dim)
    angles = torch.arange(max_pos, device=DEV).float()[:, None] * inv_freq
    return angles.cos(), angles.sin()


def _garbage_pools(num_pages: int, hkv: int, dim: int, gen: torch.Generator):
    """K and V pools [num_pages, 64, hkv, dim] of random fp16 bit patterns (NaN and Inf included)."""
    def pool():
        bits = torch.randint(-(1 << 15), 1 << 15, (num_pages, 64, hkv, dim), generator=gen, device=DEV,
                             dtype=torch.int32)
        return bits.to(torch.int16).view(torch.float16)

    return pool(), pool()


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


def _rope_case(t: int, hq: int, hkv: int, dim: int, seed: int, row_pad: int = 0):
    """-> qkv (rows row_pad wider than their width when asked), positions, slots (a few < 0), pools."""
    gen = torch.Generator(device=DEV).manual_seed(seed)
    width = (hq + 2 * hkv) * dim
    qkv = (torch.randn(t, width + row_pad, device=DEV, generator=gen) * 3).half()[:, :width]
    positions = torch.randint(0, 8192, (t,), device=DEV, generator=gen)
    pages = max(1, -(-t // 64)) + 2
    slots = torch.randperm(pages * 64, device=DEV, generator=gen)[:t]
    slots[::7] = -1  # padding tokens: not cached
    return qkv, positions, slots, _garbage_pools(pages, hkv, dim, gen)


@pytest.mark.cuda
@pytest.mark.parametrize("hq,hkv,dim", [(8, 8, 64), (12, 4, 128), (14, 2, 64), (32, 8, 128)])
@pytest.mark.parametrize("t", [0, 1, 64, 300])
def test_rope_kv_write_fp16_matches_reference(t, hq, hkv, dim):
    """q and the pools bit for bit: the kernel rounds op for op as the reference does."""
    cos, sin = _rope_tables(8192, dim)
    for row_pad in (0, 8):  # the GEMM output's rows, or a view with wider rows
        qkv, positions, slots, pools = _rope_case(t, hq, hkv, dim, seed=t + hq + dim + row_pad, row_pad=row_pad)
        ref_pools = [p.clone() for p in pools]
        q = attention.rope_kv_write_fp16(qkv, positions, slots, cos, sin, *pools, hq, hkv, enable_pdl=True)
        q_ref = ref.rope_kv_write_fp16(qkv, positions, slots, cos, sin, *ref_pools, hq, hkv)
        assert q.shape == (t, hq, dim) and torch.equal(q, q_ref)
        for pool, ref_pool in zip(pools, ref_pools):
            assert _same_bits(pool, ref_pool)  # written slots, and the garbage everywhere else


def _capture(run) -> tuple[torch.cuda.CUDAGraph, object]:
    """run() captured (after one eager call on the capture stream, which builds the extensions); -> the graph
    and the outputs it writes."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = run()
    torch.cuda.current_stream().wait_stream(stream)
    return graph, out


@pytest.mark.cuda
@pytest.mark.parametrize("t", [1, 16])
def test_fp16_kernels_replayed_in_a_cuda_graph_match_reference(t):
    """One graph of the three kernels (PDL on) over static buffers, replayed on fresh inputs copied in; the
    residual and the pools are updated in place by each replay."""
    hidden, inter, hq, hkv, dim = 1024, 2816, 8, 2, 128
    w = (torch.rand(hidden, device=DEV) + 0.5).half()
    cos, sin = _rope_tables(8192, dim)  # _rope_case draws positions below 8192
    x_s, r_s = _rows(t, hidden, seed=0), _rows(t, hidden, seed=1)
    gu_s = _rows(t, 2 * inter, seed=2)
    qkv_s, pos_s, slots_s, pools = _rope_case(t, hq, hkv, dim, seed=3)

    def run():
        norm = quant_kernels.rmsnorm_fp16(x_s, w, 1e-5, residual=r_s, enable_pdl=True)
        act = quant_kernels.silu_mul_fp16(gu_s[:, :inter], gu_s[:, inter:], enable_pdl=True)
        q = attention.rope_kv_write_fp16(qkv_s, pos_s, slots_s, cos, sin, *pools, hq, hkv, enable_pdl=True)
        return norm, act, q

    graph, (norm, act, q) = _capture(run)
    for seed in range(4, 7):
        x, r, gu = _rows(t, hidden, seed=seed), _rows(t, hidden, seed=seed + 10), _rows(t, 2 * inter, seed=seed + 20)
        qkv, pos, slots, _ = _rope_case(t, hq, hkv, dim, seed=seed + 30)
        for static, new in ((x_s, x), (r_s, r), (gu_s, gu), (qkv_s, qkv), (pos_s, pos), (slots_s, slots)):
            static.copy_(new)
        ref_pools = [p.clone() for p in pools]
        r_ref = r.clone()
        for out in (norm, act, q):
            out.fill_(float("nan"))
        graph.replay()  # on the stream that filled the inputs
        torch.cuda.synchronize()
        _within_one_rounding(norm, rmsnorm_fp16(x, w, 1e-5, residual=r_ref))
        assert torch.equal(r_s, r_ref)
        _within_one_rounding(act, silu_mul_fp16(gu[:, :inter], gu[:, inter:]), 2)
        assert torch.equal(q, ref.rope_kv_write_fp16(qkv, pos, slots, cos, sin, *ref_pools, hq, hkv))
        assert all(_same_bits(p, rp) for p, rp in zip(pools, ref_pools))


@pytest.mark.cuda
@pytest.mark.parametrize("tiles", [False, True])
def test_rmsnorm_quant_with_residual_matches_reference(tiles):
    """The W4A8 path's norm with the residual add fused in: the sum exact, codes as the reference's."""
    t, k = (13, 1024) if tiles else (33, 4096)
    x, w = _rows(t, k, seed=5), (torch.rand(k, device=DEV) + 0.5).half()
    r = _rows(t, k, seed=6, scale=8.0)
    r_ref = r.clone()
    rows = (lambda q: tiles_to_rows(q, t)) if tiles else (lambda q: q)  # tile rows past t: never written
    for sums in ("inputs", "codes"):
        r_kernel = r.clone()
        q, s, row_sums = quant_kernels.rmsnorm_quant(x, w, 1e-5, sums, tiles=tiles, residual=r_kernel)
        q_ref, s_ref, sums_ref = reference_rmsnorm_quant(x, w, 1e-5, sums, residual=r_ref.clone())
        assert torch.equal(r_kernel, r + x)
        q_plain, s_plain, sums_plain = quant_kernels.rmsnorm_quant(r + x, w, 1e-5, sums, tiles=tiles)  # no residual
        q = rows(q)
        assert torch.equal(q, rows(q_plain)) and torch.equal(s, s_plain) and torch.equal(row_sums, sums_plain)
        diff = (q.int() - q_ref.int()).abs()
        assert int(diff.max()) <= 1 and (diff > 0).float().mean().item() <= 1e-3
        assert ((s.float() - s_ref.float()).abs() <= s_ref.float() * 1e-3).all()
        if sums == "inputs":
            assert ((row_sums - sums_ref).norm() / sums_ref.norm()).item() < 1e-3


def _cpu_rope_args(**changes):
    pool = torch.zeros(2, 64, 1, 64, dtype=torch.float16)
    args = {"qkv": torch.zeros(3, 6 * 64, dtype=torch.float16), "positions": torch.zeros(3, dtype=torch.int64),
            "slots": torch.zeros(3, dtype=torch.int64), "cos": torch.zeros(16, 32), "sin": torch.zeros(16, 32),
            "k_pool": pool, "v_pool": pool.clone(), "num_q_heads": 4, "num_kv_heads": 1}
    args.update(changes)
    return args


@pytest.mark.parametrize("changes,message", [
    ({"qkv": torch.zeros(3, 6 * 96, dtype=torch.float16)}, "head_dim 96 unsupported"),
    ({"qkv": torch.zeros(3, 6 * 64)}, "qkv must be fp16"),
    ({"num_q_heads": 5}, "not a multiple of Hq"),
    ({"k_pool": torch.zeros(2, 64, 2, 64, dtype=torch.float16)}, r"k_pool must be fp16 \[num_pages, 64, 1, 64\]"),
    ({"v_pool": torch.zeros(2, 64, 1, 64)}, r"v_pool must be fp16"),
    ({"positions": torch.zeros(3, dtype=torch.int32)}, r"positions must be int64 \[3\]"),
    ({"slots": torch.zeros(2, dtype=torch.int64)}, r"slots must be int64 \[3\]"),
    ({"cos": torch.zeros(16, 64)}, r"cos must be contiguous fp32 \[max_pos, 32\]"),
])
def test_rope_kv_write_fp16_rejects_bad_arguments(changes, message):
    with pytest.raises(ValueError, match=message):
        attention.rope_kv_write_fp16(**_cpu_rope_args(**changes))


def test_fp16_rows_reject_bad_arguments():
    x = torch.zeros(2, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="must be a CUDA fp16 tensor"):
        quant_kernels.rmsnorm_fp16(x, torch.ones(64, dtype=torch.float16), 1e-5)
    with pytest.raises(ValueError, match=r"RMSNorm weight must be \[64\]"):
        quant_kernels.rmsnorm_fp16(x, torch.ones(32, dtype=torch.float16), 1e-5)
    with pytest.raises(ValueError, match="residual .* must have one shape"):
        quant_kernels.rmsnorm_fp16(x, torch.ones(64, dtype=torch.float16), 1e-5, residual=x[:1])
    with pytest.raises(ValueError, match="residual must be a CUDA fp16 tensor"):
        quant_kernels.rmsnorm_quant(x, torch.ones(64, dtype=torch.float16), 1e-5, residual=x.float())
    with pytest.raises(ValueError, match="must have one shape"):
        quant_kernels.silu_mul_fp16(x, x[:, :32])
