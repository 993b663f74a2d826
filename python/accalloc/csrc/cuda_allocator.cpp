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

#include <memory>
#include <string>

namespace {

constexpr AccallocDeviceType kCuda = ACCALLOC_DEVICE_CUDA;

void* cuda_malloc(size_t size, int device, cudaStream_t stream) {
  void* ptr = nullptr;
  accalloc_torch::check(accalloc_malloc_on(kCuda, &ptr, size, device, stream), "accalloc_malloc");
  return ptr;
}

void cuda_free(void* ptr, size_t /*size*/, int /*device*/, cudaStream_t /*stream*/) { accalloc_torch::free_block(ptr); }

struct AccallocCudaAllocator final : public torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator {
  AccallocCudaAllocator() : CUDAPluggableAllocator(&cuda_malloc, &cuda_free) {
    set_reset_fn([] { accalloc_torch::check(accalloc_empty_cache_on(kCuda), "accalloc_empty_cache"); });
    set_memory_fraction_fn([](double fraction, int device) {
      accalloc_torch::check(accalloc_set_memory_fraction_on(kCuda, fraction, device), "accalloc_set_memory_fraction");
    });
    set_record_stream_fn([](void* ptr, cudaStream_t stream) {
      accalloc_torch::check(accalloc_record_stream(ptr, stream), "accalloc_record_stream");
    });
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
// accalloc_torch_use_for_cuda_error() (e.g. PyTorch's own allocator has already allocated).
__attribute__((visibility("default"))) int accalloc_torch_use_for_cuda(void) {
  try {
    int32_t count = 0;
    accalloc_torch::check(accalloc_device_count_on(kCuda, &count), "accalloc_device_count (CUDA)");
    auto allocator = std::make_shared<AccallocCudaAllocator>();
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(allocator);
    // Kept alive by the CUDA allocator slot; c10's table holds a plain pointer.
    c10::SetAllocator(c10::DeviceType::CUDA, allocator.get(), /*priority=*/1);
    return 0;
  } catch (const std::exception& e) {
    g_error = e.what();
    return -1;
  }
}

__attribute__((visibility("default"))) const char* accalloc_torch_use_for_cuda_error(void) { return g_error.c_str(); }

}  // extern "C"
