// accalloc as PyTorch's c10::DeviceAllocator, for any accalloc device type.
//
// A PrivateUse1 backend (or any out-of-tree accelerator) adopts accalloc in two steps: its driver's raw
// functions go to accalloc_register_backend() as an AccallocBackendVTable, and the AccallocDeviceType
// that call returns goes to this class, registered with c10::SetAllocator for the backend's
// c10::DeviceType. torch.accelerator.memory_stats(), memory_allocated(), empty_cache(),
// get_memory_info() and the rest are then answered by accalloc, with PyTorch's own statistics.
//
//     static accalloc_torch::DeviceAllocator allocator(my_accalloc_type, c10::DeviceType::PrivateUse1,
//                                                      &my_copy_function, &my_stream_handle);
//     c10::SetAllocator(c10::DeviceType::PrivateUse1, &allocator);
//
// Header-only; needs accalloc.h and libaccalloc at link time, and PyTorch's c10 headers (no ATen).
#pragma once

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "accalloc.h"

namespace accalloc_torch {

// Turn a failed accalloc call into the c10 error PyTorch users expect: an out-of-memory is
// c10::OutOfMemoryError (torch.OutOfMemoryError in Python), anything else a RuntimeError, as CUDA's
// and PyTorch's reference out-of-tree backend raise them; each carries accalloc's message. A device
// index out of range is a RuntimeError too (not an IndexError), worded as PyTorch's backends word it,
// and accalloc's message names the valid range.
inline void check(AccallocStatus status, const char* what) {
  if (status == ACCALLOC_OK) {
    return;
  }
  const char* message = accalloc_last_error_message();
  TORCH_CHECK_WITH(OutOfMemoryError, status != ACCALLOC_ERROR_OUT_OF_MEMORY, message);
  TORCH_CHECK(status != ACCALLOC_ERROR_INVALID_DEVICE, "The device index is out of range (", what, "): ", message);
  TORCH_CHECK(false, what, " failed (", accalloc_status_name(status), "): ", message);
}

inline void copy_stat(c10::CachingAllocator::Stat& to, const AccallocStat& from) {
  to.current = from.current;
  to.peak = from.peak;
  to.allocated = from.allocated;
  to.freed = from.freed;
}

inline void copy_stat_array(c10::CachingAllocator::StatArray& to, const AccallocStat (&from)[3]) {
  // accalloc's pools are indexed as c10's: ACCALLOC_STAT_ALL, _SMALL_POOL, _LARGE_POOL.
  static_assert(ACCALLOC_STAT_ALL == 0 && ACCALLOC_STAT_SMALL_POOL == 1 && ACCALLOC_STAT_LARGE_POOL == 2,
                "accalloc's pool indices are c10's StatType");
  for (size_t pool = 0; pool < 3; ++pool) {
    copy_stat(to[pool], from[pool]);
  }
}

// c10's DeviceStats from accalloc's, field by field (DeviceStats holds a hash map, so it is no C
// struct). The two fields Python does not report stay as c10 initialises them: no private pools,
// no OOM rejections.
inline c10::CachingDeviceAllocator::DeviceStats to_device_stats(const AccallocDeviceStats& s) {
  c10::CachingDeviceAllocator::DeviceStats out;
  copy_stat_array(out.allocation, s.allocation);
  copy_stat_array(out.segment, s.segment);
  copy_stat_array(out.active, s.active);
  copy_stat_array(out.inactive_split, s.inactive_split);
  copy_stat_array(out.allocated_bytes, s.allocated_bytes);
  copy_stat_array(out.reserved_bytes, s.reserved_bytes);
  copy_stat_array(out.active_bytes, s.active_bytes);
  copy_stat_array(out.inactive_split_bytes, s.inactive_split_bytes);
  copy_stat_array(out.requested_bytes, s.requested_bytes);
  copy_stat(out.oversize_allocations, s.oversize_allocations);
  copy_stat(out.oversize_segments, s.oversize_segments);
  out.num_alloc_retries = s.num_alloc_retries;
  out.num_ooms = s.num_ooms;
  out.num_sync_all_streams = s.num_sync_all_streams;
  out.num_device_alloc = s.num_device_alloc;
  out.num_device_free = s.num_device_free;
  out.max_split_size = s.max_split_size;
  return out;
}

// PyTorch's memory profiler (torch.profiler's profile_memory=True) is told of every allocation made
// and freed while it records, with the device's allocated and reserved bytes after it, as CUDA's
// allocator tells it. The c10::DeviceType each accalloc device type serves as (a deleter gets only the
// pointer) is noted by the DeviceAllocator serving it.
inline std::mutex& profiled_types_lock() {
  static std::mutex lock;
  return lock;
}

inline std::unordered_map<AccallocDeviceType, c10::DeviceType>& profiled_types() {
  static std::unordered_map<AccallocDeviceType, c10::DeviceType> types;
  return types;
}

// Report accalloc's `type` to the profiler as PyTorch's `torch_type` (a DeviceAllocator does it for
// the type it serves; use_for_cuda for CUDA).
inline void serve_profiler_as(AccallocDeviceType type, c10::DeviceType torch_type) {
  std::lock_guard<std::mutex> guard(profiled_types_lock());
  profiled_types()[type] = torch_type;
}

// Tell the profiler that `bytes` (negative: freed) at `ptr` on accalloc's `type` device `device`.
inline void report_to_profiler(void* ptr, int64_t bytes, AccallocDeviceType type, int32_t device) {
  c10::DeviceType torch_type;
  {
    std::lock_guard<std::mutex> guard(profiled_types_lock());
    auto found = profiled_types().find(type);
    if (found == profiled_types().end()) {
      return;  // a device type no DeviceAllocator serves: nothing PyTorch knows it as
    }
    torch_type = found->second;
  }
  int64_t allocated = 0;
  int64_t reserved = 0;
  if (accalloc_memory_allocated_on(type, device, &allocated) != ACCALLOC_OK ||
      accalloc_memory_reserved_on(type, device, &reserved) != ACCALLOC_OK) {
    return;
  }
  c10::reportMemoryUsageToProfiler(ptr, bytes, static_cast<size_t>(allocated), static_cast<size_t>(reserved),
                                   c10::Device(torch_type, static_cast<c10::DeviceIndex>(device)));
}

// The memory history's stacks (accalloc.torch's torch.<device>.memory._record_memory_history, for the
// host accelerator): while set, called after each allocation and before each free of a block PyTorch's
// face hands out, with the block's device type and device. It records the caller's stack for the
// snapshot (accalloc's own history has none).
using HistoryRecorder = void (*)(void* ptr, bool allocated, AccallocDeviceType type, int32_t device);

inline std::atomic<HistoryRecorder>& history_recorder() {
  static std::atomic<HistoryRecorder> recorder{nullptr};
  return recorder;
}

// After an allocation of `ptr` on accalloc's `type` device `device`: tell the profiler, while it records
// memory, of the bytes accalloc counts for it, and the memory history's recorder, while one is set.
inline void report_allocation(void* ptr, AccallocDeviceType type, int32_t device) {
  if (ptr == nullptr) {
    return;
  }
  uint64_t size = 0;
  if (C10_UNLIKELY(c10::memoryProfilingEnabled()) &&
      accalloc_allocation_info(ptr, &size, nullptr, nullptr) == ACCALLOC_OK) {
    report_to_profiler(ptr, static_cast<int64_t>(size), type, device);
  }
  const HistoryRecorder recorder = history_recorder().load(std::memory_order_acquire);
  if (C10_UNLIKELY(recorder != nullptr)) {
    recorder(ptr, true, type, device);
  }
}

// A block of accalloc's about to be freed: its size, type and device, asked while the profiler records
// memory or the memory history's recorder is set (`known` false otherwise, or for a pointer that is not
// a live block of accalloc's), and the recorder told of the free before it, while the address is still
// the block's (after, another thread could be given it first).
struct Freeing {
  bool known = false;
  bool profiled = false;
  uint64_t size = 0;
  AccallocDeviceType type = 0;
  int32_t device = 0;

