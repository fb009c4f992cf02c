"""Scheduler and block manager units: chunked prefill, preemption order, FCFS without starvation, pages."""

import pytest

from qoq.engine.block_manager import BlockManager
from qoq.engine.params import SamplingParams
from qoq.engine.scheduler import Scheduler
from qoq.engine.sequence import Sequence, Status


def seqs(*lengths):
    return [Sequence(i, [1] * n, SamplingParams(max_tokens=1000), arrival=i) for i, n in enumerate(lengths)]


def run_step(sched, produce=True):
    """schedule, mark computed, and append one token to every sequence whose chunk completed it."""
    out = sched.schedule()
    sched.update(out)
    for s in out:
        if s.samples and produce:
            s.seq.output_ids.append(2)
    return [(s.seq.seq_id, s.start, s.num_tokens) for s in out]


def test_block_manager_pages_and_slots():
    bm = BlockManager(5)
    assert bm.num_pages == 4 and bm.scratch_page == 4 and bm.num_free_pages == 4
    assert bm.can_allocate(0, 256) and not bm.can_allocate(0, 257)
    slots = bm.allocate(0, 65)
    assert slots[:2] == [0, 1] and slots[64] == 64 and bm.num_free_pages == 2
    assert bm.pages_needed(0, 63) == 0 and bm.pages_needed(0, 64) == 1
    assert bm.append_slot(0) == 65
    bm.free(0)
    assert bm.num_free_pages == 4
    with pytest.raises(ValueError, match="at least 2"):
        BlockManager(1)


def test_chunked_prefill_under_token_budget():
    sched = Scheduler(BlockManager(20), max_num_seqs=8, max_num_batched_tokens=50)
    a, b = seqs(120, 30)
    sched.add(a), sched.add(b)
    assert run_step(sched) == [(0, 0, 50)]
    assert run_step(sched) == [(0, 50, 50)]
    assert run_step(sched) == [(0, 100, 20), (1, 0, 30)]  # a's last chunk, b's whole prompt
    assert run_step(sched) == [(0, 120, 1), (1, 30, 1)]  # both decode
    assert len(a.output_ids) == 2 and len(b.output_ids) == 2


def test_max_num_seqs_caps_the_batch():
    sched = Scheduler(BlockManager(20), max_num_seqs=2, max_num_batched_tokens=100)
    for s in seqs(4, 4, 4):
        sched.add(s)
    assert [x[0] for x in run_step(sched)] == [0, 1]
    assert [s.seq_id for s in sched.waiting] == [2]


def test_preempts_newest_and_readmits_it_first():
    bm = BlockManager(4)  # 3 usable pages
    sched = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=1000)
    a, b, c = seqs(64, 60, 30)
    for s in (a, b, c):
        sched.add(s)
    run_step(sched)  # 3 pages, all used; each got a token
    assert bm.num_free_pages == 0
    # a (65 tokens) needs a second page: c, the newest, is preempted
    assert run_step(sched) == [(0, 64, 1), (1, 60, 1)]
    assert c.status == Status.WAITING and c.num_computed == 0 and c.output_ids == [2]
    assert list(sched.waiting) == [c] and sched.num_preemptions == 1
    for _ in range(4):  # b reaches 64 tokens, then needs its second page
        run_step(sched)
    assert b.status == Status.WAITING and list(sched.waiting) == [b, c]  # b is older: it goes first
    sched.finish(a, "length")
    assert len(b.output_ids) == 5
    out = run_step(sched)
    assert out[0] == (1, 0, 65)  # b re-prefills prompt + its 5 generated tokens
    assert bm.num_free_pages == 0  # 2 pages for b and c's one page
    assert out[1] == (2, 0, 31)


def test_lone_sequence_preempts_itself_when_nothing_else_frees():
    bm = BlockManager(2)  # one usable page
    sched = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=1000)
    (a,) = seqs(64)
    sched.add(a)
    run_step(sched)
    assert run_step(sched) == []  # a needs a second page that does not exist: it waits
    assert a.status == Status.WAITING and bm.num_free_pages == 1


def test_fcfs_no_starvation_of_a_long_prompt():
    """A long prompt at the head of the queue is not overtaken by short ones arriving later."""
    bm = BlockManager(5)  # 4 usable pages
    sched = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=1000)
    short = seqs(10)[0]
    sched.add(short)
    run_step(sched)
    long = Sequence(1, [1] * 250, SamplingParams(max_tokens=10), arrival=1)  # 4 pages: waits for short
    sched.add(long)
    later = [Sequence(2 + i, [1] * 5, SamplingParams(max_tokens=10), arrival=2 + i) for i in range(3)]
    for s in later:
        sched.add(s)
    for _ in range(3):
        assert [x[0] for x in run_step(sched)] == [0]  # nobody overtakes the long prompt
    sched.finish(short, "length")
    assert run_step(sched) == [(1, 0, 250)]


def test_page_rows_mirror_every_sequence_pages():
    """page_table gathers the block manager's int32 rows: each sequence's pages, the scratch page past
    them, a freed row reset (rows and width grow as sequences arrive and lengthen)."""
    bm = BlockManager(40)
    s = bm.scratch_page

    def want(seq_ids, width):
        return [bm.pages(i) + [s] * (width - len(bm.pages(i))) for i in seq_ids]

    for i in range(10):  # more rows than the first allocation holds
        bm.allocate(i, 1 + 70 * (i % 2))
    assert bm.page_table([bm.rows[i] for i in (1, 0, 2)]).tolist() == want([1, 0, 2], 2)
    for _ in range(64 * 9):  # sequence 0 grows token by token past the first width
        bm.allocate(0, 1)
    assert len(bm.pages(0)) == 10
    assert bm.page_table([bm.rows[i] for i in range(10)]).tolist() == want(range(10), 10)
    row = bm.rows[0]
    bm.free(0)
    bm.allocate(10, 5)
    assert bm.rows[10] == row and bm.page_table([row]).tolist() == want([10], 1)
    assert bm.grow(10, 64 * 40) is None and bm.pages(10) == bm.page_rows[row, :1].tolist()  # nothing taken
