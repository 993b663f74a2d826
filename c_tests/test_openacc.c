/* OpenACC and accalloc in one program. GCC's libgomp exports the OpenACC runtime API (acc_malloc,
 * acc_free, acc_get_num_devices, ...), and `import torch` loads it globally: accalloc's names must not
 * collide with it, neither at compile time (both headers in one translation unit) nor at link and load
 * time (libgomp linked first, so a clash would bind our calls to OpenACC's functions). */
#include <openacc.h>

#include "accalloc.h"
#include "accalloc_test_util.h"

#define CHECK_STATUS(call, want) CHECK_STATUS_WITH(call, want, accalloc_status_name, accalloc_last_error_message)

static int64_t stat_of(const char *key)
{
    int64_t value = -1;
    CHECK_STATUS(accalloc_memory_stat(0, key, &value), ACCALLOC_OK);
    return value;
}

int main(void)
{
    if (ACCALLOC_CHECK_ABI() != ACCALLOC_OK) {
        fprintf(stderr, "%s\n", accalloc_last_error_message());
        return 1;
    }
    /* OpenACC's allocator, on its host fallback device. */
    int openacc_devices = acc_get_num_devices(acc_device_host);
    CHECK(openacc_devices >= 1);
    void *openacc_block = acc_malloc(4096);
    CHECK(openacc_block != NULL);

    /* accalloc's: 1000 bytes round to 1024 in a 2 MiB small-pool segment; 3 MiB take a 20 MiB one. */
    void *small = NULL, *large = NULL;
    CHECK_STATUS(accalloc_malloc(&small, 1000, 0, NULL), ACCALLOC_OK);
    CHECK_STATUS(accalloc_malloc(&large, 3 << 20, 0, NULL), ACCALLOC_OK);
    CHECK(small != NULL && large != NULL && small != openacc_block && large != openacc_block);
    memset(small, 0xab, 1000);
    memset(openacc_block, 0xcd, 4096);
    CHECK(((unsigned char *)small)[999] == 0xab);

    CHECK_EQ(stat_of("allocated_bytes.all.current"), 1024 + (3 << 20));
    CHECK_EQ(stat_of("requested_bytes.all.current"), 1000 + (3 << 20));
    CHECK_EQ(stat_of("reserved_bytes.all.current"), (2 << 20) + (20 << 20));
    CHECK_EQ(stat_of("segment.all.current"), 2);
    CHECK_EQ(stat_of("inactive_split.all.current"), 2);

    acc_free(openacc_block); /* OpenACC's free does not touch accalloc's books */
    CHECK_EQ(stat_of("allocation.all.current"), 2);

    CHECK_STATUS(accalloc_free(small), ACCALLOC_OK);
    CHECK_STATUS(accalloc_free(large), ACCALLOC_OK);
    CHECK_EQ(stat_of("allocated_bytes.all.current"), 0);
    CHECK_EQ(stat_of("reserved_bytes.all.current"), (2 << 20) + (20 << 20));
    CHECK_STATUS(accalloc_empty_cache(), ACCALLOC_OK);
    CHECK_EQ(stat_of("reserved_bytes.all.current"), 0);
    CHECK_EQ(stat_of("num_device_free"), 2);

    printf("test_openacc: %d checks, %d failed (OpenACC host devices: %d)\n", g_checks, g_failures,
           openacc_devices);
    return g_failures == 0 ? 0 : 1;
}
