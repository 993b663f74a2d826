/* accalloc quick start: allocate through the caching allocator and read PyTorch-style statistics.
 *
 *   cargo build --release        (leaves target/release/libaccalloc.so and its SONAME link .so.2)
 *   cc -std=c99 -Iinclude examples/quickstart.c -Ltarget/release -laccalloc \
 *      -Wl,-rpath,$PWD/target/release -o quickstart && ./quickstart
 * or, against an installed copy: cc examples/quickstart.c $(pkg-config --cflags --libs accalloc)
 */
#include <stdio.h>
#include <stdlib.h>
#include "accalloc.h"

#define CHECK(call)                                                                        \
    do {                                                                                   \
        AccallocStatus status_ = (call);                                                        \
        if (status_ != ACCALLOC_OK) {                                                           \
            fprintf(stderr, "%s failed: %s: %s\n", #call, accalloc_status_name(status_),      \
                    accalloc_last_error_message());                                             \
            return 1;                                                                      \
        }                                                                                  \
    } while (0)

int main(void) {
    void *small = NULL, *large = NULL;
    int64_t allocated = 0, reserved = 0, retries = 0;
    AccallocDeviceStats stats;
    stats.struct_size = sizeof stats;

    if (ACCALLOC_CHECK_ABI() != ACCALLOC_OK) { /* a library of another ABI: refuse it */
        fprintf(stderr, "%s\n", accalloc_last_error_message());
        return 1;
    }
    printf("accalloc %s on %s\n", accalloc_version(), accalloc_device_type_name(accalloc_current_accelerator()));

    CHECK(accalloc_malloc(&small, 1000, -1, NULL));     /* small pool: a 2 MiB segment, 1024 bytes used */
    CHECK(accalloc_malloc(&large, 5 << 20, -1, NULL));  /* large pool: a 20 MiB segment, 5 MiB used */
    CHECK(accalloc_memory_allocated(-1, &allocated));
    CHECK(accalloc_memory_reserved(-1, &reserved));
    printf("allocated %lld bytes, reserved %lld bytes\n", (long long)allocated, (long long)reserved);

    CHECK(accalloc_free(small));
    CHECK(accalloc_free(large));
    CHECK(accalloc_memory_stat(-1, "num_alloc_retries", &retries));
    CHECK(accalloc_get_device_stats(-1, &stats));
    printf("after free: allocated %lld, still cached %lld, segments %lld, retries %lld\n",
           (long long)stats.allocated_bytes[ACCALLOC_STAT_ALL].current,
           (long long)stats.reserved_bytes[ACCALLOC_STAT_ALL].current,
           (long long)stats.segment[ACCALLOC_STAT_ALL].current, (long long)retries);

    {
        /* PyTorch's memory_summary() table; a NULL buffer asks for the size first. */
        size_t len = 0;
        char *summary;
        CHECK(accalloc_memory_summary(-1, 1, NULL, 0, &len));
        summary = (char *)malloc(len);
        if (!summary)
            return 1;
        CHECK(accalloc_memory_summary(-1, 1, summary, len, &len));
        fputs(summary, stdout);
        free(summary);
    }

    CHECK(accalloc_empty_cache());
    CHECK(accalloc_memory_reserved(-1, &reserved));
    printf("after empty_cache: reserved %lld\n", (long long)reserved);

    if (accalloc_free((void *)&stats) != ACCALLOC_OK) /* not ours: reported, nothing changes */
        printf("bad free reported: %s\n", accalloc_last_error_message());
    return 0;
}
