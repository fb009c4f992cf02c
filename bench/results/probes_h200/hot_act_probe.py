"""Probe: the GEMVs and FP16 F.linear with the activations cold (a fresh set per call, as bench/gemm_h200.py
times them) and hot in L2 (one activation tensor shared by every call, the weights still rotating), at
M = 1 and 16, g128, the dependent-launch picks; three timings each.

    QOQ_CUDA_BUILD_DIR=$PWD/build/cuda PYTHONPATH=. python bench/results/probes_h200/hot_act_probe.py $OUT
"""
import json, sys
from pathlib import Path
import torch
import torch.nn.functional as F
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
import bench.gemm_h200 as gb
from bench.timing import n_sets, time_graph
from qoq.runtime_cuda.gemm import auto_variant, w4a8_gemm

DEV = "cuda"
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
rows = []
for n, k in ((12288, 4096), (4096, 4096), (22016, 4096), (4096, 11008)):
    for m in (1, 16):
        v = auto_variant(m, n, k, 128, 132, True, True)
        calls = gb.w4a8_calls(m, n, k, 128, v, enable_pdl=True)
        sets = len(calls)
        qx = torch.randint(-127, 128, (m, k), dtype=torch.int8, device=DEV)
        s_x = torch.rand(m, 1, device=DEV).half()
        qsum = qx.sum(dim=1, dtype=torch.int32)
        shared = []
        for _ in range(sets):
            qw = torch.randint(-128, 128, (n, k // 2), dtype=torch.int8, device=DEV)
            s1 = torch.rand(n, device=DEV).half() / 64
            s2 = torch.randint(1, 17, (k // 128, n), dtype=torch.int8, device=DEV)
            z = -torch.randint(0, 100, (k // 128, n), dtype=torch.int8, device=DEV)
            shared.append(lambda qw=qw, s1=s1, s2=s2, z=z: w4a8_gemm(qx, s_x, qw, s1, variant=v, enable_pdl=True,
                                                                     s2_scales=s2, s2_zeros=z, qsum=qsum))
        fp_rot, fp_shared = [], []
        x0 = torch.randn(m, k, device=DEV).half()
        for _ in range(n_sets(n * k * 2, 64)):
            w = torch.randn(n, k, device=DEV).half()
            x = torch.randn(m, k, device=DEV).half()
            fp_rot.append(lambda x=x, w=w: F.linear(x, w))
            fp_shared.append(lambda w=w: F.linear(x0, w))
        r = dict(n=n, k=k, m=m, variant=v, sets=sets)
        for name, c in (("w4a8_cold", calls), ("w4a8_hot", shared), ("fp16_cold", fp_rot), ("fp16_hot", fp_shared)):
            r[name] = [round(time_graph(c), 2) for _ in range(3)]
        print(r, flush=True)
        rows.append(r)
        del calls, shared, fp_rot, fp_shared
        torch.cuda.empty_cache()
(out / "hot_act_probe.json").write_text(json.dumps(rows, indent=1))
