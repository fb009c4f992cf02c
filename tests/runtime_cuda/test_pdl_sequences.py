"""Kernels in the launch order a decode step uses, with programmatic dependent launch on (Hopper).

Each kernel test elsewhere runs one kernel on a quiet GPU; a race between a programmatic dependent and the
kernel ahead of it shows only when launches queue up behind other work (docs/design.md §5.5). Here every
PDL-launched wrapper runs (a) right after large unrelated kernels, (b) on buffers the caching allocator
hands back full of garbage, (c) inside a CUDA graph and (d) in a decode layer's own order, and must give
bit-for-bit what the same kernels give launched one at a time on an idle GPU, which the reference tests
tie to the torch references. The W4A8KV4 layer's GEMMs and decode attention, and the fp16 path's row kernels
and RoPE write (dependents of cuBLAS GEMMs) alike.
"""

import pytest
import torch
import torch.nn.functional as F

from qoq.quant.linear import IntegerLinear, export_linear
from qoq.quant.weights import quantize_weight
from qoq.runtime_cuda import quant_kernels
from qoq.runtime_cuda.attention import (
    decode_attention,
    decode_attention_fp16,
    rope_kv4_write,
    rope_kv_write_fp16,
)
from qoq.runtime_cuda.gemm import (
    TILED_VARIANTS,
    auto_variant,
    is_hopper,
    tiles_for,
    w4a8_gemm,
)
from qoq.runtime_cuda.linear import CudaW4A8Linear
from tests.runtime_cuda.kv_inputs import decode_inputs

pytestmark = pytest.mark.cuda
DEV = "cuda"


@pytest.fixture(autouse=True)
def _hopper_only():
    if not is_hopper(torch.device(DEV)):
        pytest.skip("programmatic dependent launch runs on Hopper only")


def _busy_with_garbage() -> None:
    """Queue large unrelated kernels, and leave the allocator's free blocks full of garbage bytes."""
    junk = torch.randint(-128, 127, (1 << 29,), dtype=torch.int8, device=DEV)  # 512 MiB, freed below
    a = torch.randn(8192, 8192, device=DEV, dtype=torch.float16)
    for _ in range(3):
        a = a @ a.T * 1e-3
    del junk, a


def _linear(n: int, k: int, group: int, seed: int = 0) -> tuple[CudaW4A8Linear, dict]:
    gen = torch.Generator(device=DEV).manual_seed(seed)
    w = torch.randn(n, k, device=DEV, generator=gen) / k**0.5  # outputs stay in fp16 range through a chain
    t = export_linear("w", quantize_weight(w, group),
                      torch.randn(n, device=DEV, generator=gen).half())
    return CudaW4A8Linear.from_tensors(t, "w"), t


def _quantize(lin: CudaW4A8Linear, x: torch.Tensor):
    return quant_kernels.quant_tokens(x, sums=lin.sums, tiles=tiles_for(x.shape[0], lin.group_size))


def _gemm(lin: CudaW4A8Linear, q, variant: str, pdl: bool) -> torch.Tensor:
    qx, s_x, sums = q
    per_token = {"xsum": sums} if lin.per_channel else {"qsum": sums}
    return w4a8_gemm(qx, s_x, lin.qweight, lin.s1_scales, s2_scales=lin.s2_scales, s2_zeros=lin.s2_zeros,
                     s1_szeros=lin.s1_szeros, bias=lin.bias, variant=variant, enable_pdl=pdl, **per_token)


def _variants(m: int, n: int, k: int, group: int) -> list[str]:
    """Every kernel that takes enable_pdl and this shape's layout, and auto's pick."""
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    if tiles_for(m, group):
        return list(TILED_VARIANTS)
    picks = {"gemv", "wg128x64", "wg64x64k2", auto_variant(m, n, k, group, sms, True, True)}
    return sorted(v for v in picks if not v.startswith("gemv") or m <= 64)


# Shapes where the persistent GEMV runs several column blocks per SM (N/32 > SMs), one-wave ones, and a
# K long enough for the per-group rule to pick the persistent GEMV in one wave.
SHAPES = [(8192, 8192), (27648, 5120), (5120, 13824), (1536, 1536)]


