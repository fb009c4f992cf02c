"""CUDA-graph timing shared by the H200 benchmark scripts (docs/design.md §6: CUDA events, warm-up, median).

Calls are captured back to back in one graph, each on its own input set, so no host overhead enters
the timing and cycling sets larger than L2 in total makes every call read HBM.
"""

from __future__ import annotations

import statistics

import torch

ROTATE_BYTES = 256 << 20  # input sets cycled per timing: > 3x the 60 MB L2


def n_sets(bytes_per_set: int, max_sets: int) -> int:
    """Input sets to cycle so that together they exceed ROTATE_BYTES (2 .. max_sets)."""
    return max(2, min(max_sets, -(-ROTATE_BYTES // bytes_per_set)))


def time_graph(calls: list, reps: int = 40) -> float:
    """Median µs per call: all calls (one per input set) captured in one CUDA graph, `reps` timed replays."""
    for call in calls:
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    for _ in range(5):
        graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / len(calls))
    return statistics.median(times)
