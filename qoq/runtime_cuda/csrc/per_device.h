// Host-side setup that belongs to one GPU: a kernel's function attributes (the >48 KB dynamic shared
// memory opt-in) and occupancy are properties of the kernel in a device's context, so a process that
// launches on several GPUs must set or query them on each, not once per process.
#pragma once

#include <cuda_runtime.h>

#include <mutex>

namespace qoq_cuda {

// One value per device, computed by the first get() on that device (the current device). Devices
// beyond kMaxDevices compute it on every call.
template <typename T>
class PerDevice {
 public:
  static constexpr int kMaxDevices = 64;

  template <typename Compute>
  T get(Compute&& compute) {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return compute();
    std::call_once(once_[device], [&] { values_[device] = compute(); });
    return values_[device];
  }

 private:
  std::once_flag once_[kMaxDevices];
  T values_[kMaxDevices]{};
};

}  // namespace qoq_cuda
