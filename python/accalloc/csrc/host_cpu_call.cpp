// CpuCall, and the boxed fallback that runs an operator with no device kernel through the CPU's
// kernel over the device's memory (see host_device.h for what CpuCall promises).
//
// PyTorch's own at::native::cpu_fallback copies every argument to the CPU and every result back, and
// returns copies for view operators (writes through them are lost). The device's memory is host
// memory, so this fallback copies nothing: arguments are CPU tensors over the same bytes, results are
// made in accalloc memory and handed to device tensors, and a result over an argument's memory is a
// view of that argument.
#include "host_device.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/SparseTensorImpl.h>
#include <ATen/native/SparseTensorUtils.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_and_tensors.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/CPUAllocator.h>
#include <torch/library.h>

#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>

namespace accalloc_host {
namespace {

// The names of sleep-and-wake tags (accalloc.torch.region), by pool id, for the error of a kernel
// given a paused tensor.
std::mutex g_tag_names_mutex;
std::map<std::pair<uint64_t, uint64_t>, std::string> g_tag_names;

std::string tag_name(AccallocPoolId pool) {
  std::lock_guard<std::mutex> lock(g_tag_names_mutex);
  auto found = g_tag_names.find({pool.first, pool.second});
  if (found != g_tag_names.end()) {
    return "'" + found->second + "'";
  }
  return c10::str("of pool (", pool.first, ", ", pool.second, ")");
}

// A paused tag's memory went back to the device (PROT_NONE on the host): a kernel touching it would
// crash the process, so the call is refused first, naming the tag.
void check_not_paused(const c10::StorageImpl* storage, c10::Device device) {
  if (storage->data() == nullptr) {
    return;
  }
  AccallocPoolId pool{0, 0};
  if (accalloc_pool_paused_at_on(allocator().accalloc_type(), device.index(), storage->data(), storage->nbytes(),
                                 &pool) != ACCALLOC_OK) {
    return;  // not memory accalloc can tell about (another device's): the kernel decides
  }
  TORCH_CHECK(pool.first == 0 && pool.second == 0, "a tensor of the paused tag ", tag_name(pool),
              " was given to an operator on ", device,
              ": its memory is back with the device until accalloc.torch.resume()");
}

// Set on a thread while a CpuCall lives there: its CPU allocations come from accalloc.
thread_local bool t_allocate_from_accalloc = false;

// The CPU allocator of the process: the one it replaced, except on a thread inside a CpuCall, where a
// CPU kernel's allocations (its results and its scratch) are blocks of the accalloc device the call
// runs for. Their DataPtrs say CPU, as the CPU tensors over them must; CpuCall::device gives a result's
// block back to the device.
class CpuAllocator final : public c10::Allocator {
 public:
  explicit CpuAllocator(c10::Allocator* cpu) : cpu_(cpu) {}

  c10::DataPtr allocate(size_t n) override {
    if (!t_allocate_from_accalloc) {
      return cpu_->allocate(n);
    }
    c10::DataPtr block = allocator().allocate(n);
    block.unsafe_set_device(c10::Device(c10::kCPU));
    return block;
  }

  // raw_allocate hands out the bare pointer of either kind of block; accalloc knows its own.
  c10::DeleterFnPtr raw_deleter() const override { return &raw_free; }

  void copy_data(void* dst, const void* src, std::size_t n) const override { std::memcpy(dst, src, n); }

  static c10::DeleterFnPtr cpu_raw_deleter;

 private:
  static void raw_free(void* ptr) {
    if (ptr == nullptr) {
      return;
    }
    const accalloc_torch::Freeing freeing(ptr);
    if (accalloc_free(ptr) != ACCALLOC_OK) {
      cpu_raw_deleter(ptr);
      return;
    }
    freeing.freed(ptr);
  }

