"""The kernel fuzz's samplers (qoq/runtime_cuda/fuzz_shapes.py), its reference side (fuzz_check.py, with
pure-torch stand-ins for the kernels) and bench/kernel_fuzz_h200.py's helpers, on the CPU."""

import json
import math

import pytest
import torch

from qoq.runtime_cuda import attention_reference as ref
from qoq.runtime_cuda import fuzz_shapes as fs
from qoq.runtime_cuda.fuzz_check import (
    ATTENTION_REL_TOL, GEMM_REL_TOL, check_attention_cases, check_gemm_cases, reference_attend, reference_linear,
)


@pytest.fixture(scope="module")
def gemm():
    return fs.gemm_cases(11, 2000)


@pytest.fixture(scope="module")
def attn():
    return fs.attention_cases(11, 500)


def test_samplers_are_deterministic_per_seed():
    assert fs.gemm_cases(5, 300) == fs.gemm_cases(5, 300)
    assert fs.attention_cases(5, 100) == fs.attention_cases(5, 100)
    assert fs.gemm_cases(5, 300) != fs.gemm_cases(6, 300)
    assert fs.attention_cases(5, 100) != fs.attention_cases(6, 100)
    assert fs.gemm_cases(5, 300)[:101] == fs.gemm_cases(5, 101)  # a shorter run is a prefix of a longer one


def test_gemm_cases_obey_the_kernels_constraints_and_caps(gemm):
    assert len(gemm) == 2000
    for c in gemm:
        assert c.group in (64, 128, -1), c
        assert c.n % 32 == 0 and c.k % 32 == 0, c
        assert fs.DIM_MIN <= c.n <= fs.DIM_MAX and fs.DIM_MIN <= c.k <= fs.DIM_MAX, c
        assert c.group == -1 or c.k % c.group == 0, c
        assert 1 <= c.m <= fs.M_MAX, c
        assert c.n * c.k <= fs.MAX_NK and c.m * c.k <= fs.MAX_MK and c.m * c.n <= fs.MAX_MN, c
    weights = {}
    for c in gemm:  # a weight id names one weight
        assert weights.setdefault(c.weight, (c.n, c.k, c.group, c.bias)) == (c.n, c.k, c.group, c.bias)


def test_gemm_cases_cover_the_ranges(gemm):
    ms = [c.m for c in gemm]
    assert sum(m % 2 for m in ms) > 0.3 * len(ms)  # odd M
    assert 1 in ms and max(ms) > 2048 and any(17 <= m <= 64 for m in ms)
    assert {c.group for c in gemm} == {64, 128, -1}
    assert all(sum(c.group == g for c in gemm) > 500 for g in (64, 128, -1))
    assert any(c.k % 64 == 32 for c in gemm if c.group == -1)  # K a multiple of 32 only
    assert any(c.n % 64 == 32 for c in gemm)
    assert max(c.k for c in gemm) > 32768 and max(c.n for c in gemm) > 32768
    assert min(c.k for c in gemm) < 512 and min(c.n for c in gemm) < 512
    assert sum(c.m >= 97 and c.n <= 2048 and c.k <= 2048 for c in gemm) >= 20  # the regime found slow
    assert any(c.bias for c in gemm) and not all(c.bias for c in gemm)


def test_attention_cases_obey_the_kernels_constraints_and_caps(attn):
    assert len(attn) == 500
    for c in attn:
        assert 1 <= c.batch <= fs.BATCH_MAX and len(c.lens) == c.batch, c
        assert all(1 <= n <= fs.LEN_MAX for n in c.lens), c
        assert 1 <= c.hkv <= 8 and 1 <= c.group <= 8 and c.dim in (64, 128), c
        assert sum(c.lens) * c.hkv <= fs.MAX_TOKEN_HEADS, c
        assert c.batch * max(c.lens) * c.hkv <= fs.MAX_DENSE_TOKEN_HEADS, c
        assert c.num_splits is None or 1 <= c.num_splits <= fs.MAX_SPLITS, c
        assert c.num_stages in (None, 2) or (c.num_stages == 3 and c.dim == 128), c
        assert max(c.lens) <= c.max_seq_len <= fs.LEN_MAX, c


