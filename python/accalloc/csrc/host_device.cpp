// An accelerator on PyTorch's DeviceType::PrivateUse1 whose memory is accalloc's host backend (or any
// accalloc device type whose memory the CPU can address: a backend registered from C over malloc, a
// simulator, unified memory).
//
// What a PrivateUse1 backend needs, and no more: the allocator (accalloc_torch::DeviceAllocator over
// the device type), a device guard (current device = accalloc's per-thread current device, one
// default stream per device, synchronous events), the hooks, the ATen kernels that create, view and
// copy tensors. Every other operator runs the CPU's kernel over the device's memory (host_cpu_call.cpp:
// the memory is host memory, so the CPU's kernels work on it in place of device kernels, with no
// copies), and host_routes.cpp sends convolution, attention and a few composites there too.
//
// Loading this library registers the guard and the kernels; accalloc_torch_register_device() chooses
// the accalloc device type and registers the allocator and the hooks. accalloc.torch.register_device()
// and register_host_device() do both, once.
#include <ATen/EmptyTensor.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_local_scalar_dense.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/library.h>

#include "host_device.h"

#include <chrono>
#include <cstring>
#include <mutex>

namespace accalloc_host {
namespace {
// The accalloc device type behind PrivateUse1, chosen once by accalloc_torch_register_device.
AccallocDeviceType kAccallocType = ACCALLOC_DEVICE_HOST;
}  // namespace

accalloc_torch::DeviceAllocator& allocator() {
  // Never destroyed: DataPtr deleters may run during interpreter shutdown.
  static auto* instance = new accalloc_torch::DeviceAllocator(kAccallocType, kType);
  return *instance;
}

c10::DeviceIndex current_device() {
  int32_t device = 0;
  accalloc_torch::check(accalloc_current_device_on(kAccallocType, &device), "accalloc_current_device");
  return static_cast<c10::DeviceIndex>(device);
}

namespace {

void set_current_device(c10::DeviceIndex device) {
  accalloc_torch::check(accalloc_set_device_on(kAccallocType, device), "accalloc_set_device");
}

c10::DeviceIndex device_count() noexcept {
  int32_t count = 0;
  if (accalloc_device_count_on(kAccallocType, &count) != ACCALLOC_OK) {
    return 0;
  }
  return static_cast<c10::DeviceIndex>(count);
}

// ---- device guard -----------------------------------------------------------------------------------

// An event created with enable_timing=True: when it was last recorded. Events complete when recorded
// (the work before them already has), so the time of the record is the time the work was done.
struct TimedEvent {
  std::chrono::steady_clock::time_point recorded;
};

struct HostGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kType; }

  c10::Device exchangeDevice(c10::Device device) const override {
    TORCH_CHECK(device.type() == kType, "expected a ", kType, " device, got ", device);
    c10::Device old = getDevice();
    if (old.index() != device.index()) {
      set_current_device(device.index());
    }
    return old;
  }

  c10::Device getDevice() const override { return c10::Device(kType, current_device()); }

  void setDevice(c10::Device device) const override {
    TORCH_CHECK(device.type() == kType, "expected a ", kType, " device, got ", device);
    set_current_device(device.index());
  }

  void uncheckedSetDevice(c10::Device device) const noexcept override {
    (void)accalloc_set_device_on(kAccallocType, device.index());
  }

