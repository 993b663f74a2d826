/* Bookkeeping does not outlive the peak: fill a 64 MiB host device with 512-byte allocations (131,072
 * live blocks), free them all and empty the cache. The process's resident memory and its anonymous
 * mappings must come back to within a few MiB of where they started (the blocks' memory is never
 * written, so what stays resident is accalloc's metadata: its block slab and pointer map).
 *
 * Run with ACCALLOC_HOST_CAPACITY=64MiB. Not run under AddressSanitizer or valgrind, whose own
 * allocators keep freed memory on purpose. */
#include "accalloc.h"
#include "accalloc_test_util.h"

#include <stdio.h>
#include <string.h>

#define CHECK_OK(call) CHECK_STATUS_WITH(call, ACCALLOC_OK, accalloc_status_name, accalloc_last_error_message)

#define BLOCK 512
#define COUNT (64 * 1024 * 1024 / BLOCK)
/* What may stay: "a few MiB". */
#define SLACK_KIB (4 * 1024)

/* A field of /proc/self/status in KiB (VmRSS: resident; RssAnon: resident anonymous pages). */
static long status_kib(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long value = -1;
    size_t n = strlen(field);
    if (f == NULL) {
        return -1;
    }
    while (fgets(line, sizeof line, f) != NULL) {
        if (strncmp(line, field, n) == 0 && line[n] == ':') {
            value = strtol(line + n + 1, NULL, 10);
            break;
        }
    }
    fclose(f);
    return value;
}

/* Anonymous private mappings (no file behind them) in KiB, as /proc/self/maps lists them. */
static long anonymous_mapped_kib(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    long total = 0;
    if (f == NULL) {
        return -1;
    }
    while (fgets(line, sizeof line, f) != NULL) {
        unsigned long start, end, offset, inode;
        char perms[8], dev[16], path[256] = "";
        int fields = sscanf(line, "%lx-%lx %7s %lx %15s %lu %255s", &start, &end, perms, &offset, dev, &inode, path);
        if (fields >= 6 && inode == 0 && (path[0] == '\0' || strcmp(path, "[heap]") == 0)) {
            total += (long)((end - start) / 1024);
        }
    }
    fclose(f);
    return total;
}

int main(void)
{
    static void *blocks[COUNT];
    int64_t allocated = -1;
    /* The runtime starts, and its first segment comes and goes, before the baseline is read. */
    void *warm = NULL;
    CHECK_OK(accalloc_malloc(&warm, BLOCK, 0, NULL));
    CHECK_OK(accalloc_free(warm));
    CHECK_OK(accalloc_empty_cache());
    long rss_before = status_kib("VmRSS"), anon_before = anonymous_mapped_kib();

    for (int i = 0; i < COUNT; ++i) {
        if (accalloc_malloc(&blocks[i], BLOCK, 0, NULL) != ACCALLOC_OK) {
            fprintf(stderr, "FAIL: malloc %d of %d: %s\n", i, COUNT, accalloc_last_error_message());
            return 1;
        }
    }
    CHECK_OK(accalloc_memory_allocated(0, &allocated));
    CHECK_EQ(allocated, (int64_t)COUNT * BLOCK);
    long rss_peak = status_kib("VmRSS");
    for (int i = 0; i < COUNT; ++i) {
        CHECK_OK(accalloc_free(blocks[i]));
    }
    CHECK_OK(accalloc_empty_cache());
    long rss_after = status_kib("VmRSS"), anon_after = anonymous_mapped_kib();

    printf("resident: %ld KiB at the start, %ld at the peak, %ld after empty_cache (+%ld)\n", rss_before, rss_peak,
           rss_after, rss_after - rss_before);
    printf("anonymous mappings: %ld KiB at the start, %ld after empty_cache (+%ld)\n", anon_before, anon_after,
           anon_after - anon_before);
    CHECK(rss_before > 0 && anon_before > 0);
    CHECK(rss_peak - rss_before > SLACK_KIB); /* the peak's metadata is real */
    CHECK(rss_after - rss_before <= SLACK_KIB);
    CHECK(anon_after - anon_before <= SLACK_KIB);
    printf("test_metadata: %d checks, %d failed\n", g_checks, g_failures);
    return g_failures == 0 && g_checks > 0 ? 0 : 1;
}
