// Host side of the W4A8 GEMMs: the launch of the variant gemm.py chose. Arguments are checked in
// gemm_bindings.cpp, so nothing here throws on bad input.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>

#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <algorithm>
#include <unordered_map>

#include "gemm_w4a8_gemv.cuh"
#include "gemm_w4a8_gemv_persistent.cuh"
#include "gemm_w4a8_tiled.cuh"
#include "gemm_w4a8_wgmma.cuh"
#include "per_device.h"

namespace qoq_gemm {

// An attribute of the current device.
static int device_attribute(cudaDeviceAttr attribute) {
  int device = 0, value = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&value, attribute, device));
  return value;
}

static int multiprocessors() { return device_attribute(cudaDevAttrMultiProcessorCount); }

// K splits of a tiled grid of `blocks` tiles: below one wave each block's serial k-loop is latency
// bound, so split K until about two blocks per SM run (keeping >= 4 k-steps per split).
static int k_splits(int blocks, int k_steps) {
  const int sms = multiprocessors();
  if (blocks >= sms) return 1;
  const int wanted = (2 * sms + blocks - 1) / blocks;
  return std::max(1, std::min({wanted, k_steps / 4, 8}));
}

// p.split_steps for `splits` K splits of `k_steps`; returns the splits that remain (every one gets
// >= 1 k-step).
static int plan_splits(GemmParams& p, int splits, int k_steps) {
  p.split_steps = (k_steps + splits - 1) / splits;
  return (k_steps + p.split_steps - 1) / p.split_steps;
}

// A tiled grid launched with its K split (int32 partial sums added atomically into a zeroed
// workspace, then the epilogue kernel) when the tiles alone fill < 1 wave.
template <typename Kernel>
static void launch_split(Kernel kernel, GemmParams p, dim3 tiles, int threads, int smem, int k_steps,
                         const at::Tensor& like, cudaStream_t stream) {
  const int z = plan_splits(p, k_splits(static_cast<int>(tiles.x * tiles.y), k_steps), k_steps);
  at::Tensor sums;
  if (z > 1) {
    sums = at::zeros({p.M, p.N}, like.options().dtype(at::kInt));
    p.split_acc = sums.data_ptr<int32_t>();
  }
  kernel<<<dim3(tiles.x, tiles.y, z), threads, smem, stream>>>(p);
  if (z > 1) {
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    const int pairs = p.M * p.N / 2, per_block = 256;
    split_epilogue_kernel<<<(pairs + per_block - 1) / per_block, per_block, 0, stream>>>(p);
  }
}

// The >48 KB dynamic shared-memory opt-in, once per kernel and GPU (`opt_in`: the kernel's record).
template <typename Kernel>
static void allow_smem(Kernel kernel, int smem, qoq_cuda::PerDevice<cudaError_t>& opt_in) {
  C10_CUDA_CHECK(opt_in.get([&] { return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem); }));
}

// A grid in clusters of `cluster` blocks (1 x 1 x 1: a plain launch, as before Hopper); `dependent`:
// as a programmatic dependent of the kernel ahead in the stream (GemmParams::dependent).
template <typename... Params, typename... Args>
static void launch_clustered(void (*kernel)(Params...), dim3 grid, int threads, int smem, dim3 cluster,
                             bool dependent, cudaStream_t stream, const Args&... args) {
  C10_CUDA_CHECK(launch_with_attributes(kernel, grid, threads, smem, cluster, dependent, stream, args...));
}

template <int BM, int WARPS_M, bool GROUPED>
static void launch_tiled(const GemmParams& p, const at::Tensor& like, cudaStream_t stream) {
  constexpr int smem = TiledSmem<BM>::TOTAL;
  static qoq_cuda::PerDevice<cudaError_t> opt_in;
  allow_smem(gemm_tiled_kernel<BM, WARPS_M, GROUPED>, smem, opt_in);
  const dim3 tiles((p.M + BM - 1) / BM, (p.N + TILED_BN - 1) / TILED_BN);
  launch_split(gemm_tiled_kernel<BM, WARPS_M, GROUPED>, p, tiles, WARPS_M * 128, smem,
               (p.K + TILED_BK - 1) / TILED_BK, like, stream);
}

// The driver's tensor-map encoder, through the runtime (no libcuda link; the by-version lookup from
// CUDA 12.5, where the plain one is deprecated).
static PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const auto encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
    C10_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
