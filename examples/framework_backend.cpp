// A framework-shaped use of accalloc for an accelerator it has never heard of.
//
// "MyAccel" is a pretend device whose driver hands out raw memory (here: the C library's, with a
// 256 MiB budget per device). The framework registers that driver with accalloc_register_backend and gets
// the whole caching allocator on top: RAII device buffers, a std::pmr::memory_resource for containers,
// PyTorch's statistics and memory_summary, side by side with the host backend.
//
//   cargo build --release
//   g++ -std=c++17 -Iinclude examples/framework_backend.cpp -Ltarget/release -laccalloc
//       -Wl,-rpath,$PWD/target/release -o framework_backend   (one line)
//   ./framework_backend
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory_resource>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "accalloc.h"

namespace myaccel {

// ---- the pretend driver ---------------------------------------------------------------------------
struct Driver {
    static constexpr int kDevices = 2;
    static constexpr size_t kCapacity = size_t(256) << 20;
    size_t used[kDevices] = {};
};

extern "C" {
static int32_t device_count(void *, int32_t *out) {
    *out = Driver::kDevices;
    return ACCALLOC_BACKEND_OK;
}
static int32_t raw_alloc(void *ctx, int32_t device, size_t size, void *, void **out) {
    auto *driver = static_cast<Driver *>(ctx);
    if (driver->used[device] + size > Driver::kCapacity) return ACCALLOC_BACKEND_OUT_OF_MEMORY;
    void *ptr = nullptr;
    if (posix_memalign(&ptr, 512, size) != 0) return ACCALLOC_BACKEND_OUT_OF_MEMORY;
    driver->used[device] += size;
    *out = ptr;
    return ACCALLOC_BACKEND_OK;
}
static int32_t raw_free(void *ctx, int32_t device, void *ptr, size_t size) {
    static_cast<Driver *>(ctx)->used[device] -= size;
    std::free(ptr);
    return ACCALLOC_BACKEND_OK;
}
static int32_t mem_get_info(void *ctx, int32_t device, uint64_t *free_bytes, uint64_t *total) {
    *total = Driver::kCapacity;
    *free_bytes = Driver::kCapacity - static_cast<Driver *>(ctx)->used[device];
    return ACCALLOC_BACKEND_OK;
}
}  // extern "C"

// ---- the framework's allocator, one per accelerator --------------------------------------------------
class Error : public std::runtime_error {
   public:
    Error(const char *what, AccallocStatus status)
        : std::runtime_error(std::string(what) + ": " + accalloc_status_name(status) + ": " + accalloc_last_error_message()) {}
};

inline void check(AccallocStatus status, const char *what) {
    if (status != ACCALLOC_OK) throw Error(what, status);
}

class DeviceAllocator {
   public:
    static DeviceAllocator &instance() {
        static DeviceAllocator allocator;
        return allocator;
    }
    AccallocDeviceType type() const { return type_; }
    void *allocate(size_t bytes, int device) {
        void *ptr = nullptr;
        check(accalloc_malloc_on(type_, &ptr, bytes, device, nullptr), "accalloc_malloc_on");
        return ptr;
    }
    void deallocate(void *ptr) noexcept { (void)accalloc_free(ptr); }
    int64_t memory_allocated(int device) const {
        int64_t value = 0;
        check(accalloc_memory_allocated_on(type_, device, &value), "accalloc_memory_allocated_on");
        return value;
    }
    std::string summary(int device) const {
        size_t len = 0;
        check(accalloc_memory_summary_on(type_, device, 1, nullptr, 0, &len), "accalloc_memory_summary_on");
        std::string text(len, '\0');
        check(accalloc_memory_summary_on(type_, device, 1, text.data(), len, &len), "accalloc_memory_summary_on");
        text.resize(len - 1);
        return text;
    }

   private:
    DeviceAllocator() {
        AccallocBackendVTable table;
        std::memset(&table, 0, sizeof table);
        table.struct_size = sizeof table;
        table.context = &driver_;
        table.device_count = device_count;
        table.raw_alloc = raw_alloc;
        table.raw_free = raw_free;
        table.mem_get_info = mem_get_info;
        check(accalloc_register_backend("myaccel", &table, &type_), "accalloc_register_backend");
    }
    Driver driver_;
    AccallocDeviceType type_ = -1;
};

// An owning device buffer: freed back to the cache when it goes out of scope.
class DeviceBuffer {
   public:
    DeviceBuffer(size_t bytes, int device) : ptr_(DeviceAllocator::instance().allocate(bytes, device)), bytes_(bytes) {}
    DeviceBuffer(DeviceBuffer &&other) noexcept : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(other.bytes_) {}
    DeviceBuffer(const DeviceBuffer &) = delete;
    DeviceBuffer &operator=(const DeviceBuffer &) = delete;
    ~DeviceBuffer() {
        if (ptr_) DeviceAllocator::instance().deallocate(ptr_);
    }
    void *data() const { return ptr_; }
    size_t size() const { return bytes_; }

   private:
    void *ptr_;
    size_t bytes_;
};

// A memory resource for standard containers (device 0 of MyAccel).
class Resource : public std::pmr::memory_resource {
    void *do_allocate(size_t bytes, size_t alignment) override {
        if (alignment > 512) throw std::bad_alloc();
        return DeviceAllocator::instance().allocate(bytes, 0);
    }
    void do_deallocate(void *ptr, size_t, size_t) override { DeviceAllocator::instance().deallocate(ptr); }
    bool do_is_equal(const memory_resource &other) const noexcept override { return this == &other; }
};

}  // namespace myaccel

int main() {
    using namespace myaccel;
    auto &allocator = DeviceAllocator::instance();
    std::printf("registered %s as device type %d\n", accalloc_device_type_name(allocator.type()), allocator.type());
    {
        std::vector<DeviceBuffer> activations;
        for (int layer = 0; layer < 8; layer++) activations.emplace_back(size_t(3) << 20, 0);
        DeviceBuffer weights(size_t(40) << 20, 1);
        Resource resource;
        std::pmr::vector<float> host_visible(1000, 1.0f, &resource);
        std::printf("allocated on device 0: %lld bytes, device 1: %lld bytes\n",
                    static_cast<long long>(allocator.memory_allocated(0)),
                    static_cast<long long>(allocator.memory_allocated(1)));
    }
    std::printf("after scope: %lld bytes allocated, segments stay cached\n",
                static_cast<long long>(allocator.memory_allocated(0)));
    std::printf("%s", allocator.summary(0).c_str());
    int64_t host_allocated = -1;
    check(accalloc_memory_allocated_on(ACCALLOC_DEVICE_HOST, 0, &host_allocated), "accalloc_memory_allocated_on");
    std::printf("the host backend's statistics are separate: %lld bytes allocated there\n",
                static_cast<long long>(host_allocated));
    try {
        DeviceBuffer too_big(size_t(1) << 30, 0);
    } catch (const Error &e) {
        std::printf("as expected: %.60s...\n", e.what());
    }
    check(accalloc_empty_cache_on(allocator.type()), "accalloc_empty_cache_on");
    return 0;
}
