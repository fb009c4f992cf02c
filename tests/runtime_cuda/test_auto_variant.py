"""gemm.auto_variant against the committed H200 sweep (CPU: it only reads bench/results/gemm_h200.json).

The heuristic was fit to that sweep; this keeps a change to it (or a new sweep) from silently picking
kernels that measured slow on the machine the targets are stated for.
"""

import json
from collections import defaultdict
from pathlib import Path

from qoq.runtime_cuda.gemm import VARIANTS, auto_variant, tiles_for

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


def test_tiled_activations_go_to_the_16_warp_gemvs():
    # at M <= 16 the activations come as A-fragment tiles: gemv16 in one wave of 32-column blocks (but the
    # persistent GEMV per group at long K), the persistent GEMV over one wave where its 32-bit weight offsets
    # reach; per group 64/128 and per channel
    for m in (1, 4, 9, 16):
        assert tiles_for(m, 128) and tiles_for(m, -1) and tiles_for(m, 64)
        for group in (128, 64, -1):
            for pdl in (False, True):
                assert auto_variant(m, 4096, 4096, group, 132, True, pdl) == "gemv16"
                assert auto_variant(m, 4096, 11008, group, 132, True, pdl) == ("gemv16" if group == -1 else "gemv16p")
                assert auto_variant(m, 12288, 4096, group, 132, True, pdl) == "gemv16p"
                assert auto_variant(m, 262144, 32768, group, 132, True, pdl) == "gemv16"
    assert not tiles_for(17, 128) and not tiles_for(16, 256) and not tiles_for(0, 128)
    assert auto_variant(16, 4096, 4096, 256, 132, True, True).startswith("wg")  # no GEMV for groups of 256
