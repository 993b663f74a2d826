// accalloc as PyTorch's CUDA allocator, with PyTorch's statistics kept.
//
// PyTorch's CUDAPluggableAllocator refuses getDeviceStats, the resets and cacheInfo, so with a plain
// pluggable allocator torch.cuda.memory_stats() fails. This subclass hands allocation to accalloc's
// CUDA backend through the pluggable allocator's functions and answers the statistics from accalloc;
// it is swapped in before CUDA allocates and also registered as c10's allocator for kCUDA at
// priority 1 (as the native one is), so torch.accelerator's memory API reaches it too.
#include <c10/core/Allocator.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <accalloc/torch_device_allocator.h>

#include <functional>
#include <unordered_set>
#include <vector>
#include <memory>
#include <mutex>
#include <string>

namespace {

constexpr AccallocDeviceType kCuda = ACCALLOC_DEVICE_CUDA;

void* cuda_malloc(size_t size, int device, cudaStream_t stream) {
  void* ptr = nullptr;
  accalloc_torch::check(accalloc_malloc_on(kCuda, &ptr, size, device, stream), "accalloc_malloc");
  // PyTorch's pluggable allocator tells the memory profiler nothing: accalloc does, as CUDA's own
  // allocator would (the free side is free_block's).
  accalloc_torch::report_allocation(ptr, kCuda, device);
  return ptr;
}

void cuda_free(void* ptr, size_t /*size*/, int /*device*/, cudaStream_t /*stream*/) { accalloc_torch::free_block(ptr); }

AccallocPoolId pool_id(c10::cuda::MempoolId_t id) {
  return AccallocPoolId{static_cast<uint64_t>(id.first), static_cast<uint64_t>(id.second)};
}

// PyTorch's pool filter (a graph's capture-id test, or use_mem_pool's thread test), owned by accalloc
// until its route ends.
using StreamFilter = std::function<bool(cudaStream_t)>;

int32_t call_filter(void* stream, void* context) {
  try {
    return (*static_cast<StreamFilter*>(context))(static_cast<cudaStream_t>(stream)) ? 1 : 0;
  } catch (...) {
    return 0;  // no exception may cross accalloc: a throwing filter takes nothing
  }
}

void delete_filter(void* context) { delete static_cast<StreamFilter*>(context); }

// A graph pool's checkpoint (getCheckpointState), freed with the state.
struct PoolState final : public c10::cuda::CUDACachingAllocator::AllocatorState {
  PoolState(AccallocPoolCheckpoint* checkpoint, c10::DeviceIndex device, c10::cuda::MempoolId_t id)
      : checkpoint(checkpoint), device(device), id(id) {}
  ~PoolState() override { accalloc_pool_checkpoint_destroy(checkpoint); }
  PoolState(const PoolState&) = delete;
  PoolState& operator=(const PoolState&) = delete;
  AccallocPoolCheckpoint* checkpoint;
  c10::DeviceIndex device;
  c10::cuda::MempoolId_t id;
};

struct AccallocCudaAllocator final : public torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator {
  AccallocCudaAllocator() : CUDAPluggableAllocator(&cuda_malloc, &cuda_free) {
    accalloc_torch::serve_profiler_as(kCuda, c10::DeviceType::CUDA);
    set_reset_fn([] { accalloc_torch::check(accalloc_empty_cache_on(kCuda), "accalloc_empty_cache"); });
    set_memory_fraction_fn([](double fraction, int device) {
      accalloc_torch::check(accalloc_set_memory_fraction_on(kCuda, fraction, device), "accalloc_set_memory_fraction");
    });
    set_record_stream_fn([](void* ptr, cudaStream_t stream) {
      accalloc_torch::check(accalloc_record_stream(ptr, stream), "accalloc_record_stream");
    });
    // Pools: CUDA graphs and torch.cuda.MemPool / use_mem_pool route to accalloc's private pools. The
    // filter cannot tell a graph capture from use_mem_pool, so every route keeps the capture rules
    // (no event query, no cudaFree while it is begun): safe inside a capture, where both are illegal.
    set_begin_allocate_to_pool([](int device, c10::cuda::MempoolId_t id, StreamFilter filter) {
      auto* owned = new StreamFilter(std::move(filter));
      accalloc_torch::check(
          accalloc_pool_begin_filtered_on(kCuda, device, pool_id(id), &call_filter, owned, &delete_filter, 1),
          "accalloc_pool_begin_filtered");
    });
    set_end_allocate_to_pool_fn([](int device, c10::cuda::MempoolId_t id) {
      accalloc_torch::check(accalloc_pool_end_on(kCuda, device, pool_id(id)), "accalloc_pool_end");
    });
    set_release_pool([](int device, c10::cuda::MempoolId_t id) {
      accalloc_torch::check(accalloc_pool_release_on(kCuda, device, pool_id(id)), "accalloc_pool_release");
    });
  }

