"""Split decode attention on concurrent streams and in CUDA graphs: its split counters
(qoq.runtime_cuda.split_counters) are per stream, zeroed outside captures, and never freed under a graph."""

import pytest
import torch

from qoq.runtime_cuda import attention, split_counters
from qoq.runtime_cuda import attention_reference as ref
from tests.runtime_cuda.kv_inputs import decode_inputs

pytestmark = pytest.mark.cuda


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.fixture
def fresh_counters(monkeypatch):
    """No arena or slice yet: as in a new process."""
    monkeypatch.setattr(split_counters, "_arenas", {})
    monkeypatch.setattr(split_counters, "_arena_used", {})
    monkeypatch.setattr(split_counters, "_slices", {})


def test_streams_get_their_own_counters(fresh_counters):
    device = torch.device("cuda", torch.cuda.current_device())
    a, b = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(a):
        first = split_counters.split_counters(device, 100)
        assert split_counters.split_counters(device, 50).data_ptr() == first.data_ptr()  # reused
    with torch.cuda.stream(b):
        other = split_counters.split_counters(device, 100)
    span = first.numel() * 4
    assert abs(other.data_ptr() - first.data_ptr()) >= span  # disjoint
    assert int(first.abs().sum()) == int(other.abs().sum()) == 0


def test_split_decodes_on_concurrent_streams_match_reference(fresh_counters):
    # four streams held at one gate (an event recorded after a sleep kernel), so that their launches start
    # together and their CTAs run side by side; the same sequences and heads on every stream, so counters
    # shared between streams would collide
    case = decode_inputs([4096] * 4, 8, 128, 4, "cuda", seed=5)
    expected = ref.decode_attention(*case)
    gate_stream, gate = torch.cuda.Stream(), torch.cuda.Event()
    streams = [torch.cuda.Stream() for _ in range(4)]
    torch.cuda.synchronize()
    outs = []
    for _ in range(10):
        with torch.cuda.stream(gate_stream):
            torch.cuda._sleep(2_000_000)  # ~1 ms: every launch below is queued before the gate opens
            gate.record()
        for stream in streams:
            stream.wait_event(gate)
            with torch.cuda.stream(stream):
                outs.append(attention.decode_attention(*case, 4096, num_splits=8))
    torch.cuda.synchronize()
    assert all(_rel(out, expected) < 1e-3 for out in outs)  # NaN fails too


def test_split_decode_in_a_cuda_graph_after_eager_warmup(fresh_counters):
    q, k_pool, v_pool, table, seq_lens = decode_inputs([500, 1500], 2, 128, 4, "cuda", seed=7)
    expected = ref.decode_attention(q, k_pool, v_pool, table, seq_lens)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # torch's recipe: warm up on a side stream, then capture on another
        attention.decode_attention(q, k_pool, v_pool, table, seq_lens, 1500, num_splits=4)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attention.decode_attention(q, k_pool, v_pool, table, seq_lens, 1500, num_splits=4)
    arenas = list(split_counters._arenas[q.device.index])
    # an eager call that outgrows every arena: new counters, the captured ones stay allocated
    split_counters.split_counters(q.device, 2 * split_counters.ARENA_MIN)
    assert all(kept is old for kept, old in zip(split_counters._arenas[q.device.index], arenas))
    assert len(split_counters._arenas[q.device.index]) == len(arenas) + 1
    for _ in range(3):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert _rel(out, expected) < 1e-3


@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty")  # the capture ends at the refusal
def test_capture_before_any_eager_call_is_refused(fresh_counters):
    q, k_pool, v_pool, table, seq_lens = decode_inputs([900], 2, 128, 4, "cuda", seed=3)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="call it once eagerly"), torch.cuda.graph(graph):
        attention.decode_attention(q, k_pool, v_pool, table, seq_lens, 900, num_splits=4)
