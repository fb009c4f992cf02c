#!/bin/bash
export QOQ_CUDA_BUILD_DIR=$PWD/build/cuda PYTHONPATH=.
mkdir -p build/cuda
python -c "from qoq.runtime_cuda import gemm; gemm.extension()" 2>&1 | tail -2
prof() {
  local name=$1; shift
  ncu --clock-control none -f --section SourceCounters --section WarpStateStats --section SpeedOfLight -o /tmp/$name "$@" > /tmp/$name.log 2>&1
  tail -2 /tmp/$name.log
  ncu --import /tmp/$name.ncu-rep --page details --csv > $OUT/ncu_details_$name.csv 2>&1
  ncu --import /tmp/$name.ncu-rep --page source --csv --print-source sass > $OUT/ncu_source_$name.csv 2>&1
}
prof qkv_g128_m16_gemv16p -k regex:gemm_gemv --launch-skip 2 --launch-count 1 python bench/results/probes_h200/gemv_ncu_case.py 12288 4096 16 128 gemv16p
prof qkv_pc_m16_gemv16p -k regex:gemm_gemv --launch-skip 2 --launch-count 1 python bench/results/probes_h200/gemv_ncu_case.py 12288 4096 16 -1 gemv16p
prof qkv_g128_m1_gemv16p -k regex:gemm_gemv --launch-skip 2 --launch-count 1 python bench/results/probes_h200/gemv_ncu_case.py 12288 4096 1 128 gemv16p
ls -la $OUT