  // Host memory is written synchronously: each device has one stream, the default one. A device
  // named without an index (torch.Stream(device="accalloc")) is the current one, as on CUDA.
  c10::Stream getStream(c10::Device device) const override {
    return c10::Stream(c10::Stream::DEFAULT,
                       device.has_index() ? device : c10::Device(kType, current_device()));
  }
  c10::Stream getDefaultStream(c10::Device device) const override { return getStream(device); }
  c10::Stream getStreamFromGlobalPool(c10::Device device, bool /*high_priority*/) const override {
    return getStream(device);
  }
  c10::Stream getNewStream(c10::Device device, int /*priority*/) const override { return getStream(device); }
  c10::Stream exchangeStream(c10::Stream stream) const override { return getStream(stream.device()); }
  void* getStreamNativeHandle(const c10::Stream /*stream*/) const override { return nullptr; }
  bool queryStream(const c10::Stream& /*stream*/) const override { return true; }
  void synchronizeStream(const c10::Stream& /*stream*/) const override {}
  // Nothing to wait for, but a device that does not exist is an error, as on CUDA.
  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    uint64_t free = 0, total = 0;
    accalloc_torch::check(accalloc_mem_get_info_on(kAccallocType, device_index, &free, &total),
                          "accalloc_mem_get_info (synchronize)");
  }

  // torch.accelerator.get_device_capability(): the dtypes whose tensors can be made on the device and
  // converted to and from the others there. Operators run on the CPU, so these are the ones the CPU
  // converts (not the quantized ones, which have no kernels for the device, nor the sub-byte and bits
  // types, which the CPU cannot convert either).
  c10::DeviceCapability getDeviceCapability(c10::Device /*device*/) const override {
    c10::DeviceCapability capability;
    capability.capability_data.capability_bits = 0;
    for (int index :
         {c10::kIndex_Byte, c10::kIndex_Char, c10::kIndex_Short, c10::kIndex_Int, c10::kIndex_Long,
          c10::kIndex_Half, c10::kIndex_Float, c10::kIndex_Double, c10::kIndex_ComplexHalf,
          c10::kIndex_ComplexFloat, c10::kIndex_ComplexDouble, c10::kIndex_Bool, c10::kIndex_BFloat16,
          c10::kIndex_Float8_e5m2, c10::kIndex_Float8_e4m3fn, c10::kIndex_Float8_e5m2fnuz,
          c10::kIndex_Float8_e4m3fnuz, c10::kIndex_Float8_e8m0fnu, c10::kIndex_UInt16, c10::kIndex_UInt32,
          c10::kIndex_UInt64}) {
      capability.capability_data.capability_bits |= 1ULL << index;
    }
    return capability;
  }

  // Events complete when recorded: the work before them already has. Only a timed one
  // (enable_timing=True: BACKEND_DEFAULT) has anything to keep, the time of its latest record.
  void record(void** event, const c10::Stream& /*stream*/, const c10::DeviceIndex /*device_index*/,
              const c10::EventFlag flag) const override {
    if (flag != c10::EventFlag::BACKEND_DEFAULT) {
      return;
    }
    if (*event == nullptr) {
      *event = new TimedEvent();
    }
    static_cast<TimedEvent*>(*event)->recorded = std::chrono::steady_clock::now();
  }
  void block(void* /*event*/, const c10::Stream& /*stream*/) const override {}
  bool queryEvent(void* /*event*/) const override { return true; }
  void synchronizeEvent(void* /*event*/) const override {}
  void destroyEvent(void* event, const c10::DeviceIndex /*device_index*/) const noexcept override {
    delete static_cast<TimedEvent*>(event);
  }
  // Milliseconds from event1's record to event2's. c10::Event has checked that both were created
  // with timing and recorded, so both have their time.
  double elapsedTime(void* event1, void* event2, const c10::DeviceIndex /*device_index*/) const override {
    TORCH_CHECK(event1 != nullptr && event2 != nullptr,
                "Both events must be recorded before calculating elapsed time.");
    auto from = static_cast<TimedEvent*>(event1)->recorded;
    auto to = static_cast<TimedEvent*>(event2)->recorded;
    return std::chrono::duration<double, std::milli>(to - from).count();
  }
  void recordDataPtrOnStream(const c10::DataPtr& /*data_ptr*/, const c10::Stream& /*stream*/) const override {}

  c10::DeviceIndex deviceCount() const noexcept override { return device_count(); }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, HostGuardImpl);

// ---- pinned host memory -----------------------------------------------------------------------------

// accalloc's host caching allocator of the device type: what pin_memory=True, tensor.pin_memory() and
// torch.accelerator.empty_host_cache() use. Never destroyed, as the device allocator.
accalloc_torch::HostAllocator& host_allocator() {
  static auto* instance = new accalloc_torch::HostAllocator(kAccallocType);
  return *instance;
}

// ---- hooks ------------------------------------------------------------------------------------------

struct HostHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex /*device_index*/) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return device_count(); }
  void setCurrentDevice(c10::DeviceIndex device) const override { set_current_device(device); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    c10::DeviceIndex old = current_device();
    if (old != device) {
      set_current_device(device);
    }
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override { return exchangeDevice(device); }

  // Random numbers come from the CPU generator: the kernels that draw them run on the CPU fallback.
  const at::Generator& getDefaultGenerator(c10::DeviceIndex /*device_index*/) const override {
    return at::detail::getDefaultCPUGenerator();
  }

  // torch.Generator(device=...): a generator of the device over a CPU generator of its own.
  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override {
    return new_generator(device_index < 0 ? current_device() : device_index);
  }

  // accalloc's C ABI does not say which device owns a pointer; the current device is the answer for
  // tensors made on it.
  at::Device getDeviceFromPtr(void* /*data*/) const override { return at::Device(kType, current_device()); }

  at::Allocator* getPinnedMemoryAllocator() const override { return &host_allocator(); }
  bool isPinnedPtr(const void* data) const override { return accalloc_torch::is_pinned(data); }

  // Storage.resize_ on this device: a new block of the new size, the old bytes copied over.
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t new_bytes) const override {
    c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
    TORCH_CHECK(impl->resizable(), "Trying to resize storage that is not resizable");
    c10::DataPtr fresh = allocator().allocate(new_bytes);
    size_t keep = std::min(new_bytes, impl->nbytes());
    if (keep > 0 && impl->data() != nullptr) {
      allocator().copy_data(fresh.get(), impl->data(), keep);
    }
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(new_bytes);
  }
};