@pytest.mark.parametrize("group", [128, 64, -1])
@pytest.mark.parametrize("n,k", SHAPES)
def test_gemm_after_busy_gpu_equals_idle_launch(n, k, group):
    lin, t = _linear(n, k, group)
    integer = IntegerLinear.from_tensors(t, "w")
    for m in (1, 2, 3, 8, 16, 24, 64):
        for variant in _variants(m, n, k, group):
            x = torch.randn(m, k, device=DEV).half()
            x[:, :4] *= 20
            torch.cuda.synchronize()
            idle = _gemm(lin, _quantize(lin, x), variant, pdl=False)
            torch.cuda.synchronize()
            for _ in range(2):
                _busy_with_garbage()
                raced = _gemm(lin, _quantize(lin, x), variant, pdl=True)
                assert torch.equal(raced, idle), f"M={m} {variant}: PDL launch after busy GPU differs"
            ref = integer(x).float()
            err = ((idle.float() - ref).norm() / ref.norm()).item()
            assert err < 2e-3, f"M={m} {variant}: {err} against IntegerLinear"


def test_linear_chain_in_a_cuda_graph_equals_eager():
    """rmsnorm_quant -> qkv -> silu_mul_quant -> down captured once, replayed on new inputs."""
    qkv, _ = _linear(8192, 4096, 128, seed=1)
    down, _ = _linear(4096, 4096, 128, seed=2)
    norm = torch.rand(4096, device=DEV).half() + 0.5

    def chain(x):
        y = qkv.forward_quantized(*quant_kernels.rmsnorm_quant(x, norm, 1e-5, sums=qkv.sums, tiles=tiles_for(
            x.shape[0], 128)))
        q = quant_kernels.silu_mul_quant(y[:, :4096], y[:, 4096:], sums=down.sums, tiles=tiles_for(x.shape[0], 128))
        return down.forward_quantized(*q)

    for m in (1, 4, 16, 32):
        static_x = torch.randn(m, 4096, device=DEV).half()
        chain(static_x)  # builds and warms every kernel outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = chain(static_x)
        for seed in range(3):
            x = torch.randn(m, 4096, device=DEV, generator=torch.Generator(device=DEV).manual_seed(seed)).half()
            torch.cuda.synchronize()
            expected = chain(x)
            torch.cuda.synchronize()
            _busy_with_garbage()
            static_x.copy_(x)
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(static_y, expected), f"M={m} replay {seed}"


