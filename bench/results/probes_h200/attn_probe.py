"""Probe: per-warp timeline of the decode kernel (trace build) + split/stage sweep at B >= 64."""
import json, sys, time
from pathlib import Path
import torch
from torch.utils.cpp_extension import load

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
import bench.attention_h200 as ab  # noqa
from bench.timing import time_graph  # noqa
from qoq.runtime_cuda import attention  # noqa

out = Path(sys.argv[1])
root = Path("build/cuda")
t0 = time.time()
base = attention.extension()
print("base built", time.time() - t0, flush=True)


def build(name, csrc):
    d = root / f"probe_{name}"
    d.mkdir(parents=True, exist_ok=True)
    csrc = Path(csrc)
    return load(name=f"qoq_attn_{name}", sources=[str(csrc / s) for s in attention.SOURCES],
                extra_include_paths=[str(csrc)], extra_cflags=["-O3", "-std=c++17"],
                extra_cuda_cflags=["-O3", "-std=c++17", "--use_fast_math", "-lineinfo",
                                   "-gencode=arch=compute_90a,code=sm_90a"], build_directory=str(d))


exts = {"base": base}
for name, path in [a.split("=") for a in sys.argv[2:]]:
    t0 = time.time()
    exts[name] = build(name, path)
    print("built", name, time.time() - t0, flush=True)


def use(ext):
    attention.extension = lambda: ext


def summarize(tr):
    tr = tr.double()
    ghz = ((tr[:, :, 13] - tr[:, :, 1]) / (tr[:, :, 14] - tr[:, :, 0])).median().item()
    sm = tr[:, 0, 15].long()
    start = torch.full((int(sm.max()) + 1,), float("inf"), dtype=torch.float64)
    start.scatter_reduce_(0, sm, tr[:, :, 1].min(1).values, reduce="amin")
    rel = (tr[:, :, 1:14] - start[sm][:, None, None]) / ghz / 1000  # us from the SM's first entry
    names = ["entry"] + [f"{e}{k}" for k in range(5) for e in ("land", "done")] + ["precombine", "end"]
    summ = {"ghz": ghz, "span_us": (tr[:, :, 14].max() - tr[:, :, 0].min()).item() / 1000,
            "entry_spread_us": (tr[:, :, 0].max() - tr[:, :, 0].min()).item() / 1000}
    for i, nme in enumerate(names):
        v = rel[:, :, i].flatten()
        v = v[(v > -1) & (v < 1e4)] if nme != "entry" else v
        if v.numel():
            q = torch.quantile(v, torch.tensor([0.1, 0.5, 0.9, 1.0], dtype=torch.float64)).tolist()
            summ[nme] = [round(x, 3) for x in q]
    for k in range(4):  # per-chunk compute and wait durations
        c = (tr[:, :, 3 + 2 * k] - tr[:, :, 2 + 2 * k]) / ghz / 1000
        w = (tr[:, :, 4 + 2 * k] - tr[:, :, 3 + 2 * k]) / ghz / 1000
        c = c[(c > 0) & (c < 1e3)]
        w = w[(w > -1) & (w < 1e3)]
        if c.numel():
            summ[f"compute{k}"] = [round(x, 3) for x in torch.quantile(c, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)).tolist()]
        if w.numel() and k < 3:
            summ[f"wait{k + 1}"] = [round(x, 3) for x in torch.quantile(w, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)).tolist()]
    comb = (tr[:, :, 13] - tr[:, :, 12]) / ghz / 1000
    summ["combine"] = [round(x, 3) for x in torch.quantile(comb.flatten(), torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)).tolist()]
    return summ


res = {"timing": [], "trace": []}
SHAPES = [("llama3-8b", 64, 512), ("llama3-8b", 256, 512), ("llama3-8b", 64, 1536), ("llama2-7b", 64, 512),
          ("llama2-7b", 64, 1536)]
for model, batch, length in SHAPES:
    hq, hkv, dim = ab.MODELS[model]
    lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
    sets = ab.decode_sets(hq, hkv, dim, batch, length)
    for rep in range(2):
        for name, ext in exts.items():
            if name == "trace":
                continue
            use(ext)
            for splits in (1, 2, 4):
                for st in (2, 3):
                    us = time_graph([lambda s=s: attention.decode_attention(s[0], s[1], s[2], s[3], lens, length,
                                                                            num_splits=splits, num_stages=st)
                                     for s in sets], 40)
                    row = dict(ext=name, rep=rep, model=model, batch=batch, length=length, splits=splits, stages=st,
                               us=us)
                    res["timing"].append(row)
                    print(row, flush=True)
    if "trace" in exts:
        use(exts["trace"])
        for st in (2, 3):
            calls = [lambda s=s: attention.decode_attention(s[0], s[1], s[2], s[3], lens, length, num_splits=1,
                                                            num_stages=st) for s in sets]
            us = time_graph(calls, 10)
            tr = exts["trace"].trace().view(4096, 4, 16)
            n = batch * hkv
            tr = tr[:n].clone()
            torch.save(tr, out / f"trace_{model}_{batch}_{length}_{st}.pt")
            res["trace"].append(dict(model=model, batch=batch, length=length, stages=st, us=us,
                                     summary=summarize(tr)))
            print(json.dumps(res["trace"][-1]["summary"]), flush=True)
            print("trace", model, batch, length, st, us, flush=True)
    del sets
    torch.cuda.empty_cache()

(out / "attn_probe.json").write_text(json.dumps(res))
print("done")
