"""GPU checks: the CUDA kernels against their pure-torch references (docs/design.md §5 tolerances)."""

import pytest
import torch

from qoq.quant.linear import IntegerLinear, export_linear
from qoq.quant.weights import quantize_weight
from qoq.runtime_cuda import quant_kernels
from qoq.runtime_cuda.gemm import TILED_VARIANTS, VARIANTS, is_hopper, w4a8_accumulators, w4a8_gemm
from qoq.runtime_cuda.linear import CudaW4A8Linear
from qoq.runtime_cuda.reference import (
    reference_accumulators,
    reference_gemm,
    reference_quant,
    reference_rmsnorm_quant,
    reference_silu_mul_quant,
    rows_to_tiles,
    tiles_to_rows,
)

pytestmark = pytest.mark.cuda
DEV = "cuda"


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _artifact(n: int, k: int, group_size: int, seed: int) -> dict:
    g = torch.Generator(device=DEV).manual_seed(seed)
    w = torch.randn(n, k, device=DEV, generator=g)
    bias = torch.randn(n, device=DEV, generator=g).half()
    return export_linear("w", quantize_weight(w, group_size), bias)


def _kernel_accumulators(qx: torch.Tensor, qweight: torch.Tensor, variant: str, **terms) -> torch.Tensor:
    """The kernel's int32 accumulators [M, N], written over a poisoned buffer: every element must be written."""
    acc = torch.full((qx.shape[0], qweight.shape[0]), -(2**31), dtype=torch.int32, device=DEV)
    w4a8_accumulators(qx, qweight, out=acc, variant=variant, **terms)
    return acc


def _gemm_args(t: dict) -> dict:
    names = ("s2_scales", "s2_zeros", "s1_szeros", "bias")
    return {k: t[f"w.{k}"] for k in names if f"w.{k}" in t}


TILED = ["tiled64", "tiled128", "tiled128w", "tiled64w"]
WGMMA = [v for v in VARIANTS if v.startswith("wg")] if torch.cuda.is_available() and is_hopper(torch.device(DEV)) else []
GEMV = ["gemv", "gemv16"]
VARIANTS_BY_M = {m: ((GEMV + ["gemv16p"] if m <= 16 else GEMV) + TILED + WGMMA if m <= 64 else TILED + WGMMA)
                 for m in (1, 5, 16, 17, 33, 64, 100, 300)}


# N=96 leaves a partial 128-column tile; K=288 per channel leaves a 32-wide K tail; K=2048 and
# K=1056 (with a tail) make the small tiled grids split K; K=11008 at M=16 stages 176 KB of activations
# in the GEMVs' shared memory; K=128 is one k-step of the wgmma kernels, so the second warpgroup of a
# k2 block has none. On Hopper the GEMV's 32-column blocks share activation rows in pairs where N/32 is
# even (N=128, 192, 4096), not at N=96, 160.
@pytest.mark.parametrize("group_size,n,k", [(128, 96, 384), (64, 160, 192), (-1, 96, 288), (128, 128, 2048),
                                            (-1, 96, 1056), (128, 4096, 11008), (-1, 192, 640), (64, 128, 128)])
def test_gemm_accumulators_exact_and_outputs_close(group_size, n, k):
    t = _artifact(n, k, group_size, seed=n + k)
    for m, variants in VARIANTS_BY_M.items():
        x = torch.randn(m, k, device=DEV).half()
        qx, s_x, xsum = reference_quant(x, sums="inputs")
        s2 = {a: v for a, v in _gemm_args(t).items() if a.startswith("s2")}
        if s2:  # the code sums the wgmma kernels take off, as the quantization kernels give them
            s2["qsum"] = qx.sum(dim=1, dtype=torch.int32)
        acc_ref = reference_accumulators(qx, t["w.qweight"], **{a: v for a, v in s2.items() if a != "qsum"})
        args = dict(_gemm_args(t), xsum=xsum if group_size == -1 else None)
        y_ref = reference_gemm(qx, s_x, t["w.qweight"], t["w.s1_scales"], out_dtype=torch.float32, **args)
        args["qsum"] = s2.get("qsum")
        for variant in variants:
            acc = _kernel_accumulators(qx, t["w.qweight"], variant, **s2)
            assert torch.equal(acc.long(), acc_ref), (m, variant)
            y = torch.full((m, n), float("nan"), dtype=torch.float16, device=DEV)
            w4a8_gemm(qx, s_x, t["w.qweight"], t["w.s1_scales"], out=y, variant=variant, **args)
            assert torch.isfinite(y).all() and _rel(y, y_ref) < 1e-3, (m, variant)


