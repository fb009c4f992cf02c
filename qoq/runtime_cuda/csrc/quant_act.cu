// Fused per-token activation quantization (docs/design.md §3.3, §3.5, §5): one block per token row.
// Pass 1 computes the fp16 GEMM input y (x, RMSNorm(x) or silu(gate)*up) into shared memory and
// its |max| and sum; pass 2 writes the int8 codes and sums them. Divisions are IEEE (__fdiv_rn)
// even under --use_fast_math so codes match the torch reference exactly.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_fp16.h>

#include "grid_dependency.cuh"
#include "half8.cuh"
#include "quant_act.cuh"

namespace qoq_quant {

constexpr int THREADS = 256;
constexpr float ABS_MAX_FLOOR = 1e-6f;
constexpr float SMALLEST_FP16_SCALE = 5.9604644775390625e-08f;  // 2^-24, as qoq.quant.activations

struct QuantParams {
  const half* x;      // [T, K] rows x_stride apart (gate for SiluMul)
  const half* up;     // [T, K] rows up_stride apart (SiluMul)
  const half* gamma;  // [K] (RmsNorm)
  int64_t x_stride, up_stride;
  float eps;
  int K;
  int8_t* qx;    // [T, K], or with `tiles` A-fragment tiles [K/32][32][16] of T <= 16 rows
  bool tiles;
  half* scale;   // [T]
  float* xsum;   // [T] or nullptr: sums of y
  int* qsum;     // [T] or nullptr: sums of the codes
};

template <bool IS_MAX, typename T>
__device__ __forceinline__ T combine(T a, T b) {
  if constexpr (IS_MAX) return fmaxf(a, b);
  else return a + b;
}

// IS_MAX: |max| (of values >= 0); else a sum. `scratch`: 32 words of shared memory.
template <bool IS_MAX, typename T>
__device__ T block_reduce(T v, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const T o = __shfl_xor_sync(0xffffffffu, v, off);
    v = combine<IS_MAX>(v, o);
  }
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < THREADS / 32 ? scratch[lane] : T(0);  // 0 is neutral for sums and for |max|
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const T o = __shfl_xor_sync(0xffffffffu, v, off);
      v = combine<IS_MAX>(v, o);
    }
    if (lane == 0) scratch[0] = v;
  }
  __syncthreads();
  const T result = scratch[0];
  __syncthreads();  // scratch is reused by the next reduction
  return result;
}

__device__ __forceinline__ float round_to_half(float v) { return __half2float(__float2half_rn(v)); }

// Byte offset of the codes of row `row` at k..k+3 (k % 4 == 0) in A-fragment tiles (gemm_w4a8_params.h
// GemmParams::tiled): tile k / 32, lane 4 (row % 8) + (k % 16) / 4, word 2 ((k % 32) / 16) + row / 8.
__device__ __forceinline__ int64_t tile_offset(int row, int k) {
  const int kk = k % 32;
  return static_cast<int64_t>(k / 32) * 512 + ((row % 8) * 4 + (kk % 16) / 4) * 16 + ((kk / 16) * 2 + row / 8) * 4;
}

