#!/bin/bash
# ncu source counters of four W4A8 GEMVs and of the one-wave decode row; run from the repository root, OUT set.
export QOQ_CUDA_BUILD_DIR=$PWD/build/cuda PYTHONPATH=.
mkdir -p build/cuda
python -c "from qoq.runtime_cuda import gemm; gemm.extension()" 2>&1 | tail -2
prof() {  # name, ncu args..., then the program
  local name=$1; shift
  ncu --clock-control none -f --section SourceCounters --section WarpStateStats --section SpeedOfLight --section MemoryWorkloadAnalysis_Tables -o /tmp/$name "$@" > /tmp/$name.log 2>&1
  tail -3 /tmp/$name.log
  ncu --import /tmp/$name.ncu-rep --page details --csv > $OUT/ncu_details_$name.csv 2>&1
  ncu --import /tmp/$name.ncu-rep --page source --csv --print-source sass > $OUT/ncu_source_$name.csv 2>&1
}
prof gate_up_g128_m16_gemv -k regex:gemm_gemv --launch-skip 2 --launch-count 1 python bench/results/probes_h200/gemv_ncu_case.py 22016 4096 16 128 gemv
prof o_g128_m16_gemv16 -k regex:gemm_gemv --launch-skip 2 --launch-count 1 python bench/results/probes_h200/gemv_ncu_case.py 4096 4096 16 128 gemv16
prof qkv_g128_m16_gemv16p -k regex:gemm_gemv --launch-skip 2 --launch-count 1 python bench/results/probes_h200/gemv_ncu_case.py 12288 4096 16 128 gemv16p
prof gate_up_g128_m1_gemv -k regex:gemm_gemv --launch-skip 2 --launch-count 1 python bench/results/probes_h200/gemv_ncu_case.py 22016 4096 1 128 gemv
# the one-wave decode row in the standalone harness (2 ring slots, 6th launch)
mkdir -p /tmp/lp && cp bench/kv4_stream_ceiling.cu /tmp/lp/main.cu && nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 --use_fast_math -lineinfo -Iqoq/runtime_cuda/csrc -Ibench /tmp/lp/main.cu -o /tmp/lp/probe
prof decode_l3_b64_l512 -k regex:decode_kv4_kernel --launch-skip 5 --launch-count 1 /tmp/lp/probe 8 4 64 512
ls -la $OUT