  // {0, 0}: every device's cache; a pool: PyTorch's emptyCache(pool) on the current device.
  void emptyCache(c10::cuda::MempoolId_t id) override {
    if (id == c10::cuda::MempoolId_t{0, 0}) {
      accalloc_torch::check(accalloc_empty_cache_on(kCuda), "accalloc_empty_cache");
      return;
    }
    accalloc_torch::check(accalloc_pool_empty_cache_on(kCuda, c10::cuda::current_device(), pool_id(id), 0),
                          "accalloc_pool_empty_cache");
  }

  void createOrIncrefPool(c10::DeviceIndex device, c10::cuda::MempoolId_t id,
                          std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> allocator) override {
    TORCH_CHECK(allocator == nullptr,
                "accalloc: MemPool(allocator=...) is not supported through use_for_cuda (a pool with an allocator "
                "of its own takes an AccallocBackendVTable: accalloc_pool_create_with_allocator)");
    accalloc_torch::check(accalloc_pool_retain_on(kCuda, device, pool_id(id)), "accalloc_pool_retain");
  }

  void setUseOnOOM(c10::DeviceIndex device, c10::cuda::MempoolId_t id, bool use_on_oom) override {
    accalloc_torch::check(accalloc_pool_set_flags_on(kCuda, device, pool_id(id), use_on_oom ? 1 : 0, 0),
                          "accalloc_pool_set_flags");
  }

  void setNoSplit(c10::DeviceIndex device, c10::cuda::MempoolId_t id) override {
    accalloc_torch::check(accalloc_pool_set_flags_on(kCuda, device, pool_id(id), -1, 1), "accalloc_pool_set_flags");
  }

  int getPoolUseCount(c10::DeviceIndex device, c10::cuda::MempoolId_t id) override {
    int64_t uses = -1;
    accalloc_torch::check(accalloc_pool_info_on(kCuda, device, pool_id(id), &uses, nullptr), "accalloc_pool_info");
    return uses < 0 ? 0 : static_cast<int>(uses);
  }

  // CUDA graph trees (torch.compile's mode="reduce-overhead") check that a graph pool's live
  // allocations are exactly the tensors the tree holds.
  bool checkPoolLiveAllocations(c10::DeviceIndex device, c10::cuda::MempoolId_t id,
                                const std::unordered_set<void*>& expected_live_allocations) override {
    std::vector<void*> live(expected_live_allocations.size() + 1);  // one more: "more than expected"
    size_t count = 0;
    accalloc_torch::check(
        accalloc_pool_live_allocations_on(kCuda, device, pool_id(id), live.data(), live.size(), &count),
        "accalloc_pool_live_allocations");
    if (count != expected_live_allocations.size()) {
      return false;
    }
    for (size_t i = 0; i < count; ++i) {
      if (expected_live_allocations.count(live[i]) == 0) {
        return false;
      }
    }
    return true;
  }

  // Every DataPtr's deleter (the pluggable allocator's raw_deleter) and torch's raw frees come here.
  // The pluggable allocator would free by its own records of each block, which the blocks a
  // checkpoint hands out again are not in (and whose type libtorch_cuda does not export): accalloc
  // needs no record to free a block.
  void raw_delete(void* ptr) override {
    if (ptr == nullptr) {
      return;
    }
    {
      const std::lock_guard<std::mutex> lock(allocator_mutex_);
      allocation_metadata_.erase(ptr);
    }
    accalloc_torch::free_block(ptr);
  }

  // CUDA graph trees checkpoint the graph pool after each recording, and put it back when they record
  // again after a replay (whose outputs the allocator never handed out).
  std::shared_ptr<c10::cuda::CUDACachingAllocator::AllocatorState> getCheckpointState(
      c10::DeviceIndex device, c10::cuda::MempoolId_t id) override {
    AccallocPoolCheckpoint* checkpoint = nullptr;
    accalloc_torch::check(accalloc_pool_checkpoint_on(kCuda, device, pool_id(id), &checkpoint),
                          "accalloc_pool_checkpoint");
    return std::make_shared<PoolState>(checkpoint, device, id);
  }

