"""gemv16p where a warp's last run of 4 k-tiles is partial (K not a multiple of 128) and, while computing it,
the warp refills its registers with a whole run of its next column block (K >= 4096: >= 3 runs a column
block; N / 32 > SMs). The A fragments of the slots past K must be refilled too (csrc/gemm_w4a8_gemv.cuh,
gemv_compute_run); stale ones lost up to a third of the output's norm on the shapes a fuzz run found
(fuzz_shapes.REGRESSION_GEMM_NKG). Those, passing neighbours and shapes built from this GPU's SM count, at
M = 1, 5, 15: CudaW4A8Linear (the auto pick), gemv16p on A-fragment tiles and on rows, each against
IntegerLinear; the tiled kernel's accumulators exact."""

import pytest
import torch

from qoq.quant.linear import IntegerLinear
from qoq.runtime_cuda import fuzz_shapes as fs
from qoq.runtime_cuda.fuzz_check import GEMM_REL_TOL, gemm_input, gemm_tensors, rel_err
from qoq.runtime_cuda.gemm import w4a8_accumulators, w4a8_gemm
from qoq.runtime_cuda.linear import CudaW4A8Linear
from qoq.runtime_cuda.quant_kernels import quant_tokens
from qoq.runtime_cuda.reference import accumulate, integer_weight, tiles_to_rows

pytestmark = pytest.mark.cuda
DEV = "cuda"
SEED = 20261202
MS = (1, 5, 15)
# Shapes that passed before the fix: K a multiple of 128 (no partial run), per group, per channel and g128.
NEIGHBOURS = ((9088, 4864, 64), (8320, 5888, -1), (12224, 9472, 64), (5120, 17024, -1), (13824, 4736, 128),
              (7552, 10880, 128))


def _sm_shapes() -> tuple:
    """Partial last runs (K / 32 % 4 = 1, 2, 3) on any GPU: one block with a second column block, every block
    with two or three."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return (32 * (sms + 1), 4128, -1), (32 * (2 * sms + 3), 4160, 64), (32 * (sms + 7), 6208, 64)


def _gemv16p(lin: CudaW4A8Linear, x: torch.Tensor, tiles: bool) -> torch.Tensor:
    """lin's forward with gemv16p picked explicitly, on tiles or rows (a programmatic dependent of the
    quantization, as CudaW4A8Linear launches its GEMM)."""
    qx, s_x, sums = quant_tokens(x, sums=lin.sums, tiles=tiles)
    per_token = {"xsum": sums} if lin.per_channel else {"qsum": sums}
    return w4a8_gemm(qx, s_x, lin.qweight, lin.s1_scales, s2_scales=lin.s2_scales, s2_zeros=lin.s2_zeros,
                     s1_szeros=lin.s1_szeros, bias=lin.bias, variant="gemv16p", enable_pdl=True, **per_token)


def test_gemv16p_partial_last_runs_over_column_blocks():
    shapes = [*fs.REGRESSION_GEMM_NKG, *NEIGHBOURS, *_sm_shapes()]
    failures = []
    for w, (n, k, group) in enumerate(shapes):
        case = fs.GemmCase(MS[0], n, k, group, -200 - w, w % 2 == 0)
        t = gemm_tensors(case, SEED, DEV)
        lin, integer = CudaW4A8Linear.from_tensors(t, "w"), IntegerLinear.from_tensors(t, "w")
        s2 = {a: t[f"w.{a}"] for a in ("s2_scales", "s2_zeros") if f"w.{a}" in t}
        w_int = integer_weight(lin.qweight, **s2)
        for m in MS:
            x = gemm_input(case._replace(m=m), m, SEED, DEV)
            expected = integer(x)
            errs = {"auto": rel_err(lin(x), expected)}
            for tiles in (True, False):
                errs["tiles" if tiles else "rows"] = rel_err(_gemv16p(lin, x, tiles), expected)
            # the tiled kernel's raw sums, over a poisoned buffer: every element written, exactly
            qx, _, sums = quant_tokens(x, sums="codes", tiles=True)
            acc = torch.full((m, n), -(2**31), dtype=torch.int32, device=DEV)
            w4a8_accumulators(qx, lin.qweight, out=acc, variant="gemv16p", m=m, qsum=sums if s2 else None, **s2)
            bad = int((acc.long() != accumulate(tiles_to_rows(qx, m), w_int)).sum())
            if bad or not all(e < GEMM_REL_TOL for e in errs.values()):
                failures.append((n, k, group, m, bad, {key: f"{e:.3g}" for key, e in errs.items()}))
        del lin, integer, t, w_int
    assert not failures, failures
