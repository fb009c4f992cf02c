"""Why was the decode kernel slower than a copy of its own byte stream? Builds variants of the decode
kernel (string edits of attention_decode_kv4.cu / attention_decode_combine.cuh in BISECT_CSRC, default
the repository's csrc), each compiled into bench/kv4_stream_ceiling.cu's standalone harness (event-timed,
warm and flushed L2, 2 and 3 ring slots, next to the no-math streams), and runs them on the given shapes
(KV heads x group x batch x length). JSON lines to OUT/decode_bisect_h200.jsonl.

    BISECT_CSRC=<91a76d4's csrc> python bench/results/probes_h200/decode_bisect.py $OUT base,s1only,nomath+nocombine \
        32x1x64x1536,8x4x64x512

Variants ("+" joins edits): nomath (attend_chunk replaced by one word read per chunk), nocombine (the
combine replaced by a sum of every accumulator into a sink), noseqlen, noq, nostore, phase1, p0 (the combine
cut after its first or second step), staticsmem, s1only (the cross-split merge removed from the code),
nofence / noatomic / noldcg / nobar (one kind of instruction removed from the merge), nopartial (no
instantiation for a sequence's last, partial chunk: wrong results there, a bound), noinline (the combine
as a call).
"""
import itertools, json, os, subprocess, sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CSRC = Path(os.environ.get("BISECT_CSRC", ROOT / "qoq/runtime_cuda/csrc"))  # the tree whose kernel is edited
SRC = (CSRC / "attention_decode_kv4.cu").read_text()
OUT = Path(sys.argv[1])
COMBINE_CALL = next(line for line in SRC.splitlines() if line.startswith("  combine_warps_and_splits<D"))
KSPLIT = ", false" if "bool kSplit" in SRC else ""  # trees from the one with kSplit on
EDITS = {
    "nomath": [("""    if (tok_end - t >= C::kTokens)  // split ends are page-aligned: only a sequence's end cuts a chunk
      attend_chunk<D, false>(c, qb, qs, u_log2, C::kTokens, st, lane);
    else
      attend_chunk<D, true>(c, qb, qs, u_log2, tok_end - t, st, lane);""",
                "    st.o[0][0] += __int_as_float(*reinterpret_cast<const int*>(c.slot + lane * 4) & 0x3fffffff);")],
    "nocombine": [(COMBINE_CALL,
                   "  float sink = st.m[0] + st.m[1] + st.l[0] + st.l[1] + st.z[0] + st.z[1] + st.z[2] + st.z[3];\n"
                   "  for (int i = 0; i < D / 16; ++i) sink += st.o[i][0] + st.o[i][1] + st.o[i][2] + st.o[i][3];\n"
                   "  if (sink == 1.2345f) p.out[threadIdx.x] = __float2half(sink);")],
    "nostore": [("      out[g * D + d] = __float2half_rn(O);", "      if (O == 1.2345f) out[g * D + d] = __float2half_rn(O);")],
    "phase1": [("""  constexpr float kEven = 16777216.f, kOdd = 1048576.f;  // 2^24; 2^24 / 16 for the high nibbles""",
                """  if (S == 1) {
    float sink = wt[0] + wt[1];
    for (int i = 0; i < D / 16; ++i) sink += (st.o[i][0] + st.o[i][1] + st.o[i][2] + st.o[i][3]) * wt[0];
    if (sink == 1.2345f) p.out[threadIdx.x] = __float2half(sink);
    return;
  }
  constexpr float kEven = 16777216.f, kOdd = 1048576.f;  // 2^24; 2^24 / 16 for the high nibbles""")],
    "p0": [("""  }
  __syncthreads();

  // Each lane weighs""", """  }
  __syncthreads();
  if (S == 1) {
    float sink = sm_m[warp ^ 1][quad] + sm_l[warp ^ 2][quad] + st.o[0][0];
    for (int i = 0; i < D / 16; ++i) sink += st.o[i][0] + st.o[i][1] + st.o[i][2] + st.o[i][3];
    if (sink == 1.2345f) p.out[threadIdx.x] = __float2half(sink);
    return;
  }
  // Each lane weighs""")],
    "staticsmem": [(COMBINE_CALL,
                    "  float sink = st.m[0] + st.m[1] + st.l[0] + st.l[1] + st.z[0] + st.z[1] + st.z[2] + st.z[3];\n"
                   "  for (int i = 0; i < D / 16; ++i) sink += st.o[i][0] + st.o[i][1] + st.o[i][2] + st.o[i][3];\n" "  __shared__ float dummy[608];\n  dummy[threadIdx.x] = sink;\n  __syncthreads();\n"
                   "  sink += dummy[threadIdx.x ^ 1];\n"
                   "  if (sink == 1.2345f) p.out[threadIdx.x] = __float2half(sink);")],
    "s1only": [("  if (S == 1) return;\n  __threadfence();", "  return;\n  __threadfence();")],
    "nofence": [("  __threadfence();\n  __syncthreads();\n  if (threadIdx.x == 0)", "  __syncthreads();\n  if (threadIdx.x == 0)"),
                ("  if (!is_last) return;\n  __threadfence();", "  if (!is_last) return;")],
    "noatomic": [("is_last = atomicAdd(&p.counters[bh], 1) == S - 1;", "is_last = p.counters[bh] == S - 1;")],
    "noldcg": [("__ldcg(&p.part_ml[((part0 + s) * G + g) * 2])", "p.part_ml[((part0 + s) * G + g) * 2]"),
               ("__ldcg(&p.part_ml[((part0 + s) * G + g) * 2 + 1])", "p.part_ml[((part0 + s) * G + g) * 2 + 1]"),
               ("__ldcg(&p.part_o[(part0 + s) * GD + idx])", "p.part_o[(part0 + s) * GD + idx]")],
    "nobar": [("  __threadfence();\n  __syncthreads();\n  if (threadIdx.x == 0)", "  __threadfence();\n  if (threadIdx.x == 0)"),
              ("  __syncthreads();\n  if (!is_last) return;", "  if (!is_last) return;"),
              ("  }\n  __syncthreads();\n  for (int idx = threadIdx.x; idx < GD; idx += kDecodeThreads) {\n    const int g = idx / D;",
               "  }\n  for (int idx = threadIdx.x; idx < GD; idx += kDecodeThreads) {\n    const int g = idx / D;")],
    "nopartial": [("""    if (tok_end - t >= C::kTokens)  // split ends are page-aligned: only a sequence's end cuts a chunk
      attend_chunk<D, false>(c, qb, qs, u_log2, C::kTokens, st, lane);
    else
      attend_chunk<D, true>(c, qb, qs, u_log2, tok_end - t, st, lane);""",
                   "    attend_chunk<D, false>(c, qb, qs, u_log2, C::kTokens, st, lane);  // wrong for partial chunks")],
    "noinline": [("__device__ __forceinline__ void combine_warps_and_splits", "__device__ __noinline__ void combine_warps_and_splits")],
    "noseqlen": [("  const int seq_len = p.seq_lens[b];", "  const int seq_len = p.pages_per_split * kPageTokens;")],
    "noq": [("  const float qsum = load_query<D>(p, b, head, lane, qb);",
             "  for (int i = 0; i < D / 16; ++i) qb[i][0] = qb[i][1] = 0x3c003c00u * (lane == 99);\n  const float qsum = 0.f;")],
}
VARIANTS = [tuple(v.split("+")) if v != "base" else () for v in sys.argv[2].split(",")]
SHAPES = [s.split("x") for s in sys.argv[3].split(",")]


