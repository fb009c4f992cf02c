"""gemm.auto_variant and gemm.tiles_for: properties of the routing rule (CPU; no kernel runs).

The thresholds come from a benchmark (gemm.Routing); these tests hold what must stay true whatever the
thresholds: every pick is a kernel that accepts the shape, tiles go with the tile-reading kernels, and
the regimes follow one another in M without coming back.
"""

import itertools

from qoq.runtime_cuda.gemm import (
    GEMV_GROUPS, GEMV_MAX_M, GEMVP_MAX_M, GEMVP_MAX_WEIGHT_BYTES, ROUTING, TILED_VARIANTS, VARIANTS, Routing,
    auto_variant, tiles_for,
)

MS = sorted({*range(0, 70), 96, 128, 129, 255, 256, 384, 511, 512, 513, 1024, 2048, 4096, 16384})
SHAPES = [(4096, 4096), (12288, 4096), (11008, 4096), (4096, 11008), (22016, 4096), (6144, 4096), (1024, 4096),
          (4096, 8192), (14336, 8192), (128256, 4096), (32, 32), (160, 96), (262144, 32768)]  # (N, K)
GROUPS = (-1, 64, 128, 256)
SMS = (8, 78, 108, 132)


def _grid():
    for (n, k), group, sms, hopper, pdl in itertools.product(SHAPES, GROUPS, SMS, (False, True), (False, True)):
        yield n, k, group, sms, hopper, pdl


def _family(variant: str) -> str:
    return "tiles" if variant in TILED_VARIANTS else "gemv" if variant.startswith("gemv") else "blocks"


def test_every_pick_is_a_variant_that_accepts_the_shape():
    for n, k, group, sms, hopper, pdl in _grid():
        for m in MS:
            pick = auto_variant(m, n, k, group, sms, hopper, pdl)
            where = (m, n, k, group, sms, hopper, pdl, pick)
            assert pick in VARIANTS, where
            if pick.startswith("gemv"):
                assert m <= GEMV_MAX_M and group in GEMV_GROUPS, where
            if pick == "gemv16p":
                assert m <= GEMVP_MAX_M and n * k // 2 < GEMVP_MAX_WEIGHT_BYTES, where
            if pick.startswith("wg"):
                assert hopper, where
            elif hopper:  # on Hopper every M > 16 goes to wgmma, but a dependent's per-group GEMV
                assert pick in TILED_VARIANTS or (pick == "gemv" and pdl and group != -1), where


def test_tiles_are_read_exactly_where_tiles_for_says():
    for n, k, group, sms, hopper, pdl in _grid():
        for m in MS:
            pick = auto_variant(m, n, k, group, sms, hopper, pdl)
            assert (pick in TILED_VARIANTS) == tiles_for(m, group), (m, n, k, group, sms, hopper, pdl, pick)
    for m, group in itertools.product(MS, GROUPS):
        assert tiles_for(m, group) == (1 <= m <= GEMVP_MAX_M and group in GEMV_GROUPS)


def test_regimes_follow_one_another_in_m():
    # tiles (M <= 16), then rows in a GEMV, then blocks (tiled MMA or wgmma); none comes back at a larger M
    order = ["tiles", "gemv", "blocks"]
    for n, k, group, sms, hopper, pdl in _grid():
        families = [_family(auto_variant(m, n, k, group, sms, hopper, pdl)) for m in MS if m > 0]
        ranks = [order.index(f) for f in families]
        assert ranks == sorted(ranks), (n, k, group, sms, hopper, pdl, families)


def test_the_wide_tiles_once_picked_stay_picked_at_larger_m():
    # non-Hopper: 128-row blocks from some number of waves of them, for every larger M
    for (n, k), group, sms in itertools.product(SHAPES, GROUPS, SMS):
        picks = [auto_variant(m, n, k, group, sms, False) for m in MS if m > 0]
        wide = [p.startswith("tiled128") for p in picks]
        assert wide == sorted(wide), (n, k, group, sms, picks)


def test_two_warpgroup_tiles_only_where_the_grid_leaves_sms_idle():
    # Hopper: the 64x64 tile whose two warpgroups split K is the small-grid kernel, never one for a grid
    # of 128x64 tiles that fills every SM
    for n, k, group, sms, hopper, pdl in _grid():
        for m in MS:
            if auto_variant(m, n, k, group, sms, hopper, pdl) == "wg64x64k2":
                assert -(-m // 64) * -(-n // 128) < sms, (m, n, k, group, sms, pdl)


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


def test_the_thresholds_are_the_routing_table():
    # the boundaries move with the table, and only there
    assert auto_variant(24, 4096, 4096, 128, 132) == "gemv"
    assert auto_variant(24, 4096, 4096, 128, 132, routing=Routing(gemv_max_m=16, gemv_small_max_m=16)) != "gemv"
    assert auto_variant(16, 4096, 11008, 128, 132, True) == "gemv16p"
    assert auto_variant(16, 4096, 11008, 128, 132, True, routing=Routing(long_k=16384)) == "gemv16"
    assert auto_variant(32, 4096, 4096, 128, 132, True, True) == "gemv"
    assert auto_variant(32, 4096, 4096, 128, 132, True, True, routing=Routing(pdl_gemv_max_m=16)).startswith("wg")
    for m, n, k, group, sms, hopper, pdl in [(2048, 4096, 4096, 128, 132, True, True), (512, 4096, 11008, -1, 132, False, False)]:
        assert auto_variant(m, n, k, group, sms, hopper, pdl) == auto_variant(m, n, k, group, sms, hopper, pdl, ROUTING)