  c10::cuda::CUDACachingAllocator::CheckpointDelta setCheckpointPoolState(
      c10::DeviceIndex device, std::shared_ptr<c10::cuda::CUDACachingAllocator::AllocatorState> state) override {
    auto* pool_state = dynamic_cast<PoolState*>(state.get());
    TORCH_CHECK(pool_state != nullptr, "accalloc: setCheckpointPoolState takes a state accalloc's getCheckpointState made");
    size_t live = 0, allocations = 0;
    accalloc_torch::check(
        accalloc_pool_live_allocations_on(kCuda, device, pool_id(pool_state->id), nullptr, 0, &live),
        "accalloc_pool_live_allocations");
    accalloc_torch::check(accalloc_pool_checkpoint_allocations(pool_state->checkpoint, &allocations),
                          "accalloc_pool_checkpoint_allocations");
    // Room for a few more than are live now: another thread may allocate in the pool meanwhile (with
    // too little room the restore refuses, and changes nothing).
    std::vector<void*> freed(live + 64), allocated(allocations);
    std::vector<size_t> sizes(allocations);
    size_t freed_count = 0, allocated_count = 0;
    accalloc_torch::check(accalloc_pool_checkpoint_restore(pool_state->checkpoint, freed.data(), freed.size(),
                                                           &freed_count, allocated.data(), sizes.data(),
                                                           allocated.size(), &allocated_count),
                          "accalloc_pool_checkpoint_restore");
    c10::cuda::CUDACachingAllocator::CheckpointDelta delta;
    delta.ptrs_freed.assign(freed.begin(), freed.begin() + static_cast<std::ptrdiff_t>(freed_count));
    {
      // The freed blocks leave the pluggable allocator's records; the blocks handed out again need
      // none (raw_delete frees without them).
      const std::lock_guard<std::mutex> lock(allocator_mutex_);
      for (void* ptr : delta.ptrs_freed) {
        allocation_metadata_.erase(ptr);
      }
    }
    for (size_t i = 0; i < allocated_count; ++i) {
      delta.dataptrs_allocd.emplace_back(allocated[i], allocated[i], raw_deleter(),
                                         c10::Device(c10::DeviceType::CUDA, device));
    }
    return delta;
  }

  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    AccallocDeviceStats stats;
    std::memset(&stats, 0, sizeof stats);
    stats.struct_size = sizeof stats;
    accalloc_torch::check(accalloc_get_device_stats_on(kCuda, device, &stats), "accalloc_get_device_stats");
    return accalloc_torch::to_device_stats(stats);
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    accalloc_torch::check(accalloc_reset_accumulated_memory_stats_on(kCuda, device),
                          "accalloc_reset_accumulated_memory_stats");
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    accalloc_torch::check(accalloc_reset_peak_memory_stats_on(kCuda, device), "accalloc_reset_peak_memory_stats");
  }

  // cudnn's benchmark mode sizes its workspace by the largest block it could get: the device's free
  // memory is what accalloc could hand out without releasing its cache.
  void cacheInfo(c10::DeviceIndex device, size_t* largest_block) override {
    uint64_t free = 0, total = 0;
    accalloc_torch::check(accalloc_mem_get_info_on(kCuda, device, &free, &total), "accalloc_mem_get_info");
    *largest_block = static_cast<size_t>(free);
  }

  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    uint64_t free = 0, total = 0;
    accalloc_torch::check(accalloc_mem_get_info_on(kCuda, device, &free, &total), "accalloc_mem_get_info");
    return {static_cast<size_t>(free), static_cast<size_t>(total)};
  }

  std::string name() override { return "accalloc"; }
};

std::string g_error;

}  // namespace

extern "C" {

// Swap accalloc in as PyTorch's CUDA allocator. Returns 0, or -1 with the reason in
// accalloc_torch_use_for_cuda_error(): accalloc has no CUDA accelerator in this process (the
// message says why), or PyTorch's own allocator has already allocated (the message says what to do).
// The reasons are c10's messages without their C++ backtraces.
__attribute__((visibility("default"))) int accalloc_torch_use_for_cuda(void) {
  try {
    int32_t count = 0;
    accalloc_torch::check(accalloc_device_count_on(kCuda, &count), "accalloc_device_count (CUDA)");
    auto allocator = std::make_shared<AccallocCudaAllocator>();
    try {
      torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(allocator);
    } catch (const c10::Error& e) {
      std::string message = e.what_without_backtrace();
      // PyTorch refuses to swap an allocator that has allocated already.
      if (message.find("already initialized") != std::string::npos) {
        message += " (call accalloc.torch.use_for_cuda() before the first CUDA tensor is made)";
      }
      g_error = message;
      return -1;
    }
    // Kept alive by the CUDA allocator slot; c10's table holds a plain pointer.
    c10::SetAllocator(c10::DeviceType::CUDA, allocator.get(), /*priority=*/1);
    return 0;
  } catch (const c10::Error& e) {
    g_error = e.what_without_backtrace();
    return -1;
  } catch (const std::exception& e) {
    g_error = e.what();
    return -1;
  } catch (...) {
    g_error = "an unknown C++ exception";
    return -1;
  }
}

__attribute__((visibility("default"))) const char* accalloc_torch_use_for_cuda_error(void) { return g_error.c_str(); }

}  // extern "C"
