"""A smaller seeded kernel fuzz on the GPU, through the same runner as bench/kernel_fuzz_h200.py
(qoq/runtime_cuda/fuzz_check.py): CudaW4A8Linear against IntegerLinear, decode_attention against the
pure-torch reference, every 4th case behind busy work with PDL launches."""

import pytest

from qoq.runtime_cuda import fuzz_shapes as fs
from qoq.runtime_cuda.fuzz_check import check_attention_cases, check_gemm_cases

pytestmark = pytest.mark.cuda
SEED = 20261201


def _failures(rows):
    return [r for r in rows if not r["ok"]]


def test_gemm_fuzz_matches_integer_linear():
    cases = fs.gemm_cases(SEED, 200)
    rows = check_gemm_cases(cases, SEED, "cuda")
    assert len(rows) == len(cases)
    assert not _failures(rows), _failures(rows)[:10]


def test_gemm_pinned_shapes_match_integer_linear():
    cases = fs.pinned_gemm_cases()
    rows = check_gemm_cases(cases, SEED, "cuda")
    assert len(rows) == len(cases) and not _failures(rows), _failures(rows)[:10]


def test_attention_fuzz_matches_reference():
    cases = fs.attention_cases(SEED, 60)
    rows = check_attention_cases(cases, SEED, "cuda")
    assert len(rows) == len(cases)
    assert not _failures(rows), _failures(rows)[:10]


def test_attention_pinned_shapes_match_reference():
    cases = fs.pinned_attention_cases()
    rows = check_attention_cases(cases, SEED, "cuda")
    assert len(rows) == len(cases) and not _failures(rows), _failures(rows)[:10]
