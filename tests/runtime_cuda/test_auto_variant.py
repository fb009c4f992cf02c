"""gemm.auto_variant against the committed H200 sweep (CPU: it only reads bench/results/gemm_h200.json).

The heuristic was fit to that sweep; this keeps a change to it (or a new sweep) from silently picking
kernels that measured slow on the machine the targets are stated for.
"""

import json
from collections import defaultdict
from pathlib import Path

from qoq.runtime_cuda.gemm import VARIANTS, auto_variant

SWEEP = Path(__file__).resolve().parents[2] / "bench" / "results" / "gemm_h200.json"


def _timed_variants() -> tuple[dict, dict]:
    """The sweep, and (group, N, K, M) -> {variant: µs} over every kernel variant it timed."""
    result = json.loads(SWEEP.read_text())
    times = defaultdict(dict)
    for row in result["bench"]:
        if row["method"].startswith("w4a8") and row.get("variant", "auto") not in ("auto", "auto_no_pdl") and "us" in row:
            group = -1 if row["method"] == "w4a8_pc" else int(row["method"].removeprefix("w4a8_g"))
            times[(group, row["n"], row["k"], row["m"])][row["variant"]] = row["us"]
    return result, times


def test_auto_variant_is_within_8_percent_of_the_fastest_timed_kernel():
    result, times = _timed_variants()
    assert len(times) == 2 * 4 * 9  # g128 and per channel x four Llama-2 shapes x nine M
    slow = {}
    for (group, n, k, m), by_variant in times.items():
        # the sweep launches as CudaW4A8Linear does: programmatic dependents on Hopper
        pick = auto_variant(m, n, k, group, result["multiprocessors"], result["hopper"], pdl=True)
        assert pick in VARIANTS and pick in by_variant, (group, n, k, m, pick)
        ratio = by_variant[pick] / min(by_variant.values())
        if ratio > 1.08:
            slow[(group, n, k, m)] = (pick, round(ratio, 3), min(by_variant, key=by_variant.get))
    assert not slow, slow


def test_the_persistent_gemv_is_not_picked_for_weights_of_4_gib():
    # the persistent GEMV addresses its packed weights (N * K / 2 bytes) with 32-bit offsets
    small, large = (12288, 4096), (262144, 32768)  # 24 MiB; exactly 4 GiB
    for m, pdl in [(16, False), (1, True)]:
        assert auto_variant(m, *small, 128, 132, True, pdl) == "gemv16p"
        assert auto_variant(m, *large, 128, 132, True, pdl) != "gemv16p"


def test_per_channel_one_wave_m16_takes_the_persistent_gemv_only_where_its_rows_fit():
    # down_proj's [16][11008 + 16] rows fit a Hopper block's shared memory; Llama-3's K = 14336 does not,
    # where the persistent kernel would hand over to the 8-warp GEMV instead of the timed one
    assert auto_variant(16, 4096, 11008, -1, 132, True, True) == "gemv16p"
    assert auto_variant(16, 4096, 14336, -1, 132, True, True) == "gemv16"
    assert auto_variant(16, 4096, 11008, 128, 132, True, True) == "gemv16"  # per group gemv16 stays faster
    assert auto_variant(8, 4096, 11008, -1, 132, True, True) == "gemv16"  # untimed below M = 9


def test_gate_up_proj_from_m4_takes_the_persistent_gemv_per_group_128_as_dependents():
    # timed at M = 4 and 8 only as programmatic dependents (bench/results/ab_h200/ab_gemv_gate_up_second_run_early.json)
    for m in (4, 8):
        assert auto_variant(m, 22016, 4096, 128, 132, True, pdl=True) == "gemv16p"
        assert auto_variant(m, 22016, 4096, -1, 132, True, pdl=True) == "gemv"
        assert auto_variant(m, 22016, 4096, 128, 132, True, pdl=False) == "gemv"