def test_attention_cases_cover_the_ranges(attn):
    assert {c.group for c in attn} == set(range(1, 9))  # 3, 5 and 7 included
    assert {c.dim for c in attn} == {64, 128}
    assert {c.hkv for c in attn} == set(range(1, 9))
    batches = [c.batch for c in attn]
    assert 1 in batches and max(batches) > 200
    assert any(len(set(c.lens)) == 1 and c.batch > 1 for c in attn)  # equal lengths
    assert sum(len(set(c.lens)) > 1 for c in attn) > 200  # ragged
    assert any(1 in c.lens for c in attn) and max(max(c.lens) for c in attn) > 4096
    assert any(n % 64 in (0, 1, 63) for c in attn for n in c.lens)
    assert sum(c.num_splits is None for c in attn) > 200 and sum(c.num_splits is not None for c in attn) > 100
    assert any(c.num_stages == 3 for c in attn) and any(c.num_stages == 2 for c in attn)
    assert sum(c.max_seq_len > max(c.lens) for c in attn) > 20


def test_pinned_cases():
    gemm = fs.pinned_gemm_cases()
    assert all(c.m >= 97 and c.n <= 2048 and c.k <= 2048 and c.weight < 0 for c in gemm)
    assert {c.group for c in gemm} == {128, -1}
    attn = fs.pinned_attention_cases()
    assert any(c.batch == 7 and c.group == 7 for c in attn)
    assert any(c.batch == 96 and c.hkv == 1 and c.group == 8 and c.lens == (700,) * 96 for c in attn)


def test_regression_cases():
    """The gemv16p shapes found wrong: M <= 16, K not a multiple of 128 and >= 4096, more column blocks than an
    H200 has SMs; weights of their own, inside the sampler's caps."""
    cases = fs.regression_gemm_cases()
    assert len(cases) == len(fs.REGRESSION_GEMM_NKG) * len(fs.REGRESSION_GEMM_M)
    pinned_weights = {c.weight for c in fs.pinned_gemm_cases()}
    for c in cases:
        assert c.m <= 16 and c.k % 128 and c.k >= 4096 and c.n // 32 > 132 and c.group in (64, -1), c
        assert c.k % 32 == 0 and c.n % 32 == 0 and (c.group == -1 or c.k % c.group == 0), c
        assert c.n * c.k <= fs.MAX_NK and c.weight < 0 and c.weight not in pinned_weights, c
    by_weight = {}
    for c in cases:  # one weight id per (N, K, group, bias), as check_gemm_cases groups them
        assert by_weight.setdefault(c.weight, (c.n, c.k, c.group, c.bias)) == (c.n, c.k, c.group, c.bias)
    assert len(by_weight) == len(fs.REGRESSION_GEMM_NKG)


def test_samplers_take_caps_for_small_runs():
    for c in fs.gemm_cases(1, 200, max_nk=1 << 17, max_mk=1 << 13, max_mn=1 << 13):
        assert c.n * c.k <= 1 << 17 and c.m * c.k <= 1 << 13 and c.m * c.n <= 1 << 13 and c.m >= 1
    for c in fs.attention_cases(1, 100, max_batch=4, max_len=300):
        assert c.batch <= 4 and max(c.lens) <= c.max_seq_len <= 300
    with pytest.raises(ValueError):
        fs.gemm_cases(1, 10, max_nk=1 << 15)


def test_timing_order_puts_pinned_then_one_per_class_first():
    classes = [i % 7 for i in range(50)]
    order = fs.timing_order(50, lambda i: classes[i], seed=3, first=[48, 49])
    assert sorted(order) == list(range(50)) and order[:2] == [48, 49]
    head = [classes[i] for i in order[2:7]]  # classes 6 and 0 come with the pinned 48, 49
    assert sorted(head) == [1, 2, 3, 4, 5]
    assert order == fs.timing_order(50, lambda i: classes[i], seed=3, first=[48, 49])


def test_distribution():
    d = fs.distribution([1.5, 0.5, 2.0, 1.0, 3.0, 0.9, 1.1, 1.2, 1.3, 1.4, 1.6])
    assert d == dict(n=11, min=0.5, p10=0.9, median=1.3, max=3.0, below_1=2)
    assert fs.distribution([]) is None
    assert fs.distribution([2.0, 4.0])["median"] == 3.0


def test_buckets():
    assert [fs.m_bucket(m) for m in (1, 2, 16, 17, 64, 65, 256, 257, 1024, 1025, 4096)] == [
        "1", "2-16", "2-16", "17-64", "17-64", "65-256", "65-256", "257-1024", "257-1024", "1025-4096", "1025-4096"]
    assert [fs.batch_bucket(b) for b in (1, 2, 8, 9, 32, 33, 128, 129, 256)] == [
        "1", "2-8", "2-8", "9-32", "9-32", "33-128", "33-128", "129-256", "129-256"]


