// Sparse COO tensors on the device. A sparse tensor is its indices and values, two strided tensors of
// the device; the CPU's sparse kernels run over them through the fallback (host_cpu_call.cpp:
// CpuCall::cpu and adopt_sparse), and so do the operators with a SparseCPU kernel and a composite one
// (route_cpu_kernels, host_routes.cpp). copy_ is the one kernel of the device's own: the fallback would
// give the CPU's sparse copy a CPU tensor where the source is on the device, and the composite copy_
// asks _copy_from, which the CPU has no sparse kernel for.
#include "host_device.h"

#include <torch/library.h>

#include <optional>

namespace accalloc_host {
namespace {

// Between the device and the CPU, or on the device: the CPU's sparse copy over CPU tensors standing
// for the device's. A device destination takes the copy's indices and values (allocated on the device,
// inside the CpuCall); a CPU one gets CPU memory (the copy is made after the CpuCall, whose CPU
// allocations would be the device's).
at::Tensor& sparse_copy_(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  const bool to_device = self.device().type() == kType;
  std::optional<at::Tensor> cpu_src;
  {
    CpuCall call(to_device ? self.device() : src.device());
    cpu_src = call.cpu(src);
    if (to_device) {
      at::Tensor cpu_self = call.cpu(self);
      cpu_self.copy_(*cpu_src, non_blocking);
      call.adopt_sparse(self, cpu_self);
      return self;
    }
  }
  self.copy_(*cpu_src, non_blocking);
  return self;
}

TORCH_LIBRARY_IMPL(aten, SparsePrivateUse1, m) {
  m.impl("copy_", sparse_copy_);
}

}  // namespace
}  // namespace accalloc_host
