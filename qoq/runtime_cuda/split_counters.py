"""The int32 counters a split decode-attention launch counts its finished splits in (one per sequence and KV
head; the last split to finish merges them all and sets its counter back to zero).

Three rules make them safe to share: counters are zeroed once, when their arena is made, which must not be
inside a CUDA-graph capture (there the zeroing would only be a node of that graph); each stream has its own,
since launches on concurrent streams must not count into one another's; and no arena is ever freed, since a
captured graph keeps using the counters it was captured with.
"""

from __future__ import annotations

import torch

ARENA_MIN = 1 << 16  # counters per arena (256 KB)
SLICE_MIN = 4096  # counters handed to a stream at a time, so that growing batches rarely take new ones

_arenas: dict[int, list[torch.Tensor]] = {}  # device index -> its arenas, the newest last
_arena_used: dict[int, int] = {}  # device index -> counters handed out of its newest arena
_slices: dict[tuple[int, int], torch.Tensor] = {}  # (device index, stream id) -> that stream's counters


def split_counters(device: torch.device, n: int) -> torch.Tensor:
    """>= n zeroed int32 counters for split launches on the current stream of `device`."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, torch.cuda.current_stream(index).stream_id)
    counters = _slices.get(key)
    if counters is not None and counters.numel() >= n:
        return counters
    size = max(n, SLICE_MIN)
    arenas = _arenas.setdefault(index, [])
    used = _arena_used.get(index, 0)
    if not arenas or used + size > arenas[-1].numel():
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"decode_attention needs {size} more split counters on cuda:{index} inside a CUDA-graph capture, "
                "where they cannot be zeroed: call it once eagerly on this device, at the largest batch, before "
                "capturing")
        arenas.append(torch.zeros(max(ARENA_MIN, 4 * size), dtype=torch.int32, device=index))
        used = 0
    counters = arenas[-1][used : used + size]
    _arena_used[index] = used + size
    _slices[key] = counters
    return counters