  c10::Allocator* cpu_;
};

c10::DeleterFnPtr CpuAllocator::cpu_raw_deleter = nullptr;

c10::Storage cpu_storage_over(c10::StorageImpl* impl, c10::Allocator* allocator) {
  // No deleter: the bytes stay the device storage's. Resizable as the device storage is, through the
  // CPU allocator (so inside a CpuCall, from accalloc).
  c10::DataPtr bytes(const_cast<void*>(impl->data()), c10::Device(c10::kCPU));
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), impl->nbytes(),
                                                            std::move(bytes), allocator, impl->resizable()));
}

at::Tensor tensor_over(c10::Storage storage, c10::DispatchKeySet keys, const at::Tensor& like) {
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), keys, like.dtype());
  t.unsafeGetTensorImpl()->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  if (like.is_conj()) {
    t._set_conj(true);
  }
  if (like.is_neg()) {
    t._set_neg(true);
  }
  return t;
}

}  // namespace

void install_cpu_allocator() {
  static CpuAllocator* installed = [] {
    c10::Allocator* cpu = c10::GetCPUAllocator();
    CpuAllocator::cpu_raw_deleter = cpu->raw_deleter();
    auto* replacement = new CpuAllocator(cpu);  // never destroyed: CPU DataPtrs outlive everything
    c10::SetCPUAllocator(replacement, /*priority=*/0);
    return replacement;
  }();
  (void)installed;
}

CpuCall::CpuCall(c10::Device device)
    : device_(device), was_allocating_(t_allocate_from_accalloc) {
  int32_t current = -1;
  if (accalloc_current_device_on(allocator().accalloc_type(), &current) != ACCALLOC_OK ||
      current != device.index()) {
    guard_.reset_device(device);
  }
  t_allocate_from_accalloc = true;
}

CpuCall::~CpuCall() { t_allocate_from_accalloc = was_allocating_; }

at::Tensor CpuCall::cpu(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != kType) {
    return t;
  }
  if (t.layout() == c10::kSparse) {
    // A sparse COO tensor is its indices and values, two strided tensors: a CPU sparse tensor over
    // theirs (read from the tensor itself: asking through the dispatcher would come back here).
    at::SparseTensorImpl* impl = at::sparse::get_sparse_impl(t);
    at::Tensor cpu_sparse = at::_sparse_coo_tensor_with_dims_and_tensors(
        impl->sparse_dim(), impl->dense_dim(), t.sizes(), cpu(impl->indices()), cpu(impl->values()),
        t.options().device(c10::kCPU), impl->coalesced());
    return cpu_sparse;
  }
  c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
  for (auto& [device_storage, cpu_storage] : cpu_storages_) {
    if (device_storage == impl) {
      return tensor_over(cpu_storage, c10::DispatchKeySet(c10::DispatchKey::CPU), t);
    }
  }
  check_not_paused(impl, t.device());
  c10::Storage cpu_storage = cpu_storage_over(impl, c10::GetCPUAllocator());
  cpu_storages_.emplace_back(impl, cpu_storage);
  device_storages_.emplace_back(cpu_storage.unsafeGetStorageImpl(), t.storage());
  return tensor_over(std::move(cpu_storage), c10::DispatchKeySet(c10::DispatchKey::CPU), t);
}