# -- the reference side, kernels replaced by pure-torch stand-ins --------------------------------------

SMALL_GEMM = dict(max_nk=1 << 17, max_mk=1 << 13, max_mn=1 << 13)


def test_gemm_check_passes_the_reference_twin_and_catches_errors():
    cases = fs.gemm_cases(2, 8, ms_per_weight=2, **SMALL_GEMM)
    rows = check_gemm_cases(cases, 2, "cpu", make_linear=reference_linear)
    assert len(rows) == 8 and all(r["ok"] for r in rows), rows
    assert [r["i"] for r in rows] == list(range(8)) and {r["g"] for r in rows} <= {64, 128, -1}

    class Off(torch.nn.Module):  # 1% too large: a wrong scale
        def __init__(self, t):
            super().__init__()
            self.inner = reference_linear(t)

        def forward(self, x):
            return self.inner(x) * (1 + 5 * GEMM_REL_TOL)

    rows = check_gemm_cases(cases[:2], 2, "cpu", make_linear=Off)
    assert not any(r["ok"] for r in rows)

    def raising(t):
        def forward(x):
            raise ValueError("no kernel for this shape")
        return forward

    rows = check_gemm_cases(cases[:1], 2, "cpu", make_linear=raising)
    assert not rows[0]["ok"] and rows[0]["err"] is None and "no kernel" in rows[0]["error"]


@pytest.mark.parametrize("group", [64, 128, -1])
def test_gemm_tolerance_holds_at_long_k_for_the_reference_twin(group):
    """K = 32768: the twin (the CUDA path's arithmetic) stays within GEMM_REL_TOL of IntegerLinear."""
    cases = [fs.GemmCase(m, 256, 32768, group, 0, True) for m in (1, 3)]
    rows = check_gemm_cases(cases, 4, "cpu", make_linear=reference_linear)
    assert all(r["ok"] for r in rows), rows


def test_attention_check_runs_the_reference_and_catches_errors():
    cases = fs.attention_cases(2, 5, max_batch=4, max_len=300) + [fs.AttentionCase(2, (1, 65), 1, 7, 64, 3, 2, 200)]
    rows = check_attention_cases(cases, 2, "cpu", attend=reference_attend)
    assert len(rows) == 6 and all(r["ok"] and r["err"] == 0.0 for r in rows), rows
    assert [r["pdl"] for r in rows] == [False, True] * 3
    assert [r["kb"] for r in rows] == [False, True, False, False, False, True]

    def drops_last_token(q, k_pages, v_pages, page_table, seq_lens, *args, k_bias=None):
        shorter = (seq_lens - 1).clamp(min=1)
        return ref.decode_attention(q, k_pages, v_pages, page_table, shorter, k_bias=k_bias)

    def drops_the_k_bias(*args, k_bias=None):
        return ref.decode_attention(*args[:5])

    rows = check_attention_cases(cases[-1:], 2, "cpu", attend=drops_the_k_bias, start=5)  # a k-bias case
    assert rows[0]["kb"] and not rows[0]["ok"] and rows[0]["err"] > 0.05

    rows = check_attention_cases(cases[-1:], 2, "cpu", attend=drops_last_token)
    assert not rows[0]["ok"] and rows[0]["err"] > ATTENTION_REL_TOL


def test_attention_inputs_hold_the_sequences_and_garbage_elsewhere():
    from qoq.runtime_cuda.fuzz_check import attention_inputs

    case = fs.AttentionCase(3, (1, 64, 130), 2, 3, 64, None, None, 300)
    q, k_pool, v_pool, table, seq_lens = attention_inputs(case, 0, 9, "cpu")
    assert q.shape == (3, 6, 64) and table.shape == (3, math.ceil(300 / 64)) and seq_lens.tolist() == [1, 64, 130]
    used = torch.cat([table[0, :1], table[1, :1], table[2, :3]])
    assert len(set(used.tolist())) == 5 and int(table.max()) < k_pool.shape[0]
    out = ref.decode_attention(q, k_pool, v_pool, table, seq_lens)
    assert torch.isfinite(out).all()


# -- bench/kernel_fuzz_h200.py helpers -----------------------------------------------------------------