def _decode_layer(batch: int, hq: int, hkv: int, d: int, hidden: int, inter: int, seed: int = 0):
    """The weights of one decode layer and its KV4 cache: a function running the layer's kernels in order."""
    gens = iter(range(seed * 10, seed * 10 + 10))
    qkv, _ = _linear((hq + 2 * hkv) * d, hidden, 128, next(gens))
    o_proj, _ = _linear(hidden, hq * d, 128, next(gens))
    gate_up, _ = _linear(2 * inter, hidden, 128, next(gens))
    down, _ = _linear(hidden, inter, 128, next(gens))
    norms = [torch.rand(hidden, device=DEV).half() + 0.5 for _ in range(2)]
    lens = [(97 * i + 13) % 700 + 1 for i in range(batch)]
    _, k_pool, v_pool, table, seq_lens = decode_inputs([n + 1 for n in lens], hkv, d, hq // hkv, DEV, seed)
    positions = torch.tensor(lens, dtype=torch.int64, device=DEV)  # the new token of each sequence
    slots = (table.long().gather(1, (positions // 64)[:, None])[:, 0] * 64 + positions % 64)
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device=DEV).float() / d))
    angles = torch.arange(1024, device=DEV).float()[:, None] * inv[None]
    cos, sin = angles.cos(), angles.sin()

    def run(h, delta, k_pages, v_pages, pdl: bool, serial: bool):
        """h += delta (the block ahead's down output) in the first norm, h += o_proj's in the second, as the
        runner fuses them; -> the MLP's output."""
        sync = torch.cuda.synchronize if serial else (lambda: None)
        tiles = tiles_for(batch, 128)
        q = quant_kernels.rmsnorm_quant(delta, norms[0], 1e-5, sums=qkv.sums, tiles=tiles, residual=h)
        sync()
        y = _gemm(qkv, q, "auto", pdl)
        sync()
        q_rot, _ = rope_kv4_write(y, positions, slots, cos, sin, k_pages, v_pages, hq, hkv)
        sync()
        attn = decode_attention(q_rot, k_pages, v_pages, table, seq_lens, int(seq_lens.max()), enable_pdl=pdl)
        sync()
        o = _gemm(o_proj, _quantize(o_proj, attn.reshape(batch, hq * d)), "auto", pdl)
        sync()
        q = quant_kernels.rmsnorm_quant(o, norms[1], 1e-5, sums=gate_up.sums, tiles=tiles, residual=h)
        sync()
        g = _gemm(gate_up, q, "auto", pdl)
        sync()
        q = quant_kernels.silu_mul_quant(g[:, :inter], g[:, inter:], sums=down.sums, tiles=tiles)
        sync()
        return _gemm(down, q, "auto", pdl)

    return run, k_pool, v_pool


def _assert_layer_in_launch_order_equals_serialized(run, k_pool, v_pool, batch: int, hidden: int) -> None:
    """The layer run serialized on an idle GPU, then three times with PDL on behind busy work: the MLP output,
    the residual (updated in place) and the pools bit-equal."""
    h, delta = (torch.randn(2, batch, hidden, device=DEV) * 2).half().unbind(0)
    h0, k0, v0 = h.clone(), k_pool.clone(), v_pool.clone()
    expected = run(h0, delta, k0, v0, pdl=False, serial=True)
    torch.cuda.synchronize()
    for _ in range(3):
        k1, v1 = k_pool.clone(), v_pool.clone()
        _busy_with_garbage()
        h1 = h.clone()  # written just ahead of the first norm (a programmatic dependent on the fp16 path)
        out = run(h1, delta, k1, v1, pdl=True, serial=False)
        torch.cuda.synchronize()
        assert torch.equal(k1.view(torch.uint8), k0.view(torch.uint8))
        assert torch.equal(v1.view(torch.uint8), v0.view(torch.uint8))
        assert torch.equal(h1, h0) and torch.equal(out, expected)


@pytest.mark.parametrize("batch", [1, 3, 16, 48])
@pytest.mark.parametrize("hq,hkv,d", [(32, 8, 128), (14, 2, 64)])
def test_decode_layer_in_launch_order_equals_serialized(batch, hq, hkv, d):
    run, k_pool, v_pool = _decode_layer(batch, hq, hkv, d, hidden=2048, inter=5632)
    _assert_layer_in_launch_order_equals_serialized(run, k_pool, v_pool, batch, 2048)


def _fp16_decode_layer(batch: int, hq: int, hkv: int, d: int, hidden: int, inter: int, seed: int = 0):
    """One decode layer of the fp16 path (runner_cuda's order: cuBLAS linears between the fp16 kernels) over
    fp16 pools holding random sequences: a function running it, and the pools."""
    gen = torch.Generator(device=DEV).manual_seed(seed)

    def weight(n, k):
        return (torch.randn(n, k, device=DEV, generator=gen) / k**0.5).half()

    qkv_w, o_w, gate_up_w, down_w = (weight((hq + 2 * hkv) * d, hidden), weight(hidden, hq * d),
                                     weight(2 * inter, hidden), weight(hidden, inter))
    norms = [torch.rand(hidden, device=DEV, generator=gen).half() + 0.5 for _ in range(2)]
    lens = [(97 * i + 13) % 700 + 1 for i in range(batch)]  # before the new token
    width = max(n // 64 + 1 for n in lens)
    pages = torch.randperm(batch * width, device=DEV, generator=gen).int().view(batch, width)
    k_pool, v_pool = (torch.randn(batch * width, 64, hkv, d, device=DEV, generator=gen).half() for _ in range(2))
    positions = torch.tensor(lens, dtype=torch.int64, device=DEV)
    slots = pages.long().gather(1, (positions // 64)[:, None])[:, 0] * 64 + positions % 64
    seq_lens = (positions + 1).int()
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device=DEV).float() / d))
    angles = torch.arange(1024, device=DEV).float()[:, None] * inv[None]
    cos, sin = angles.cos(), angles.sin()

    def run(h, delta, k_pool, v_pool, pdl: bool, serial: bool):
        sync = torch.cuda.synchronize if serial else (lambda: None)
        x = quant_kernels.rmsnorm_fp16(delta, norms[0], 1e-5, residual=h, enable_pdl=pdl)
        sync()
        qkv = F.linear(x, qkv_w)
        sync()
        q = rope_kv_write_fp16(qkv, positions, slots, cos, sin, k_pool, v_pool, hq, hkv, enable_pdl=pdl)
        sync()
        attn = decode_attention_fp16(q, k_pool, v_pool, pages, seq_lens, width * 64)
        sync()
        o = F.linear(attn.reshape(batch, hq * d), o_w)
        sync()
        x = quant_kernels.rmsnorm_fp16(o, norms[1], 1e-5, residual=h, enable_pdl=pdl)
        sync()
        gu = F.linear(x, gate_up_w)
        sync()
        act = quant_kernels.silu_mul_fp16(gu[:, :inter], gu[:, inter:], enable_pdl=pdl)
        sync()
        return F.linear(act, down_w)

    return run, k_pool, v_pool


@pytest.mark.parametrize("batch", [1, 3, 16, 48])
@pytest.mark.parametrize("hq,hkv,d", [(32, 32, 128), (32, 8, 128), (14, 2, 64)])
def test_fp16_decode_layer_in_launch_order_equals_serialized(batch, hq, hkv, d):
    run, k_pool, v_pool = _fp16_decode_layer(batch, hq, hkv, d, hidden=2048, inter=5632)
    _assert_layer_in_launch_order_equals_serialized(run, k_pool, v_pool, batch, 2048)


@pytest.mark.parametrize("batch", [1, 16])
def test_fp16_decode_layer_graph_with_pdl_equals_graph_without(batch):
    """The layer captured twice, its fp16 kernels launched as programmatic dependents and plainly (cuBLAS picks
    its kernels alike in both captures), replayed behind busy work on fresh inputs: bit-equal."""
    hidden = 2048
    run, k_pool, v_pool = _fp16_decode_layer(batch, 32, 8, 128, hidden=hidden, inter=5632, seed=1)
    graphs = []
    stream = torch.cuda.Stream()
    for pdl in (True, False):
        h, delta = torch.zeros(2, batch, hidden, device=DEV, dtype=torch.float16).unbind(0)
        pools = k_pool.clone(), v_pool.clone()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            run(h, delta, *pools, pdl=pdl, serial=False)  # eager first: decode attention's split counters
            stream.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                out = run(h, delta, *pools, pdl=pdl, serial=False)
        torch.cuda.current_stream().wait_stream(stream)
        graphs.append((graph, h, delta, pools, out))
    for seed in range(3):
        gen = torch.Generator(device=DEV).manual_seed(seed)
        h_new, delta_new = (torch.randn(2, batch, hidden, device=DEV, generator=gen) * 2).half().unbind(0)
        results = []
        for graph, h, delta, pools, out in graphs:
            h.copy_(h_new)
            delta.copy_(delta_new)
            for pool, fresh in zip(pools, (k_pool, v_pool)):
                pool.copy_(fresh)
            torch.cuda.synchronize()
            _busy_with_garbage()
            graph.replay()
            torch.cuda.synchronize()
            results.append([out.clone(), h.clone(), *(p.clone() for p in pools)])
        for with_pdl, plain in zip(*results):
            assert torch.equal(with_pdl.view(torch.int16), plain.view(torch.int16)), f"replay {seed}"