void CpuCall::adopt_resize(const at::Tensor& device_tensor, const at::Tensor& cpu_tensor) {
  if (!device_tensor.defined() || device_tensor.device().type() != kType || !cpu_tensor.defined()) {
    return;
  }
  c10::StorageImpl* device_impl = device_tensor.storage().unsafeGetStorageImpl();
  c10::StorageImpl* cpu_impl = cpu_tensor.storage().unsafeGetStorageImpl();
  if (cpu_impl->data() != device_impl->data() || cpu_impl->nbytes() != device_impl->nbytes()) {
    // The kernel grew the storage: the new block (accalloc's, see CpuAllocator) replaces the device's
    // old one, which is freed, as Storage.resize_ does on any device.
    c10::DataPtr grown = cpu_impl->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::kCPU)));
    if (grown.get_deleter() == &accalloc_torch::free_block) {
      grown.unsafe_set_device(device_);
    } else {
      // A block from elsewhere (a kernel that allocated outside this thread): copied in.
      c10::DataPtr fresh = allocator().allocate(cpu_impl->nbytes());
      if (cpu_impl->nbytes() > 0) {
        std::memcpy(fresh.get(), grown.get(), cpu_impl->nbytes());
      }
      grown = std::move(fresh);
    }
    device_impl->set_data_ptr_noswap(std::move(grown));
    device_impl->set_nbytes(cpu_impl->nbytes());
    // The CPU storage goes on standing for the device storage, over its new bytes.
    cpu_impl->set_data_ptr_noswap(c10::DataPtr(device_impl->mutable_data(), c10::Device(c10::kCPU)));
  }
  if (device_tensor.sizes() != cpu_tensor.sizes() || device_tensor.strides() != cpu_tensor.strides() ||
      device_tensor.storage_offset() != cpu_tensor.storage_offset()) {
    device_tensor.unsafeGetTensorImpl()->set_sizes_and_strides(cpu_tensor.sizes(), cpu_tensor.strides(),
                                                               cpu_tensor.storage_offset());
  }
}

void CpuCall::adopt_sparse(const at::Tensor& device_sparse, const at::Tensor& cpu_sparse) {
  at::SparseTensorImpl* from = at::sparse::get_sparse_impl(cpu_sparse);
  at::SparseTensorImpl* to = at::sparse::get_sparse_impl(device_sparse);
  at::Tensor indices = device(from->indices());
  at::Tensor values = device(from->values());
  // Cleared first: a kernel may have shrunk a tensor it emptied (sparse_resize_and_clear_), which
  // resize_ refuses for a tensor with elements, as the device tensor still has.
  to->resize_and_clear_(from->sparse_dim(), from->dense_dim(), cpu_sparse.sizes());
  to->set_indices_and_values_unsafe(indices, values);
  to->set_coalesced(from->coalesced());
}

at::Tensor CpuCall::device(const at::Tensor& r, uint32_t holders) {
  if (!r.defined() || r.device().type() != c10::kCPU) {
    return r;
  }
  if (r.layout() == c10::kSparse) {
    at::Tensor sparse = at::detail::make_tensor<at::SparseTensorImpl>(
        c10::DispatchKeySet(c10::DispatchKey::SparsePrivateUse1), r.dtype());
    adopt_sparse(sparse, r);
    return sparse;
  }
  TORCH_CHECK_NOT_IMPLEMENTED(r.layout() == c10::kStrided, "the accalloc device (", device_,
                              ") holds strided and sparse COO tensors only: the CPU's kernel made a ",
                              r.layout(), " tensor");
  c10::StorageImpl* impl = r.storage().unsafeGetStorageImpl();
  for (auto& [cpu_storage, device_storage] : device_storages_) {
    if (cpu_storage == impl) {
      return tensor_over(device_storage, key_set(), r);
    }
  }
  if (r.storage().data_ptr().get_deleter() == &accalloc_torch::free_block && r.storage().use_count() <= holders) {
    c10::DataPtr block = impl->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::kCPU)));
    block.unsafe_set_device(device_);
    c10::Storage device_storage(c10::make_intrusive<c10::StorageImpl>(
        c10::StorageImpl::use_byte_size_t(), impl->nbytes(), std::move(block), &allocator(), impl->resizable()));
    device_storages_.emplace_back(impl, device_storage);
    return tensor_over(std::move(device_storage), key_set(), r);
  }
  // Memory that is not the kernel's own new block: a copy on the device.
  at::Tensor copy = at::empty_strided(r.sizes(), r.strides(), r.options().device(device_));
  cpu(copy).copy_(r);
  return copy;
}