def test_bench_helpers(tmp_path):
    from bench import kernel_fuzz_h200 as bench

    xml = ('<testsuites><testsuite name="pytest" errors="1" failures="2" skipped="3" tests="30"/></testsuites>')
    assert bench.junit_counts(xml) == dict(tests=30, failures=2, errors=1, skipped=3)
    log = "========= COMPUTE-SANITIZER\n...\n========= ERROR SUMMARY: 0 errors\n"
    assert bench.sanitizer_errors(log) == 0
    assert bench.sanitizer_errors("========= ERROR SUMMARY: 3 errors\n") == 3
    assert bench.sanitizer_errors("nothing") is None
    assert bench.command_line(["--seed", "1", "--out", str(tmp_path)], tmp_path).endswith("--seed 1 --out $OUT")

    result = dict(gpu="cpu", seed=1, command="c", complete=True, notes=["n"],
                  gemm_checks=[dict(i=0, ok=True, pinned=False), dict(i=1, ok=False, pinned=True)],
                  attention_checks=[dict(i=0, ok=True, pinned=False)],
                  gemm_timing=[dict(i=0, m=3, g=128, speedup=1.5, pinned=False), dict(i=1, m=200, g=-1, speedup=0.8),
                               dict(i=2, m=5, g=64, error="x")],
                  attention_timing=[dict(i=0, b=7, grp=7, speedup=0.9)],
                  pdl_tests=dict(ran=True, tests=21, skipped=0, failures=0, errors=1))
    path = tmp_path / "kernel_fuzz_h200.json"
    bench.dump(result, path)
    data = json.loads(path.read_text())
    s = data["summary"]
    assert list(data)[0] == "summary"
    assert (s["gemm_cases"], s["attention_cases"], s["failures"], s["gemm_fuzz_cases"]) == (2, 1, 1, 1)
    assert (s["min_speedup_vs_fp16_gemm"], s["median_speedup_vs_fp16_gemm"], s["gemm_below_fp16"]) == (0.8, 1.15, 1)
    assert s["min_speedup_vs_sdpa_attention"] == 0.9 and s["timing_errors"] == 1
    assert s["pdl_sequence_failures"] == 1 and s["sanitizer_errors"] is None and "sanitizer_note" in s
    for key in ("gpu", "seed", "p10_speedup_vs_fp16_gemm", "sanitizer_tools", "command"):
        assert key in s
    assert data["worst_gemm"][0]["speedup"] == 0.8 and data["distributions"]["gemm"]["all"]["n"] == 2


def test_bench_resummarize_folds_in_sanitizer_logs(tmp_path):
    from bench import kernel_fuzz_h200 as bench

    result = dict(gpu="g", seed=2, command="c", complete=True, gemm_checks=[], attention_checks=[], gemm_timing=[],
                  attention_timing=[], pdl_tests=dict(ran=True, tests=21, skipped=21, failures=0, errors=0))
    path = tmp_path / "kernel_fuzz_h200.json"
    bench.dump(result, path)
    assert json.loads(path.read_text())["summary"]["pdl_sequence_failures"] is None  # every test skipped
    logs = []
    for tool, errors in (("memcheck", 0), ("racecheck", 2)):
        logs.append(tmp_path / f"{tool}.log")
        logs[-1].write_text(f"========= ERROR SUMMARY: {errors} errors\n")
    bench.main(["--resummarize", str(path), "--sanitizer-logs", *(f"{p.stem}={p}" for p in logs)])
    s = json.loads(path.read_text())["summary"]
    assert s["sanitizer_errors"] == 2 and s["sanitizer_tools"] == ["memcheck", "racecheck"]
    assert "sanitizer_note" not in s and s["seed"] == 2


def test_bench_timing_inputs_build_on_cpu():
    """The timed calls' inputs (not the calls: they need the GPU) have the shapes the kernels take."""
    from bench import kernel_fuzz_h200 as bench

    for group in (64, 128, -1):
        lin = bench.random_linear(96, 256, group, device="cpu")
        assert (lin.in_features, lin.out_features, lin.group_size) == (256, 96, group)
    case = fs.AttentionCase(3, (1, 64, 130), 2, 4, 64, None, None, 130)
    q, k_pool, v_pool, table, seq_lens = bench.kv4_set(case, device="cpu")
    assert q.shape == (3, 8, 64) and table.shape == (3, 3)
    assert sorted(torch.cat([table[0, :1], table[1, :1], table[2, :3]]).tolist()) == list(range(5))
    assert torch.isfinite(ref.decode_attention(q, k_pool, v_pool, table, seq_lens)).all()
    for expand in (False, True):
        assert bench.dense_call(case, expand, device="cpu")().shape == (3, 8, 1, 64)
