// cpp: accalloc.h from C++ (its extern "C" guard is what lets this link: without it the calls would be
// C++-mangled and unresolved), a small RAII wrapper, and 4 threads x 2000 malloc/free of varying sizes
// at once, two threads per device. Afterwards every figure must add up: nothing allocated, every
// allocation freed, the counts and byte totals equal to what the threads did.
// Run with ACCALLOC_HOST_CAPACITY=1GiB and ACCALLOC_HOST_DEVICES=2.
#include "accalloc.h"

#include <array>
#include <atomic>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#if !defined(__cplusplus)
#error "this file must be compiled as C++"
#endif

namespace {

int g_checks = 0;
int g_failures = 0;

void check(bool ok, const char* what, int line) {
    ++g_checks;
    if (!ok) {
        ++g_failures;
        std::fprintf(stderr, "FAIL test_cpp.cpp:%d: %s (last error: \"%s\")\n", line, what, accalloc_last_error_message());
    }
}
#define CHECK(cond) check((cond), #cond, __LINE__)

void check_eq(int64_t got, int64_t want, const char* what, int line) {
    ++g_checks;
    if (got != want) {
        ++g_failures;
        std::fprintf(stderr, "FAIL test_cpp.cpp:%d: %s: expected %" PRId64 ", got %" PRId64 "\n", line, what, want, got);
    }
}
#define CHECK_EQ(got, want) check_eq(static_cast<int64_t>(got), static_cast<int64_t>(want), #got, __LINE__)

// The error type a C++ framework would wrap a failed status in.
struct AccallocError {
    AccallocStatus status;
    std::string message;
};

// Owns one block; frees it when it goes out of scope. Move-only, like std::unique_ptr.
class DeviceBuffer {
  public:
    DeviceBuffer() = default;
    DeviceBuffer(size_t size, int32_t device) : size_(size) {
        AccallocStatus st = accalloc_malloc(&ptr_, size, device, nullptr);
        if (st != ACCALLOC_OK) throw AccallocError{st, accalloc_last_error_message()};
    }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), size_(std::exchange(o.size_, 0)) {}
    DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
        if (this != &o) {
            reset();
            ptr_ = std::exchange(o.ptr_, nullptr);
            size_ = std::exchange(o.size_, 0);
        }
        return *this;
    }
    ~DeviceBuffer() { reset(); }
    void reset() noexcept {
        if (ptr_ != nullptr) {
            AccallocStatus st = accalloc_free(ptr_);
            if (st != ACCALLOC_OK) {
                ++free_failures_;
            }
            ptr_ = nullptr;
            size_ = 0;
        }
    }
    void* get() const { return ptr_; }
    size_t size() const { return size_; }
    static std::atomic<int> free_failures_;

  private:
    void* ptr_ = nullptr;
    size_t size_ = 0;
};
std::atomic<int> DeviceBuffer::free_failures_{0};

static_assert(!std::is_copy_constructible<DeviceBuffer>::value, "DeviceBuffer is move-only");
static_assert(std::is_nothrow_move_constructible<DeviceBuffer>::value, "DeviceBuffer moves without throwing");

int64_t mstat(int32_t device, const char* key) {
    int64_t v = INT64_MIN;
    AccallocStatus st = accalloc_memory_stat(device, key, &v);
    if (st != ACCALLOC_OK) {
        ++g_failures;
        std::fprintf(stderr, "FAIL accalloc_memory_stat(%d, \"%s\") returned %s: %s\n", device, key, accalloc_status_name(st),
                     accalloc_last_error_message());
    }
    return v;
}

// What one thread did, to compare with the library's totals.
struct ThreadTally {
    int32_t device = -1;
    int64_t mallocs = 0;          // successful non-zero mallocs
    int64_t small_mallocs = 0;    // size <= 1 MiB
    int64_t large_mallocs = 0;
    int64_t zero_size = 0;        // malloc(0): NULL, not counted by the library
    int64_t requested = 0;        // sum of sizes asked for
    int64_t small_rounded = 0;    // sum of sizes rounded up to 512, small pool only
    int64_t errors = 0;           // unexpected statuses or exceptions
    int64_t corrupt = 0;          // a block that did not hold what this thread wrote into it
    int64_t device_mismatch = 0;  // accalloc_current_device disagreed with accalloc_set_device
};

constexpr int kThreads = 4;
constexpr int kIterations = 2000;
constexpr int kLive = 4;  // blocks a thread holds at once
constexpr size_t kMiB = 1048576;

uint64_t next_random(uint64_t& state) {  // xorshift64*: deterministic sizes per thread
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return state * 2685821657736338717ULL;
}