namespace {

bool writes(const c10::Argument& argument) {
  return argument.alias_info() != nullptr && argument.alias_info()->isWrite();
}

// This thread's current device, through the device guard (host_device.cpp).
c10::Device current() { return c10::impl::getDeviceGuardImpl(kType)->getDevice(); }

// The device the call runs for: the first device tensor's or device argument's (without an index,
// the current device), else the current device.
c10::Device device_of(const torch::jit::Stack& stack, size_t begin) {
  for (size_t i = begin; i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().device().type() == kType) {
      return v.toTensor().device();
    }
    if (v.isDevice() && v.toDevice().type() == kType) {
      return v.toDevice().has_index() ? v.toDevice() : current();
    }
    if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList().vec()) {
        if (t.defined() && t.device().type() == kType) {
          return t.device();
        }
      }
    }
  }
  return current();
}

// `visit(tensor, index)` for each tensor on the stack from `begin`, alone or in a list (optional ones
// present), with the index of the stack slot from `begin`.
template <typename Visit>
void for_each_tensor(const torch::jit::Stack& stack, size_t begin, Visit visit) {
  for (size_t i = begin; i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor()) {
      visit(v.toTensor(), i - begin);
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList().vec()) {
        visit(t, i - begin);
      }
    } else if (v.isOptionalTensorList()) {
      for (const std::optional<at::Tensor>& t : v.toOptionalTensorVector()) {
        if (t.has_value()) {
          visit(*t, i - begin);
        }
      }
    }
  }
}

// How many result tensors on the stack (from `begin`) share `result`'s storage (1 for a result with
// none: an undefined tensor).
uint32_t holders_of(const at::Tensor& result, const torch::jit::Stack& stack, size_t begin) {
  if (!result.defined() || !result.has_storage()) {
    return 1;
  }
  c10::StorageImpl* storage = result.storage().unsafeGetStorageImpl();
  uint32_t holders = 0;
  for_each_tensor(stack, begin, [&](const at::Tensor& t, size_t /*slot*/) {
    if (t.defined() && t.has_storage() && t.storage().unsafeGetStorageImpl() == storage) {
      ++holders;
    }
  });
  return holders;
}

// What other devices an operator's tensors may be on, as on CUDA: copies take any; indexing takes
// index tensors on the CPU; every other operator, a CPU tensor of no dimensions (a scalar) at most.
enum class OtherDevices { ScalarsOnly, Cpu, Any };

OtherDevices other_devices_of(const c10::OperatorName& name) {
  static const std::set<std::string> copies = {
      "aten::copy_", "aten::_copy_from", "aten::_copy_from_and_resize", "aten::_to_copy", "aten::to",
      "aten::_foreach_copy_", "aten::set_", "aten::is_set_to", "aten::_pin_memory", "aten::is_pinned",
  };
  static const std::set<std::string> indexing = {
      "aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_", "aten::_unsafe_index",
      "aten::_unsafe_index_put",
  };
  if (copies.count(name.name) != 0) {
    return OtherDevices::Any;
  }
  return indexing.count(name.name) != 0 ? OtherDevices::Cpu : OtherDevices::ScalarsOnly;
}

// The check CUDA's kernels make before they take anything: every tensor of a call on one device,
// but for what other_devices_of allows. Without it a program adding a CPU tensor to a device
// tensor, or tensors of two accalloc devices, would run here and fail only on a GPU. Tensors are
// looked at in argument order: the first device tensor's device, and the first tensor found on
// another (either may come first).
struct OneDevice {
  OtherDevices allowed;
  std::optional<c10::Device> device;
  std::optional<c10::Device> other;
  size_t other_argument = 0;

  void look(const at::Tensor& t, size_t argument) {
    if (!t.defined()) {
      return;
    }
    const c10::Device d = t.device();
    const bool same = d.type() == kType ? (!device || *device == d)
                                         : d.is_cpu() && (t.dim() == 0 || allowed == OtherDevices::Cpu);
    if (d.type() == kType && !device) {
      device = d;
    }
    if (!same && !other) {
      other = d;
      other_argument = argument;
    }
  }