def build(variant):
    name = "base" if not variant else "_".join(variant)
    src = SRC
    if any(key in ("nostore", "phase1", "p0", "s1only", "nofence", "noatomic", "noldcg", "nobar", "noinline") for key in variant):  # edits of the combine: inline a copy of it
        comb = (CSRC / "attention_decode_combine.cuh").read_text()
        src = src.replace('#include "attention_decode_combine.cuh"', comb.replace("#pragma once", ""))
    for key in variant:
        for old, new in EDITS[key]:
            assert src.count(old) == 1, (key, old)
            src = src.replace(old, new)
    d = Path(f"/tmp/bisect/{name}")
    d.mkdir(parents=True, exist_ok=True)
    (d / "attention_decode_kv4.cu").write_text(src)
    exe = d / "probe"
    cmd = ["nvcc", "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-std=c++17", "--use_fast_math", f"-I{d}",
           f"-I{CSRC}", f"-I{ROOT}/bench", "-Xptxas", "-v",
           str(d / "main.cu"), "-o", str(exe)]
    # the harness includes "attention_decode_kv4.cu" by quotes: copy it next to the variant so that one wins
    main = (ROOT / "bench/kv4_stream_ceiling.cu").read_text()
    occupancy = """  for (int stages : {2, 3}) {  // CTAs per SM the decode kernel gets
    int n = 0;
    auto kernel = stages == 2 ? qoq_attn::decode_kv4_kernel<128, 2KSPLIT> : qoq_attn::decode_kv4_kernel<128, 3KSPLIT>;
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, stages * 4 * 4352));
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, 128, stages * 4 * 4352));
    printf("{\\"occupancy_%d_slots\\": %d}\\n", stages, n);
  }
  const long bytes = sh.kv4_bytes();"""
    occupancy = occupancy.replace("KSPLIT", KSPLIT)
    assert main.count("  const long bytes = sh.kv4_bytes();") == 1
    (d / "main.cu").write_text(main.replace("  const long bytes = sh.kv4_bytes();", occupancy))
    r = subprocess.run(cmd, capture_output=True, text=True)
    lines, regs, entry = r.stderr.splitlines(), [], ""
    for l in lines:  # the decode kernels' register counts
        if "Compiling entry function" in l:
            entry = l
        elif "registers" in l and "decode_kv4_kernel" in entry:
            regs.append(l.strip())
    return name, exe, r.returncode, r.stderr[-2000:] if r.returncode else "; ".join(regs)


with ThreadPoolExecutor(8) as pool:
    built = list(pool.map(build, VARIANTS))
with open(OUT / "decode_bisect_h200.jsonl", "w") as f:
    for name, exe, rc, log in built:
        print(name, rc, log, flush=True)
        f.write(json.dumps({"variant": name, "build_rc": rc, "ptxas": log}) + "\n")
    for shape, (name, exe, rc, _) in itertools.product(SHAPES, built):
        if rc:
            continue
        r = subprocess.run([str(exe), *shape], capture_output=True, text=True, timeout=120)
        for line in r.stdout.splitlines():
            if not line.startswith("{"):
                print(name, shape, line, flush=True)
                continue
            row = json.loads(line)
            if "kernel" not in row and "kv_heads" not in row:
                row.update(variant=name, shape=" ".join(shape))
                f.write(json.dumps(row) + "\n")
                print(json.dumps(row), flush=True)
            if "kernel" in row and (row["kernel"].startswith("decode") or name == "base"):
                row.update(variant=name, shape=" ".join(shape))
                f.write(json.dumps(row) + "\n")
                print(json.dumps(row), flush=True)