void fill(const DeviceBuffer& b, unsigned char tag) {
    if (accalloc_current_accelerator() != ACCALLOC_DEVICE_HOST || b.get() == nullptr) return;
    auto* p = static_cast<unsigned char*>(b.get());
    size_t n = b.size() < 64 ? b.size() : 64;
    std::memset(p, tag, n);
    std::memset(p + b.size() - n, tag, n);
    std::memset(p + b.size() / 2 - n / 2, tag, n);
}

bool holds(const DeviceBuffer& b, unsigned char tag) {
    if (accalloc_current_accelerator() != ACCALLOC_DEVICE_HOST || b.get() == nullptr) return true;
    auto* p = static_cast<unsigned char*>(b.get());
    size_t n = b.size() < 64 ? b.size() : 64;
    for (size_t i = 0; i < n; ++i) {
        if (p[i] != tag || p[b.size() - n + i] != tag || p[b.size() / 2 - n / 2 + i] != tag) return false;
    }
    return true;
}

void worker(int index, ThreadTally* tally) {
    const int32_t device = index % 2;
    tally->device = device;
    if (accalloc_set_device(device) != ACCALLOC_OK) {
        ++tally->errors;
        return;
    }
    uint64_t rng = 0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(index + 1);
    std::array<DeviceBuffer, kLive> live;
    std::array<unsigned char, kLive> tags{};
    try {
        for (int i = 0; i < kIterations; ++i) {
            uint64_t r = next_random(rng);
            size_t size;
            if (r % 97 == 0) {
                size = 0;
            } else if (r % 10 == 0) {
                size = kMiB + 1 + static_cast<size_t>((r >> 16) % (11 * kMiB));  // large pool, up to 12 MiB
            } else {
                size = 1 + static_cast<size_t>((r >> 16) % kMiB);  // small pool, 1 B .. 1 MiB
            }
            int slot = i % kLive;
            if (!holds(live[slot], tags[slot])) ++tally->corrupt;
            live[slot].reset();  // frees the block this slot held
            if ((i & 63) == 0) {
                int32_t cur = -1;
                if (accalloc_current_device(&cur) != ACCALLOC_OK || cur != device) ++tally->device_mismatch;
            }
            DeviceBuffer b(size, -1);  // -1: this thread's current device
            if (size == 0) {
                if (b.get() != nullptr) ++tally->errors;
                ++tally->zero_size;
                continue;
            }
            if (b.get() == nullptr) {
                ++tally->errors;
                continue;
            }
            ++tally->mallocs;
            tally->requested += static_cast<int64_t>(size);
            if (size <= kMiB) {
                ++tally->small_mallocs;
                tally->small_rounded += static_cast<int64_t>((size + 511) / 512 * 512);
            } else {
                ++tally->large_mallocs;
            }
            tags[slot] = static_cast<unsigned char>(0x40 + index * kLive + slot);
            fill(b, tags[slot]);
            live[slot] = std::move(b);
        }
        for (int slot = 0; slot < kLive; ++slot) {
            if (!holds(live[slot], tags[slot])) ++tally->corrupt;
        }
    } catch (const AccallocError& e) {
        ++tally->errors;
        std::fprintf(stderr, "thread %d: %s: %s\n", index, accalloc_status_name(e.status), e.message.c_str());
    }
    // `live` goes out of scope here: RAII frees the last blocks.
}

}  // namespace