  // PyTorch's error, naming the argument and the operator.
  void check(const std::string& argument, const std::string& op) const {
    TORCH_CHECK(!device || !other, "Expected all tensors to be on the same device, but found at least two devices, ",
                *device, " and ", *other, "! (argument '", argument, "' of ", op, ")");
  }
};

void check_same_device(const c10::FunctionSchema& schema, const torch::jit::Stack& stack, size_t begin) {
  // By the schema's address (the dispatcher keeps each operator's for the process's life): the
  // names compared once per operator and thread, not at every call.
  thread_local std::unordered_map<const c10::FunctionSchema*, OtherDevices> known;
  auto [entry, added] = known.try_emplace(&schema, OtherDevices::ScalarsOnly);
  if (added) {
    entry->second = other_devices_of(schema.operator_name());
  }
  OneDevice one{entry->second};
  if (one.allowed == OtherDevices::Any) {
    return;
  }
  for_each_tensor(stack, begin, [&](const at::Tensor& t, size_t argument) { one.look(t, argument); });
  if (one.device && one.other) {
    one.check(schema.arguments()[one.other_argument].name(), c10::toString(schema.operator_name()));
  }
}

}  // namespace

void check_same_device(const char* op, std::initializer_list<std::pair<const char*, const at::Tensor*>> tensors) {
  OneDevice one{OtherDevices::ScalarsOnly};
  size_t argument = 0;
  for (const auto& [name, tensor] : tensors) {
    if (tensor != nullptr) {
      one.look(*tensor, argument);
    }
    ++argument;
  }
  if (one.device && one.other) {
    one.check((tensors.begin() + one.other_argument)->first, op);
  }
}