  explicit Freeing(void* ptr) {
    const HistoryRecorder recorder = history_recorder().load(std::memory_order_acquire);
    profiled = c10::memoryProfilingEnabled();
    if (C10_LIKELY(!profiled && recorder == nullptr) || ptr == nullptr) {
      return;
    }
    known = accalloc_allocation_info(ptr, &size, &type, &device) == ACCALLOC_OK;
    if (known && recorder != nullptr) {
      recorder(ptr, false, type, device);
    }
  }

  // After the free: the profiler told of the bytes gone.
  void freed(void* ptr) const {
    if (known && profiled) {
      report_to_profiler(ptr, -static_cast<int64_t>(size), type, device);
    }
  }
};

// The deleter of every DataPtr: a pointer knows the device type and device that own it. A deleter
// cannot throw, so a failure (a bug elsewhere: a double free) is a warning with accalloc's message.
inline void free_block(void* ptr) {
  const Freeing freeing(ptr);
  if (accalloc_free(ptr) != ACCALLOC_OK) {
    TORCH_WARN("accalloc_free(", ptr, "): ", accalloc_last_error_message());
    return;
  }
  freeing.freed(ptr);
}

class DeviceAllocator : public c10::DeviceAllocator {
 public:
  // Copies n bytes between two blocks of this device (default: memcpy, right for host memory).
  using CopyFn = void (*)(void* dst, const void* src, size_t n);
  // The driver's handle of a c10::Stream, as the backend's event functions take it (default: NULL,
  // the default stream, for every stream).
  using StreamHandleFn = void* (*)(c10::Stream);

