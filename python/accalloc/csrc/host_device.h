// What the host accelerator's source files share (internal to the accalloc._torch_host extension).
//
// host_device.cpp: the allocator, device guard, hooks and the kernels that create, view and copy
// tensors. host_cpu_call.cpp: CpuCall, and the boxed fallback that runs every other operator's CPU
// kernel over the device's memory. host_routes.cpp: where PyTorch would not take the device to the
// CPU's kernels by itself (convolution, attention, composites). host_rnn_cells.cpp: the fused LSTM and
// GRU cells PyTorch takes on the device, which the CPU has no kernel for. host_ddp_timer.cpp: DDP's
// time statistics on the device. host_graph.cpp: torch.accelerator.Graph (capture records what the
// kernels run, replay runs it again).
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Storage.h>

#include <accalloc/torch_device_allocator.h>
#include <accalloc/torch_host_allocator.h>

#include <initializer_list>
#include <utility>
#include <vector>

namespace accalloc_host {

constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;
constexpr c10::DispatchKey kPrivateUse1Key = c10::DispatchKey::PrivateUse1;

// The device allocator of PrivateUse1 (over the accalloc device type chosen at registration).
accalloc_torch::DeviceAllocator& allocator();

// This thread's current device (accalloc's, of the type chosen at registration).
c10::DeviceIndex current_device();

// A new random number generator of the device (host_generator.cpp): torch.Generator(device=...).
at::Generator new_generator(c10::DeviceIndex index);

// The CPU generator a device generator draws from (the generator itself when it is not the device's):
// what the CPU kernels the device runs are given.
at::Generator cpu_generator_of(const at::Generator& generator);

// The dispatch keys of a tensor on this device.
inline c10::DispatchKeySet key_set() { return c10::DispatchKeySet(c10::DispatchKey::PrivateUse1); }

// One run of a CPU kernel over the device's memory. The device's memory is host memory, so nothing is
// copied either way:
// - cpu(t) gives a CPU tensor over t's bytes. Tensors that share a device storage get CPU tensors that
//   share one CPU storage, so the kernel sees aliasing and overlap as they are (a storage that a
//   kernel resizes grows in accalloc memory, and adopt_resize gives the growth to the device tensor).
// - While a CpuCall lives, the CPU allocator of this thread allocates from accalloc on `device`:
//   what the kernel allocates (its outputs, its scratch) is device memory, counted in its statistics.
// - device(r) gives a device tensor over r's bytes: a view of the argument whose memory r is, or r's
//   own accalloc block, handed over. Only memory from elsewhere (a CPU tensor the kernel was given,
//   a constant it keeps) is copied.
class CpuCall {
 public:
  explicit CpuCall(c10::Device device);
  ~CpuCall();
  CpuCall(const CpuCall&) = delete;
  CpuCall& operator=(const CpuCall&) = delete;

  c10::Device device() const { return device_; }
  at::Tensor cpu(const at::Tensor& t);
  // After the kernel: a device tensor whose CPU tensor it resized (out= arguments) takes the new
  // sizes, strides and, where the storage grew, the new block.
  void adopt_resize(const at::Tensor& device_tensor, const at::Tensor& cpu_tensor);
  // A sparse device tensor takes the CPU sparse tensor's sizes, indices and values (those of a result,
  // or what an in-place kernel made of a sparse argument) and whether they are coalesced.
  void adopt_sparse(const at::Tensor& device_sparse, const at::Tensor& cpu_sparse);
  // `holders`: how many of the kernel's results share r's storage (they are all handed over together;
  // a storage with other holders is copied instead).
  at::Tensor device(const at::Tensor& r, uint32_t holders = 1);

 private:
  // Set only when `device` is not already current (the common case needs no switch and back).
  c10::OptionalDeviceGuard guard_;
  c10::Device device_;
  bool was_allocating_;
  // Device storage -> its CPU storage, and CPU storages handed over -> their device storage. A kernel
  // call has a handful of tensors: a vector searched in order beats a map.
  std::vector<std::pair<c10::StorageImpl*, c10::Storage>> cpu_storages_;
  std::vector<std::pair<c10::StorageImpl*, c10::Storage>> device_storages_;
};

// Makes this process's CPU allocator the one CpuCall turns to accalloc (once; at registration).
void install_cpu_allocator();

// The boxed kernel of every operator that runs the CPU's kernel over the device's memory.
void cpu_kernel_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);
// The same for sparse COO tensors of the device: the CPU's sparse kernels over their indices and values.
void sparse_kernel_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// For a kernel registered unboxed, the check the fallback makes of every operator (host_cpu_call.cpp):
// `tensors` (argument name, tensor or nullptr) on one device, a CPU scalar aside, else PyTorch's
// "Expected all tensors to be on the same device" error naming the argument and `op`.
void check_same_device(const char* op, std::initializer_list<std::pair<const char*, const at::Tensor*>> tensors);
// An optional tensor argument as check_same_device takes it.
inline const at::Tensor* tensor_or_null(const std::optional<at::Tensor>& t) { return t.has_value() ? &*t : nullptr; }

// Graphs (host_graph.cpp): whether a torch.accelerator.Graph is capturing (cheap: every kernel asks),
// and the recording of one operator the device ran for it: its arguments as given and its results
// (the stack from `returns_begin`), or, for a kernel registered unboxed, by the operator's name.
bool graph_capturing();
void record_for_graph(const c10::OperatorHandle& op, const std::vector<c10::IValue>& arguments,
                      const torch::jit::Stack& results, size_t returns_begin);
void record_for_graph(const char* name, const char* overload, std::vector<c10::IValue> arguments,
                      std::vector<c10::IValue> results);
// Before a kernel writes: the tensors it writes (of its arguments), whose bytes a capture keeps to put
// back at its end when they are from before it.
void save_for_graph(const std::vector<c10::IValue>& written);
void register_graphs();

// Sends the operators for which PyTorch would give the device a composite kernel, though the CPU
// has its own, to the CPU's (once; at registration: see host_routes.cpp).
void route_cpu_kernels();

}  // namespace accalloc_host