namespace {

// `cpu_key`: the CPU's key the kernel is taken from: CPU for the device's strided tensors, SparseCPU
// when the call came for SparsePrivateUse1 (a sparse tensor among the arguments, or one to make).
void run_cpu_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::DispatchKey cpu_key) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t arguments_begin = stack->size() - schema.arguments().size();
  check_same_device(schema, *stack, arguments_begin);
  CpuCall call(device_of(*stack, arguments_begin));

  // The arguments, kept for what the kernel writes to (in place and out=).
  std::vector<c10::IValue> arguments(stack->begin() + static_cast<std::ptrdiff_t>(arguments_begin), stack->end());
  // The CPU arguments the kernel writes to, for adopt_resize.
  std::vector<std::pair<size_t, c10::IValue>> written;
  for (size_t i = 0; i < arguments.size(); ++i) {
    c10::IValue& slot = (*stack)[arguments_begin + i];
    const c10::IValue& v = arguments[i];
    if (v.isTensor()) {
      slot = call.cpu(v.toTensor());
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> cpu_list;
      cpu_list.reserve(v.toTensorList().size());
      for (const at::Tensor& t : v.toTensorList().vec()) {
        cpu_list.push_back(call.cpu(t));
      }
      slot = std::move(cpu_list);
    } else if (v.isOptionalTensorList()) {
      c10::List<std::optional<at::Tensor>> cpu_list;
      for (const std::optional<at::Tensor>& t : v.toOptionalTensorVector()) {
        cpu_list.push_back(t.has_value() ? std::optional<at::Tensor>(call.cpu(*t)) : std::nullopt);
      }
      slot = std::move(cpu_list);
    } else if (v.isDevice() && v.toDevice().type() == kType) {
      slot = c10::Device(c10::kCPU);
    } else if (v.isGenerator()) {
      slot = cpu_generator_of(v.toGenerator());
    }
    if (writes(schema.arguments()[i])) {
      written.emplace_back(i, slot);
    }
  }

  if (graph_capturing()) {
    std::vector<c10::IValue> written_arguments;
    for (const auto& [index, cpu_value] : written) {
      written_arguments.push_back(arguments[index]);
    }
    save_for_graph(written_arguments);
  }
  op.redispatchBoxed(c10::DispatchKeySet(cpu_key), stack);

  for (auto& [index, cpu_value] : written) {
    const c10::IValue& original = arguments[index];
    if (original.isTensor() && original.toTensor().layout() == c10::kSparse) {
      call.adopt_sparse(original.toTensor(), cpu_value.toTensor());
    } else if (original.isTensor()) {
      call.adopt_resize(original.toTensor(), cpu_value.toTensor());
    } else if (original.isTensorList()) {
      auto device_list = original.toTensorList().vec();
      auto cpu_list = cpu_value.toTensorList().vec();
      for (size_t k = 0; k < device_list.size(); ++k) {
        call.adopt_resize(device_list[k], cpu_list[k]);
      }
    }
  }

  const size_t returns_begin = stack->size() - schema.returns().size();
  for (size_t r = 0; r < schema.returns().size(); ++r) {
    c10::IValue& slot = (*stack)[returns_begin + r];
    const c10::AliasInfo* alias = schema.returns()[r].alias_info();
    if (alias != nullptr && alias->isWrite()) {
      // An in-place or out= result is the argument it wrote to, the very tensor (or list) given.
      bool found = false;
      for (size_t i = 0; i < arguments.size() && !found; ++i) {
        const c10::AliasInfo* argument_alias = schema.arguments()[i].alias_info();
        if (argument_alias != nullptr && *argument_alias == *alias) {
          slot = arguments[i];
          found = true;
        }
      }
      TORCH_CHECK(found, "The operator ", schema.operator_name(), " returns ", schema.returns()[r],
                  ", which aliases none of its arguments");
      continue;
    }
    if (slot.isTensor()) {
      const at::Tensor result = slot.toTensor();
      slot = call.device(result, holders_of(result, *stack, returns_begin));
    } else if (slot.isTensorList()) {
      std::vector<at::Tensor> results = slot.toTensorList().vec();
      c10::List<at::Tensor> device_list;
      device_list.reserve(results.size());
      for (const at::Tensor& result : results) {
        device_list.push_back(call.device(result, holders_of(result, *stack, returns_begin)));
      }
      slot = std::move(device_list);
    }
  }
  if (graph_capturing()) {
    record_for_graph(op, arguments, *stack, returns_begin);
  }
}

// run_cpu_kernel, naming the operator in an error of a missing kernel: a result of a layout the device
// does not hold is refused deep inside.
void run_naming_the_operator(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::DispatchKey cpu_key) {
  try {
    run_cpu_kernel(op, stack, cpu_key);
  } catch (c10::NotImplementedError& e) {
    e.add_context(c10::str("in ", op.schema().operator_name(), " on the accalloc device"));
    throw;
  }
}

}  // namespace

void cpu_kernel_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  run_naming_the_operator(op, stack, c10::DispatchKey::CPU);
}

// Sparse COO tensors on the device: the CPU's sparse kernels over the device's indices and values.
void sparse_kernel_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  run_naming_the_operator(op, stack, c10::DispatchKey::SparseCPU);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&cpu_kernel_fallback>());
}

TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&sparse_kernel_fallback>());
}

}  // namespace accalloc_host

extern "C" {

// Name the sleep-and-wake tag of pool (first, second) for the error of an operator given one of its
// tensors while paused (accalloc.torch.region calls it when it makes the tag).
__attribute__((visibility("default"))) void accalloc_torch_name_tag(uint64_t first, uint64_t second,
                                                                    const char* name) {
  if (name == nullptr) {
    return;
  }
  std::lock_guard<std::mutex> lock(accalloc_host::g_tag_names_mutex);
  accalloc_host::g_tag_names[{first, second}] = name;
}

}  // extern "C"