# Groups of 192 and 256 (multiples of 64 the recipes do not use): the wgmma kernels read two table
# rows per 128-k step where the group is not a multiple of 128 (192: one division per row) and one
# where it is (256); the tiled kernels one per 64 k. The GEMVs take only 64 and 128.
@pytest.mark.parametrize("group_size,n,k", [(192, 128, 768), (256, 96, 1024)])
def test_gemm_groups_beyond_128(group_size, n, k):
    t = _artifact(n, k, group_size, seed=k)
    s2 = {a: v for a, v in _gemm_args(t).items() if a.startswith("s2")}
    for m in (5, 100, 300):
        qx = torch.randint(-127, 128, (m, k), dtype=torch.int8, device=DEV)
        acc_ref = reference_accumulators(qx, t["w.qweight"], **s2)
        for variant in TILED + WGMMA:
            acc = _kernel_accumulators(qx, t["w.qweight"], variant, qsum=qx.sum(dim=1, dtype=torch.int32), **s2)
            assert torch.equal(acc.long(), acc_ref), (m, variant)


def test_gemm_level2_scale_16_and_zero_codes():
    """Every group spans its channel's whole level-0 range [-120, 120], so s2 = 16, the largest the format
    allows (q*s2 reaches 240 in the kernels' byte-parallel multiplies), and a run of codes 0 fills whole
    packed words."""
    n, k = 160, 512
    for group_size in (128, 64):
        g = torch.Generator(device=DEV).manual_seed(group_size)
        w = torch.randn(n, k, device=DEV, generator=g)
        peak = w.abs().amax(dim=1, keepdim=True)  # [n, 1]
        groups = w.view(n, k // group_size, group_size)
        groups[:, :, 0], groups[:, :, 1] = peak, -peak
        groups[:, :, 32:48] = -peak.unsqueeze(-1)
        t = export_linear("w", quantize_weight(w, group_size), None)
        assert (t["w.s2_scales"] == 16).all()
        s2 = {a: v for a, v in _gemm_args(t).items() if a.startswith("s2")}
        for m in (1, 16, 64, 300):
            qx = torch.randint(-127, 128, (m, k), dtype=torch.int8, device=DEV)
            acc_ref = reference_accumulators(qx, t["w.qweight"], **s2)
            for variant in VARIANTS_BY_M[m]:
                acc = _kernel_accumulators(qx, t["w.qweight"], variant, qsum=qx.sum(dim=1, dtype=torch.int32), **s2)
                assert torch.equal(acc.long(), acc_ref), (group_size, m, variant)


def test_persistent_gemv_exact_over_column_blocks_and_repeats():
    """gemv16p's blocks take several 32-column blocks each (N/32 > SMs) through two alternating sum
    buffers: fresh inputs many times at M <= 16, with and without the paired row copies (M >= 4);
    accumulators exact, fp16 outputs (bias, and per channel the zero term) bit-equal to the staged GEMV's."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    n = 32 * (3 * sms + 5)  # every block 3 or 4 column blocks; an odd count for the pairs
    failures = []
    for group_size, k in ((128, 1024), (-1, 544), (64, 192)):
        t = _artifact(n, k, group_size, seed=k)
        s2 = {a: v for a, v in _gemm_args(t).items() if a.startswith("s2")}
        for rep in range(4):
            for m in (1, 3, 4, 9, 16):
                qx, s_x, xsum = reference_quant(torch.randn(m, k, device=DEV).half(), sums="inputs")
                acc_ref = reference_accumulators(qx, t["w.qweight"], **s2)
                acc = _kernel_accumulators(qx, t["w.qweight"], "gemv16p", **s2)
                bad = int((acc.long() != acc_ref).sum())
                args = dict(_gemm_args(t), xsum=xsum if group_size == -1 else None)
                y, y_staged = (w4a8_gemm(qx, s_x, t["w.qweight"], t["w.s1_scales"], variant=v, **args)
                               for v in ("gemv16p", "gemv"))
                bad_out = int((y != y_staged).sum())
                if bad or bad_out:
                    failures.append((group_size, k, rep, m, bad, bad_out))
    assert not failures, failures


def test_tiled_gemvs_exact_and_bit_equal_to_staged_rows():
    """A-fragment tiles whose rows past M hold garbage (never to be stored or mixed in): the 16-warp GEMVs'
    accumulators exact and their fp16 outputs bit-equal to the 8-warp GEMV's over staged rows, at M = 1..16,
    in one wave and over several column blocks a block (gemv16p), with K tails of runs."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    failures = []
    for group_size, n, k in ((128, 96, 384), (64, 160, 192), (-1, 96, 288), (128, 32 * (3 * sms + 5), 1024),
                             (-1, 32 * (2 * sms + 3), 544), (128, 4096, 11008)):
        t = _artifact(n, k, group_size, seed=n + k)
        s2 = {a: v for a, v in _gemm_args(t).items() if a.startswith("s2")}
        for m in (1, 5, 13, 16):
            padded = torch.randint(-127, 128, (16, k), dtype=torch.int8, device=DEV)
            qx, tiles = padded[:m].contiguous(), rows_to_tiles(padded)
            s_x, xsum = torch.rand(m, 1, device=DEV).half(), torch.randn(m, device=DEV)
            args = dict(_gemm_args(t), xsum=xsum if group_size == -1 else None)
            acc_ref = reference_accumulators(qx, t["w.qweight"], **s2)
            y_rows = w4a8_gemm(qx, s_x, t["w.qweight"], t["w.s1_scales"], variant="gemv", **args)
            for variant in TILED_VARIANTS:
                acc = torch.full((m, n), -(2**31), dtype=torch.int32, device=DEV)
                w4a8_accumulators(tiles, t["w.qweight"], out=acc, variant=variant, m=m, **s2)
                y = w4a8_gemm(tiles, s_x, t["w.qweight"], t["w.s1_scales"], variant=variant, **args)
                bad, bad_out = int((acc.long() != acc_ref).sum()), int((y != y_rows).sum())
                if bad or bad_out:
                    failures.append((group_size, n, k, m, variant, bad, bad_out))
    assert not failures, failures


@pytest.mark.skipif(not WGMMA, reason="the wgmma kernels run on Hopper only")
@pytest.mark.parametrize("group_size", [128, -1])
def test_wgmma_accumulators_exact_over_repeats(group_size):
    """A race shows as an error that moves between runs: fresh inputs many times, every wgmma variant."""
    failures = {}
    for n, k in ((96, 384), (512, 1024)):  # N=96: a partial block of channels
        t = _artifact(n, k, group_size, seed=7)
        s2 = {a: v for a, v in _gemm_args(t).items() if a.startswith("s2")}
        for _ in range(10):
            for m in (1, 37, 130, 300):
                qx = torch.randint(-127, 128, (m, k), dtype=torch.int8, device=DEV)
                acc_ref = reference_accumulators(qx, t["w.qweight"], **s2)
                for variant in WGMMA:
                    acc = _kernel_accumulators(qx, t["w.qweight"], variant, **s2)
                    bad = int((acc.long() != acc_ref).sum())
                    if bad:
                        failures.setdefault(variant, []).append((n, k, m, bad))
    assert not failures, failures


@pytest.mark.skipif(not WGMMA, reason="programmatic dependent launch runs on Hopper only")
@pytest.mark.parametrize("group_size", [128, -1])
def test_pdl_gemm_reads_the_activations_of_the_quantization_just_ahead(group_size):
    """enable_pdl: each GEMM starts while the quantization kernel ahead of it runs (that kernel lets its
    dependents launch at once) and loads weights early; the fresh codes only after the wait (the 16-warp
    GEMVs both as staged rows and as tiles read straight into registers). Six quantize -> GEMM pairs queued
    with no sync between give what the plain launches give."""
    sums = "inputs" if group_size == -1 else "codes"
    # 264 column blocks: gemv16p's blocks take two each, one wave of the 8-warp GEMV; 384: the staged
    # GEMVs' grids over one wave, which let the next kernel launch before their own wait
    cases = [(8448, v, m) for v in GEMV + ["gemv16p"] for m in (1, 4, 16)] + [(8448, v, m) for v in WGMMA for m in (64, 256)]
    cases += [(12288, v, m) for v in GEMV for m in (1, 4, 16)]
    k = 1024
    artifacts = {n: _artifact(n, k, group_size, seed=11) for n in (8448, 12288)}
    for n, variant, m in cases:
        t = artifacts[n]
        xs = [torch.randn(m, k, device=DEV).half() for _ in range(6)]

        def pairs(pdl: bool, tiles: bool) -> list[torch.Tensor]:
            ys = []
            for x in xs:
                qx, s_x, token_sums = quant_kernels.quant_tokens(x, sums=sums, tiles=tiles)
                per_token = {"xsum": token_sums} if group_size == -1 else {"qsum": token_sums}
                ys.append(w4a8_gemm(qx, s_x, t["w.qweight"], t["w.s1_scales"], variant=variant, enable_pdl=pdl,
                                    **_gemm_args(t), **per_token))
            return ys

        for tiles in (False, True) if variant in TILED_VARIANTS else (False,):
            with_pdl = pairs(True, tiles)
            torch.cuda.synchronize()
            for y, y_plain in zip(with_pdl, pairs(False, tiles)):
                assert torch.equal(y, y_plain), (n, variant, m, tiles)


def test_gemm_rejects_bad_shapes():
    t = _artifact(64, 256, 128, seed=0)
    s2 = {"s2_scales": t["w.s2_scales"], "s2_zeros": t["w.s2_zeros"]}
    with pytest.raises(ValueError, match="does not match K"):
        w4a8_accumulators(torch.zeros(4, 224, dtype=torch.int8, device=DEV), t["w.qweight"], **s2)
    qx = torch.zeros(4, 256, dtype=torch.int8, device=DEV)
    with pytest.raises(ValueError, match="variant"):
        w4a8_accumulators(qx, t["w.qweight"], variant="tiled256", **s2)


def test_bad_arguments_raise_before_reaching_the_extension():
    t = _artifact(64, 256, 128, seed=0)
    qx = torch.zeros(4, 256, dtype=torch.int8, device=DEV)
    s2 = {"s2_scales": t["w.s2_scales"], "s2_zeros": t["w.s2_zeros"]}
    s_x = torch.ones(5, dtype=torch.float16, device=DEV)  # one per token: 4
    with pytest.raises(ValueError, match=r"s_x must be \[4\], got \[5\]"):
        w4a8_gemm(qx, s_x, t["w.qweight"], t["w.s1_scales"], **s2)
    with pytest.raises(ValueError, match="16-byte aligned"):
        w4a8_gemm(qx, s_x[1:], t["w.qweight"], t["w.s1_scales"], **s2)
    if WGMMA:  # per group they take the code sums
        with pytest.raises(ValueError, match=r"qsum must be \[4\]"):
            w4a8_gemm(qx, s_x[:4], t["w.qweight"], t["w.s1_scales"],
                      qsum=torch.zeros(5, dtype=torch.int32, device=DEV), variant="wg64x64", **s2)
    with pytest.raises(ValueError, match="gemv16p variant handles M <= 16"):
        w4a8_accumulators(torch.zeros(17, 256, dtype=torch.int8, device=DEV), t["w.qweight"], variant="gemv16p", **s2)
    with pytest.raises(ValueError, match="gemv variant handles M <= 64"):
        w4a8_accumulators(torch.zeros(65, 256, dtype=torch.int8, device=DEV), t["w.qweight"], variant="gemv", **s2)
    with pytest.raises(ValueError, match="multiple of 8"):
        quant_kernels.quant_tokens(torch.zeros(2, 12, dtype=torch.float16, device=DEV))
    tiles = rows_to_tiles(torch.zeros(12, 256, dtype=torch.int8, device=DEV))
    with pytest.raises(ValueError, match="the gemv variant reads qx as rows"):
        w4a8_accumulators(tiles, t["w.qweight"], variant="gemv", m=12, **s2)
    with pytest.raises(ValueError, match="tiled qx needs its row count"):
        w4a8_accumulators(tiles, t["w.qweight"], variant="gemv16", **s2)
    with pytest.raises(ValueError, match="at most 16 tokens"):
        quant_kernels.quant_tokens(torch.zeros(17, 256, dtype=torch.float16, device=DEV), tiles=True)


def _codes_match(q: torch.Tensor, q_ref: torch.Tensor) -> None:
    diff = (q.int() - q_ref.int()).abs()
    assert int(diff.max()) <= 1 and (diff > 0).float().mean().item() <= 1e-3


def _check_quant(quantize, reference) -> None:
    """`quantize(sums)` of a CUDA kernel against `reference(sums)`: codes, scales, input sums; and the
    code sums exactly those of the kernel's own codes."""
    (q, s, xs), (q_ref, s_ref, xs_ref) = quantize("inputs"), reference("inputs")
    assert q.shape == q_ref.shape and s.shape == s_ref.shape
    _codes_match(q, q_ref)
    assert _rel(s, s_ref) < 1e-3 and _rel(xs, xs_ref) < 1e-3
    q, _, qsum = quantize("codes")
    assert qsum.dtype == torch.int32 and torch.equal(qsum, q.sum(dim=-1, dtype=torch.int32))


@pytest.mark.parametrize("k", [256, 4096, 28672])  # 28672: the row buffer needs > 48 KB of shared memory
def test_quant_tokens(k):
    x = (torch.randn(3, 5, k, device=DEV) * 3).half()
    _check_quant(lambda sums: quant_kernels.quant_tokens(x, sums), lambda sums: reference_quant(x, sums))
    _, s, xs = quant_kernels.quant_tokens(x)
    assert xs is None and torch.equal(s, reference_quant(x)[1])
    with pytest.raises(ValueError, match="unknown sums"):
        quant_kernels.quant_tokens(x, sums=True)


def test_rmsnorm_quant():
    x, w = (torch.randn(33, 1024, device=DEV) * 2).half(), (torch.rand(1024, device=DEV) + 0.5).half()
    _check_quant(lambda sums: quant_kernels.rmsnorm_quant(x, w, 1e-5, sums),
                 lambda sums: reference_rmsnorm_quant(x, w, 1e-5, sums))


def test_quantizers_write_tiles():
    """tiles=True: the same codes, scales and sums as rows, in A-fragment tiles."""
    x, w = (torch.randn(16, 1024, device=DEV) * 2).half(), (torch.rand(1024, device=DEV) + 0.5).half()
    gate, up = (torch.randn(2, 6, 768, device=DEV) * 3).half().unbind(0)
    runs = [lambda tiles, sums, x=x[:t]: quant_kernels.quant_tokens(x, sums, tiles=tiles) for t in (1, 9, 16)]
    runs += [lambda tiles, sums: quant_kernels.rmsnorm_quant(x[:13], w, 1e-5, sums, tiles=tiles),
             lambda tiles, sums: quant_kernels.silu_mul_quant(gate, up, sums, tiles=tiles)]
    for run in runs:
        for sums in ("inputs", "codes"):
            (q, s, xs), (q_tiles, s_tiles, xs_tiles) = run(False, sums), run(True, sums)
            assert q_tiles.shape == (q.shape[1] // 32, 32, 16)
            assert torch.equal(tiles_to_rows(q_tiles, q.shape[0]), q)
            assert torch.equal(s_tiles, s) and torch.equal(xs_tiles, xs)


def test_silu_mul_quant_on_the_halves_of_a_gate_up_output():
    gate_up = (torch.randn(2, 9, 2 * 768, device=DEV) * 3).half()
    gate, up = gate_up[..., :768], gate_up[..., 768:]  # strided views
    _check_quant(lambda sums: quant_kernels.silu_mul_quant(gate, up, sums),
                 lambda sums: reference_silu_mul_quant(gate, up, sums))


@pytest.mark.parametrize("group_size", [128, -1])
@pytest.mark.parametrize("lead", [(2, 19), (1, 12)])  # 12 tokens: quantized to tiles for the 16-warp GEMV
def test_cuda_linear_matches_integer_linear(group_size, lead):
    t = _artifact(128, 512, group_size, seed=7)
    lin, ref = CudaW4A8Linear.from_tensors(t, "w"), IntegerLinear.from_tensors(t, "w")
    x = torch.randn(*lead, 512, device=DEV).half()
    y = lin(x)
    assert y.shape == (*lead, 128) and y.dtype == torch.float16
    assert _rel(y, ref(x)) < 1e-3
