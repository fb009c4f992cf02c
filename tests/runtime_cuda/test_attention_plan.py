"""attention.split_plan / plan_stages: properties of the launch rules (CPU; no kernel runs).

The rules were fit to bench/attention_h200.py's sweep; these tests hold what must stay true whatever the
thresholds: a plan covers the sequence with no empty split, pinned counts are honored within the
kernel's limits, and splitting and ring depth follow the grid's size the way the rules say.
"""

import itertools
import math

from qoq.runtime_cuda.attention import (
    MAX_SPLITS,
    SHORT_PAGES,
    plan_stages,
    plan_stages_fp16,
    split_plan,
    supported_stages,
)
from qoq.runtime_cuda.attention_reference import PAGE_TOKENS

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
KV_HEADS = (1, 2, 8, 32)
LENGTHS = (1, 63, 64, 65, 512, 513, 1536, 4096, 8191, 32768, 131072)
SMS = (8, 78, 132)


def _pages(length: int) -> int:
    return max(1, math.ceil(length / PAGE_TOKENS))


def test_a_plan_covers_the_sequence_with_no_empty_split():
    for b, h, length, sms, pinned in itertools.product(BATCHES, KV_HEADS, LENGTHS, SMS, (None, 1, 3, 8, 100)):
        splits, per_split = split_plan(b, h, length, sms, pinned)
        pages = _pages(length)
        assert 1 <= splits <= MAX_SPLITS and per_split >= 1, (b, h, length, sms, pinned)
        assert splits * per_split >= pages > (splits - 1) * per_split, (b, h, length, sms, pinned, splits, per_split)
        if pinned is not None:
            assert splits <= min(pinned, MAX_SPLITS, pages)


def test_short_sequences_are_not_split():
    for b, h, sms in itertools.product(BATCHES, KV_HEADS, SMS):
        assert split_plan(b, h, SHORT_PAGES * PAGE_TOKENS, sms) == (1, SHORT_PAGES)
        assert split_plan(b, h, 1, sms) == (1, 1)


def test_splits_fill_the_sms_and_no_more():
    # the automatic count gives at most two CTAs per SM over all (sequence, KV head, split)s, fewer as the
    # batch grows, and at least 3 pages a split
    for h, length, sms in itertools.product(KV_HEADS, LENGTHS, SMS):
        counts = [split_plan(b, h, length, sms)[0] for b in BATCHES]
        assert counts == sorted(counts, reverse=True), (h, length, sms, counts)
        for b, splits in zip(BATCHES, counts):
            assert splits == 1 or (splits <= math.ceil(2 * sms / (b * h)) and _pages(length) >= 3 * splits), (
                b, h, length, sms, splits)
    # a lone sequence on a big GPU is split (the unsplit grid would leave most SMs idle)
    assert split_plan(1, 8, 4096, 132)[0] > 1


def test_stages_are_supported_and_three_only_for_big_or_lone_grids():
    for b, h, splits, d, sms in itertools.product(BATCHES, KV_HEADS, (1, 2, 4, 8), (64, 128), SMS):
        stages = plan_stages(b, h, splits, d, sms)
        assert stages in supported_stages(d), (b, h, splits, d, sms)
        ctas = b * h * splits
        if stages == 3:
            assert ctas >= 2 * sms or (splits == 1 and ctas <= sms), (b, h, splits, d, sms)
    assert supported_stages(64) == (2,) and supported_stages(128) == (2, 3)
    # at head_dim 128 three slots for a grid of several waves of CTAs, two just over one SM's worth
    assert plan_stages(256, 32, 1, 128, 132) == 3 and plan_stages(8, 32, 1, 128, 132) == 2


def test_more_batch_never_takes_three_stages_away_in_a_split_grid():
    for h, splits, sms in itertools.product(KV_HEADS, (2, 4, 8), SMS):
        stages = [plan_stages(b, h, splits, 128, sms) for b in BATCHES]
        assert stages == sorted(stages), (h, splits, sms, stages)


def test_fp16_kernel_takes_three_stages_only_at_one_cta_per_sm_or_fewer():
    # its rings: two slots fit three CTAs per SM, three slots two; a third slot pays only where a CTA's four
    # warps are alone on their SM
    for b, h, splits, sms in itertools.product(BATCHES, KV_HEADS, (1, 2, 4, 8), SMS):
        assert plan_stages_fp16(b, h, splits, sms) == (3 if b * h * splits <= sms else 2), (b, h, splits, sms)