// ---- kernels ----------------------------------------------------------------------------------------

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> /*pin_memory*/,
                               std::optional<c10::MemoryFormat> memory_format) {
  TORCH_CHECK(!layout.has_value() || *layout == c10::kStrided, "only strided tensors live on this device");
  c10::OptionalDeviceGuard guard(device);
  return at::detail::empty_generic(size, &allocator(), key_set(), c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> /*pin_memory*/) {
  TORCH_CHECK(!layout.has_value() || *layout == c10::kStrided, "only strided tensors live on this device");
  c10::OptionalDeviceGuard guard(device);
  return at::detail::empty_strided_generic(size, stride, &allocator(), key_set(), c10::dtype_or_default(dtype));
}

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> storage_offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  return at::native::resize_(self, size, memory_format);
}

at::Tensor reshape_alias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) { return at::native::view(self, size); }

// Between the CPU and the device, or within the device: the CPU's copy over the same bytes (it
// broadcasts self to dst's sizes, and resolves the conjugate and negative bits that come along).
// A non-blocking copy with pinned memory on the CPU side records the device's stream on that block,
// as PyTorch's CUDA copy does: its reuse waits for the copy (here done already: the host's copies are
// synchronous, and its events complete at once).
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  c10::Device device = dst.device().type() == kType ? dst.device() : self.device();
  CpuCall call(device);
  if (graph_capturing()) {
    save_for_graph({dst});
  }
  call.cpu(dst).copy_(call.cpu(self));
  if (graph_capturing()) {
    record_for_graph("aten::_copy_from", "", {self, dst, non_blocking}, {dst});
  }
  if (non_blocking) {
    for (const at::Tensor* cpu : {&self, &dst}) {
      if (cpu->device().is_cpu() && cpu->is_pinned()) {
        auto& storage = cpu->storage();
        host_allocator().record_event(storage.mutable_data(), storage.data_ptr().get_context(),
                                      c10::Stream(c10::Stream::DEFAULT, device));
      }
    }
  }
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  // As on CUDA, where reading the device synchronizes, which a capture forbids: a value read now
  // would not be read again by a replay.
  TORCH_CHECK(!graph_capturing(), "reading a tensor's value (item(), a Python bool or number of it) on the ",
              self.device(), " during a graph capture: a replay would not read it again");
  CpuCall call(self.device());
  return at::_local_scalar_dense(call.cpu(self));
}

at::Tensor& set_source_storage_offset(at::Tensor& self, c10::Storage source, int64_t storage_offset,
                                      c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::native::set_storage_cpu_(self, std::move(source), storage_offset, size, stride);
}

at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source) {
  int64_t elements = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return self.set_(std::move(source), 0, {elements}, {});
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, &allocator(), /*resizable=*/true);
  return self.set_(std::move(storage), 0, {0}, {});
}

// tensor.record_stream(stream): every stream of a device is its default one, the one the tensor's block
// was allocated on, and PyTorch's allocators record nothing for a block's own stream. A stream of
// another device type is refused, as CUDA's record_stream refuses one.
void record_stream(at::Tensor& self, c10::Stream stream) {
  TORCH_CHECK(stream.device_type() == kType, "record_stream: the tensor is on ", self.device(),
              ", the stream on ", stream.device(), "; a tensor of the ", kType,
              " device is recorded on a stream of the same device type");
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("record_stream", record_stream);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("resize_", resize_);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("view", view);
  // View operators with backend kernels (on the CPU's, CUDA's and Meta's) must be real views here
  // too: the boxed CPU fallback would return a copy, and writes through it would be lost.
  m.impl("unfold", at::native::unfold);
  m.impl("view_as_real", at::native::view_as_real);
  m.impl("view_as_complex", at::native::view_as_complex);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("set_.source_Storage_storage_offset", set_source_storage_offset);
  m.impl("set_.source_Storage", set_source_storage);
  m.impl("set_", set_empty);
}

// A copy whose source or destination is a conjugate or negative view reaches _copy_from with its bit
// set: copy_from hands the bits to the CPU's copy, which resolves them. Without these fallthroughs
// PyTorch's fallback for those bits would resolve them first by clone(), whose copy_ comes back to
// _copy_from with the bit still set, and recurse until the stack overflows. (Only backends that copy
// through _copy_from see these keys' change; in this process that is this device.)
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

}  // namespace
}  // namespace accalloc_host

extern "C" {

// Make accalloc's device type `device_type` PyTorch's PrivateUse1 allocator and hooks (once; a later
// call with the same type does nothing). Returns 0; -1 when accalloc cannot start or the type has no
// device (accalloc_last_error_message says why); -2 when another type was registered before.
__attribute__((visibility("default"))) int accalloc_torch_register_device(AccallocDeviceType device_type) {
  using namespace accalloc_host;
  static std::mutex mutex;
  static bool registered = false;
  std::lock_guard<std::mutex> lock(mutex);
  if (registered) {
    return device_type == kAccallocType ? 0 : -2;
  }
  int32_t count = 0;
  if (accalloc_device_count_on(device_type, &count) != ACCALLOC_OK) {
    return -1;
  }
  kAccallocType = device_type;
  c10::SetAllocator(kType, &allocator());
  at::setHostAllocator(kType, &host_allocator());
  at::RegisterPrivateUse1HooksInterface(new HostHooks());
  install_cpu_allocator();
  route_cpu_kernels();
  registered = true;
  return 0;
}

}  // extern "C"
