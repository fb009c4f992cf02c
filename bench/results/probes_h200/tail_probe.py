"""A/B: tail splitting (the last X (sequence, KV head) pairs in 2 splits) vs none, and the old grid."""
import json, math, sys
from pathlib import Path
import torch
from torch.utils.cpp_extension import load

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
import bench.attention_h200 as ab  # noqa
from bench.timing import time_graph  # noqa
from qoq.runtime_cuda import attention  # noqa

out = Path(sys.argv[1])
d = Path("build/cuda/tail_old"); d.mkdir(parents=True, exist_ok=True)
old = load(name="qoq_tail_old", sources=[str(Path("scratch/old_csrc") / s) for s in attention.SOURCES],
           extra_include_paths=["scratch/old_csrc"], extra_cflags=["-O3", "-std=c++17"],
           extra_cuda_cflags=["-O3", "-std=c++17", "--use_fast_math", "-lineinfo", "-gencode=arch=compute_90a,code=sm_90a"],
           build_directory=str(d))
new = attention.extension()
SHAPES = [("llama2-7b", 64, 1536), ("llama2-7b", 64, 512), ("llama3-8b", 256, 512), ("llama3-8b", 256, 1536),
          ("llama2-7b", 64, 4096), ("llama2-7b", 256, 1536), ("llama3-8b", 256, 4096)]
rows = []
for model, batch, length in SHAPES:
    hq, hkv, dim = ab.MODELS[model]
    lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
    sets = ab.decode_sets(hq, hkv, dim, batch, length)
    pairs = batch * hkv
    st = attention.plan_stages(batch, hkv, 1, dim, 132)
    pages = math.ceil(length / 64)
    empty = torch.empty(0, dtype=torch.float32, device="cuda")
    cnt = torch.empty(0, dtype=torch.int32, device="cuda")

    def old_calls():
        return [lambda s=s: old.decode_kv4(s[0], s[1], s[2], s[3], lens, torch.empty_like(s[0]), empty, empty, cnt,
                                           hkv, 1, pages, st, 1 / math.sqrt(dim)) for s in sets]

    def new_calls(x):
        return [lambda s=s: attention.decode_attention(s[0], s[1], s[2], s[3], lens, length, num_splits=2 if x else 1,
                                                       num_stages=st, unsplit_pairs=pairs - x if x else None)
                for s in sets]

    configs = {"old": old_calls, "x0": lambda: new_calls(0)}
    for x in (132, 264, 528):
        configs[f"x{x}"] = lambda x=x: new_calls(x)
    times = {k: [] for k in configs}
    for rep in range(4):
        for name in (list(configs) if rep % 2 == 0 else list(configs)[::-1]):
            times[name].append(round(time_graph(configs[name](), 40), 2))
    ref_out = attention.decode_attention(*sets[0], lens, length, num_splits=1, num_stages=st)
    tail_out = attention.decode_attention(*sets[0], lens, length, num_splits=2, num_stages=st, unsplit_pairs=pairs - 264)
    err = ((tail_out.float() - ref_out.float()).norm() / ref_out.float().norm()).item()
    rows.append(dict(model=model, batch=batch, length=length, stages=st, rel_err_tail_vs_unsplit=err, **times))
    print(rows[-1], flush=True)
    del sets
    torch.cuda.empty_cache()
(out / "tail_probe.json").write_text(json.dumps(rows, indent=1))