  DeviceAllocator(AccallocDeviceType accalloc_type, c10::DeviceType torch_type, CopyFn copy = nullptr,
                  StreamHandleFn stream_handle = nullptr)
      : accalloc_type_(accalloc_type), torch_type_(torch_type), copy_(copy), stream_handle_(stream_handle) {
    serve_profiler_as(accalloc_type, torch_type);
  }

  AccallocDeviceType accalloc_type() const { return accalloc_type_; }

  // n bytes on the current device of torch_type (its device guard's), on its current stream.
  c10::DataPtr allocate(size_t n) override {
    const c10::impl::DeviceGuardImplInterface* guard = c10::impl::getDeviceGuardImpl(torch_type_);
    c10::Device device = guard->getDevice();
    void* stream = stream_handle_ ? stream_handle_(guard->getStream(device)) : nullptr;
    void* ptr = nullptr;
    check(accalloc_malloc_on(accalloc_type_, &ptr, n, device.index(), stream), "accalloc_malloc");
    report_allocation(ptr, accalloc_type_, device.index());
    return {ptr, ptr, &free_block, device};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &free_block; }

  void copy_data(void* dst, const void* src, std::size_t n) const override {
    if (copy_ != nullptr) {
      copy_(dst, src, n);
    } else {
      std::memcpy(dst, src, n);
    }
  }

  bool initialized() override {
    int32_t count = 0;
    return accalloc_device_count_on(accalloc_type_, &count) == ACCALLOC_OK && count > 0;
  }

  // {0, 0}: the whole cache of every device of the type; a pool's id: PyTorch's emptyCache(pool) on
  // the current device (a pool still in use keeps its segments; emptyLivePool gives them back).
  void emptyCache(c10::MempoolId_t mempool_id) override {
    if (mempool_id == c10::MempoolId_t{0, 0}) {
      check(accalloc_empty_cache_on(accalloc_type_), "accalloc_empty_cache");
      return;
    }
    check(accalloc_pool_empty_cache_on(accalloc_type_, current_device(), pool_id(mempool_id), 0),
          "accalloc_pool_empty_cache");
  }

  // Private pools, for a backend's graphs and MemPool (the rules are PyTorch's: see accalloc.h).
  // createOrIncrefPool: one more use of the pool (made with one use if new).
  void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) {
    check(accalloc_pool_retain_on(accalloc_type_, device, pool_id(mempool_id)), "accalloc_pool_retain");
  }

  // setUseOnOOM and setNoSplit in one call.
  void setPoolFlags(c10::DeviceIndex device, c10::MempoolId_t mempool_id, bool use_on_oom, bool no_split) {
    check(accalloc_pool_set_flags_on(accalloc_type_, device, pool_id(mempool_id), use_on_oom, no_split),
          "accalloc_pool_set_flags");
  }