template <RowOp OP>
__global__ void __launch_bounds__(THREADS) quant_rows_kernel(const QuantParams p) {
  extern __shared__ __align__(16) uint4 row_buf[];  // [K/8] fp16 GEMM inputs of this row
  __shared__ float scratch[32];
  int* scratch_int = reinterpret_cast<int*>(scratch);
  const int row = blockIdx.x, vecs = p.K / 8;
  const uint4* x = reinterpret_cast<const uint4*>(p.x + row * p.x_stride);
  allow_dependent_grids();  // a GEMM launched as a programmatic dependent may load its weights meanwhile

  float inv_rms = 0.0f;
  if constexpr (OP == RowOp::RmsNorm) {
    float sum_sq = 0.0f;
    for (int v = threadIdx.x; v < vecs; v += THREADS) {
      float f[8];
      unpack_half8(x[v], f);
#pragma unroll
      for (int e = 0; e < 8; ++e) sum_sq += f[e] * f[e];
    }
    sum_sq = block_reduce<false>(sum_sq, scratch);
    inv_rms = __fdiv_rn(1.0f, __fsqrt_rn(__fdiv_rn(sum_sq, static_cast<float>(p.K)) + p.eps));
  }

  float abs_max = 0.0f, sum = 0.0f;
  for (int v = threadIdx.x; v < vecs; v += THREADS) {
    float f[8];
    unpack_half8(x[v], f);
    float other[8];
    if constexpr (OP == RowOp::RmsNorm) unpack_half8(reinterpret_cast<const uint4*>(p.gamma)[v], other);
    if constexpr (OP == RowOp::SiluMul) unpack_half8(reinterpret_cast<const uint4*>(p.up + row * p.up_stride)[v], other);
    uint4 packed;
    half2* out = reinterpret_cast<half2*>(&packed);
#pragma unroll
    for (int e = 0; e < 8; e += 2) {
      float y[2];
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const float a = f[e + u];
        if constexpr (OP == RowOp::Plain) y[u] = a;
        if constexpr (OP == RowOp::RmsNorm) y[u] = round_to_half(a * inv_rms * other[e + u]);
        if constexpr (OP == RowOp::SiluMul) {
          const float silu = round_to_half(__fdiv_rn(a, 1.0f + expf(-a)));  // F.silu rounds to fp16
          y[u] = round_to_half(silu * other[e + u]);
        }
        abs_max = fmaxf(abs_max, fabsf(y[u]));
        sum += y[u];
      }
      out[e / 2] = __floats2half2_rn(y[0], y[1]);
    }
    row_buf[v] = packed;  // read back below by this same thread: no barrier needed
  }
  abs_max = block_reduce<true>(abs_max, scratch);
  if (p.xsum != nullptr) sum = block_reduce<false>(sum, scratch);
  const half scale_h = __float2half_rn(__fdiv_rn(fmaxf(abs_max, ABS_MAX_FLOOR), 127.0f));
  const float scale = fmaxf(__half2float(scale_h), SMALLEST_FP16_SCALE);
  if (threadIdx.x == 0) {
    p.scale[row] = __float2half_rn(scale);
    if (p.xsum != nullptr) p.xsum[row] = sum;
  }

  uint2* codes = reinterpret_cast<uint2*>(p.qx + static_cast<int64_t>(row) * p.K);  // unless tiles
  int code_sum = 0;
  for (int v = threadIdx.x; v < vecs; v += THREADS) {
    float f[8];
    unpack_half8(row_buf[v], f);
    uint32_t word[2] = {0u, 0u};
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int q = static_cast<int>(fminf(fmaxf(rintf(__fdiv_rn(f[e], scale)), -127.0f), 127.0f));
      code_sum += q;
      word[e / 4] |= (static_cast<uint32_t>(q) & 0xffu) << (8 * (e % 4));
    }
    if (p.tiles) {  // k = 8 v + 4 w
      *reinterpret_cast<uint32_t*>(p.qx + tile_offset(row, 8 * v)) = word[0];
      *reinterpret_cast<uint32_t*>(p.qx + tile_offset(row, 8 * v + 4)) = word[1];
    } else {
      codes[v] = make_uint2(word[0], word[1]);
    }
  }
  if (p.qsum != nullptr) {
    code_sum = block_reduce<false>(code_sum, scratch_int);
    if (threadIdx.x == 0) p.qsum[row] = code_sum;
  }
}

template <RowOp OP>
static std::vector<at::Tensor> launch(QuantParams p, const at::Tensor& x, RowSums sums) {
  const int64_t T = x.size(0), K = x.size(1);
  // tiles: rows T..15 are left as they are (the GEMM never stores them)
  at::Tensor qx = p.tiles ? at::empty({K / 32, 32, 16}, x.options().dtype(at::kChar))
                          : at::empty({T, K}, x.options().dtype(at::kChar));
  at::Tensor scale = at::empty({T, 1}, x.options());
  at::Tensor row_sums = at::empty({sums == RowSums::None ? 0 : T},
                                  x.options().dtype(sums == RowSums::Codes ? at::kInt : at::kFloat));
  p.K = static_cast<int>(K);
  p.qx = qx.data_ptr<int8_t>();
  p.scale = reinterpret_cast<half*>(scale.data_ptr<at::Half>());
  p.xsum = sums == RowSums::Inputs ? row_sums.data_ptr<float>() : nullptr;
  p.qsum = sums == RowSums::Codes ? row_sums.data_ptr<int>() : nullptr;
  if (T > 0 && K > 0) {
    const c10::cuda::CUDAGuard guard(x.device());
    const int smem = static_cast<int>(K * sizeof(half));
    if (smem > 48 * 1024) {
      C10_CUDA_CHECK(cudaFuncSetAttribute(quant_rows_kernel<OP>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    }
    quant_rows_kernel<OP><<<T, THREADS, smem, c10::cuda::getCurrentCUDAStream()>>>(p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {qx, scale, row_sums};
}

std::vector<at::Tensor> quant_rows(RowOp op, const at::Tensor& x, const at::Tensor& other, double eps,
                                   RowSums sums, bool tiles) {
  QuantParams p{};
  p.tiles = tiles;
  p.x = reinterpret_cast<const half*>(x.data_ptr<at::Half>());
  p.x_stride = x.stride(0);
  switch (op) {
    case RowOp::Plain:
      return launch<RowOp::Plain>(p, x, sums);
    case RowOp::RmsNorm:
      p.gamma = reinterpret_cast<const half*>(other.data_ptr<at::Half>());
      p.eps = static_cast<float>(eps);
      return launch<RowOp::RmsNorm>(p, x, sums);
    case RowOp::SiluMul:
      p.up = reinterpret_cast<const half*>(other.data_ptr<at::Half>());
      p.up_stride = other.stride(0);
      return launch<RowOp::SiluMul>(p, x, sums);
  }
  return {};
}

}  // namespace qoq_quant
