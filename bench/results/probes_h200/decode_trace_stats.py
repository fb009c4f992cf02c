"""Per-CTA figures from attn_probe.py's raw decode traces (trace_<model>_<batch>_<length>_<stages>.pt,
[CTAs, 4 warps, 16] int64: 0 globaltimer at entry, 1 clock64 at entry, 2 + 2k / 3 + 2k chunk k landed /
computed (k < 5), 12 before the combine, 13 after it, 14 globaltimer at exit, 15 SM id).

    python decode_trace_stats.py TRACE.pt ... > decode_trace_stats.json
"""
import json
import sys

import torch

Q = torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)


def quantiles(x):
    return [round(v, 3) for v in torch.quantile(x.flatten(), Q).tolist()]


def stats(tr: torch.Tensor, slots: int = 528) -> dict:
    tr = tr.double()
    ghz = ((tr[:, :, 13] - tr[:, :, 1]) / (tr[:, :, 14] - tr[:, :, 0])).median()
    first_in, last_in = tr[:, :, 12].min(1).values, tr[:, :, 12].max(1).values
    start, end = tr[:, :, 0].min(1).values, tr[:, :, 14].max(1).values
    t0 = start.min()
    start, end = (start - t0) / 1000, (end - t0) / 1000  # us
    span = float(end.max())
    active = [int(((start <= t + 2) & (end > t + 2)).sum()) for t in range(0, int(span) + 1, 4)]
    return {
        "combine_after_last_warp_us": quantiles((tr[:, :, 13].max(1).values - last_in) / ghz / 1000),
        "warp_arrival_spread_us": quantiles((last_in - first_in) / ghz / 1000),
        "entry_to_first_chunk_us": quantiles((tr[:, :, 2] - tr[:, :, 1]) / ghz / 1000),
        "cta_life_us": quantiles(end - start),
        "span_us": round(span, 2),
        "slot_utilization": round(float((end - start).sum() / (slots * span)), 3),  # 4 CTAs x 132 SMs
        "active_ctas_every_4us": active,
    }


if __name__ == "__main__":
    print(json.dumps({path.rsplit("/", 1)[-1]: stats(torch.load(path)) for path in sys.argv[1:]}, indent=1))
