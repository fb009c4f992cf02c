// Fused per-token row kernels (docs/design.md §3.3, §3.5, §5): one block per token row. Pass 1 computes
// the fp16 row y (x, RMSNorm(x) or silu(gate)*up; RMSNorm optionally of residual += x, in place), which the
// quantizing kernels keep in shared memory with its |max| and sum and pass 2 turns into int8 codes and their
// sum, and the fp16 ones (the fp16 path) write out as it is. Divisions are IEEE (__fdiv_rn) even under
// --use_fast_math so codes match the torch reference exactly.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
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

struct RowParams {
  const half* x;      // [T, K] rows x_stride apart (gate for SiluMul)
  const half* up;     // [T, K] rows up_stride apart (SiluMul)
  const half* gamma;  // [K] (RmsNorm)
  half* residual;     // [T, K] rows residual_stride apart, or nullptr (RmsNorm): residual += x, then its RMSNorm
  int64_t x_stride, up_stride, residual_stride;
  float eps;
  int K;
  int8_t* qx;    // [T, K], or with `tiles` A-fragment tiles [K/32][32][16] of T <= 16 rows
  bool tiles;
  half* scale;   // [T]
  float* xsum;   // [T] or nullptr: sums of y
  int* qsum;     // [T] or nullptr: sums of the codes
  half* out;     // [T, K] contiguous: y itself (the fp16 kernels)
  bool dependent;  // launched as a programmatic dependent (fp16 kernels): x, up and residual only after the wait
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

// QUANT: y's §3.3 codes, scale and sums; else y itself in p.out. Every load of the activations (x, up,
// residual) comes after wait_prior_grids and is coherent (design.md §5.5); gamma is a weight.
template <RowOp OP, bool QUANT>
__global__ void __launch_bounds__(THREADS) row_kernel(const RowParams p) {
  extern __shared__ __align__(16) uint4 row_buf[];  // [K/8] fp16: RMSNorm's input, then (QUANT) y
  __shared__ float scratch[32];
  int* scratch_int = reinterpret_cast<int*>(scratch);
  const int row = blockIdx.x, vecs = p.K / 8;
  const half* x = p.x + row * p.x_stride;
  allow_dependent_grids();  // a GEMM launched as a programmatic dependent may load its weights meanwhile
  wait_prior_grids();       // a no-op unless launched as a programmatic dependent

  float inv_rms = 0.0f;
  if constexpr (OP == RowOp::RmsNorm) {
    half* residual = p.residual == nullptr ? nullptr : p.residual + row * p.residual_stride;
    float sum_sq = 0.0f;
    for (int v = threadIdx.x; v < vecs; v += THREADS) {
      uint4 in = load_after_wait16(x + 8 * v);
      if (residual != nullptr) {  // fp16(residual + x), as torch adds two fp16 tensors
        float a[8], b[8];
        unpack_half8(in, a);
        unpack_half8(load_after_wait16(residual + 8 * v), b);
        half2* sum = reinterpret_cast<half2*>(&in);
#pragma unroll
        for (int e = 0; e < 8; e += 2) sum[e / 2] = __floats2half2_rn(b[e] + a[e], b[e + 1] + a[e + 1]);
        reinterpret_cast<uint4*>(residual)[v] = in;
      }
      row_buf[v] = in;  // read back below by this same thread: no barrier needed
      float f[8];
      unpack_half8(in, f);
#pragma unroll
      for (int e = 0; e < 8; ++e) sum_sq += f[e] * f[e];
    }
    sum_sq = block_reduce<false>(sum_sq, scratch);
    inv_rms = __fdiv_rn(1.0f, __fsqrt_rn(__fdiv_rn(sum_sq, static_cast<float>(p.K)) + p.eps));
  }

  float abs_max = 0.0f, sum = 0.0f;
  for (int v = threadIdx.x; v < vecs; v += THREADS) {
    float f[8];
    if constexpr (OP == RowOp::RmsNorm) unpack_half8(row_buf[v], f);
    else unpack_half8(load_after_wait16(x + 8 * v), f);
    float other[8];
    if constexpr (OP == RowOp::RmsNorm) unpack_half8(reinterpret_cast<const uint4*>(p.gamma)[v], other);
    if constexpr (OP == RowOp::SiluMul) unpack_half8(load_after_wait16(p.up + row * p.up_stride + 8 * v), other);
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
    if constexpr (QUANT) row_buf[v] = packed;  // read back below by this same thread: no barrier needed
    else reinterpret_cast<uint4*>(p.out + static_cast<int64_t>(row) * p.K)[v] = packed;
  }
  if constexpr (!QUANT) return;
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

// T blocks of row_kernel<OP, QUANT> on x's GPU and current stream; shared memory for the rows it keeps.
template <RowOp OP, bool QUANT>
static void launch(const RowParams& p, const at::Tensor& x) {
  const int64_t T = x.size(0);
  if (T == 0 || p.K == 0) return;
  const c10::cuda::CUDAGuard guard(x.device());
  const int smem = (QUANT || OP == RowOp::RmsNorm) ? static_cast<int>(p.K * sizeof(half)) : 0;
  if (smem > 48 * 1024) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(row_kernel<OP, QUANT>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  }
  C10_CUDA_CHECK(launch_with_attributes(row_kernel<OP, QUANT>, dim3(T), THREADS, smem, dim3(1, 1, 1), p.dependent,
                                        c10::cuda::getCurrentCUDAStream(), p));
}

// The RowParams of op over x [T, K]: other (gamma or up) and the residual, outputs left to the caller.
static RowParams row_params(RowOp op, const at::Tensor& x, const at::Tensor& other, double eps,
                            const c10::optional<at::Tensor>& residual) {
  RowParams p{};
  p.x = reinterpret_cast<const half*>(x.data_ptr<at::Half>());
  p.x_stride = x.stride(0);
  p.K = static_cast<int>(x.size(1));
  if (op == RowOp::RmsNorm) {
    p.gamma = reinterpret_cast<const half*>(other.data_ptr<at::Half>());
    p.eps = static_cast<float>(eps);
    if (residual.has_value()) {
      p.residual = reinterpret_cast<half*>(residual->data_ptr<at::Half>());
      p.residual_stride = residual->stride(0);
    }
  }
  if (op == RowOp::SiluMul) {
    p.up = reinterpret_cast<const half*>(other.data_ptr<at::Half>());
    p.up_stride = other.stride(0);
  }
  return p;
}

std::vector<at::Tensor> quant_rows(RowOp op, const at::Tensor& x, const at::Tensor& other, double eps,
                                   RowSums sums, bool tiles, const c10::optional<at::Tensor>& residual) {
  RowParams p = row_params(op, x, other, eps, residual);
  const int64_t T = x.size(0), K = x.size(1);
  // tiles: rows T..15 are left as they are (the GEMM never stores them)
  at::Tensor qx = tiles ? at::empty({K / 32, 32, 16}, x.options().dtype(at::kChar))
                        : at::empty({T, K}, x.options().dtype(at::kChar));
  at::Tensor scale = at::empty({T, 1}, x.options());
  at::Tensor row_sums = at::empty({sums == RowSums::None ? 0 : T},
                                  x.options().dtype(sums == RowSums::Codes ? at::kInt : at::kFloat));
  p.tiles = tiles;
  p.qx = qx.data_ptr<int8_t>();
  p.scale = reinterpret_cast<half*>(scale.data_ptr<at::Half>());
  p.xsum = sums == RowSums::Inputs ? row_sums.data_ptr<float>() : nullptr;
  p.qsum = sums == RowSums::Codes ? row_sums.data_ptr<int>() : nullptr;
  switch (op) {
    case RowOp::Plain: launch<RowOp::Plain, true>(p, x); break;
    case RowOp::RmsNorm: launch<RowOp::RmsNorm, true>(p, x); break;
    case RowOp::SiluMul: launch<RowOp::SiluMul, true>(p, x); break;
  }
  return {qx, scale, row_sums};
}

at::Tensor rows_fp16(RowOp op, const at::Tensor& x, const at::Tensor& other, double eps,
                     const c10::optional<at::Tensor>& residual, bool enable_pdl) {
  RowParams p = row_params(op, x, other, eps, residual);
  at::Tensor out = at::empty({x.size(0), x.size(1)}, x.options());
  p.out = reinterpret_cast<half*>(out.data_ptr<at::Half>());
  p.dependent = enable_pdl && x.size(0) > 0 && at::cuda::getDeviceProperties(x.get_device())->major >= 9;
  switch (op) {
    case RowOp::Plain: TORCH_CHECK(false, "rows_fp16 takes RmsNorm or SiluMul"); break;
    case RowOp::RmsNorm: launch<RowOp::RmsNorm, false>(p, x); break;
    case RowOp::SiluMul: launch<RowOp::SiluMul, false>(p, x); break;
  }
  return out;
}

}  // namespace qoq_quant
