"""Totals from `ncu --import REP --page source --csv --print-source sass` exports (loop_probe.py writes them):
shared-memory wavefronts (all, ideal, excessive) and warp stall samples by reason, per build.

    python ncu_source_summary.py name=ncu_source_NAME.csv ... > ncu_ring_alignment_h200.json
"""
import csv, json, sys


def summary(path: str) -> dict:
    rows = list(csv.reader(open(path)))
    hdr = rows[1]
    ix = {h: i for i, h in enumerate(hdr)}
    data = [r for r in rows[2:] if len(r) >= len(hdr)]
    num = lambda r, key: int(r[ix[key]].replace(",", "")) if r[ix[key]] not in ("", "-") else 0  # noqa: E731
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    return {
        "instructions_executed": sum(num(r, "Instructions Executed") for r in data),
        "stall_samples": sum(num(r, "Warp Stall Sampling (All Samples)") for r in data),
        "shared_wavefronts": sum(num(r, "L1 Wavefronts Shared") for r in data),
        "shared_wavefronts_ideal": sum(num(r, "L1 Wavefronts Shared Ideal") for r in data),
        "shared_wavefronts_excessive": sum(num(r, "L1 Wavefronts Shared Excessive") for r in data),
        "stalls": dict(sorted(((h[6:], sum(num(r, h) for r in data)) for h in stalls), key=lambda kv: -kv[1])),
    }


if __name__ == "__main__":
    print(json.dumps({name: summary(path) for name, path in (a.split("=", 1) for a in sys.argv[1:])}, indent=1))
