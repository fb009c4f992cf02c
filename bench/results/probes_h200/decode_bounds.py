"""Probe: decode attention bounds in bench/timing.py's graph timing: the kernel of HEAD against builds with
no math (each landed chunk touched, not attended), no cross-warp combine (one value a warp stored), or neither;
plainly and as programmatic dependents, three replays interleaved. Wrong outputs by design."""
import json, sys, time
from pathlib import Path
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
import bench.ab_csrc_h200 as ab  # noqa
from bench.timing import time_graph  # noqa
from qoq.runtime_cuda import attention  # noqa

out = Path(sys.argv[1])
trees = {name: Path(f"scratch/{name}") for name in ("A", "nomath", "nocomb", "nomath_nocomb")}  # see README
t0 = time.time()
mods = {name: ab.build(tree, Path("build/ab"), attention) for name, tree in trees.items()}
print("built", round(time.time() - t0, 1), flush=True)
SHAPES = [("llama3-8b", 64, 512, 1, 2), ("llama3-8b", 64, 1536, 1, 2), ("llama3-8b", 256, 512, 1, 3),
          ("llama2-7b", 64, 1536, 1, 3)]
rows = []
for case in SHAPES:
    make = ab.decode_calls(*case)
    row = dict(zip(("model", "batch", "length", "splits", "stages"), case))
    for rep in range(3):
        for pdl in (False, True):
            for name, mod in (mods.items() if rep % 2 == 0 else reversed(list(mods.items()))):
                ab.use(attention, mod)
                row.setdefault(f"{name}_{'dep' if pdl else 'plain'}", []).append(round(time_graph(make(pdl)), 2))
    rows.append(row)
    print(row, flush=True)
(out / "decode_bounds.json").write_text(json.dumps(rows, indent=1))