#else
    C10_CUDA_CHECK(cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &found));
#endif
    TORCH_CHECK(found == cudaDriverEntryPointSuccess && fn != nullptr, "cuTensorMapEncodeTiled not found");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// A byte tensor of RANK dims (innermost first; strides in bytes of dims 1..) read in `box` boxes.
template <int RANK>
static CUtensorMap byte_tensor_map(const void* base, const cuuint64_t (&dims)[RANK], const cuuint64_t (&strides)[RANK - 1],
                                   const cuuint32_t (&box)[RANK], CUtensorMapSwizzle swizzle) {
  CUtensorMap map;
  cuuint32_t unit[RANK];
  std::fill(unit, unit + RANK, 1u);
  const CUresult result = tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, RANK, const_cast<void*>(base), dims,
                                               strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                                               CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TORCH_CHECK(result == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (CUresult ", static_cast<int>(result), ")");
  return map;
}

// The activations [M, K] in [bt tokens][128 k] boxes, 128-byte swizzled as the wgmma B operand reads
// them; the weights [N/32 n-tiles][K/32 k-tiles][2][256 B] in boxes of one k-step's tiles of `rows`
// channels (the 512-byte tile is split in two: a box dimension holds at most 256 elements).
static CUtensorMap activation_map(const GemmParams& p, int bt) {
  return byte_tensor_map<2>(p.qx, {static_cast<cuuint64_t>(p.K), static_cast<cuuint64_t>(p.M)},
                            {static_cast<cuuint64_t>(p.K)}, {WG_BK, static_cast<cuuint32_t>(bt)},
                            CU_TENSOR_MAP_SWIZZLE_128B);
}

static CUtensorMap weight_map(const GemmParams& p, int rows) {
  const cuuint64_t k_tiles = p.K / 32;
  return byte_tensor_map<4>(p.qweight, {256, 2, k_tiles, static_cast<cuuint64_t>(p.N / 32)}, {256, 512, k_tiles * 512},
                            {256, 2, WG_BK / 32, static_cast<cuuint32_t>(rows / 32)}, CU_TENSOR_MAP_SWIZZLE_NONE);
}

// K splits of a wgmma grid of `blocks` (split across the blocks of a cluster: wgmma_store). Under one
// wave, until about two blocks per SM run; a larger grid that fills under half of the SMs' slots for
// this kernel (`per_sm` blocks each), in two. Each warpgroup keeps >= 8 k-steps, as the stages' fill
// latency dominates shorter ones, and two-warpgroup blocks split at most in two (in four they were
// slower than in two).
static int wgmma_splits(int blocks, int k_steps, int kw, int per_sm) {
  const int sms = multiprocessors();
  const int wanted = blocks < sms ? 2 * sms / blocks : std::min(2, per_sm * sms / blocks);
  return std::max(1, std::min({wanted, k_steps / (8 * kw), kw == 2 ? 2 : 8}));  // <= 8: a portable cluster
}

template <int ROWS, int BT, int STAGES, int SCALE_ROWS, int KW>
static void launch_wgmma(const GemmParams& p, cudaStream_t stream) {
  constexpr int smem = WgmmaSmem<ROWS, BT, STAGES, KW>::TOTAL;
  static qoq_cuda::PerDevice<cudaError_t> opt_in;
  allow_smem(gemm_wgmma_kernel<ROWS, BT, STAGES, SCALE_ROWS, KW>, smem, opt_in);
  static qoq_cuda::PerDevice<int> blocks_per_sm;
  const int per_sm = blocks_per_sm.get([] {  // blocks of this kernel an SM holds (its registers and shared memory)
    int blocks = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &blocks, gemm_wgmma_kernel<ROWS, BT, STAGES, SCALE_ROWS, KW>, KW * WG_THREADS, smem));
    return blocks;
  });
  const dim3 tiles((p.M + BT - 1) / BT, (p.N + ROWS - 1) / ROWS);
  const int k_steps = (p.K + WG_BK - 1) / WG_BK;
  GemmParams split = p;
  const int z = plan_splits(split, wgmma_splits(static_cast<int>(tiles.x * tiles.y), k_steps, KW, per_sm), k_steps);
  launch_clustered(gemm_wgmma_kernel<ROWS, BT, STAGES, SCALE_ROWS, KW>, dim3(tiles.x, tiles.y, z), KW * WG_THREADS,
                   smem, dim3(1, 1, z), p.dependent, stream, activation_map(p, BT), weight_map(p, ROWS), split);
}

