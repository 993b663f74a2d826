// accalloc's pinned host caching allocator as PyTorch's at::HostAllocator, for any accalloc device type.
//
// A PrivateUse1 backend registered with accalloc (see torch_device_allocator.h) gets pinned memory,
// non-blocking copies' reuse guard and torch.accelerator.empty_host_cache() in a few lines:
//
//     static accalloc_torch::HostAllocator host_allocator(my_accalloc_type, &my_stream_handle);
//     REGISTER_HOST_ALLOCATOR(at::kPrivateUse1, &host_allocator);
//     // in the backend's PrivateUse1HooksInterface:
//     at::Allocator* getPinnedMemoryAllocator() const override { return &host_allocator; }
//     bool isPinnedPtr(const void* p) const override { return accalloc_torch::is_pinned(p); }
//
// The backend's table needs host_alloc and host_free (else allocating throws NotImplementedError with
// accalloc's message). After a non-blocking copy from or to pinned memory, call
// host_allocator.record_event(ptr, ctx, stream) as PyTorch's CUDA copy does: the block is then reused
// only after that stream's work queued before its free is done.
//
// Header-only; needs accalloc.h and libaccalloc at link time, and PyTorch's ATen core headers.
#pragma once

#include <ATen/core/CachingHostAllocator.h>
#include <c10/core/Stream.h>
#include <c10/util/Exception.h>

#include "accalloc.h"

namespace accalloc_torch {

// Pinned memory of any accelerator: PyTorch's isPinnedPtr.
inline bool is_pinned(const void* ptr) {
  bool pinned = false;
  return accalloc_host_is_pinned(ptr, &pinned) == ACCALLOC_OK && pinned;
}

// The deleter of every pinned DataPtr. A deleter cannot throw: a failure is a warning with accalloc's
// message (the memory is accalloc's again either way).
inline void free_pinned(void* ptr) {
  if (accalloc_host_free(ptr) != ACCALLOC_OK) {
    TORCH_WARN("accalloc_host_free(", ptr, "): ", accalloc_last_error_message());
  }
}

class HostAllocator : public at::HostAllocator {
 public:
  // The driver's handle of a c10::Stream, as the backend's event functions take it (default: NULL,
  // the default stream, for every stream).
  using StreamHandleFn = void* (*)(c10::Stream);

  explicit HostAllocator(AccallocDeviceType accalloc_type, StreamHandleFn stream_handle = nullptr)
      : accalloc_type_(accalloc_type), stream_handle_(stream_handle) {}

  // n bytes of pinned memory (rounded up to a power of two), a CPU tensor's storage.
  at::DataPtr allocate(size_t n) override {
    void* ptr = nullptr;
    AccallocStatus status = accalloc_host_malloc_on(accalloc_type_, &ptr, n);
    TORCH_CHECK_NOT_IMPLEMENTED(status != ACCALLOC_ERROR_NOT_SUPPORTED, accalloc_last_error_message());
    TORCH_CHECK_WITH(OutOfMemoryError, status != ACCALLOC_ERROR_OUT_OF_MEMORY, accalloc_last_error_message());
    TORCH_CHECK(status == ACCALLOC_OK, "accalloc_host_malloc failed (", accalloc_status_name(status),
                "): ", accalloc_last_error_message());
    return {ptr, ptr, &free_pinned, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &free_pinned; }

  void copy_data(void* dst, const void* src, std::size_t n) const override { std::memcpy(dst, src, n); }

  // `stream` used the pinned block at `ptr` (any address inside it); false where `ptr` is not pinned
  // memory from accalloc, as PyTorch's own host allocators answer.
  bool record_event(void* ptr, void* /*ctx*/, c10::Stream stream) override {
    void* handle = stream_handle_ ? stream_handle_(stream) : nullptr;
    bool recorded = false;
    AccallocStatus status = accalloc_host_record_stream(ptr, stream.device_index(), handle, &recorded);
    TORCH_CHECK(status == ACCALLOC_OK, "accalloc_host_record_stream failed (", accalloc_status_name(status),
                "): ", accalloc_last_error_message());
    return recorded;
  }

  void empty_cache() override {
    AccallocStatus status = accalloc_host_empty_cache_on(accalloc_type_);
    // An accelerator without pinned memory has nothing cached: empty_host_cache is a no-op there.
    TORCH_CHECK(status == ACCALLOC_OK || status == ACCALLOC_ERROR_NOT_SUPPORTED,
                "accalloc_host_empty_cache failed (", accalloc_status_name(status), "): ",
                accalloc_last_error_message());
  }

  at::HostStats get_stats() override {
    at::HostStats stats;
    stat_family(stats.allocations, "allocations");
    stat_family(stats.allocated_bytes, "allocated_bytes");
    stat_family(stats.active_requests, "active_requests");
    stat_family(stats.active_bytes, "active_bytes");
    duration_family(stats.host_alloc_time, "host_alloc_time");
    duration_family(stats.host_free_time, "host_free_time");
    stats.num_host_alloc = stat("num_host_alloc");
    stats.num_host_free = stat("num_host_free");
    return stats;
  }

  void reset_accumulated_stats() override {
    check(accalloc_host_reset_accumulated_memory_stats_on(accalloc_type_), "accalloc_host_reset_accumulated_memory_stats");
  }

  void reset_peak_stats() override {
    check(accalloc_host_reset_peak_memory_stats_on(accalloc_type_), "accalloc_host_reset_peak_memory_stats");
  }

 private:
  static void check(AccallocStatus status, const char* what) {
    TORCH_CHECK(status == ACCALLOC_OK, what, " failed (", accalloc_status_name(status), "): ",
                accalloc_last_error_message());
  }

  int64_t stat(const std::string& key) const {
    int64_t value = 0;
    check(accalloc_host_memory_stat_on(accalloc_type_, key.c_str(), &value), "accalloc_host_memory_stat");
    return value;
  }

  void stat_family(c10::CachingAllocator::Stat& to, const std::string& family) const {
    to.current = stat(family + ".current");
    to.peak = stat(family + ".peak");
    to.allocated = stat(family + ".allocated");
    to.freed = stat(family + ".freed");
  }

  void duration_family(c10::CachingAllocator::DurationStat& to, const std::string& family) const {
    to.total = stat(family + ".total");
    to.max = stat(family + ".max");
    to.min = stat(family + ".min");
    to.count = stat(family + ".count");
  }

  AccallocDeviceType accalloc_type_;
  StreamHandleFn stream_handle_;
};

}  // namespace accalloc_torch