  // beginAllocateToPool for a graph capture: allocations on `stream` (from any thread) go to the pool.
  void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id, c10::Stream stream) {
    void* handle = stream_handle_ ? stream_handle_(stream) : nullptr;
    check(accalloc_pool_begin_on(accalloc_type_, device, pool_id(mempool_id), ACCALLOC_ROUTE_STREAM, handle),
          "accalloc_pool_begin");
  }

  // beginAllocateToPool with PyTorch's filter over the driver's stream handle (a capture-id test);
  // the filter runs with the device held; `capture`: a graph capture, under its rules.
  void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                           std::function<bool(void*)> filter, bool capture = true) {
    auto* owned = new std::function<bool(void*)>(std::move(filter));
    check(accalloc_pool_begin_filtered_on(accalloc_type_, device, pool_id(mempool_id), &call_filter, owned,
                                          &delete_filter, capture ? 1 : 0),
          "accalloc_pool_begin_filtered");
  }

  // use_mem_pool: this thread's allocations (on any stream) go to the pool.
  void beginAllocateCurrentThreadToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) {
    check(accalloc_pool_begin_on(accalloc_type_, device, pool_id(mempool_id), ACCALLOC_ROUTE_THREAD, nullptr),
          "accalloc_pool_begin");
  }

  void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) {
    check(accalloc_pool_end_on(accalloc_type_, device, pool_id(mempool_id)), "accalloc_pool_end");
  }

  void releasePool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) {
    check(accalloc_pool_release_on(accalloc_type_, device, pool_id(mempool_id)), "accalloc_pool_release");
  }

  // The pool's use count (0 where it does not exist).
  int getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t mempool_id) {
    int64_t uses = -1;
    check(accalloc_pool_info_on(accalloc_type_, device, pool_id(mempool_id), &uses, nullptr), "accalloc_pool_info");
    return uses < 0 ? 0 : static_cast<int>(uses);
  }

  // accalloc's own: a live pool's free segments go back too (PyTorch keeps them).
  void emptyLivePool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) {
    check(accalloc_pool_empty_cache_on(accalloc_type_, device, pool_id(mempool_id), 1), "accalloc_pool_empty_cache");
  }

  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override {
    void* handle = stream_handle_ ? stream_handle_(stream) : nullptr;
    if (handle == nullptr) {
      return;  // the default stream: the block's own stream, nothing to wait for
    }
    check(accalloc_record_stream(ptr.get(), handle), "accalloc_record_stream");
  }

  // AccallocPoolId of c10's pair; the current device of torch_type; the filter's trampolines.
 private:
  static AccallocPoolId pool_id(c10::MempoolId_t id) {
    return AccallocPoolId{static_cast<uint64_t>(id.first), static_cast<uint64_t>(id.second)};
  }

  c10::DeviceIndex current_device() const {
    return c10::impl::getDeviceGuardImpl(torch_type_)->getDevice().index();
  }

  static int32_t call_filter(void* stream, void* context) {
    try {
      return (*static_cast<std::function<bool(void*)>*>(context))(stream) ? 1 : 0;
    } catch (...) {
      return 0;  // a throwing filter takes nothing (no exception may cross accalloc)
    }
  }

  static void delete_filter(void* context) { delete static_cast<std::function<bool(void*)>*>(context); }

 public:
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    AccallocDeviceStats stats;
    std::memset(&stats, 0, sizeof stats);
    stats.struct_size = sizeof stats;
    check(accalloc_get_device_stats_on(accalloc_type_, device, &stats), "accalloc_get_device_stats");
    return to_device_stats(stats);
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    check(accalloc_reset_accumulated_memory_stats_on(accalloc_type_, device),
          "accalloc_reset_accumulated_memory_stats");
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    check(accalloc_reset_peak_memory_stats_on(accalloc_type_, device), "accalloc_reset_peak_memory_stats");
  }

  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    uint64_t free = 0, total = 0;
    check(accalloc_mem_get_info_on(accalloc_type_, device, &free, &total), "accalloc_mem_get_info");
    return {static_cast<size_t>(free), static_cast<size_t>(total)};
  }

 private:
  AccallocDeviceType accalloc_type_;
  c10::DeviceType torch_type_;
  CopyFn copy_;
  StreamHandleFn stream_handle_;
};

}  // namespace accalloc_torch