// Per group a k-step of WG_BK spans one s2 / -z row where the group is a multiple of it, else two.
template <int ROWS, int BT, int STAGES, bool GROUPED, int KW = 1>
static void dispatch_wgmma(const GemmParams& p, cudaStream_t stream) {
  if constexpr (!GROUPED) return launch_wgmma<ROWS, BT, STAGES, 0, KW>(p, stream);
  else if (p.group % WG_BK == 0) return launch_wgmma<ROWS, BT, STAGES, 1, KW>(p, stream);
  else return launch_wgmma<ROWS, BT, STAGES, 2, KW>(p, stream);
}

static int smem_optin() { return device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin); }

static bool is_hopper() { return device_attribute(cudaDevAttrComputeCapabilityMajor) == 9; }

// Blocks per cluster sharing their activation rows (Hopper, MT = 1, M >= GEMV_CLUSTER_MIN_M, an even
// number of 32-column blocks), else 1.
static int gemv_cluster(const GemmParams& p, int mt) {
  const bool shared = mt == 1 && !p.tiled && p.M >= GEMV_CLUSTER_MIN_M && (p.N / 32) % GEMV_CLUSTER == 0;
  return shared && is_hopper() ? GEMV_CLUSTER : 1;
}

template <int MT, int GROUP, int WARPS, bool ACT_FIRST = false, bool TILED = false>
static void launch_gemv(GemmParams p, int smem_limit, cudaStream_t stream) {
  static qoq_cuda::PerDevice<cudaError_t> opt_in;
  const auto kernel = gemm_gemv_kernel<MT, GROUP, WARPS, ACT_FIRST, TILED>;
  allow_smem(kernel, smem_limit, opt_in);
  // tiled activations stage nothing: shared memory holds only the warps' partial sums
  const int smem = gemv_smem_bytes(MT, WARPS, TILED ? 0 : p.M, p.K), cluster = gemv_cluster(p, MT);
  if (p.dependent) {  // over one wave (grid_dependency.cuh: the next kernel may fill the last wave's gaps)
    // blocks an SM holds, by GPU and shared memory
    static thread_local std::unordered_map<int64_t, int> per_sm_by_smem;
    int device = 0;
    C10_CUDA_CHECK(cudaGetDevice(&device));
    const auto [it, fresh] = per_sm_by_smem.try_emplace((static_cast<int64_t>(device) << 32) | smem, 0);
    if (fresh) C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&it->second, kernel, WARPS * 32, smem));
    p.early_trigger = p.N / 32 > it->second * multiprocessors();
  }
  launch_clustered(kernel, dim3(p.N / 32), WARPS * 32, smem, dim3(cluster), p.dependent, stream, p);
}

// Whether a staged GEMV (M <= 16) copies its activation rows before its first weight loads: where the
// grid is one wave (N / 32 <= SMs), and per group at M = 16, where a block's rows are as many bytes as
// its weights; in multi-wave grids the weights go first. As a programmatic dependent the rows wait for
// the kernel ahead and weight loads issued first do not, so the 16-warp GEMV per group loads its weights
// first; every other case keeps the rule above.
template <int WARPS>
static bool gemv_act_first(const GemmParams& p) {
  if (p.dependent && p.group > 0 && WARPS == 16) return false;
  return p.N / 32 <= multiprocessors() || (p.group > 0 && p.M == 16);
}

// M <= 16 stages its activation rows in shared memory where they fit (K up to ~14000 at M = 16);
// otherwise the 32-row kernel reads them from global memory.
template <int GROUP, int WARPS>
static void dispatch_gemv(const GemmParams& p, cudaStream_t stream) {
  const int limit = smem_optin();
  if constexpr (WARPS == 16) {  // only the 16-warp GEMV reads tiled activations (gemm_bindings.cpp checks)
    if (p.tiled) return launch_gemv<1, GROUP, WARPS, false, true>(p, limit, stream);
  }
  if (p.M <= 16 && gemv_smem_bytes(1, WARPS, p.M, p.K) <= limit) {
    if (gemv_act_first<WARPS>(p)) return launch_gemv<1, GROUP, WARPS, true>(p, limit, stream);
    return launch_gemv<1, GROUP, WARPS>(p, limit, stream);
  }
  if (p.M <= 32) return launch_gemv<2, GROUP, WARPS>(p, limit, stream);
  return launch_gemv<4, GROUP, WARPS>(p, limit, stream);
}