int main() {
    // --- the RAII wrapper on its own ---
    {
        int64_t before = mstat(0, "allocation.all.allocated");
        {
            DeviceBuffer a(1000, 0);
            DeviceBuffer b(3 * kMiB, 0);
            CHECK(a.get() != nullptr);
            CHECK(b.get() != nullptr);
            CHECK_EQ(mstat(0, "allocated_bytes.all.current"), 1024 + 3 * 1048576);
            DeviceBuffer c(std::move(a));  // ownership moves, nothing is freed
            CHECK(a.get() == nullptr);
            CHECK_EQ(mstat(0, "allocation.all.current"), 2);
            b = std::move(c);  // b's old block is freed, c's block moves in
            CHECK_EQ(mstat(0, "allocation.all.current"), 1);
            CHECK_EQ(mstat(0, "allocated_bytes.all.current"), 1024);
        }
        CHECK_EQ(mstat(0, "allocation.all.current"), 0);
        CHECK_EQ(mstat(0, "allocation.all.allocated") - before, 2);
        CHECK_EQ(mstat(0, "allocation.all.freed") - before, 2);
        bool threw = false;
        try {
            DeviceBuffer too_big(size_t(1) << 40, 0);
        } catch (const AccallocError& e) {
            threw = true;
            CHECK(e.status == ACCALLOC_ERROR_OUT_OF_MEMORY);
            CHECK(e.message.find("out of memory") != std::string::npos);
        }
        CHECK(threw);
        CHECK_EQ(DeviceBuffer::free_failures_.load(), 0);
        CHECK(accalloc_empty_cache() == ACCALLOC_OK);
        for (int32_t d = 0; d < 2; ++d) {
            CHECK(accalloc_reset_accumulated_memory_stats(d) == ACCALLOC_OK);
            CHECK(accalloc_reset_peak_memory_stats(d) == ACCALLOC_OK);
        }
        CHECK_EQ(mstat(0, "num_ooms"), 0);
        CHECK_EQ(mstat(0, "reserved_bytes.all.current"), 0);
    }

    // --- 4 threads x 2000 malloc/free, two threads per device ---
    std::array<ThreadTally, kThreads> tallies{};
    {
        std::vector<std::thread> threads;
        for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t, &tallies[t]);
        for (auto& th : threads) th.join();
    }
    CHECK_EQ(DeviceBuffer::free_failures_.load(), 0);

    for (const auto& t : tallies) {
        CHECK_EQ(t.errors, 0);
        CHECK_EQ(t.corrupt, 0);
        CHECK_EQ(t.device_mismatch, 0);
        CHECK(t.zero_size > 0);      // the sizes did include malloc(0)
        CHECK(t.large_mallocs > 0);  // and large-pool requests
    }
    int64_t total_mallocs = 0;
    for (int32_t d = 0; d < 2; ++d) {
        ThreadTally sum;
        for (const auto& t : tallies) {
            if (t.device != d) continue;
            sum.mallocs += t.mallocs;
            sum.small_mallocs += t.small_mallocs;
            sum.large_mallocs += t.large_mallocs;
            sum.requested += t.requested;
            sum.small_rounded += t.small_rounded;
        }
        total_mallocs += sum.mallocs;
        CHECK(sum.mallocs > 2 * kIterations * 9 / 10);

        int64_t cur_alloc = -1, reserved = -1;
        CHECK(accalloc_memory_allocated(d, &cur_alloc) == ACCALLOC_OK);
        CHECK_EQ(cur_alloc, 0);
        CHECK(accalloc_memory_reserved(d, &reserved) == ACCALLOC_OK);
        CHECK_EQ(mstat(d, "reserved_bytes.all.current"), reserved);
        CHECK(reserved > 0);  // the cache kept segments

        CHECK_EQ(mstat(d, "allocation.all.allocated"), sum.mallocs);
        CHECK_EQ(mstat(d, "allocation.all.freed"), sum.mallocs);
        CHECK_EQ(mstat(d, "allocation.all.current"), 0);
        CHECK_EQ(mstat(d, "allocation.small_pool.allocated"), sum.small_mallocs);
        CHECK_EQ(mstat(d, "allocation.large_pool.allocated"), sum.large_mallocs);
        CHECK_EQ(mstat(d, "active.all.allocated"), sum.mallocs);
        CHECK_EQ(mstat(d, "active.all.current"), 0);
        CHECK_EQ(mstat(d, "requested_bytes.all.allocated"), sum.requested);
        CHECK_EQ(mstat(d, "requested_bytes.all.freed"), sum.requested);
        CHECK_EQ(mstat(d, "requested_bytes.all.current"), 0);
        // small blocks are split whenever 512 bytes or more are left, so each gets exactly its rounded size
        CHECK_EQ(mstat(d, "allocated_bytes.small_pool.allocated"), sum.small_rounded);
        CHECK_EQ(mstat(d, "allocated_bytes.all.allocated"), mstat(d, "allocated_bytes.all.freed"));
        CHECK_EQ(mstat(d, "active_bytes.all.current"), 0);
        CHECK_EQ(mstat(d, "inactive_split.all.current"), 0);  // all free blocks merged back into whole segments
        CHECK_EQ(mstat(d, "inactive_split_bytes.all.current"), 0);
        CHECK(mstat(d, "allocation.all.peak") <= 2 * kLive);
        CHECK(mstat(d, "allocation.all.peak") >= 1);
        CHECK_EQ(mstat(d, "num_ooms"), 0);
        CHECK_EQ(mstat(d, "segment.all.current"), mstat(d, "num_device_alloc") - mstat(d, "num_device_free"));
    }
    CHECK_EQ(total_mallocs, mstat(0, "allocation.all.allocated") + mstat(1, "allocation.all.allocated"));

    CHECK(accalloc_empty_cache() == ACCALLOC_OK);
    for (int32_t d = 0; d < 2; ++d) {
        CHECK_EQ(mstat(d, "reserved_bytes.all.current"), 0);
        CHECK_EQ(mstat(d, "segment.all.current"), 0);
        CHECK_EQ(mstat(d, "num_device_alloc"), mstat(d, "num_device_free"));
    }

    std::printf("test_cpp: %d checks, %d failed (%" PRId64 " mallocs from %d threads)\n", g_checks, g_failures,
                total_mallocs, kThreads);
    return g_failures == 0 ? 0 : 1;
}
