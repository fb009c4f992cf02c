"""Time the decode kernel of several csrc trees in bench/kv4_stream_ceiling.cu's harness (trees relative to
the repository root; each built with its own copy of the harness), then export ncu source counters of some of
them at Llama-2 B64 L1536 (ncu_source_summary.py totals those):

    python bench/results/probes_h200/loop_probe.py OUT 32x1x64x1536,8x4x64x512 old=scratch/old_csrc new=qoq/runtime_cuda/csrc --ncu=old,new
"""
import json, os, subprocess, sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
ROOT = Path(__file__).resolve().parents[3]
OUT = Path(sys.argv[1]); OUT.mkdir(parents=True, exist_ok=True)
SHAPES = [s.split("x") for s in sys.argv[2].split(",")]
args = [a for a in sys.argv[3:] if "=" in a]
ncu_pair = next((a.split("=", 1)[1].split(",") for a in sys.argv[3:] if a.startswith("--ncu=")), [])
TREES = dict(a.split("=", 1) for a in args if not a.startswith("--"))

def build(item):
    name, tree = item
    d = Path(f"/tmp/loopprobe/{name}"); d.mkdir(parents=True, exist_ok=True)
    (d / "main.cu").write_text((ROOT / "bench/kv4_stream_ceiling.cu").read_text())
    exe = d / "probe"
    cmd = ["nvcc", "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-std=c++17", "--use_fast_math", "-lineinfo",
           f"-I{ROOT / tree}", f"-I{ROOT}/bench", str(d / "main.cu"), "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    return name, exe, r.returncode, r.stderr[-1500:]

with ThreadPoolExecutor(8) as pool:
    built = list(pool.map(build, TREES.items()))
rows = []
for name, exe, rc, err in built:
    print(name, rc, err if rc else "", flush=True)
for rnd in range(2):
    order = built if rnd == 0 else built[::-1]
    for shape in SHAPES:
        for name, exe, rc, _ in order:
            if rc: continue
            r = subprocess.run([str(exe), *shape], capture_output=True, text=True, timeout=120)
            for line in r.stdout.splitlines():
                if line.startswith("{") and '"kernel"' in line and "decode" in line:
                    row = dict(json.loads(line), tree=name, shape=" ".join(shape), round=rnd)
                    rows.append(row); print(json.dumps(row), flush=True)
(OUT / "loop_probe.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
for name in ncu_pair:
    exe = Path(f"/tmp/loopprobe/{name}/probe")
    rep = f"/tmp/ncu_{name}"
    subprocess.run(["ncu", "--clock-control", "none", "-f", "-k", "regex:decode_kv4_kernel", "--launch-skip", "21",
                    "--launch-count", "1", "--section", "SourceCounters", "--section", "WarpStateStats",
                    "--section", "SpeedOfLight", "-o", rep, str(exe), "32", "1", "64", "1536"],
                   capture_output=True, text=True)
    for page, extra in (("details", []), ("source", ["--print-source", "sass"])):
        r = subprocess.run(["ncu", "--import", rep + ".ncu-rep", "--page", page, "--csv", *extra],
                           capture_output=True, text=True)
        (OUT / f"ncu_{page}_{name}.csv").write_text(r.stdout + r.stderr[-3000:])
        print(name, page, r.returncode, len(r.stdout), r.stderr[-500:], flush=True)