template <int WARPS>
static void dispatch_gemv_group(const GemmParams& p, cudaStream_t stream) {
  if (p.group == 0) return dispatch_gemv<0, WARPS>(p, stream);
  return p.group == 64 ? dispatch_gemv<64, WARPS>(p, stream) : dispatch_gemv<128, WARPS>(p, stream);
}

// One block per SM (at most one per column block); on Hopper from GEMV_CLUSTER_MIN_M rows on, pairs of
// blocks share one read of the activation rows, as in the staged GEMV (tiled activations: no rows, no pairs).
template <int GROUP, bool TILED>
static void launch_gemvp(const GemmParams& p, int smem_limit, cudaStream_t stream) {
  static qoq_cuda::PerDevice<cudaError_t> opt_in;
  allow_smem(gemm_gemv_persistent_kernel<GROUP, TILED>, smem_limit, opt_in);
  int blocks = std::min(multiprocessors(), p.N / 32);
  const bool pairs = !TILED && p.M >= GEMV_CLUSTER_MIN_M && blocks >= GEMV_CLUSTER && is_hopper();
  if (pairs) blocks -= blocks % GEMV_CLUSTER;
  launch_clustered(gemm_gemv_persistent_kernel<GROUP, TILED>, dim3(blocks), GEMVP_WARPS * 32,
                   gemvp_smem_bytes(TILED ? 0 : p.M, p.K), dim3(pairs ? GEMV_CLUSTER : 1), p.dependent, stream, p);
}

template <bool TILED>
static void launch_gemvp_group(const GemmParams& p, int smem_limit, cudaStream_t stream) {
  if (p.group == 0) return launch_gemvp<0, TILED>(p, smem_limit, stream);
  return p.group == 64 ? launch_gemvp<64, TILED>(p, smem_limit, stream) : launch_gemvp<128, TILED>(p, smem_limit, stream);
}

// Rows that do not fit shared memory (K beyond ~14000 at M = 16) go to the 8-warp GEMV, the faster one
// in the multi-wave grids auto_variant gives gemv16p; tiled activations always fit (none are staged).
static void dispatch_gemvp(const GemmParams& p, cudaStream_t stream) {
  const int limit = smem_optin();
  if (p.tiled) return launch_gemvp_group<true>(p, limit, stream);
  if (gemvp_smem_bytes(p.M, p.K) > limit) return dispatch_gemv_group<8>(p, stream);
  return launch_gemvp_group<false>(p, limit, stream);
}

// The variant is chosen by the caller (qoq/runtime_cuda/gemm.py picks one for "auto").
template <bool GROUPED>
static void dispatch(const GemmParams& p, Variant variant, const at::Tensor& like, cudaStream_t stream) {
  switch (variant) {
    case GEMV:
      return dispatch_gemv_group<8>(p, stream);
    case GEMV16:
      return dispatch_gemv_group<16>(p, stream);
    case GEMV16P:
      return dispatch_gemvp(p, stream);
    case TILED64:
      return launch_tiled<64, 2, GROUPED>(p, like, stream);
    case TILED128:
      return launch_tiled<128, 2, GROUPED>(p, like, stream);
    case TILED128_WIDE:
      return launch_tiled<128, 1, GROUPED>(p, like, stream);
    case TILED64_WIDE:
      return launch_tiled<64, 1, GROUPED>(p, like, stream);
    case WG128X64:
      return dispatch_wgmma<128, 64, 4, GROUPED>(p, stream);
    case WG128X128:
      return dispatch_wgmma<128, 128, 4, GROUPED>(p, stream);
    case WG64X64:
      return dispatch_wgmma<64, 64, 4, GROUPED>(p, stream);
    case WG64X64_K2:
      return dispatch_wgmma<64, 64, 4, GROUPED, 2>(p, stream);
  }
}

void launch_gemm(GemmParams p, Variant variant, const at::Tensor& like) {
  const c10::cuda::CUDAGuard guard(like.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  p.dependent = p.dependent && is_hopper();  // the tiled kernels ignore it (launched plainly)
  if (p.group > 0) dispatch<true>(p, variant, like, stream);
  else dispatch<false>(p, variant, like, stream);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace qoq_gemm
