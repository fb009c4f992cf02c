"""Probe: decode time with the scale/zero vectors inline after each 32-token block's codes (mode 1) or
not copied at all (mode 2), against the current layout; same bytes, interleaved replays."""
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


def build(name, csrc, flags):
    d = root / f"probe_{name}"
    d.mkdir(parents=True, exist_ok=True)
    csrc = Path(csrc)
    return load(name=f"qoq_attn_{name}", sources=[str(csrc / s) for s in attention.SOURCES],
                extra_include_paths=[str(csrc)], extra_cflags=["-O3", "-std=c++17"],
                extra_cuda_cflags=["-O3", "-std=c++17", "--use_fast_math", "-lineinfo", *flags,
                                   "-gencode=arch=compute_90a,code=sm_90a"], build_directory=str(d))


t0 = time.time()
exts = {"base": attention.extension()}
exts["inline"] = build("inline", "scratch/layout_csrc", ["-DQOQ_SZ_MODE=1"])
exts["nosz"] = build("nosz", "scratch/layout_csrc", ["-DQOQ_SZ_MODE=2"])
print("built", time.time() - t0, flush=True)


def inline_pool(pool, hkv):
    """Sane fp16 scale/zero at the inline positions: [P, H, 2 blocks, 2176] bytes, vectors at 2048.."""
    v = pool.view(pool.shape[0], hkv, 2, 2176)[..., 2048:].contiguous().view(torch.float16)  # [P,H,2,64]
    v[..., :32] = (torch.rand_like(v[..., :32], dtype=torch.float32) * 0.2 + 0.01).half()
    v[..., 32:] = (torch.rand_like(v[..., 32:], dtype=torch.float32) * 15).half()
    pool.view(pool.shape[0], hkv, 2, 2176)[..., 2048:] = v.view(torch.uint8)
    return pool


SHAPES = [("llama2-7b", 64, 1536, 3), ("llama3-8b", 64, 512, 2), ("llama3-8b", 256, 512, 3), ("llama2-7b", 64, 512, 3),
          ("llama3-8b", 64, 1536, 2), ("llama2-7b", 256, 4096, 3)]
rows = []
for model, batch, length, st in SHAPES:
    hq, hkv, dim = ab.MODELS[model]
    lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
    sets = ab.decode_sets(hq, hkv, dim, batch, length)
    inline_sets = [(q, inline_pool(k.clone(), hkv), inline_pool(v.clone(), hkv), t) for q, k, v, t in sets]
    times = {k: [] for k in exts}
    for rep in range(4):
        order = list(exts) if rep % 2 == 0 else list(exts)[::-1]
        for name in order:
            attention.extension = lambda e=exts[name]: e
            use = inline_sets if name == "inline" else sets
            times[name].append(round(time_graph([lambda s=s: attention.decode_attention(
                s[0], s[1], s[2], s[3], lens, length, num_splits=1, num_stages=st) for s in use], 40), 2))
    # the inline build's output on inline pools must be finite (sane vectors)
    attention.extension = lambda e=exts["inline"]: e
    o = attention.decode_attention(*inline_sets[0], lens, length, num_splits=1, num_stages=st)
    row = dict(model=model, batch=batch, length=length, stages=st, inline_finite=bool(o.isfinite().all()), **times)
    rows.append(row)
    print(row, flush=True)
    del sets, inline_sets
    torch.cuda.empty_cache()
(out / "layout_probe.json").write_text(json.dumps(rows, indent=1))
