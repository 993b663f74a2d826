/* api_shared / api_static: every exported accalloc function, every error status a caller can trigger,
 * and exact statistics worked out by hand from docs/PYTORCH_RULES.md (PyTorch's CUDACachingAllocator
 * rules). Run with ACCALLOC_HOST_CAPACITY=1GiB and ACCALLOC_HOST_DEVICES=2 (two host devices of 1073741824 bytes),
 * in a fresh process: every figure below assumes the statistics start at zero.
 *
 * Every check after a step compares the whole AccallocDeviceStats (all 122 figures) with the expected one,
 * then checks that accalloc_memory_stat agrees with accalloc_get_device_stats for each flat key and that the four
 * convenience getters agree with the struct. */
/* mmap's MAP_ANONYMOUS and madvise, for the pool allocator with virtual memory below. */
#define _DEFAULT_SOURCE
#include "accalloc.h"

#include "accalloc_test_util.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>

#define CHECK_STATUS(call, want) CHECK_STATUS_WITH(call, want, accalloc_status_name, accalloc_last_error_message)

#define KiB ((int64_t)1024)
#define MiB ((int64_t)1048576)
#define GiB ((int64_t)1073741824)

enum { ALL = ACCALLOC_STAT_ALL, SMALL = ACCALLOC_STAT_SMALL_POOL, LARGE = ACCALLOC_STAT_LARGE_POOL };

static void set_stat(AccallocStat *s, int64_t current, int64_t peak, int64_t allocated, int64_t freed)
{
    s->current = current;
    s->peak = peak;
    s->allocated = allocated;
    s->freed = freed;
}
/* SET: one pool slot; SET2: the "all" slot and one pool slot with the same figures. */
#define SET(e, fam, pool, c, p, a, f) set_stat(&(e).fam[pool], (c), (p), (a), (f))
#define SET2(e, fam, pool, c, p, a, f)      \
    do {                                    \
        SET(e, fam, ALL, c, p, a, f);       \
        SET(e, fam, pool, c, p, a, f);      \
    } while (0)

/* A fresh device: every figure 0, max_split_size -1 (unset). */
static void fresh_expected(AccallocDeviceStats *e)
{
    memset(e, 0, sizeof *e);
    e->struct_size = sizeof *e;
    e->max_split_size = -1;
}

static int get_stats(int32_t device, AccallocDeviceStats *out)
{
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    return (int)accalloc_get_device_stats(device, out);
}

static int is_host(void)
{
    return accalloc_current_accelerator() == ACCALLOC_DEVICE_HOST;
}

/* Compares all 122 figures of `device` with *want; `step` names the step in failure messages. */
static void expect_device(int32_t device, const AccallocDeviceStats *want, const char *step)
{
    AccallocDeviceStats got, want_copy = *want;
    int k, st;
    int64_t v;
    char name[ACCALLOC_KEY_MAX];

    st = get_stats(device, &got);
    ++g_checks;
    if (st != ACCALLOC_OK) {
        ++g_failures;
        fprintf(stderr, "FAIL [%s] accalloc_get_device_stats(%d) returned %s: %s\n", step, (int)device,
                accalloc_status_name((AccallocStatus)st), accalloc_last_error_message());
        return;
    }
    for (k = 0; k < ACCALLOC_N_KEYS; ++k) {
        int64_t w = *accalloc_key(&want_copy, k, name);
        int64_t g = *accalloc_key(&got, k, name);
        ++g_checks;
        if (w != g) {
            ++g_failures;
            fprintf(stderr, "FAIL [%s] device %d %s: expected %" PRId64 ", got %" PRId64 "\n", step, (int)device,
                    name, w, g);
        }
    }
    /* The flat keys read the same figures as the struct. */
    for (k = 0; k < ACCALLOC_N_KEYS; ++k) {
        int64_t g = *accalloc_key(&got, k, name);
        v = INT64_MIN;
        st = (int)accalloc_memory_stat(device, name, &v);
        ++g_checks;
        if (st != ACCALLOC_OK || v != g) {
            ++g_failures;
            fprintf(stderr, "FAIL [%s] device %d accalloc_memory_stat(\"%s\") -> %s, %" PRId64
                            " but accalloc_get_device_stats has %" PRId64 "\n",
                    step, (int)device, name, accalloc_status_name((AccallocStatus)st), v, g);
        }
    }
    /* torch.accelerator.memory_allocated & co. */
    v = -7;
    CHECK_STATUS(accalloc_memory_allocated(device, &v), ACCALLOC_OK);
    CHECK_EQ(v, want->allocated_bytes[ALL].current);
    v = -7;
    CHECK_STATUS(accalloc_max_memory_allocated(device, &v), ACCALLOC_OK);
    CHECK_EQ(v, want->allocated_bytes[ALL].peak);
    v = -7;
    CHECK_STATUS(accalloc_memory_reserved(device, &v), ACCALLOC_OK);
    CHECK_EQ(v, want->reserved_bytes[ALL].current);
    v = -7;
    CHECK_STATUS(accalloc_max_memory_reserved(device, &v), ACCALLOC_OK);
    CHECK_EQ(v, want->reserved_bytes[ALL].peak);
}

static void expect_mem_info(int32_t device, uint64_t want_free, uint64_t want_total)
{
    uint64_t free_b = 1, total_b = 1;
    CHECK_STATUS(accalloc_mem_get_info(device, &free_b, &total_b), ACCALLOC_OK);
    CHECK_EQ(free_b, want_free);
    CHECK_EQ(total_b, want_total);
}

static void touch(void *p, size_t n, int byte)
{
    if (p != NULL && is_host())
        memset(p, byte, n);
}

static AccallocDeviceStats e0, e1; /* what devices 0 and 1 should show */

/* ------------------------------------------------------------------------------------------------ */
static void section_metadata(void)
{
    int32_t n = -1, cur = -1;
    /* No failure yet on this thread: the message is "" (never NULL). */
    CHECK(accalloc_last_error_message() != NULL);
    CHECK_STR(accalloc_last_error_message(), "");

    CHECK_STR(accalloc_version(), "0.1.0");
    {
        char v[32];
        snprintf(v, sizeof v, "%d.%d.%d", ACCALLOC_VERSION_MAJOR, ACCALLOC_VERSION_MINOR, ACCALLOC_VERSION_PATCH);
        CHECK_STR(accalloc_version(), v); /* the header's version macros match the library */
    }
    CHECK_EQ(accalloc_abi_version(), ACCALLOC_ABI_VERSION);
    CHECK_EQ(ACCALLOC_ABI_VERSION, 2);
    CHECK_EQ(ACCALLOC_CHECK_ABI(), ACCALLOC_OK);
    CHECK_EQ(accalloc_check_abi(ACCALLOC_ABI_VERSION), ACCALLOC_OK);
    CHECK_STR(ACCALLOC_VERSION_STRING, accalloc_version());
    /* (the refusal of another ABI is test_abi_mismatch.c's) */

    CHECK_STR(accalloc_status_name(ACCALLOC_OK), "ACCALLOC_OK");
    CHECK_STR(accalloc_status_name(ACCALLOC_ERROR_INVALID_ARGUMENT), "ACCALLOC_ERROR_INVALID_ARGUMENT");
    CHECK_STR(accalloc_status_name(ACCALLOC_ERROR_INVALID_DEVICE), "ACCALLOC_ERROR_INVALID_DEVICE");
    CHECK_STR(accalloc_status_name(ACCALLOC_ERROR_INVALID_POINTER), "ACCALLOC_ERROR_INVALID_POINTER");
    CHECK_STR(accalloc_status_name(ACCALLOC_ERROR_OUT_OF_MEMORY), "ACCALLOC_ERROR_OUT_OF_MEMORY");
    CHECK_STR(accalloc_status_name(ACCALLOC_ERROR_BACKEND), "ACCALLOC_ERROR_BACKEND");
    CHECK_STR(accalloc_status_name(ACCALLOC_ERROR_NOT_SUPPORTED), "ACCALLOC_ERROR_NOT_SUPPORTED");
    CHECK_STR(accalloc_status_name(ACCALLOC_ERROR_CONFIG), "ACCALLOC_ERROR_CONFIG");
    CHECK_STR(accalloc_status_name(ACCALLOC_ERROR_BUFFER_TOO_SMALL), "ACCALLOC_ERROR_BUFFER_TOO_SMALL");
    CHECK_STR(accalloc_status_name(ACCALLOC_ERROR_INTERNAL), "ACCALLOC_ERROR_INTERNAL");
    CHECK_STR(accalloc_status_name(10), "ACCALLOC_ERROR_UNKNOWN");
    CHECK_STR(accalloc_status_name(-1), "ACCALLOC_ERROR_UNKNOWN");
    CHECK_STR(accalloc_status_name(1000), "ACCALLOC_ERROR_UNKNOWN");
    CHECK_EQ(ACCALLOC_OK, 0);
    CHECK_EQ(ACCALLOC_ERROR_INVALID_ARGUMENT, 1);
    CHECK_EQ(ACCALLOC_ERROR_INVALID_DEVICE, 2);
    CHECK_EQ(ACCALLOC_ERROR_INVALID_POINTER, 3);
    CHECK_EQ(ACCALLOC_ERROR_OUT_OF_MEMORY, 4);
    CHECK_EQ(ACCALLOC_ERROR_BACKEND, 5);
    CHECK_EQ(ACCALLOC_ERROR_NOT_SUPPORTED, 6);
    CHECK_EQ(ACCALLOC_ERROR_CONFIG, 7);
    CHECK_EQ(ACCALLOC_ERROR_BUFFER_TOO_SMALL, 8);
    CHECK_EQ(ACCALLOC_ERROR_INTERNAL, 9);

    CHECK_EQ(ACCALLOC_DEVICE_HOST, 0);
    CHECK_EQ(ACCALLOC_DEVICE_CUDA, 1);
    CHECK_STR(accalloc_device_type_name(ACCALLOC_DEVICE_HOST), "host");
    CHECK_STR(accalloc_device_type_name(ACCALLOC_DEVICE_CUDA), "cuda");
    CHECK_STR(accalloc_device_type_name((AccallocDeviceType)7), "unknown");
    CHECK_STR(accalloc_device_type_name((AccallocDeviceType)-1), "unknown");
    /* These tests run on the host backend (ACCALLOC_HOST_DEVICES=2), or on CUDA's driver model with the
     * same two devices and capacity (ACCALLOC_DEVICE=cuda). */
    CHECK_EQ(accalloc_current_accelerator(), accalloc_test_on_cuda() ? ACCALLOC_DEVICE_CUDA : ACCALLOC_DEVICE_HOST);

    CHECK_EQ(ACCALLOC_STAT_ALL, 0);
    CHECK_EQ(ACCALLOC_STAT_SMALL_POOL, 1);
    CHECK_EQ(ACCALLOC_STAT_LARGE_POOL, 2);

    CHECK_STATUS(accalloc_device_count(&n), ACCALLOC_OK);
    CHECK_EQ(n, 2);
    CHECK_STATUS(accalloc_current_device(&cur), ACCALLOC_OK);
    CHECK_EQ(cur, 0);
    /* None of that failed, so still no message. */
    CHECK_STR(accalloc_last_error_message(), "");
}

/* ------------------------------------------------------------------------------------------------ */
static void section_initial(void)
{
    AccallocDeviceStats s;
    struct {
        AccallocDeviceStats s;
        unsigned char tail[64];
    } big;
    size_t i, cut = offsetof(AccallocDeviceStats, segment);
    int untouched;

    fresh_expected(&e0);
    fresh_expected(&e1);
    expect_device(0, &e0, "fresh device 0");
    expect_device(1, &e1, "fresh device 1");
    expect_device(-1, &e0, "fresh current device (-1 = 0)");
    expect_mem_info(0, (uint64_t)GiB, (uint64_t)GiB);
    expect_mem_info(1, (uint64_t)GiB, (uint64_t)GiB);
    expect_mem_info(-1, (uint64_t)GiB, (uint64_t)GiB);

    /* struct_size 0: the caller did not say how big its struct is. */
    memset(&s, 0, sizeof s);
    CHECK_STATUS(accalloc_get_device_stats(0, &s), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK(strlen(accalloc_last_error_message()) > 0);

    /* An older caller with a shorter struct: only struct_size bytes are written. */
    memset(&s, 0xAB, sizeof s);
    s.struct_size = cut;
    CHECK_STATUS(accalloc_get_device_stats(0, &s), ACCALLOC_OK);
    CHECK_EQ(s.struct_size, cut); /* rewritten with the bytes filled */
    for (i = 0; i < 3; ++i) {
        CHECK_EQ(s.allocation[i].current, 0);
        CHECK_EQ(s.allocation[i].peak, 0);
        CHECK_EQ(s.allocation[i].allocated, 0);
        CHECK_EQ(s.allocation[i].freed, 0);
    }
    untouched = 1;
    for (i = cut; i < sizeof s; ++i)
        if (((unsigned char *)&s)[i] != 0xAB)
            untouched = 0;
    CHECK(untouched); /* nothing written past struct_size */

    /* A newer caller with a longer struct: the library fills what it knows and leaves the rest. */
    memset(&big, 0xAB, sizeof big);
    big.s.struct_size = sizeof big;
    CHECK_STATUS(accalloc_get_device_stats(0, &big.s), ACCALLOC_OK);
    CHECK_EQ(big.s.struct_size, sizeof(AccallocDeviceStats)); /* the bytes the library filled */
    CHECK_EQ(big.s.max_split_size, -1);
    CHECK_EQ(big.s.num_device_alloc, 0);
    CHECK_EQ(big.s.requested_bytes[LARGE].freed, 0);
    untouched = 1;
    for (i = 0; i < sizeof big.tail; ++i)
        if (big.tail[i] != 0xAB)
            untouched = 0;
    CHECK(untouched);
}

/* ------------------------------------------------------------------------------------------------ */
/* Phase A, device 0: the small pool. */
static void *pa1, *pa2;
static void section_phase_a(void)
{
    void *p = NULL;
    int local = 0;

    /* A1: malloc(1000) on the current device (-1 -> 0): 1024 bytes out of a new 2 MiB small segment,
     * split; the 2096128-byte remainder is an inactive split block. */
    CHECK_STATUS(accalloc_malloc(&pa1, 1000, -1, NULL), ACCALLOC_OK);
    CHECK(pa1 != NULL);
    CHECK((uintptr_t)pa1 % 512 == 0); /* blocks are 512-byte aligned */
    touch(pa1, 1000, 0x11);
    SET2(e0, allocation, SMALL, 1, 1, 1, 0);
    SET2(e0, segment, SMALL, 1, 1, 1, 0);
    SET2(e0, active, SMALL, 1, 1, 1, 0);
    SET2(e0, inactive_split, SMALL, 1, 1, 1, 0);
    SET2(e0, allocated_bytes, SMALL, 1024, 1024, 1024, 0);
    SET2(e0, reserved_bytes, SMALL, 2097152, 2097152, 2097152, 0);
    SET2(e0, active_bytes, SMALL, 1024, 1024, 1024, 0);
    SET2(e0, inactive_split_bytes, SMALL, 2096128, 2096128, 2096128, 0);
    SET2(e0, requested_bytes, SMALL, 1000, 1000, 1000, 0);
    e0.num_device_alloc = 1;
    expect_device(0, &e0, "A1 malloc(1000)");
    expect_device(1, &e1, "A1 device 1 untouched");
    expect_mem_info(0, (uint64_t)(GiB - 2097152), (uint64_t)GiB);
    expect_mem_info(1, (uint64_t)GiB, (uint64_t)GiB);

    /* A2: malloc(1000) on device 0 explicitly: best fit is the remainder; cut from its start, so the
     * block sits right after the first one. An already split block shrinks: inactive_split_bytes -1024. */
    CHECK_STATUS(accalloc_malloc(&pa2, 1000, 0, NULL), ACCALLOC_OK);
    CHECK((char *)pa2 == (char *)pa1 + 1024);
    touch(pa2, 1000, 0x22);
    SET2(e0, allocation, SMALL, 2, 2, 2, 0);
    SET2(e0, active, SMALL, 2, 2, 2, 0);
    SET2(e0, allocated_bytes, SMALL, 2048, 2048, 2048, 0);
    SET2(e0, active_bytes, SMALL, 2048, 2048, 2048, 0);
    SET2(e0, requested_bytes, SMALL, 2000, 2000, 2000, 0);
    SET2(e0, inactive_split_bytes, SMALL, 2095104, 2096128, 2096128, 1024);
    expect_device(0, &e0, "A2 second malloc(1000)");

    /* Bad frees change nothing: a pointer never handed out, an interior pointer of a live block, a
     * pointer from the C heap. */
    CHECK_STATUS(accalloc_free(&local), ACCALLOC_ERROR_INVALID_POINTER);
    CHECK(strlen(accalloc_last_error_message()) > 0);
    CHECK_STATUS(accalloc_free((char *)pa1 + 512), ACCALLOC_ERROR_INVALID_POINTER);
    CHECK_STATUS(accalloc_free((char *)pa2 + 1), ACCALLOC_ERROR_INVALID_POINTER);
    p = malloc(64);
    CHECK_STATUS(accalloc_free(p), ACCALLOC_ERROR_INVALID_POINTER);
    free(p);
    CHECK_STATUS(accalloc_free(NULL), ACCALLOC_OK);
    /* size 0: no memory, NULL back, nothing counted */
    p = &local;
    CHECK_STATUS(accalloc_malloc(&p, 0, 0, NULL), ACCALLOC_OK);
    CHECK(p == NULL);
    expect_device(0, &e0, "A2 after invalid frees and malloc(0)");
    if (is_host()) {
        CHECK(((unsigned char *)pa1)[999] == 0x11); /* the blocks still hold their data */
        CHECK(((unsigned char *)pa2)[0] == 0x22);
    }

    /* A3: free(pa1): its neighbour pa2 is allocated, so no merge; a new inactive split block of 1024. */
    CHECK_STATUS(accalloc_free(pa1), ACCALLOC_OK);
    SET2(e0, allocation, SMALL, 1, 2, 2, 1);
    SET2(e0, active, SMALL, 1, 2, 2, 1);
    SET2(e0, allocated_bytes, SMALL, 1024, 2048, 2048, 1024);
    SET2(e0, active_bytes, SMALL, 1024, 2048, 2048, 1024);
    SET2(e0, requested_bytes, SMALL, 1000, 2000, 2000, 1000);
    SET2(e0, inactive_split, SMALL, 2, 2, 2, 0);
    SET2(e0, inactive_split_bytes, SMALL, 2096128, 2096128, 2097152, 1024);
    expect_device(0, &e0, "A3 free first block");

    /* Double free: reported, nothing changes. */
    CHECK_STATUS(accalloc_free(pa1), ACCALLOC_ERROR_INVALID_POINTER);
    expect_device(0, &e0, "A3 after double free");

    /* A4: free(pa2): merges with both free neighbours into the whole segment: inactive_split -2,
     * inactive_split_bytes -(1024 + 2095104). */
    CHECK_STATUS(accalloc_free(pa2), ACCALLOC_OK);
    SET2(e0, allocation, SMALL, 0, 2, 2, 2);
    SET2(e0, active, SMALL, 0, 2, 2, 2);
    SET2(e0, allocated_bytes, SMALL, 0, 2048, 2048, 2048);
    SET2(e0, active_bytes, SMALL, 0, 2048, 2048, 2048);
    SET2(e0, requested_bytes, SMALL, 0, 2000, 2000, 2000);
    SET2(e0, inactive_split, SMALL, 0, 2, 2, 2);
    SET2(e0, inactive_split_bytes, SMALL, 0, 2096128, 2097152, 2097152);
    expect_device(0, &e0, "A4 free second block (segment cached)");
    expect_mem_info(0, (uint64_t)(GiB - 2097152), (uint64_t)GiB);
    CHECK_STATUS(accalloc_free(pa2), ACCALLOC_ERROR_INVALID_POINTER);
    expect_device(0, &e0, "A4 after double free");

    /* A5: empty_cache releases the cached segment; it synchronizes every device (num_sync_all_streams
     * +1 on device 1 too, as PyTorch's emptyCache runs on each device allocator). */
    CHECK_STATUS(accalloc_empty_cache(), ACCALLOC_OK);
    SET2(e0, segment, SMALL, 0, 1, 1, 1);
    SET2(e0, reserved_bytes, SMALL, 0, 2097152, 2097152, 2097152);
    e0.num_device_free = 1;
    e0.num_sync_all_streams = 1;
    e1.num_sync_all_streams = 1;
    expect_device(0, &e0, "A5 empty_cache");
    expect_device(1, &e1, "A5 empty_cache, device 1");
    expect_mem_info(0, (uint64_t)GiB, (uint64_t)GiB);
}

/* ------------------------------------------------------------------------------------------------ */
/* Phase B, device 0: the large pool, the resets, an OOM that releases the cache. */
static void section_phase_b(void)
{
    void *p3 = NULL, *p4 = NULL, *p5 = (void *)&e0;

    /* B1: 3 MiB -> large pool, new 20 MiB segment, split (remainder 17825792 > 1 MiB). */
    CHECK_STATUS(accalloc_malloc(&p3, (size_t)(3 * MiB), 0, NULL), ACCALLOC_OK);
    touch(p3, (size_t)(3 * MiB), 0x33);
    SET(e0, allocation, ALL, 1, 2, 3, 2);
    SET(e0, allocation, LARGE, 1, 1, 1, 0);
    SET(e0, active, ALL, 1, 2, 3, 2);
    SET(e0, active, LARGE, 1, 1, 1, 0);
    SET(e0, allocated_bytes, ALL, 3145728, 3145728, 3147776, 2048);
    SET(e0, allocated_bytes, LARGE, 3145728, 3145728, 3145728, 0);
    SET(e0, active_bytes, ALL, 3145728, 3145728, 3147776, 2048);
    SET(e0, active_bytes, LARGE, 3145728, 3145728, 3145728, 0);
    SET(e0, requested_bytes, ALL, 3145728, 3145728, 3147728, 2000);
    SET(e0, requested_bytes, LARGE, 3145728, 3145728, 3145728, 0);
    SET(e0, segment, ALL, 1, 1, 2, 1);
    SET(e0, segment, LARGE, 1, 1, 1, 0);
    SET(e0, reserved_bytes, ALL, 20971520, 20971520, 23068672, 2097152);
    SET(e0, reserved_bytes, LARGE, 20971520, 20971520, 20971520, 0);
    SET(e0, inactive_split, ALL, 1, 2, 3, 2);
    SET(e0, inactive_split, LARGE, 1, 1, 1, 0);
    SET(e0, inactive_split_bytes, ALL, 17825792, 17825792, 19922944, 2097152);
    SET(e0, inactive_split_bytes, LARGE, 17825792, 17825792, 17825792, 0);
    e0.num_device_alloc = 2;
    expect_device(0, &e0, "B1 malloc(3 MiB)");

    /* B2: reset_peak_memory_stats: peak = current everywhere, nothing else moves. */
    CHECK_STATUS(accalloc_reset_peak_memory_stats(0), ACCALLOC_OK);
    SET(e0, allocation, ALL, 1, 1, 3, 2);
    SET(e0, allocation, SMALL, 0, 0, 2, 2);
    SET(e0, active, ALL, 1, 1, 3, 2);
    SET(e0, active, SMALL, 0, 0, 2, 2);
    SET(e0, allocated_bytes, SMALL, 0, 0, 2048, 2048);
    SET(e0, active_bytes, SMALL, 0, 0, 2048, 2048);
    SET(e0, requested_bytes, SMALL, 0, 0, 2000, 2000);
    SET(e0, segment, SMALL, 0, 0, 1, 1);
    SET(e0, reserved_bytes, SMALL, 0, 0, 2097152, 2097152);
    SET(e0, inactive_split, ALL, 1, 1, 3, 2);
    SET(e0, inactive_split, SMALL, 0, 0, 2, 2);
    SET(e0, inactive_split_bytes, SMALL, 0, 0, 2097152, 2097152);
    expect_device(0, &e0, "B2 reset_peak_memory_stats(0)");
    expect_device(1, &e1, "B2 device 1 not reset");

    /* B3: reset_accumulated_memory_stats: allocated and freed = 0 everywhere, the five counters = 0. */
    CHECK_STATUS(accalloc_reset_accumulated_memory_stats(0), ACCALLOC_OK);
    fresh_expected(&e0);
    SET2(e0, allocation, LARGE, 1, 1, 0, 0);
    SET2(e0, active, LARGE, 1, 1, 0, 0);
    SET2(e0, allocated_bytes, LARGE, 3145728, 3145728, 0, 0);
    SET2(e0, active_bytes, LARGE, 3145728, 3145728, 0, 0);
    SET2(e0, requested_bytes, LARGE, 3145728, 3145728, 0, 0);
    SET2(e0, segment, LARGE, 1, 1, 0, 0);
    SET2(e0, reserved_bytes, LARGE, 20971520, 20971520, 0, 0);
    SET2(e0, inactive_split, LARGE, 1, 1, 0, 0);
    SET2(e0, inactive_split_bytes, LARGE, 17825792, 17825792, 0, 0);
    expect_device(0, &e0, "B3 reset_accumulated_memory_stats(0)");
    expect_device(1, &e1, "B3 device 1 not reset");

    /* B4: 19.5 MiB: the 17 MiB free block is too small; >= 10 MiB gets a segment rounded to 2 MiB
     * (20 MiB); the 512 KiB remainder is not > 1 MiB, so no split: the caller gets the whole 20 MiB. */
    CHECK_STATUS(accalloc_malloc(&p4, (size_t)20447232, 0, NULL), ACCALLOC_OK);
    touch(p4, (size_t)20447232, 0x44);
    CHECK((uintptr_t)p3 % 512 == 0);
    CHECK((uintptr_t)p4 % 512 == 0);
    SET2(e0, allocation, LARGE, 2, 2, 1, 0);
    SET2(e0, active, LARGE, 2, 2, 1, 0);
    SET2(e0, allocated_bytes, LARGE, 24117248, 24117248, 20971520, 0);
    SET2(e0, active_bytes, LARGE, 24117248, 24117248, 20971520, 0);
    SET2(e0, requested_bytes, LARGE, 23592960, 23592960, 20447232, 0);
    SET2(e0, segment, LARGE, 2, 2, 1, 0);
    SET2(e0, reserved_bytes, LARGE, 41943040, 41943040, 20971520, 0);
    e0.num_device_alloc = 1;
    expect_device(0, &e0, "B4 malloc(19.5 MiB) takes a whole 20 MiB segment");
    expect_mem_info(0, (uint64_t)(GiB - 41943040), (uint64_t)GiB);

    /* B5: free the 3 MiB block: merges with its free remainder, the segment is whole again. */
    CHECK_STATUS(accalloc_free(p3), ACCALLOC_OK);
    SET2(e0, allocation, LARGE, 1, 2, 1, 1);
    SET2(e0, active, LARGE, 1, 2, 1, 1);
    SET2(e0, allocated_bytes, LARGE, 20971520, 24117248, 20971520, 3145728);
    SET2(e0, active_bytes, LARGE, 20971520, 24117248, 20971520, 3145728);
    SET2(e0, requested_bytes, LARGE, 20447232, 23592960, 20447232, 3145728);
    SET2(e0, inactive_split, LARGE, 0, 1, 0, 1);
    SET2(e0, inactive_split_bytes, LARGE, 0, 17825792, 0, 17825792);
    expect_device(0, &e0, "B5 free(3 MiB)");

    /* B6: free the 19.5 MiB block (a whole segment: no inactive_split change). */
    CHECK_STATUS(accalloc_free(p4), ACCALLOC_OK);
    SET2(e0, allocation, LARGE, 0, 2, 1, 2);
    SET2(e0, active, LARGE, 0, 2, 1, 2);
    SET2(e0, allocated_bytes, LARGE, 0, 24117248, 20971520, 24117248);
    SET2(e0, active_bytes, LARGE, 0, 24117248, 20971520, 24117248);
    SET2(e0, requested_bytes, LARGE, 0, 23592960, 20447232, 23592960);
    expect_device(0, &e0, "B6 free(19.5 MiB)");

    /* B7a: 1 TiB is more than the device has at all: refused as out of memory up front. It counts in
     * num_ooms, as in PyTorch, and nothing else changes (accalloc's rule for a request no device can
     * hold; PyTorch would still release the cache and count a retry). The message has PyTorch's shape. */
    CHECK_STATUS(accalloc_malloc(&p5, (size_t)1 << 40, 0, NULL), ACCALLOC_ERROR_OUT_OF_MEMORY);
    CHECK(p5 == (void *)&e0); /* on error *out is not touched */
    CHECK_CONTAINS(accalloc_last_error_message(), "out of memory");
    CHECK_CONTAINS(accalloc_last_error_message(), "Tried to allocate 1024.00 GiB");
    CHECK_CONTAINS(accalloc_last_error_message(), "Device 0");
    e0.num_ooms = 1;
    expect_device(0, &e0, "B7a malloc(1 TiB): refused, counted as an OOM, nothing else changes");
    expect_device(1, &e1, "B7a device 1 untouched");

    /* B7b: 600 MiB live next to the two cached 20 MiB segments (640 MiB reserved). */
    CHECK_STATUS(accalloc_malloc(&p4, (size_t)(600 * MiB), 0, NULL), ACCALLOC_OK);
    SET2(e0, allocation, LARGE, 1, 2, 2, 2);
    SET2(e0, active, LARGE, 1, 2, 2, 2);
    SET2(e0, allocated_bytes, LARGE, 629145600, 629145600, 650117120, 24117248);
    SET2(e0, active_bytes, LARGE, 629145600, 629145600, 650117120, 24117248);
    SET2(e0, requested_bytes, LARGE, 629145600, 629145600, 649592832, 23592960);
    SET2(e0, segment, LARGE, 3, 3, 2, 0);
    SET2(e0, reserved_bytes, LARGE, 671088640, 671088640, 650117120, 0);
    e0.num_device_alloc = 2;
    expect_device(0, &e0, "B7b malloc(600 MiB)");
    expect_mem_info(0, (uint64_t)(GiB - 671088640), (uint64_t)GiB);

    /* B7c: 500 MiB would fit an empty device but not this one: the device says no, every cached whole
     * segment is released (num_sync_all_streams +1, the two 20 MiB segments freed), one retry
     * (num_alloc_retries +1) fails too (600 + 500 MiB > 1 GiB), then num_ooms +1 (2 with B7a). */
    p5 = (void *)&e0;
    CHECK_STATUS(accalloc_malloc(&p5, (size_t)(500 * MiB), 0, NULL), ACCALLOC_ERROR_OUT_OF_MEMORY);
    CHECK(p5 == (void *)&e0);
    CHECK_CONTAINS(accalloc_last_error_message(), "Tried to allocate 500.00 MiB");
    SET2(e0, segment, LARGE, 1, 3, 2, 2);
    SET2(e0, reserved_bytes, LARGE, 629145600, 671088640, 650117120, 41943040);
    e0.num_device_free = 2;
    e0.num_sync_all_streams = 1;
    e0.num_alloc_retries = 1;
    e0.num_ooms = 2;
    expect_device(0, &e0, "B7c malloc(500 MiB) out of memory after releasing the cache");
    expect_device(1, &e1, "B7c device 1 untouched");
    expect_mem_info(0, (uint64_t)(GiB - 629145600), (uint64_t)GiB);

    /* B7d: free the 600 MiB block (cached), then empty_cache releases it (and syncs device 1 too). */
    CHECK_STATUS(accalloc_free(p4), ACCALLOC_OK);
    SET2(e0, allocation, LARGE, 0, 2, 2, 3);
    SET2(e0, active, LARGE, 0, 2, 2, 3);
    SET2(e0, allocated_bytes, LARGE, 0, 629145600, 650117120, 653262848);
    SET2(e0, active_bytes, LARGE, 0, 629145600, 650117120, 653262848);
    SET2(e0, requested_bytes, LARGE, 0, 629145600, 649592832, 652738560);
    expect_device(0, &e0, "B7d free(600 MiB)");
    CHECK_STATUS(accalloc_empty_cache(), ACCALLOC_OK);
    SET2(e0, segment, LARGE, 0, 3, 2, 3);
    SET2(e0, reserved_bytes, LARGE, 0, 671088640, 650117120, 671088640);
    e0.num_device_free = 3;
    e0.num_sync_all_streams = 2;
    e1.num_sync_all_streams = 2;
    expect_device(0, &e0, "B7d empty_cache");
    expect_device(1, &e1, "B7d empty_cache, device 1");
    expect_mem_info(0, (uint64_t)GiB, (uint64_t)GiB);

    /* Both resets together bring the device back to a fresh one (nothing is live or cached). */
    CHECK_STATUS(accalloc_reset_accumulated_memory_stats(-1), ACCALLOC_OK);
    CHECK_STATUS(accalloc_reset_peak_memory_stats(-1), ACCALLOC_OK);
    fresh_expected(&e0);
    expect_device(0, &e0, "B8 both resets on the current device");
}

/* ------------------------------------------------------------------------------------------------ */
/* Phase C, device 0: exactly the capacity, an OOM with nothing to release, a retry that succeeds. */
static void section_phase_c(void)
{
    void *big = NULL, *p = NULL, *q = NULL;

    /* C1: 1 GiB: a segment of exactly the device's capacity (no split). */
    CHECK_STATUS(accalloc_malloc(&big, (size_t)GiB, 0, NULL), ACCALLOC_OK);
    CHECK(big != NULL);
    SET2(e0, allocation, LARGE, 1, 1, 1, 0);
    SET2(e0, active, LARGE, 1, 1, 1, 0);
    SET2(e0, allocated_bytes, LARGE, GiB, GiB, GiB, 0);
    SET2(e0, active_bytes, LARGE, GiB, GiB, GiB, 0);
    SET2(e0, requested_bytes, LARGE, GiB, GiB, GiB, 0);
    SET2(e0, segment, LARGE, 1, 1, 1, 0);
    SET2(e0, reserved_bytes, LARGE, GiB, GiB, GiB, 0);
    e0.num_device_alloc = 1;
    expect_device(0, &e0, "C1 malloc(1 GiB)");
    expect_mem_info(0, 0, (uint64_t)GiB);

    /* C2: 1000 bytes need a new 2 MiB small segment: the device is full, nothing cached to release;
     * the retry fails too. The message names the segment size, not the request. */
    CHECK_STATUS(accalloc_malloc(&p, 1000, 0, NULL), ACCALLOC_ERROR_OUT_OF_MEMORY);
    CHECK_CONTAINS(accalloc_last_error_message(), "Tried to allocate 2.00 MiB");
    e0.num_sync_all_streams = 1;
    e0.num_alloc_retries = 1;
    e0.num_ooms = 1;
    expect_device(0, &e0, "C2 malloc(1000) with the device full");

    /* Device 1 is a separate 1 GiB device: the same request works there. */
    CHECK_STATUS(accalloc_malloc(&q, 1000, 1, NULL), ACCALLOC_OK);
    CHECK_STATUS(accalloc_free(q), ACCALLOC_OK);
    {
        int64_t v = -1;
        CHECK_STATUS(accalloc_memory_stat(1, "allocation.all.allocated", &v), ACCALLOC_OK);
        CHECK_EQ(v, 1);
        CHECK_STATUS(accalloc_memory_stat(1, "reserved_bytes.small_pool.current", &v), ACCALLOC_OK);
        CHECK_EQ(v, 2097152);
    }
    /* Undo device 1's figures so that phase D starts from a known state. */
    CHECK_STATUS(accalloc_empty_cache(), ACCALLOC_OK); /* also syncs device 0 */
    CHECK_STATUS(accalloc_reset_accumulated_memory_stats(1), ACCALLOC_OK);
    CHECK_STATUS(accalloc_reset_peak_memory_stats(1), ACCALLOC_OK);
    fresh_expected(&e1);
    expect_device(1, &e1, "C2 device 1 back to fresh");
    e0.num_sync_all_streams = 2; /* that empty_cache synchronized device 0 too; its 1 GiB is in use */
    expect_device(0, &e0, "C2 empty_cache with the 1 GiB block live");

    /* C3: free the 1 GiB block: cached, still reserved. */
    CHECK_STATUS(accalloc_free(big), ACCALLOC_OK);
    SET2(e0, allocation, LARGE, 0, 1, 1, 1);
    SET2(e0, active, LARGE, 0, 1, 1, 1);
    SET2(e0, allocated_bytes, LARGE, 0, GiB, GiB, GiB);
    SET2(e0, active_bytes, LARGE, 0, GiB, GiB, GiB);
    SET2(e0, requested_bytes, LARGE, 0, GiB, GiB, GiB);
    expect_device(0, &e0, "C3 free(1 GiB), cached");
    expect_mem_info(0, 0, (uint64_t)GiB);

    /* C4: malloc(1000): the new 2 MiB segment fails (1 GiB cached), the cached 1 GiB segment is
     * released (num_sync_all_streams +1, num_device_free +1), the retry succeeds (num_alloc_retries +1,
     * no OOM). */
    CHECK_STATUS(accalloc_malloc(&p, 1000, 0, NULL), ACCALLOC_OK);
    touch(p, 1000, 0x55);
    SET(e0, segment, ALL, 1, 1, 2, 1);
    SET(e0, segment, LARGE, 0, 1, 1, 1);
    SET(e0, segment, SMALL, 1, 1, 1, 0);
    SET(e0, reserved_bytes, ALL, 2097152, GiB, GiB + 2097152, GiB);
    SET(e0, reserved_bytes, LARGE, 0, GiB, GiB, GiB);
    SET(e0, reserved_bytes, SMALL, 2097152, 2097152, 2097152, 0);
    SET(e0, allocation, ALL, 1, 1, 2, 1);
    SET(e0, allocation, SMALL, 1, 1, 1, 0);
    SET(e0, active, ALL, 1, 1, 2, 1);
    SET(e0, active, SMALL, 1, 1, 1, 0);
    SET(e0, allocated_bytes, ALL, 1024, GiB, GiB + 1024, GiB);
    SET(e0, allocated_bytes, SMALL, 1024, 1024, 1024, 0);
    SET(e0, active_bytes, ALL, 1024, GiB, GiB + 1024, GiB);
    SET(e0, active_bytes, SMALL, 1024, 1024, 1024, 0);
    SET(e0, requested_bytes, ALL, 1000, GiB, GiB + 1000, GiB);
    SET(e0, requested_bytes, SMALL, 1000, 1000, 1000, 0);
    SET2(e0, inactive_split, SMALL, 1, 1, 1, 0);
    SET2(e0, inactive_split_bytes, SMALL, 2096128, 2096128, 2096128, 0);
    e0.num_sync_all_streams = 3;
    e0.num_alloc_retries = 2;
    e0.num_ooms = 1;
    e0.num_device_alloc = 2;
    e0.num_device_free = 1;
    expect_device(0, &e0, "C4 malloc(1000) succeeds after releasing the cache");
    expect_mem_info(0, (uint64_t)(GiB - 2097152), (uint64_t)GiB);

    /* C5: free it; C6: empty_cache. */
    CHECK_STATUS(accalloc_free(p), ACCALLOC_OK);
    SET(e0, allocation, ALL, 0, 1, 2, 2);
    SET(e0, allocation, SMALL, 0, 1, 1, 1);
    SET(e0, active, ALL, 0, 1, 2, 2);
    SET(e0, active, SMALL, 0, 1, 1, 1);
    SET(e0, allocated_bytes, ALL, 0, GiB, GiB + 1024, GiB + 1024);
    SET(e0, allocated_bytes, SMALL, 0, 1024, 1024, 1024);
    SET(e0, active_bytes, ALL, 0, GiB, GiB + 1024, GiB + 1024);
    SET(e0, active_bytes, SMALL, 0, 1024, 1024, 1024);
    SET(e0, requested_bytes, ALL, 0, GiB, GiB + 1000, GiB + 1000);
    SET(e0, requested_bytes, SMALL, 0, 1000, 1000, 1000);
    SET2(e0, inactive_split, SMALL, 0, 1, 1, 1);
    SET2(e0, inactive_split_bytes, SMALL, 0, 2096128, 2096128, 2096128);
    expect_device(0, &e0, "C5 free(1000)");

    CHECK_STATUS(accalloc_empty_cache(), ACCALLOC_OK);
    SET(e0, segment, ALL, 0, 1, 2, 2);
    SET(e0, segment, SMALL, 0, 1, 1, 1);
    SET(e0, reserved_bytes, ALL, 0, GiB, GiB + 2097152, GiB + 2097152);
    SET(e0, reserved_bytes, SMALL, 0, 2097152, 2097152, 2097152);
    e0.num_sync_all_streams = 4;
    e0.num_device_free = 2;
    e1.num_sync_all_streams = 1;
    expect_device(0, &e0, "C6 empty_cache");
    expect_device(1, &e1, "C6 empty_cache, device 1");
    expect_mem_info(0, (uint64_t)GiB, (uint64_t)GiB);
}

/* ------------------------------------------------------------------------------------------------ */
/* Phase E, device 0: the segment-size boundaries of the large pool. */
static void section_phase_e(void)
{
    void *p1 = NULL, *p2 = NULL, *p3 = NULL;

    CHECK_STATUS(accalloc_reset_accumulated_memory_stats(0), ACCALLOC_OK);
    CHECK_STATUS(accalloc_reset_peak_memory_stats(0), ACCALLOC_OK);
    fresh_expected(&e0);
    expect_device(0, &e0, "E0 resets after phase C");

    /* E1: 19 MiB: >= 10 MiB, segment rounded up to 2 MiB = 20 MiB; the remainder is exactly 1 MiB, which
     * is not > 1 MiB: no split, the caller gets all 20 MiB. */
    CHECK_STATUS(accalloc_malloc(&p1, (size_t)(19 * MiB), 0, NULL), ACCALLOC_OK);
    SET2(e0, allocation, LARGE, 1, 1, 1, 0);
    SET2(e0, active, LARGE, 1, 1, 1, 0);
    SET2(e0, allocated_bytes, LARGE, 20971520, 20971520, 20971520, 0);
    SET2(e0, active_bytes, LARGE, 20971520, 20971520, 20971520, 0);
    SET2(e0, requested_bytes, LARGE, 19922944, 19922944, 19922944, 0);
    SET2(e0, segment, LARGE, 1, 1, 1, 0);
    SET2(e0, reserved_bytes, LARGE, 20971520, 20971520, 20971520, 0);
    e0.num_device_alloc = 1;
    expect_device(0, &e0, "E1 malloc(19 MiB): 1 MiB remainder is not split");

    /* E2: exactly 10 MiB, nothing free: a segment of exactly 10 MiB. */
    CHECK_STATUS(accalloc_malloc(&p2, (size_t)(10 * MiB), 0, NULL), ACCALLOC_OK);
    SET2(e0, allocation, LARGE, 2, 2, 2, 0);
    SET2(e0, active, LARGE, 2, 2, 2, 0);
    SET2(e0, allocated_bytes, LARGE, 31457280, 31457280, 31457280, 0);
    SET2(e0, active_bytes, LARGE, 31457280, 31457280, 31457280, 0);
    SET2(e0, requested_bytes, LARGE, 30408704, 30408704, 30408704, 0);
    SET2(e0, segment, LARGE, 2, 2, 2, 0);
    SET2(e0, reserved_bytes, LARGE, 31457280, 31457280, 31457280, 0);
    e0.num_device_alloc = 2;
    expect_device(0, &e0, "E2 malloc(10 MiB): a 10 MiB segment");

    /* E3: 10 MiB - 512 is under 10 MiB: a 20 MiB segment, split (10486272 left). */
    CHECK_STATUS(accalloc_malloc(&p3, (size_t)(10 * MiB - 512), 0, NULL), ACCALLOC_OK);
    SET2(e0, allocation, LARGE, 3, 3, 3, 0);
    SET2(e0, active, LARGE, 3, 3, 3, 0);
    SET2(e0, allocated_bytes, LARGE, 41942528, 41942528, 41942528, 0);
    SET2(e0, active_bytes, LARGE, 41942528, 41942528, 41942528, 0);
    SET2(e0, requested_bytes, LARGE, 40893952, 40893952, 40893952, 0);
    SET2(e0, segment, LARGE, 3, 3, 3, 0);
    SET2(e0, reserved_bytes, LARGE, 52428800, 52428800, 52428800, 0);
    SET2(e0, inactive_split, LARGE, 1, 1, 1, 0);
    SET2(e0, inactive_split_bytes, LARGE, 10486272, 10486272, 10486272, 0);
    e0.num_device_alloc = 3;
    expect_device(0, &e0, "E3 malloc(10 MiB - 512): a 20 MiB segment, split");
    expect_mem_info(0, (uint64_t)(GiB - 52428800), (uint64_t)GiB);

    /* E4: free all three; E5: empty_cache. */
    CHECK_STATUS(accalloc_free(p1), ACCALLOC_OK);
    CHECK_STATUS(accalloc_free(p2), ACCALLOC_OK);
    CHECK_STATUS(accalloc_free(p3), ACCALLOC_OK);
    SET2(e0, allocation, LARGE, 0, 3, 3, 3);
    SET2(e0, active, LARGE, 0, 3, 3, 3);
    SET2(e0, allocated_bytes, LARGE, 0, 41942528, 41942528, 41942528);
    SET2(e0, active_bytes, LARGE, 0, 41942528, 41942528, 41942528);
    SET2(e0, requested_bytes, LARGE, 0, 40893952, 40893952, 40893952);
    SET2(e0, inactive_split, LARGE, 0, 1, 1, 1);
    SET2(e0, inactive_split_bytes, LARGE, 0, 10486272, 10486272, 10486272);
    expect_device(0, &e0, "E4 frees");
    CHECK_STATUS(accalloc_empty_cache(), ACCALLOC_OK);
    SET2(e0, segment, LARGE, 0, 3, 3, 3);
    SET2(e0, reserved_bytes, LARGE, 0, 52428800, 52428800, 52428800);
    e0.num_device_free = 3;
    e0.num_sync_all_streams = 1;
    e1.num_sync_all_streams = 2;
    expect_device(0, &e0, "E5 empty_cache");
    expect_device(1, &e1, "E5 empty_cache, device 1");

    /* E6: best fit is the smallest hole that fits, not the lowest address. In one small segment:
     * [q1 4096][q2 1024][q3 1024][q4 1024][tail]; free q1 and q3: holes of 4096 (low) and 1024 (higher).
     * malloc(1000) must take q3's hole exactly (no split: inactive_split -1, inactive_split_bytes -1024). */
    {
        void *q1 = NULL, *q2 = NULL, *q3 = NULL, *q4 = NULL, *q = NULL;
        int64_t v = -1;
        CHECK_STATUS(accalloc_malloc(&q1, 4096, 0, NULL), ACCALLOC_OK);
        CHECK_STATUS(accalloc_malloc(&q2, 1000, 0, NULL), ACCALLOC_OK);
        CHECK_STATUS(accalloc_malloc(&q3, 1000, 0, NULL), ACCALLOC_OK);
        CHECK_STATUS(accalloc_malloc(&q4, 1000, 0, NULL), ACCALLOC_OK);
        CHECK((char *)q2 == (char *)q1 + 4096);
        CHECK((char *)q3 == (char *)q1 + 5120);
        CHECK((char *)q4 == (char *)q1 + 6144);
        CHECK_STATUS(accalloc_free(q1), ACCALLOC_OK);
        CHECK_STATUS(accalloc_free(q3), ACCALLOC_OK);
        CHECK_STATUS(accalloc_memory_stat(0, "inactive_split.small_pool.current", &v), ACCALLOC_OK);
        CHECK_EQ(v, 3);
        CHECK_STATUS(accalloc_memory_stat(0, "inactive_split_bytes.small_pool.current", &v), ACCALLOC_OK);
        CHECK_EQ(v, 4096 + 1024 + (2097152 - 7168));
        CHECK_STATUS(accalloc_malloc(&q, 1000, 0, NULL), ACCALLOC_OK);
        CHECK(q == q3);
        CHECK_STATUS(accalloc_memory_stat(0, "inactive_split.small_pool.current", &v), ACCALLOC_OK);
        CHECK_EQ(v, 2);
        CHECK_STATUS(accalloc_memory_stat(0, "inactive_split_bytes.small_pool.current", &v), ACCALLOC_OK);
        CHECK_EQ(v, 4096 + (2097152 - 7168));
        CHECK_STATUS(accalloc_memory_stat(0, "allocated_bytes.small_pool.current", &v), ACCALLOC_OK);
        CHECK_EQ(v, 3072);
        CHECK_STATUS(accalloc_memory_stat(0, "segment.small_pool.current", &v), ACCALLOC_OK);
        CHECK_EQ(v, 1);
        CHECK_STATUS(accalloc_free(q), ACCALLOC_OK);
        CHECK_STATUS(accalloc_free(q2), ACCALLOC_OK);
        CHECK_STATUS(accalloc_free(q4), ACCALLOC_OK);
        CHECK_STATUS(accalloc_memory_stat(0, "inactive_split.small_pool.current", &v), ACCALLOC_OK);
        CHECK_EQ(v, 0);
        CHECK_STATUS(accalloc_memory_stat(0, "inactive_split_bytes.small_pool.current", &v), ACCALLOC_OK);
        CHECK_EQ(v, 0);
        CHECK_STATUS(accalloc_empty_cache(), ACCALLOC_OK);
        CHECK_STATUS(accalloc_reset_accumulated_memory_stats(0), ACCALLOC_OK);
        CHECK_STATUS(accalloc_reset_peak_memory_stats(0), ACCALLOC_OK);
        fresh_expected(&e0);
        e1.num_sync_all_streams = 3;
        expect_device(0, &e0, "E6 best fit, then everything released and reset");
        expect_device(1, &e1, "E6 device 1");
    }
}

/* ------------------------------------------------------------------------------------------------ */
static void check_json(int32_t device, const char *step)
{
    static char want_keys[ACCALLOC_N_KEYS][ACCALLOC_KEY_MAX];
    static char got_keys[ACCALLOC_N_KEYS + 1][ACCALLOC_KEY_MAX];
    int64_t values[ACCALLOC_N_KEYS + 1];
    AccallocDeviceStats s;
    size_t len = 0, need, i;
    char *buf;
    const char *why = "";
    int n, k, untouched;

    CHECK_STATUS(accalloc_memory_stats_json(device, NULL, 0, NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_memory_stats_json(device, NULL, 0, &len), ACCALLOC_OK);
    need = len;
    CHECK(need > 122 * 10);
    buf = (char *)malloc(need + 64);
    if (buf == NULL)
        return;

    /* too small by one byte: ACCALLOC_ERROR_BUFFER_TOO_SMALL, the size still reported, buf untouched */
    memset(buf, 'Z', need + 64);
    len = 0;
    CHECK_STATUS(accalloc_memory_stats_json(device, buf, need - 1, &len), ACCALLOC_ERROR_BUFFER_TOO_SMALL);
    CHECK_EQ(len, need);
    CHECK(strlen(accalloc_last_error_message()) > 0);
    len = 0;
    CHECK_STATUS(accalloc_memory_stats_json(device, buf, 0, &len), ACCALLOC_ERROR_BUFFER_TOO_SMALL);
    CHECK_EQ(len, need);
    untouched = 1;
    for (i = 0; i < need + 64; ++i)
        if (buf[i] != 'Z')
            untouched = 0;
    CHECK(untouched);

    /* exactly the size: OK, NUL-terminated, len = strlen + 1 */
    len = 0;
    CHECK_STATUS(accalloc_memory_stats_json(device, buf, need, &len), ACCALLOC_OK);
    CHECK_EQ(len, need);
    CHECK_EQ(strlen(buf) + 1, need);
    CHECK(buf[need] == 'Z');

    CHECK_STATUS(get_stats(device, &s), ACCALLOC_OK);
    accalloc_sorted_keys(want_keys);
    n = accalloc_parse_flat_json(buf, got_keys, values, ACCALLOC_N_KEYS + 1, &why);
    ++g_checks;
    if (n != ACCALLOC_N_KEYS) {
        ++g_failures;
        fprintf(stderr, "FAIL [%s] memory_stats_json: %d keys (%s); text: %s\n", step, n, n < 0 ? why : "", buf);
    } else {
        for (k = 0; k < ACCALLOC_N_KEYS; ++k) {
            char name[ACCALLOC_KEY_MAX];
            int j, found = 0;
            ++g_checks;
            if (strcmp(got_keys[k], want_keys[k]) != 0) {
                ++g_failures;
                fprintf(stderr, "FAIL [%s] memory_stats_json key #%d: expected \"%s\" (sorted), got \"%s\"\n", step,
                        k, want_keys[k], got_keys[k]);
                continue;
            }
            for (j = 0; j < ACCALLOC_N_KEYS; ++j) {
                int64_t v = *accalloc_key(&s, j, name);
                if (strcmp(name, got_keys[k]) == 0) {
                    found = 1;
                    ++g_checks;
                    if (v != values[k]) {
                        ++g_failures;
                        fprintf(stderr, "FAIL [%s] memory_stats_json %s = %" PRId64 ", accalloc_get_device_stats has %" PRId64 "\n",
                                step, name, values[k], v);
                    }
                }
            }
            CHECK(found);
        }
    }
    /* a roomier buffer: same answer */
    len = 0;
    CHECK_STATUS(accalloc_memory_stats_json(device, buf, need + 64, &len), ACCALLOC_OK);
    CHECK_EQ(len, need);
    free(buf);
}

/* ------------------------------------------------------------------------------------------------ */
/* Phase D, device 1 through accalloc_set_device: best fit, merges that leave a split block, size classes. */
static void section_phase_d(void)
{
    void *a = NULL, *b = NULL, *c = NULL, *x = NULL, *y = NULL, *z = NULL, *w = NULL;
    int32_t cur = -1;

    CHECK_STATUS(accalloc_set_device(1), ACCALLOC_OK);
    CHECK_STATUS(accalloc_current_device(&cur), ACCALLOC_OK);
    CHECK_EQ(cur, 1);

    /* D1, D2: two malloc(1000) on the current device (-1 -> 1): as A1, A2 but on device 1. */
    CHECK_STATUS(accalloc_malloc(&a, 1000, -1, NULL), ACCALLOC_OK);
    CHECK_STATUS(accalloc_malloc(&b, 1000, -1, NULL), ACCALLOC_OK);
    CHECK((char *)b == (char *)a + 1024);
    SET2(e1, allocation, SMALL, 2, 2, 2, 0);
    SET2(e1, active, SMALL, 2, 2, 2, 0);
    SET2(e1, allocated_bytes, SMALL, 2048, 2048, 2048, 0);
    SET2(e1, active_bytes, SMALL, 2048, 2048, 2048, 0);
    SET2(e1, requested_bytes, SMALL, 2000, 2000, 2000, 0);
    SET2(e1, segment, SMALL, 1, 1, 1, 0);
    SET2(e1, reserved_bytes, SMALL, 2097152, 2097152, 2097152, 0);
    SET2(e1, inactive_split, SMALL, 1, 1, 1, 0);
    SET2(e1, inactive_split_bytes, SMALL, 2095104, 2096128, 2096128, 1024);
    e1.num_device_alloc = 1;
    expect_device(1, &e1, "D2 two malloc(1000) on device 1");
    expect_device(-1, &e1, "D2 device -1 is device 1 now");
    expect_device(0, &e0, "D2 device 0 untouched");

    /* D3: free(a): no merge (b is live): inactive_split +1, +1024. */
    CHECK_STATUS(accalloc_free(a), ACCALLOC_OK);
    SET2(e1, allocation, SMALL, 1, 2, 2, 1);
    SET2(e1, active, SMALL, 1, 2, 2, 1);
    SET2(e1, allocated_bytes, SMALL, 1024, 2048, 2048, 1024);
    SET2(e1, active_bytes, SMALL, 1024, 2048, 2048, 1024);
    SET2(e1, requested_bytes, SMALL, 1000, 2000, 2000, 1000);
    SET2(e1, inactive_split, SMALL, 2, 2, 2, 0);
    SET2(e1, inactive_split_bytes, SMALL, 2096128, 2096128, 2097152, 1024);
    expect_device(1, &e1, "D3 free(a)");

    /* D4: malloc(500) rounds to 512; best fit is a's 1024-byte hole (smaller than the 2095104 tail),
     * so it lands at a; split (remainder 512): inactive_split_bytes -512. */
    CHECK_STATUS(accalloc_malloc(&c, 500, -1, NULL), ACCALLOC_OK);
    CHECK(c == a);
    SET2(e1, allocation, SMALL, 2, 2, 3, 1);
    SET2(e1, active, SMALL, 2, 2, 3, 1);
    SET2(e1, allocated_bytes, SMALL, 1536, 2048, 2560, 1024);
    SET2(e1, active_bytes, SMALL, 1536, 2048, 2560, 1024);
    SET2(e1, requested_bytes, SMALL, 1500, 2000, 2500, 1000);
    SET2(e1, inactive_split_bytes, SMALL, 2095616, 2096128, 2097152, 1536);
    expect_device(1, &e1, "D4 malloc(500) best fit");

    /* D5: free(b): merges with the 512 hole before it and the tail after it; c is still live, so the
     * merged block (2096640) is still an inactive split block. Net change of this one free, as PyTorch's
     * free_block applies it: inactive_split -1 (two merged, one new), inactive_split_bytes +1024
     * (-512 -2095104 +2096640). PyTorch nets the change before touching the Stat, so allocated/freed
     * move by the net amount only. */
    CHECK_STATUS(accalloc_free(b), ACCALLOC_OK);
    SET2(e1, allocation, SMALL, 1, 2, 3, 2);
    SET2(e1, active, SMALL, 1, 2, 3, 2);
    SET2(e1, allocated_bytes, SMALL, 512, 2048, 2560, 2048);
    SET2(e1, active_bytes, SMALL, 512, 2048, 2560, 2048);
    SET2(e1, requested_bytes, SMALL, 500, 2000, 2500, 2000);
    SET2(e1, inactive_split, SMALL, 1, 2, 2, 1);
    SET2(e1, inactive_split_bytes, SMALL, 2096640, 2096640, 2098176, 1536);
    expect_device(1, &e1, "D5 free(b) merges both sides, still split (PyTorch nets the change)");

    /* D6: free(c): merges into the whole segment: net -1, -2096640. */
    CHECK_STATUS(accalloc_free(c), ACCALLOC_OK);
    SET2(e1, allocation, SMALL, 0, 2, 3, 3);
    SET2(e1, active, SMALL, 0, 2, 3, 3);
    SET2(e1, allocated_bytes, SMALL, 0, 2048, 2560, 2560);
    SET2(e1, active_bytes, SMALL, 0, 2048, 2560, 2560);
    SET2(e1, requested_bytes, SMALL, 0, 2000, 2500, 2500);
    SET2(e1, inactive_split, SMALL, 0, 2, 2, 2);
    SET2(e1, inactive_split_bytes, SMALL, 0, 2096640, 2098176, 2098176);
    expect_device(1, &e1, "D6 free(c) whole segment again");

    /* D7: both resets on device 1 (by number while it is current): only the cached segment remains. */
    CHECK_STATUS(accalloc_reset_accumulated_memory_stats(1), ACCALLOC_OK);
    CHECK_STATUS(accalloc_reset_peak_memory_stats(1), ACCALLOC_OK);
    fresh_expected(&e1);
    SET2(e1, segment, SMALL, 1, 1, 0, 0);
    SET2(e1, reserved_bytes, SMALL, 2097152, 2097152, 0, 0);
    expect_device(1, &e1, "D7 resets with a cached segment");

    /* D8: exactly 1 MiB is still a small request: it reuses the cached 2 MiB segment (at its start),
     * which splits in two 1 MiB halves. */
    CHECK_STATUS(accalloc_malloc(&x, (size_t)MiB, -1, NULL), ACCALLOC_OK);
    CHECK(x == a);
    touch(x, (size_t)MiB, 0x66);
    SET2(e1, allocation, SMALL, 1, 1, 1, 0);
    SET2(e1, active, SMALL, 1, 1, 1, 0);
    SET2(e1, allocated_bytes, SMALL, 1048576, 1048576, 1048576, 0);
    SET2(e1, active_bytes, SMALL, 1048576, 1048576, 1048576, 0);
    SET2(e1, requested_bytes, SMALL, 1048576, 1048576, 1048576, 0);
    SET2(e1, inactive_split, SMALL, 1, 1, 1, 0);
    SET2(e1, inactive_split_bytes, SMALL, 1048576, 1048576, 1048576, 0);
    expect_device(1, &e1, "D8 malloc(1 MiB) small pool, cached segment reused");

    /* D9: 1 MiB + 1 rounds to 1049088: large pool, new 20 MiB segment, split (19922432 left). */
    CHECK_STATUS(accalloc_malloc(&y, (size_t)(MiB + 1), -1, NULL), ACCALLOC_OK);
    touch(y, (size_t)(MiB + 1), 0x77);
    SET(e1, allocation, ALL, 2, 2, 2, 0);
    SET(e1, allocation, LARGE, 1, 1, 1, 0);
    SET(e1, active, ALL, 2, 2, 2, 0);
    SET(e1, active, LARGE, 1, 1, 1, 0);
    SET(e1, allocated_bytes, ALL, 2097664, 2097664, 2097664, 0);
    SET(e1, allocated_bytes, LARGE, 1049088, 1049088, 1049088, 0);
    SET(e1, active_bytes, ALL, 2097664, 2097664, 2097664, 0);
    SET(e1, active_bytes, LARGE, 1049088, 1049088, 1049088, 0);
    SET(e1, requested_bytes, ALL, 2097153, 2097153, 2097153, 0);
    SET(e1, requested_bytes, LARGE, 1048577, 1048577, 1048577, 0);
    SET(e1, segment, ALL, 2, 2, 1, 0);
    SET(e1, segment, LARGE, 1, 1, 1, 0);
    SET(e1, reserved_bytes, ALL, 23068672, 23068672, 20971520, 0);
    SET(e1, reserved_bytes, LARGE, 20971520, 20971520, 20971520, 0);
    SET(e1, inactive_split, ALL, 2, 2, 2, 0);
    SET(e1, inactive_split, LARGE, 1, 1, 1, 0);
    SET(e1, inactive_split_bytes, ALL, 20971008, 20971008, 20971008, 0);
    SET(e1, inactive_split_bytes, LARGE, 19922432, 19922432, 19922432, 0);
    e1.num_device_alloc = 1;
    expect_device(1, &e1, "D9 malloc(1 MiB + 1) large pool");

    /* D10: 10 MiB fits in the 19922432-byte free block (best fit, no max_split_size): it is cut from it
     * right after y; 9436672 left, still split: inactive_split_bytes -10485760. */
    CHECK_STATUS(accalloc_malloc(&z, (size_t)(10 * MiB), -1, NULL), ACCALLOC_OK);
    CHECK((char *)z == (char *)y + 1049088);
    touch(z, (size_t)(10 * MiB), 0x78);
    SET(e1, allocation, ALL, 3, 3, 3, 0);
    SET(e1, allocation, LARGE, 2, 2, 2, 0);
    SET(e1, active, ALL, 3, 3, 3, 0);
    SET(e1, active, LARGE, 2, 2, 2, 0);
    SET(e1, allocated_bytes, ALL, 12583424, 12583424, 12583424, 0);
    SET(e1, allocated_bytes, LARGE, 11534848, 11534848, 11534848, 0);
    SET(e1, active_bytes, ALL, 12583424, 12583424, 12583424, 0);
    SET(e1, active_bytes, LARGE, 11534848, 11534848, 11534848, 0);
    SET(e1, requested_bytes, ALL, 12582913, 12582913, 12582913, 0);
    SET(e1, requested_bytes, LARGE, 11534337, 11534337, 11534337, 0);
    SET(e1, inactive_split_bytes, ALL, 10485248, 20971008, 20971008, 10485760);
    SET(e1, inactive_split_bytes, LARGE, 9436672, 19922432, 19922432, 10485760);
    expect_device(1, &e1, "D10 malloc(10 MiB) from the free tail");

    /* D11: 10 MiB + 1 rounds to 10486272: nothing free fits; >= 10 MiB -> segment rounded up to 2 MiB =
     * 12582912; remainder 2096640 > 1 MiB -> split. */
    CHECK_STATUS(accalloc_malloc(&w, (size_t)(10 * MiB + 1), 1, NULL), ACCALLOC_OK);
    touch(w, (size_t)(10 * MiB + 1), 0x79);
    CHECK((uintptr_t)y % 512 == 0 && (uintptr_t)z % 512 == 0 && (uintptr_t)w % 512 == 0);
    SET(e1, allocation, ALL, 4, 4, 4, 0);
    SET(e1, allocation, LARGE, 3, 3, 3, 0);
    SET(e1, active, ALL, 4, 4, 4, 0);
    SET(e1, active, LARGE, 3, 3, 3, 0);
    SET(e1, allocated_bytes, ALL, 23069696, 23069696, 23069696, 0);
    SET(e1, allocated_bytes, LARGE, 22021120, 22021120, 22021120, 0);
    SET(e1, active_bytes, ALL, 23069696, 23069696, 23069696, 0);
    SET(e1, active_bytes, LARGE, 22021120, 22021120, 22021120, 0);
    SET(e1, requested_bytes, ALL, 23068674, 23068674, 23068674, 0);
    SET(e1, requested_bytes, LARGE, 22020098, 22020098, 22020098, 0);
    SET(e1, segment, ALL, 3, 3, 2, 0);
    SET(e1, segment, LARGE, 2, 2, 2, 0);
    SET(e1, reserved_bytes, ALL, 35651584, 35651584, 33554432, 0);
    SET(e1, reserved_bytes, LARGE, 33554432, 33554432, 33554432, 0);
    SET(e1, inactive_split, ALL, 3, 3, 3, 0);
    SET(e1, inactive_split, LARGE, 2, 2, 2, 0);
    SET(e1, inactive_split_bytes, ALL, 12581888, 20971008, 23067648, 10485760);
    SET(e1, inactive_split_bytes, LARGE, 11533312, 19922432, 22019072, 10485760);
    e1.num_device_alloc = 2;
    expect_device(1, &e1, "D11 malloc(10 MiB + 1) own 12 MiB segment");
    expect_mem_info(1, (uint64_t)(GiB - 35651584), (uint64_t)GiB);

    /* the JSON view of a busy device */
    check_json(1, "D11 json");

    if (is_host()) {
        CHECK(((unsigned char *)x)[MiB - 1] == 0x66);
        CHECK(((unsigned char *)y)[MiB] == 0x77);
        CHECK(((unsigned char *)z)[10 * MiB - 1] == 0x78);
        CHECK(((unsigned char *)w)[10 * MiB] == 0x79);
    }

    /* D12: free x (merges: whole small segment), y (z live: +1), z (merges both sides: whole), w (whole). */
    CHECK_STATUS(accalloc_free(x), ACCALLOC_OK);
    CHECK_STATUS(accalloc_free(y), ACCALLOC_OK);
    CHECK_STATUS(accalloc_free(z), ACCALLOC_OK);
    CHECK_STATUS(accalloc_free(w), ACCALLOC_OK);
    SET(e1, allocation, ALL, 0, 4, 4, 4);
    SET(e1, allocation, SMALL, 0, 1, 1, 1);
    SET(e1, allocation, LARGE, 0, 3, 3, 3);
    SET(e1, active, ALL, 0, 4, 4, 4);
    SET(e1, active, SMALL, 0, 1, 1, 1);
    SET(e1, active, LARGE, 0, 3, 3, 3);
    SET(e1, allocated_bytes, ALL, 0, 23069696, 23069696, 23069696);
    SET(e1, allocated_bytes, SMALL, 0, 1048576, 1048576, 1048576);
    SET(e1, allocated_bytes, LARGE, 0, 22021120, 22021120, 22021120);
    SET(e1, active_bytes, ALL, 0, 23069696, 23069696, 23069696);
    SET(e1, active_bytes, SMALL, 0, 1048576, 1048576, 1048576);
    SET(e1, active_bytes, LARGE, 0, 22021120, 22021120, 22021120);
    SET(e1, requested_bytes, ALL, 0, 23068674, 23068674, 23068674);
    SET(e1, requested_bytes, SMALL, 0, 1048576, 1048576, 1048576);
    SET(e1, requested_bytes, LARGE, 0, 22020098, 22020098, 22020098);
    SET(e1, inactive_split, ALL, 0, 3, 4, 4);
    SET(e1, inactive_split, SMALL, 0, 1, 1, 1);
    SET(e1, inactive_split, LARGE, 0, 3, 3, 3);
    SET(e1, inactive_split_bytes, ALL, 0, 20971008, 24116736, 24116736);
    SET(e1, inactive_split_bytes, SMALL, 0, 1048576, 1048576, 1048576);
    SET(e1, inactive_split_bytes, LARGE, 0, 19922432, 23068160, 23068160);
    expect_device(1, &e1, "D12 all freed, three segments cached");

    CHECK_STATUS(accalloc_reset_accumulated_memory_stats(1), ACCALLOC_OK);
    CHECK_STATUS(accalloc_reset_peak_memory_stats(1), ACCALLOC_OK);
    fresh_expected(&e1);
    SET(e1, segment, ALL, 3, 3, 0, 0);
    SET(e1, segment, SMALL, 1, 1, 0, 0);
    SET(e1, segment, LARGE, 2, 2, 0, 0);
    SET(e1, reserved_bytes, ALL, 35651584, 35651584, 0, 0);
    SET(e1, reserved_bytes, SMALL, 2097152, 2097152, 0, 0);
    SET(e1, reserved_bytes, LARGE, 33554432, 33554432, 0, 0);
    expect_device(1, &e1, "D13 resets");
}

/* ------------------------------------------------------------------------------------------------ */
/* The per-process memory fraction, on device 1 (still current). */
static void section_fraction(void)
{
    void *f2 = NULL, *f4 = NULL, *p = NULL;
    double fraction = -1.0;

    /* No fraction set: 1.0, as torch.cuda.get_per_process_memory_fraction() says. */
    CHECK_STATUS(accalloc_get_memory_fraction(&fraction, 1), ACCALLOC_OK);
    CHECK(fraction == 1.0);
    CHECK_STATUS(accalloc_get_memory_fraction(NULL, 1), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_CONTAINS(accalloc_last_error_message(), "out is NULL");
    fraction = -1.0;
    CHECK_STATUS(accalloc_get_memory_fraction(&fraction, 2), ACCALLOC_ERROR_INVALID_DEVICE);
    CHECK(fraction == -1.0); /* untouched on error */

    /* Out of range or not a number: refused, nothing changes. */
    CHECK_STATUS(accalloc_set_memory_fraction(-0.1, 1), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK(strlen(accalloc_last_error_message()) > 0);
    CHECK_STATUS(accalloc_set_memory_fraction(1.0000001, 1), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_set_memory_fraction(2.0, 1), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_set_memory_fraction(NAN, 1), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_set_memory_fraction(INFINITY, 1), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_set_memory_fraction(-INFINITY, 1), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_set_memory_fraction(0.5, 2), ACCALLOC_ERROR_INVALID_DEVICE);
    CHECK_STATUS(accalloc_set_memory_fraction(0.5, -2), ACCALLOC_ERROR_INVALID_DEVICE);
    expect_device(1, &e1, "F0 after refused fractions");

    /* F1: fraction 0.5 -> 536870912 allowed. 600 MiB would pass it: refused without asking the device;
     * the cache is released (3 segments), the retry is refused too, OOM. */
    CHECK_STATUS(accalloc_set_memory_fraction(0.5, 1), ACCALLOC_OK);
    expect_device(1, &e1, "F1 setting the fraction changes no figure");
    /* 536870912 bytes of the 1 GiB device; device 0 keeps none set. */
    CHECK_STATUS(accalloc_get_memory_fraction(&fraction, 1), ACCALLOC_OK);
    CHECK(fraction == 0.5);
    CHECK_STATUS(accalloc_get_memory_fraction_on(accalloc_current_accelerator(), &fraction, 0), ACCALLOC_OK);
    CHECK(fraction == 1.0);
    CHECK_STATUS(accalloc_malloc(&p, (size_t)(600 * MiB), 1, NULL), ACCALLOC_ERROR_OUT_OF_MEMORY);
    CHECK_CONTAINS(accalloc_last_error_message(), "Tried to allocate 600.00 MiB");
    CHECK_CONTAINS(accalloc_last_error_message(), "Device 1");
    SET(e1, segment, ALL, 0, 3, 0, 3);
    SET(e1, segment, SMALL, 0, 1, 0, 1);
    SET(e1, segment, LARGE, 0, 2, 0, 2);
    SET(e1, reserved_bytes, ALL, 0, 35651584, 0, 35651584);
    SET(e1, reserved_bytes, SMALL, 0, 2097152, 0, 2097152);
    SET(e1, reserved_bytes, LARGE, 0, 33554432, 0, 33554432);
    e1.num_sync_all_streams = 1;
    e1.num_alloc_retries = 1;
    e1.num_ooms = 1;
    e1.num_device_free = 3;
    expect_device(1, &e1, "F1 malloc(600 MiB) over the fraction");

    /* F2: 400 MiB is within it (a segment of exactly 400 MiB, no split). */
    CHECK_STATUS(accalloc_malloc(&f2, (size_t)(400 * MiB), 1, NULL), ACCALLOC_OK);
    SET2(e1, allocation, LARGE, 1, 1, 1, 0);
    SET2(e1, active, LARGE, 1, 1, 1, 0);
    SET2(e1, allocated_bytes, LARGE, 419430400, 419430400, 419430400, 0);
    SET2(e1, active_bytes, LARGE, 419430400, 419430400, 419430400, 0);
    SET2(e1, requested_bytes, LARGE, 419430400, 419430400, 419430400, 0);
    SET(e1, segment, ALL, 1, 3, 1, 3);
    SET(e1, segment, LARGE, 1, 2, 1, 2);
    SET(e1, reserved_bytes, ALL, 419430400, 419430400, 419430400, 35651584);
    SET(e1, reserved_bytes, LARGE, 419430400, 419430400, 419430400, 33554432);
    e1.num_device_alloc = 1;
    expect_device(1, &e1, "F2 malloc(400 MiB) within the fraction");
    /* the fraction limits the allocator, not the device: mem_get_info still reports the device */
    expect_mem_info(1, (uint64_t)(GiB - 419430400), (uint64_t)GiB);

    /* F3: 400 + 200 MiB > 512 MiB: OOM; nothing cached to release. */
    CHECK_STATUS(accalloc_malloc(&p, (size_t)(200 * MiB), 1, NULL), ACCALLOC_ERROR_OUT_OF_MEMORY);
    CHECK_CONTAINS(accalloc_last_error_message(), "Tried to allocate 200.00 MiB");
    e1.num_sync_all_streams = 2;
    e1.num_alloc_retries = 2;
    e1.num_ooms = 2;
    expect_device(1, &e1, "F3 malloc(200 MiB) over the fraction");

    /* F4: fraction 1.0 (through device -1, the current one): 200 MiB fits now. */
    CHECK_STATUS(accalloc_set_memory_fraction(1.0, -1), ACCALLOC_OK);
    CHECK_STATUS(accalloc_get_memory_fraction(&fraction, -1), ACCALLOC_OK);
    CHECK(fraction == 1.0);
    CHECK_STATUS(accalloc_malloc(&f4, (size_t)(200 * MiB), 1, NULL), ACCALLOC_OK);
    SET2(e1, allocation, LARGE, 2, 2, 2, 0);
    SET2(e1, active, LARGE, 2, 2, 2, 0);
    SET2(e1, allocated_bytes, LARGE, 629145600, 629145600, 629145600, 0);
    SET2(e1, active_bytes, LARGE, 629145600, 629145600, 629145600, 0);
    SET2(e1, requested_bytes, LARGE, 629145600, 629145600, 629145600, 0);
    SET(e1, segment, ALL, 2, 3, 2, 3);
    SET(e1, segment, LARGE, 2, 2, 2, 2);
    SET(e1, reserved_bytes, ALL, 629145600, 629145600, 629145600, 35651584);
    SET(e1, reserved_bytes, LARGE, 629145600, 629145600, 629145600, 33554432);
    e1.num_device_alloc = 2;
    expect_device(1, &e1, "F4 fraction 1.0, malloc(200 MiB)");

    /* F5: free both (whole segments: cached). */
    CHECK_STATUS(accalloc_free(f2), ACCALLOC_OK);
    CHECK_STATUS(accalloc_free(f4), ACCALLOC_OK);
    SET2(e1, allocation, LARGE, 0, 2, 2, 2);
    SET2(e1, active, LARGE, 0, 2, 2, 2);
    SET2(e1, allocated_bytes, LARGE, 0, 629145600, 629145600, 629145600);
    SET2(e1, active_bytes, LARGE, 0, 629145600, 629145600, 629145600);
    SET2(e1, requested_bytes, LARGE, 0, 629145600, 629145600, 629145600);
    expect_device(1, &e1, "F5 frees");

    /* F6: fraction 0: not even a 2 MiB segment; both cached segments are released first. */
    CHECK_STATUS(accalloc_set_memory_fraction(0.0, 1), ACCALLOC_OK);
    CHECK_STATUS(accalloc_malloc(&p, 1000, 1, NULL), ACCALLOC_ERROR_OUT_OF_MEMORY);
    CHECK_CONTAINS(accalloc_last_error_message(), "Tried to allocate 2.00 MiB");
    SET(e1, segment, ALL, 0, 3, 2, 5);
    SET(e1, segment, LARGE, 0, 2, 2, 4);
    SET(e1, reserved_bytes, ALL, 0, 629145600, 629145600, 664797184);
    SET(e1, reserved_bytes, LARGE, 0, 629145600, 629145600, 662700032);
    e1.num_sync_all_streams = 3;
    e1.num_alloc_retries = 3;
    e1.num_ooms = 3;
    e1.num_device_free = 5;
    expect_device(1, &e1, "F6 fraction 0.0");
    expect_device(0, &e0, "F6 device 0 untouched by device 1's fraction");

    CHECK_STATUS(accalloc_set_memory_fraction(1.0, 1), ACCALLOC_OK);
    CHECK_STATUS(accalloc_set_device(0), ACCALLOC_OK);
}

/* ------------------------------------------------------------------------------------------------ */
/* Streams: a block is reused only on the stream it was allocated on (device 1, nothing cached). */
static void section_streams(void)
{
    void *const stream_a = accalloc_test_stream(1, 0x1000); /* opaque handles; NULL is the default stream */
    void *const stream_b = accalloc_test_stream(1, 0x2000);
    void *pa = NULL, *pd = NULL, *pa2 = NULL, *pb = NULL;
    int64_t v = -1, alloc0 = -1;

    CHECK_STATUS(accalloc_memory_stat(1, "num_device_alloc", &alloc0), ACCALLOC_OK);
    CHECK_STATUS(accalloc_memory_reserved(1, &v), ACCALLOC_OK);
    CHECK_EQ(v, 0);

    CHECK_STATUS(accalloc_malloc(&pa, 1000, 1, stream_a), ACCALLOC_OK);
    CHECK_STATUS(accalloc_free(pa), ACCALLOC_OK); /* cached: a whole 2 MiB segment of stream A */
    /* the default stream does not take stream A's cached segment: a new one */
    CHECK_STATUS(accalloc_malloc(&pd, 1000, 1, NULL), ACCALLOC_OK);
    CHECK(pd != pa);
    CHECK_STATUS(accalloc_memory_stat(1, "num_device_alloc", &v), ACCALLOC_OK);
    CHECK_EQ(v - alloc0, 2);
    CHECK_STATUS(accalloc_memory_stat(1, "segment.small_pool.current", &v), ACCALLOC_OK);
    CHECK_EQ(v, 2);
    /* stream A gets its own cached block back */
    CHECK_STATUS(accalloc_malloc(&pa2, 1000, 1, stream_a), ACCALLOC_OK);
    CHECK(pa2 == pa);
    CHECK_STATUS(accalloc_memory_stat(1, "num_device_alloc", &v), ACCALLOC_OK);
    CHECK_EQ(v - alloc0, 2);
    /* a third stream: a third segment, even though both others have room left */
    CHECK_STATUS(accalloc_malloc(&pb, 1000, 1, stream_b), ACCALLOC_OK);
    CHECK_STATUS(accalloc_memory_stat(1, "segment.small_pool.current", &v), ACCALLOC_OK);
    CHECK_EQ(v, 3);
    CHECK_STATUS(accalloc_memory_stat(1, "allocated_bytes.all.current", &v), ACCALLOC_OK);
    CHECK_EQ(v, 3072);
    CHECK_STATUS(accalloc_free(pd), ACCALLOC_OK);
    CHECK_STATUS(accalloc_free(pa2), ACCALLOC_OK);
    CHECK_STATUS(accalloc_free(pb), ACCALLOC_OK);

    CHECK_STATUS(accalloc_empty_cache(), ACCALLOC_OK);
    CHECK_STATUS(accalloc_memory_reserved(1, &v), ACCALLOC_OK);
    CHECK_EQ(v, 0);
    CHECK_STATUS(accalloc_reset_accumulated_memory_stats(1), ACCALLOC_OK);
    CHECK_STATUS(accalloc_reset_peak_memory_stats(1), ACCALLOC_OK);
    fresh_expected(&e1);
    e0.num_sync_all_streams += 1; /* that empty_cache synchronized device 0 as well */
    expect_device(1, &e1, "streams: device 1 released and reset");
    expect_device(0, &e0, "streams: device 0");
}

/* ------------------------------------------------------------------------------------------------ */
/* record_stream: a block used on another stream returns to the cache only once that stream's pending
 * work is done, checked at the start of the next malloc and forced by empty_cache (device 1). */
static void section_record_stream(void)
{
    void *const other = accalloc_test_stream(1, 0x3000);
    void *p = NULL, *p2 = NULL, *q = NULL;
    int local = 0;
    int64_t v = -1;
    int st;

    /* R1: malloc(1000) on device 1, as A1. */
    CHECK_STATUS(accalloc_malloc(&p, 1000, 1, NULL), ACCALLOC_OK);
    SET2(e1, allocation, SMALL, 1, 1, 1, 0);
    SET2(e1, segment, SMALL, 1, 1, 1, 0);
    SET2(e1, active, SMALL, 1, 1, 1, 0);
    SET2(e1, inactive_split, SMALL, 1, 1, 1, 0);
    SET2(e1, allocated_bytes, SMALL, 1024, 1024, 1024, 0);
    SET2(e1, reserved_bytes, SMALL, 2097152, 2097152, 2097152, 0);
    SET2(e1, active_bytes, SMALL, 1024, 1024, 1024, 0);
    SET2(e1, inactive_split_bytes, SMALL, 2096128, 2096128, 2096128, 0);
    SET2(e1, requested_bytes, SMALL, 1000, 1000, 1000, 0);
    e1.num_device_alloc = 1;
    expect_device(1, &e1, "R1 malloc(1000)");

    /* R2: record uses; errors for pointers that are not live allocations. Nothing moves. */
    CHECK_STATUS(accalloc_record_stream(p, other), ACCALLOC_OK);
    CHECK_STATUS(accalloc_record_stream(p, NULL), ACCALLOC_OK); /* its own stream: ignored */
    CHECK_STATUS(accalloc_record_stream(&local, other), ACCALLOC_ERROR_INVALID_POINTER);
    CHECK(strlen(accalloc_last_error_message()) > 0);
    CHECK_STATUS(accalloc_record_stream((char *)p + 512, other), ACCALLOC_ERROR_INVALID_POINTER);
    st = (int)accalloc_record_stream(NULL, other);
    CHECK(st == ACCALLOC_ERROR_INVALID_POINTER || st == ACCALLOC_ERROR_INVALID_ARGUMENT);
    expect_device(1, &e1, "R2 record_stream changes no figure");

    /* R3: free: allocation and allocated_bytes drop at once; the block waits for the other stream, so it
     * stays active (active, active_bytes, requested_bytes unchanged) and is not merged yet. */
    CHECK_STATUS(accalloc_free(p), ACCALLOC_OK);
    SET2(e1, allocation, SMALL, 0, 1, 1, 1);
    SET2(e1, allocated_bytes, SMALL, 0, 1024, 1024, 1024);
    expect_device(1, &e1, "R3 free with a recorded stream: pending");
    CHECK_STATUS(accalloc_free(p), ACCALLOC_ERROR_INVALID_POINTER);          /* already freed */
    CHECK_STATUS(accalloc_record_stream(p, other), ACCALLOC_ERROR_INVALID_POINTER); /* not live any more */
    expect_device(1, &e1, "R3 after refused calls on the pending block");

    /* R4: empty_cache synchronizes: the block returns (merges: whole segment), then the segment goes. */
    CHECK_STATUS(accalloc_empty_cache(), ACCALLOC_OK);
    SET2(e1, active, SMALL, 0, 1, 1, 1);
    SET2(e1, active_bytes, SMALL, 0, 1024, 1024, 1024);
    SET2(e1, requested_bytes, SMALL, 0, 1000, 1000, 1000);
    SET2(e1, inactive_split, SMALL, 0, 1, 1, 1);
    SET2(e1, inactive_split_bytes, SMALL, 0, 2096128, 2096128, 2096128);
    SET2(e1, segment, SMALL, 0, 1, 1, 1);
    SET2(e1, reserved_bytes, SMALL, 0, 2097152, 2097152, 2097152);
    e1.num_device_free = 1;
    e1.num_sync_all_streams = 1;
    e0.num_sync_all_streams += 1;
    expect_device(1, &e1, "R4 empty_cache completes the pending free");
    expect_device(0, &e0, "R4 device 0");

    /* R5: the next malloc checks pending frees first: the returned block is found again (same address,
     * no new segment). Own-stream uses are ignored: that free is immediate. */
    CHECK_STATUS(accalloc_malloc(&p2, 1000, 1, NULL), ACCALLOC_OK);
    CHECK_STATUS(accalloc_record_stream(p2, other), ACCALLOC_OK);
    CHECK_STATUS(accalloc_free(p2), ACCALLOC_OK);
    CHECK_STATUS(accalloc_memory_stat(1, "active.all.current", &v), ACCALLOC_OK);
    CHECK_EQ(v, 1); /* pending */
    CHECK_STATUS(accalloc_malloc(&q, 1000, 1, NULL), ACCALLOC_OK);
    CHECK(q == p2);
    CHECK_STATUS(accalloc_memory_stat(1, "num_device_alloc", &v), ACCALLOC_OK);
    CHECK_EQ(v, 2);
    CHECK_STATUS(accalloc_memory_stat(1, "active.all.current", &v), ACCALLOC_OK);
    CHECK_EQ(v, 1);
    CHECK_STATUS(accalloc_memory_stat(1, "allocation.all.current", &v), ACCALLOC_OK);
    CHECK_EQ(v, 1);
    CHECK_STATUS(accalloc_record_stream(q, NULL), ACCALLOC_OK);
    CHECK_STATUS(accalloc_free(q), ACCALLOC_OK);
    CHECK_STATUS(accalloc_memory_stat(1, "active.all.current", &v), ACCALLOC_OK);
    CHECK_EQ(v, 0); /* no other stream recorded: back in the cache at once */
    CHECK_STATUS(accalloc_memory_stat(1, "inactive_split.all.current", &v), ACCALLOC_OK);
    CHECK_EQ(v, 0);

    CHECK_STATUS(accalloc_empty_cache(), ACCALLOC_OK);
    e0.num_sync_all_streams += 1;
    CHECK_STATUS(accalloc_reset_accumulated_memory_stats(1), ACCALLOC_OK);
    CHECK_STATUS(accalloc_reset_peak_memory_stats(1), ACCALLOC_OK);
    fresh_expected(&e1);
    expect_device(1, &e1, "R6 device 1 released and reset");
    expect_device(0, &e0, "R6 device 0");
}

/* ------------------------------------------------------------------------------------------------ */
/* memory_summary (PyTorch's memory_summary() table), snapshot JSON and the event history (device 1). */
static char *text_call_summary(int32_t device, int32_t abbreviated)
{
    size_t len = 0, need, i;
    char *buf;
    int untouched = 1;
    CHECK_STATUS(accalloc_memory_summary(device, abbreviated, NULL, 0, &len), ACCALLOC_OK);
    need = len;
    buf = (char *)malloc(need + 16);
    if (buf == NULL || need < 2)
        return buf;
    memset(buf, 'Z', need + 16);
    len = 0;
    CHECK_STATUS(accalloc_memory_summary(device, abbreviated, buf, need - 1, &len), ACCALLOC_ERROR_BUFFER_TOO_SMALL);
    CHECK_EQ(len, need);
    for (i = 0; i < need + 16; ++i)
        if (buf[i] != 'Z')
            untouched = 0;
    CHECK(untouched);
    CHECK_STATUS(accalloc_memory_summary(device, abbreviated, buf, need, &len), ACCALLOC_OK);
    CHECK_EQ(strlen(buf) + 1, need);
    return buf;
}

static int count_lines_containing(const char *text, const char *needle)
{
    int n = 0;
    const char *p = text;
    while ((p = strstr(p, needle)) != NULL) {
        ++n;
        p += strlen(needle);
    }
    return n;
}

/* Every line of the box is 77 characters: "|", 75 inside, "|". */
static void check_box(const char *text, const char *what)
{
    const char *line = text;
    int lines = 0, bad = 0;
    while (*line) {
        const char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line) : strlen(line);
        if (n != 77 || line[0] != '|' || line[n - 1] != '|') {
            if (bad == 0)
                fprintf(stderr, "FAIL %s: line %d is %u characters: \"%.*s\"\n", what, lines + 1, (unsigned)n, (int)n,
                        line);
            ++bad;
        }
        ++lines;
        if (!end)
            break;
        line = end + 1;
    }
    ++g_checks;
    if (bad || lines < 10)
        ++g_failures;
}

static void section_summary_snapshot(void)
{
    void *a = NULL, *b = NULL, *p = NULL;
    char *text;
    size_t len = 0, need, i;
    int untouched;

    /* one counted OOM on device 1 (fraction 0), then 1000 B (small) and 3 MiB (large) live */
    CHECK_STATUS(accalloc_set_memory_fraction(0.0, 1), ACCALLOC_OK);
    CHECK_STATUS(accalloc_malloc(&p, 1000, 1, NULL), ACCALLOC_ERROR_OUT_OF_MEMORY);
    CHECK_STATUS(accalloc_set_memory_fraction(1.0, 1), ACCALLOC_OK);
    CHECK_STATUS(accalloc_malloc(&a, 1000, 1, NULL), ACCALLOC_OK);
    CHECK_STATUS(accalloc_malloc(&b, (size_t)(3 * MiB), 1, NULL), ACCALLOC_OK);

    text = text_call_summary(1, 0);
    if (text != NULL) {
        check_box(text, "memory_summary(1, full)");
        CHECK_CONTAINS(text, "memory summary, device ID 1");
        CHECK_CONTAINS(text, "OOMs: 1 ");
        CHECK_CONTAINS(text, "retries: 1 ");
        CHECK_CONTAINS(text, "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |");
        /* figures in PyTorch's formatting: sizes in the unit of the row's "all" figure, counts */
        CHECK_CONTAINS(text, "| Allocated memory      |   3073 KiB |   3073 KiB |   3073 KiB |      0 B   |");
        CHECK_CONTAINS(text, "|       from large pool |   3072 KiB |   3072 KiB |   3072 KiB |      0 B   |");
        CHECK_CONTAINS(text, "|       from small pool |      1 KiB |      1 KiB |      1 KiB |      0 B   |");
        CHECK_CONTAINS(text, "| Requested memory      |   3072 KiB |   3072 KiB |   3072 KiB |      0 B   |");
        CHECK_CONTAINS(text, "| Reserved memory       |  22528 KiB |  22528 KiB |  22528 KiB |      0 B   |");
        CHECK_CONTAINS(text, "| Non-releasable memory |  19455 KiB |  19455 KiB |  19455 KiB |      0 B   |");
        CHECK_CONTAINS(text, "| Allocations           |       2    |       2    |       2    |       0    |");
        CHECK_CONTAINS(text, "| Active allocs         |       2    |       2    |       2    |       0    |");
        CHECK_CONTAINS(text, "| Reserved segments     |       2    |       2    |       2    |       0    |");
        CHECK_CONTAINS(text, "| Non-releasable allocs |       2    |       2    |       2    |       0    |");
        CHECK_CONTAINS(text, "| Oversize allocations  |       0    |       0    |       0    |       0    |");
        CHECK_CONTAINS(text, "| Oversize segments     |       0    |       0    |       0    |       0    |");
        CHECK_EQ(count_lines_containing(text, "from large pool"), 9);
        CHECK_EQ(count_lines_containing(text, "from small pool"), 9);
        free(text);
    }
    text = text_call_summary(-1, 1); /* device -1 = current = 0 here, abbreviated */
    if (text != NULL) {
        check_box(text, "memory_summary(-1, abbreviated)");
        CHECK_CONTAINS(text, "memory summary, device ID 0");
        CHECK_CONTAINS(text, "| Allocated memory      |");
        CHECK_CONTAINS(text, "| Oversize segments     |");
        CHECK_EQ(count_lines_containing(text, "from large pool"), 0);
        CHECK_EQ(count_lines_containing(text, "from small pool"), 0);
        free(text);
    }
    CHECK_STATUS(accalloc_memory_summary(1, 0, NULL, 0, NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_memory_summary(2, 0, NULL, 0, &len), ACCALLOC_ERROR_INVALID_DEVICE);
    CHECK_STATUS(accalloc_memory_summary(-2, 1, NULL, 0, &len), ACCALLOC_ERROR_INVALID_DEVICE);

    /* snapshot: the same calling convention as memory_stats_json */
    CHECK_STATUS(accalloc_memory_snapshot_json(NULL, 0, NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_memory_snapshot_json(NULL, 0, &len), ACCALLOC_OK);
    need = len;
    text = (char *)malloc(need + 16);
    if (text != NULL) {
        memset(text, 'Z', need + 16);
        CHECK_STATUS(accalloc_memory_snapshot_json(text, need - 1, &len), ACCALLOC_ERROR_BUFFER_TOO_SMALL);
        CHECK_EQ(len, need);
        untouched = 1;
        for (i = 0; i < need + 16; ++i)
            if (text[i] != 'Z')
                untouched = 0;
        CHECK(untouched);
        CHECK_STATUS(accalloc_memory_snapshot_json(text, need, &len), ACCALLOC_OK);
        CHECK_EQ(strlen(text) + 1, need);
        CHECK(text[0] == '{' && text[need - 2] == '}');
        CHECK_CONTAINS(text, "\"segments\"");
        CHECK_CONTAINS(text, "\"device_traces\"");
        CHECK_CONTAINS(text, "\"allocator_settings\"");
        CHECK_CONTAINS(text, "\"active_allocated\"");
        CHECK_CONTAINS(text, "\"small\"");
        CHECK_CONTAINS(text, "\"large\"");
        free(text);
    }

    /* history: enabling with no room is refused; a malloc/free pair shows up as events */
    CHECK_STATUS(accalloc_record_memory_history(1, 0), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_record_memory_history(1, 64), ACCALLOC_OK);
    CHECK_STATUS(accalloc_free(a), ACCALLOC_OK);
    CHECK_STATUS(accalloc_memory_snapshot_json(NULL, 0, &len), ACCALLOC_OK);
    text = (char *)malloc(len);
    if (text != NULL) {
        CHECK_STATUS(accalloc_memory_snapshot_json(text, len, &len), ACCALLOC_OK);
        CHECK_CONTAINS(text, "free_requested");
        CHECK_CONTAINS(text, "free_completed");
        CHECK(strstr(text, "\"segment_alloc\"") == NULL); /* nothing else happened since it started */
        free(text);
    }
    CHECK_STATUS(accalloc_record_memory_history(0, 0), ACCALLOC_OK);
    CHECK_STATUS(accalloc_free(b), ACCALLOC_OK);
    expect_device(0, &e0, "summary/snapshot: device 0 untouched");

    CHECK_STATUS(accalloc_empty_cache(), ACCALLOC_OK);
    e0.num_sync_all_streams += 1;
    CHECK_STATUS(accalloc_reset_accumulated_memory_stats(1), ACCALLOC_OK);
    CHECK_STATUS(accalloc_reset_peak_memory_stats(1), ACCALLOC_OK);
    fresh_expected(&e1);
    expect_device(1, &e1, "summary/snapshot: device 1 released and reset");
}

/* ------------------------------------------------------------------------------------------------ */
/* accalloc_allocation_info: what a profiler is told of a live allocation, worked out by hand. */
static void section_allocation_info(void)
{
    void *p = NULL, *q = NULL;
    uint64_t size = 7;
    AccallocDeviceType type = -1;
    int32_t device = -1;
    int local = 0;

    /* 1000 bytes round up to 1024 (a multiple of 512), on device 1 of the current accelerator. */
    CHECK_STATUS(accalloc_malloc(&p, 1000, 1, NULL), ACCALLOC_OK);
    CHECK_STATUS(accalloc_allocation_info(p, &size, &type, &device), ACCALLOC_OK);
    CHECK_EQ(size, 1024);
    CHECK_EQ(type, accalloc_current_accelerator());
    CHECK_EQ(device, 1);
    /* 3 MiB + 1 byte: a large-pool block of 3 MiB + 512, the size memory_allocated counts. */
    CHECK_STATUS(accalloc_malloc(&q, (3u << 20) + 1, 0, NULL), ACCALLOC_OK);
    CHECK_STATUS(accalloc_allocation_info(q, &size, NULL, NULL), ACCALLOC_OK);
    CHECK_EQ(size, (3u << 20) + 512);
    {
        int64_t allocated = -1;
        CHECK_STATUS(accalloc_memory_allocated(0, &allocated), ACCALLOC_OK);
        CHECK_EQ(allocated, (int64_t)size);
    }
    /* Not the start of a block, a freed block, no block at all: INVALID_POINTER, nothing stored. */
    size = 7;
    CHECK_STATUS(accalloc_allocation_info((char *)p + 512, &size, &type, &device), ACCALLOC_ERROR_INVALID_POINTER);
    CHECK_STATUS(accalloc_free(p), ACCALLOC_OK);
    CHECK_STATUS(accalloc_allocation_info(p, &size, &type, &device), ACCALLOC_ERROR_INVALID_POINTER);
    CHECK_STATUS(accalloc_allocation_info(&local, &size, &type, &device), ACCALLOC_ERROR_INVALID_POINTER);
    CHECK_STATUS(accalloc_allocation_info(NULL, &size, &type, &device), ACCALLOC_ERROR_INVALID_POINTER);
    CHECK_EQ(size, 7);
    CHECK_EQ(device, 1);
    CHECK_STATUS(accalloc_allocation_info(q, NULL, &type, &device), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_free(q), ACCALLOC_OK);
    /* Both devices released and reset, as the next sections expect them. */
    CHECK_STATUS(accalloc_empty_cache(), ACCALLOC_OK);
    for (device = 0; device < 2; device++) {
        CHECK_STATUS(accalloc_reset_accumulated_memory_stats(device), ACCALLOC_OK);
        CHECK_STATUS(accalloc_reset_peak_memory_stats(device), ACCALLOC_OK);
    }
    fresh_expected(&e0);
    fresh_expected(&e1);
    expect_device(0, &e0, "allocation_info: device 0 released and reset");
    expect_device(1, &e1, "allocation_info: device 1 released and reset");
}

/* ------------------------------------------------------------------------------------------------ */
/* Every argument error of every function: the right status, a message, and no figure moves. */
static void section_errors(void)
{
    AccallocDeviceStats s;
    int64_t v = 0;
    uint64_t fr = 0, tot = 0;
    int32_t n = 0, cur = -1;
    size_t len = 0;
    char buf[16];
    void *p = NULL;
    int local = 0;
    static const char *const bad_keys[] = {
        "bogus.key", "", "allocated_bytes", "allocated_bytes.all", "allocated_bytes.all.current ",
        "Allocated_bytes.all.current", "allocated.all.current" /* PyTorch's docstring typo, not a key */,
        "allocated_bytes.all.current.extra", "allocated_bytes.medium_pool.current", "oversize_allocations.all.current",
        "num_ooms.current",
    };
    size_t i;

    /* accalloc_malloc */
    CHECK_STATUS(accalloc_malloc(NULL, 1000, 0, NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    p = &local;
    CHECK_STATUS(accalloc_malloc(&p, 1000, 2, NULL), ACCALLOC_ERROR_INVALID_DEVICE);
    CHECK(p == (void *)&local); /* on error *out is not touched */
    CHECK_CONTAINS(accalloc_last_error_message(), "2");
    CHECK_STATUS(accalloc_malloc(&p, 1000, -2, NULL), ACCALLOC_ERROR_INVALID_DEVICE);
    CHECK_STATUS(accalloc_malloc(&p, 1000, INT32_MAX, NULL), ACCALLOC_ERROR_INVALID_DEVICE);
    CHECK_STATUS(accalloc_malloc(&p, 1000, INT32_MIN, NULL), ACCALLOC_ERROR_INVALID_DEVICE);
    /* accalloc_free */
    CHECK_STATUS(accalloc_free(&local), ACCALLOC_ERROR_INVALID_POINTER);
    CHECK_STATUS(accalloc_free((void *)(uintptr_t)0x1000), ACCALLOC_ERROR_INVALID_POINTER);
    /* accalloc_get_device_stats */
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    CHECK_STATUS(accalloc_get_device_stats(0, NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_get_device_stats(2, &s), ACCALLOC_ERROR_INVALID_DEVICE);
    CHECK_STATUS(accalloc_get_device_stats(-2, &s), ACCALLOC_ERROR_INVALID_DEVICE);
    /* the four getters */
    CHECK_STATUS(accalloc_memory_allocated(0, NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_memory_allocated(2, &v), ACCALLOC_ERROR_INVALID_DEVICE);
    CHECK_STATUS(accalloc_max_memory_allocated(0, NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_max_memory_allocated(2, &v), ACCALLOC_ERROR_INVALID_DEVICE);
    CHECK_STATUS(accalloc_memory_reserved(0, NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_memory_reserved(-2, &v), ACCALLOC_ERROR_INVALID_DEVICE);
    CHECK_STATUS(accalloc_max_memory_reserved(0, NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_max_memory_reserved(2, &v), ACCALLOC_ERROR_INVALID_DEVICE);
    /* resets */
    CHECK_STATUS(accalloc_reset_accumulated_memory_stats(2), ACCALLOC_ERROR_INVALID_DEVICE);
    CHECK_STATUS(accalloc_reset_accumulated_memory_stats(-2), ACCALLOC_ERROR_INVALID_DEVICE);
    CHECK_STATUS(accalloc_reset_peak_memory_stats(2), ACCALLOC_ERROR_INVALID_DEVICE);
    CHECK_STATUS(accalloc_reset_peak_memory_stats(-2), ACCALLOC_ERROR_INVALID_DEVICE);
    /* accalloc_memory_stat */
    CHECK_STATUS(accalloc_memory_stat(0, NULL, &v), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_memory_stat(0, "allocated_bytes.all.current", NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_memory_stat(2, "allocated_bytes.all.current", &v), ACCALLOC_ERROR_INVALID_DEVICE);
    for (i = 0; i < sizeof bad_keys / sizeof bad_keys[0]; ++i) {
        int st = (int)accalloc_memory_stat(0, bad_keys[i], &v);
        ++g_checks;
        if (st != ACCALLOC_ERROR_INVALID_ARGUMENT) {
            ++g_failures;
            fprintf(stderr, "FAIL accalloc_memory_stat(0, \"%s\") returned %s, expected ACCALLOC_ERROR_INVALID_ARGUMENT\n",
                    bad_keys[i], accalloc_status_name((AccallocStatus)st));
        }
    }
    CHECK_STATUS(accalloc_memory_stat(0, "bogus.key", &v), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_CONTAINS(accalloc_last_error_message(), "bogus.key"); /* the message names the key */
    /* accalloc_memory_stats_json */
    CHECK_STATUS(accalloc_memory_stats_json(0, buf, sizeof buf, NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_memory_stats_json(2, NULL, 0, &len), ACCALLOC_ERROR_INVALID_DEVICE);
    CHECK_STATUS(accalloc_memory_stats_json(0, buf, sizeof buf, &len), ACCALLOC_ERROR_BUFFER_TOO_SMALL);
    /* accalloc_mem_get_info */
    CHECK_STATUS(accalloc_mem_get_info(0, NULL, &tot), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_mem_get_info(0, &fr, NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_mem_get_info(2, &fr, &tot), ACCALLOC_ERROR_INVALID_DEVICE);
    /* accalloc_set_memory_fraction */
    CHECK_STATUS(accalloc_set_memory_fraction(-1.0, 0), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_set_memory_fraction(0.5, 2), ACCALLOC_ERROR_INVALID_DEVICE);
    /* device functions */
    CHECK_STATUS(accalloc_device_count(NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_current_device(NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_set_device(2), ACCALLOC_ERROR_INVALID_DEVICE);
    CHECK_STATUS(accalloc_set_device(7), ACCALLOC_ERROR_INVALID_DEVICE);
    CHECK_CONTAINS(accalloc_last_error_message(), "7"); /* the message names the device */
    CHECK_STATUS(accalloc_set_device(-2), ACCALLOC_ERROR_INVALID_DEVICE);
    CHECK_STATUS(accalloc_current_device(&cur), ACCALLOC_OK);
    CHECK_EQ(cur, 0); /* a refused set_device leaves the current device alone */
    CHECK_STATUS(accalloc_device_count(&n), ACCALLOC_OK);
    CHECK_EQ(n, 2);

    expect_device(0, &e0, "after the argument errors, device 0");
    expect_device(1, &e1, "after the argument errors, device 1");

    /* A size whose rounding would overflow: refused (out of memory or invalid argument), never a crash;
     * no block is handed out. */
    {
        int st = (int)accalloc_malloc(&p, SIZE_MAX, 0, NULL);
        CHECK(st == ACCALLOC_ERROR_OUT_OF_MEMORY || st == ACCALLOC_ERROR_INVALID_ARGUMENT);
        CHECK_STATUS(accalloc_memory_stat(0, "allocation.all.allocated", &v), ACCALLOC_OK);
        CHECK_EQ(v, e0.allocation[ALL].allocated);
        CHECK_STATUS(accalloc_memory_stat(0, "reserved_bytes.all.current", &v), ACCALLOC_OK);
        CHECK_EQ(v, 0);
        st = (int)accalloc_malloc(&p, SIZE_MAX - 100, 0, NULL);
        CHECK(st == ACCALLOC_ERROR_OUT_OF_MEMORY || st == ACCALLOC_ERROR_INVALID_ARGUMENT);
        CHECK_STATUS(accalloc_memory_stat(0, "allocated_bytes.all.current", &v), ACCALLOC_OK);
        CHECK_EQ(v, 0);
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* The current device and the last error are per thread. */
struct thread_report {
    int32_t device_at_start;
    int32_t device_after_set;
    int malloc_status;
    int free_status;
    int bad_set_status;
    char initial_message[64];
    char error_message[256];
};

/* Pinned host memory: the host caching allocator, PyTorch's figures worked out by hand
 * (torch.ones(10 * 1024, pin_memory=True) is 40,960 bytes, rounded to 65,536). */
static int64_t host_stat(const char *key)
{
    int64_t v = -1;
    CHECK_STATUS(accalloc_host_memory_stat(key, &v), ACCALLOC_OK);
    return v;
}

static void section_pinned_host(void)
{
    void *a = NULL, *b = NULL, *c = NULL;
    void *const stream = accalloc_test_stream(1, 0x5000);
    bool flag = false;
    size_t len = 0;
    char *json;
    int64_t v = -1;

    CHECK_STATUS(accalloc_host_malloc(&a, 0), ACCALLOC_OK);
    CHECK(a == NULL); /* 0 bytes: NULL, as PyTorch */
    CHECK_STATUS(accalloc_host_malloc(&a, 40960), ACCALLOC_OK);
    CHECK(a != NULL);
    if (a != NULL)
        memset(a, 0x5A, 65536); /* the whole rounded block is the caller's */
    CHECK_EQ(host_stat("allocations.current"), 1);
    CHECK_EQ(host_stat("allocated_bytes.current"), 65536);
    CHECK_EQ(host_stat("active_requests.current"), 1);
    CHECK_EQ(host_stat("active_bytes.current"), 65536);
    CHECK_EQ(host_stat("num_host_alloc"), 1);
    CHECK_EQ(host_stat("host_alloc_time.count"), 1);
    /* The device's books do not see pinned memory. */
    CHECK_STATUS(accalloc_memory_reserved(0, &v), ACCALLOC_OK);
    CHECK_EQ(v, 0);

    CHECK_STATUS(accalloc_host_is_pinned((char *)a + 65535, &flag), ACCALLOC_OK);
    CHECK(flag);
    CHECK_STATUS(accalloc_host_is_pinned((char *)a + 65536, &flag), ACCALLOC_OK);
    CHECK(!flag);
    CHECK_STATUS(accalloc_host_is_pinned(&flag, &flag), ACCALLOC_OK);
    CHECK(!flag);
    CHECK_STATUS(accalloc_host_is_pinned(a, NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);

    /* empty_host_cache while the block is handed out changes nothing. */
    CHECK_STATUS(accalloc_host_empty_cache(), ACCALLOC_OK);
    CHECK_EQ(host_stat("allocations.current"), 1);

    /* A copy on device 1's other stream used it: freed, it waits for that stream (the host's
     * events complete at once, so the next allocation finds it reusable). */
    flag = false;
    CHECK_STATUS(accalloc_host_record_stream((char *)a + 100, 1, stream, &flag), ACCALLOC_OK);
    CHECK(flag);
    CHECK_STATUS(accalloc_host_record_stream(&flag, 0, stream, &flag), ACCALLOC_OK);
    CHECK(!flag); /* not pinned memory: nothing to record, not an error */
    CHECK_STATUS(accalloc_host_record_stream(a, 7, stream, NULL), ACCALLOC_ERROR_INVALID_DEVICE);
    CHECK_STATUS(accalloc_host_free(a), ACCALLOC_OK);
    CHECK_STATUS(accalloc_host_free(a), ACCALLOC_ERROR_INVALID_POINTER); /* twice */
    CHECK_STATUS(accalloc_host_free((char *)a + 8), ACCALLOC_ERROR_INVALID_POINTER);
    CHECK_STATUS(accalloc_host_free(&flag), ACCALLOC_ERROR_INVALID_POINTER);
    CHECK_STATUS(accalloc_host_free(NULL), ACCALLOC_OK);
    CHECK_STATUS(accalloc_host_record_stream(a, 0, stream, NULL), ACCALLOC_ERROR_INVALID_POINTER);

    /* 50,000 bytes round to 65,536 too: the cached block comes back. 70,000 round to 131,072: new. */
    CHECK_STATUS(accalloc_host_malloc(&b, 50000), ACCALLOC_OK);
    CHECK(b == a);
    CHECK_STATUS(accalloc_host_malloc(&c, 70000), ACCALLOC_OK);
    CHECK(c != NULL && c != a);
    CHECK_EQ(host_stat("allocations.current"), 2);
    CHECK_EQ(host_stat("allocated_bytes.current"), 65536 + 131072);
    CHECK_EQ(host_stat("active_requests.current"), 2);
    CHECK_EQ(host_stat("active_requests.allocated"), 3);
    CHECK_EQ(host_stat("active_requests.freed"), 1);
    /* Each power of two's peak counts: 1 (65,536) + 1 (131,072). */
    CHECK_EQ(host_stat("active_requests.peak"), 2);
    CHECK_EQ(host_stat("num_host_alloc"), 2);

    CHECK_STATUS(accalloc_host_free(b), ACCALLOC_OK);
    CHECK_STATUS(accalloc_host_free(c), ACCALLOC_OK);
    CHECK_STATUS(accalloc_host_empty_cache(), ACCALLOC_OK);
    CHECK_EQ(host_stat("allocations.current"), 0);
    CHECK_EQ(host_stat("allocated_bytes.freed"), 65536 + 131072);
    CHECK_EQ(host_stat("num_host_free"), 2);
    CHECK_EQ(host_stat("host_free_time.count"), 2);

    CHECK_STATUS(accalloc_host_memory_stats_json(NULL, 0, &len), ACCALLOC_OK);
    json = (char *)malloc(len);
    if (json != NULL) {
        CHECK_STATUS(accalloc_host_memory_stats_json(json, 4, &len), ACCALLOC_ERROR_BUFFER_TOO_SMALL);
        CHECK_STATUS(accalloc_host_memory_stats_json(json, len, &len), ACCALLOC_OK);
        CHECK_CONTAINS(json, "\"allocations.peak\":2,");
        CHECK_CONTAINS(json, "\"num_host_alloc\":2,\"num_host_free\":2,");
        free(json);
    }
    CHECK_STATUS(accalloc_host_memory_stats_json(NULL, 0, NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_host_memory_stat("allocations", &v), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_CONTAINS(accalloc_last_error_message(), "unknown pinned host statistic 'allocations'");
    CHECK_STATUS(accalloc_host_memory_stat(NULL, &v), ACCALLOC_ERROR_INVALID_ARGUMENT);

    CHECK_STATUS(accalloc_host_reset_peak_memory_stats(), ACCALLOC_OK);
    CHECK_EQ(host_stat("allocations.peak"), 0);
    CHECK_EQ(host_stat("host_alloc_time.max"), 0);
    CHECK_STATUS(accalloc_host_reset_accumulated_memory_stats(), ACCALLOC_OK);
    CHECK_EQ(host_stat("num_host_alloc"), 0);
    CHECK_EQ(host_stat("allocated_bytes.freed"), 0);
    CHECK_EQ(host_stat("host_free_time.count"), 0);

    CHECK_STATUS(accalloc_host_malloc(NULL, 8), ACCALLOC_ERROR_INVALID_ARGUMENT);

    /* pinned_max_cached_size_mb:0: a freed block goes straight back; a limit as large as memory
     * restores the default (and leaves the settings string as it was). */
    CHECK_STATUS(accalloc_set_allocator_settings("pinned_max_cached_size_mb:0"), ACCALLOC_OK);
    CHECK_STATUS(accalloc_host_malloc(&a, 100), ACCALLOC_OK);
    CHECK_EQ(host_stat("allocated_bytes.current"), 100); /* above the limit: not rounded either */
    CHECK_STATUS(accalloc_host_free(a), ACCALLOC_OK);
    CHECK_EQ(host_stat("allocations.current"), 0);
    CHECK_EQ(host_stat("num_host_free"), 1);
    CHECK_STATUS(accalloc_set_allocator_settings("pinned_max_cached_size_mb:99999999999999999"), ACCALLOC_OK);
    {
        char settings[256];
        CHECK_STATUS(accalloc_get_allocator_settings(settings, sizeof settings, &len), ACCALLOC_OK);
        CHECK_STR(settings, "");
    }
}

static void *thread_body(void *arg)
{
    struct thread_report *r = (struct thread_report *)arg;
    void *p = NULL;
    snprintf(r->initial_message, sizeof r->initial_message, "%s", accalloc_last_error_message());
    r->device_at_start = -1;
    (void)accalloc_current_device(&r->device_at_start);
    if (accalloc_set_device(1) == ACCALLOC_OK)
        (void)accalloc_current_device(&r->device_after_set);
    r->malloc_status = (int)accalloc_malloc(&p, 4096, -1, NULL); /* device -1: this thread's device 1 */
    r->free_status = (int)accalloc_free(p);
    r->bad_set_status = (int)accalloc_set_device(9);
    snprintf(r->error_message, sizeof r->error_message, "%s", accalloc_last_error_message());
    return NULL;
}

static void *thread_device_only(void *arg)
{
    int32_t *d = (int32_t *)arg;
    *d = -1;
    (void)accalloc_current_device(d);
    return NULL;
}

static void section_threads(void)
{
    pthread_t t;
    struct thread_report r;
    int64_t before1 = -1, after1 = -1, before0 = -1, after0 = -1, v = 0;
    char main_message[256];
    int32_t cur = -1, seen = 7;

    memset(&r, 0, sizeof r);
    CHECK_STATUS(accalloc_set_device(0), ACCALLOC_OK);
    CHECK_STATUS(accalloc_memory_stat(0, "no.such.key", &v), ACCALLOC_ERROR_INVALID_ARGUMENT);
    snprintf(main_message, sizeof main_message, "%s", accalloc_last_error_message());
    CHECK(strlen(main_message) > 0);
    CHECK_STATUS(accalloc_memory_stat(0, "allocation.all.allocated", &before0), ACCALLOC_OK);
    CHECK_STATUS(accalloc_memory_stat(1, "allocation.all.allocated", &before1), ACCALLOC_OK);

    CHECK(pthread_create(&t, NULL, thread_body, &r) == 0);
    CHECK(pthread_join(t, NULL) == 0);

    CHECK_STR(r.initial_message, ""); /* a new thread has had no failure */
    CHECK_EQ(r.device_at_start, 0);   /* and starts on device 0, whatever other threads chose */
    CHECK_EQ(r.device_after_set, 1);
    CHECK_EQ(r.malloc_status, ACCALLOC_OK);
    CHECK_EQ(r.free_status, ACCALLOC_OK);
    CHECK_EQ(r.bad_set_status, ACCALLOC_ERROR_INVALID_DEVICE);
    CHECK(strlen(r.error_message) > 0);
    CHECK(strcmp(r.error_message, main_message) != 0);
    CHECK_STR(accalloc_last_error_message(), main_message); /* the thread's failure is not ours */
    CHECK_STATUS(accalloc_current_device(&cur), ACCALLOC_OK);
    CHECK_EQ(cur, 0); /* the thread's accalloc_set_device(1) is not ours */
    CHECK_STATUS(accalloc_memory_stat(0, "allocation.all.allocated", &after0), ACCALLOC_OK);
    CHECK_STATUS(accalloc_memory_stat(1, "allocation.all.allocated", &after1), ACCALLOC_OK);
    CHECK_EQ(after0 - before0, 0);
    CHECK_EQ(after1 - before1, 1); /* the thread's malloc(-1) went to its device 1 */

    /* and the other way: our device does not leak into a new thread */
    CHECK_STATUS(accalloc_set_device(1), ACCALLOC_OK);
    CHECK(pthread_create(&t, NULL, thread_device_only, &seen) == 0);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_EQ(seen, 0);
    CHECK_STATUS(accalloc_set_device(0), ACCALLOC_OK);
}


/* ------------------------------------------------------------------------------------------------ */
/* Allocator settings (PYTORCH_ALLOC_CONF syntax): max_split_size_mb and roundup_power2_divisions. */
static void get_settings(char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    CHECK_STATUS(accalloc_get_allocator_settings(buf, cap, &len), ACCALLOC_OK);
    CHECK_EQ(len, strlen(buf) + 1);
}

/* allocated_bytes.all.current of device 0 after malloc(size) there (then freed): the rounded size. */
static int64_t rounded_by_library(size_t size)
{
    void *p = NULL;
    int64_t before = -1, after = -1;
    CHECK_STATUS(accalloc_memory_allocated(0, &before), ACCALLOC_OK);
    CHECK_STATUS(accalloc_malloc(&p, size, 0, NULL), ACCALLOC_OK);
    CHECK_STATUS(accalloc_memory_allocated(0, &after), ACCALLOC_OK);
    CHECK_STATUS(accalloc_free(p), ACCALLOC_OK);
    CHECK_STATUS(accalloc_empty_cache(), ACCALLOC_OK);
    return after - before;
}

static void section_settings(void)
{
    char buf[512], saved[512], tiny[4];
    size_t len = 0;
    int64_t v = -1, alloc0 = -1;
    void *big = NULL, *c1 = NULL, *c2 = NULL, *r = NULL, *h1 = NULL, *h2 = NULL, *h3 = NULL;
    static const char *const bad[][2] = {
        /* conf, a word the message must contain */
        {"bogus_key:1", "bogus_key"},
        {"max_split_size_mb:19", "max_split_size_mb"}, /* must be >= 20 */
        {"max_split_size_mb:abc", "max_split_size_mb"},
        {"roundup_power2_divisions:3", "roundup_power2_divisions"}, /* not a power of 2 */
        {"garbage_collection_threshold:1.0", "garbage_collection_threshold"}, /* 0 < t < 1 */
        {"garbage_collection_threshold:0", "garbage_collection_threshold"},
        {"expandable_segments:true", "expandable_segments"}, /* True or False exactly */
        {"max_split_size_mb", "max_split_size_mb"},           /* no value */
    };
    size_t i;

    /* Start from clean devices. */
    CHECK_STATUS(accalloc_empty_cache(), ACCALLOC_OK);
    CHECK_STATUS(accalloc_reset_accumulated_memory_stats(0), ACCALLOC_OK);
    CHECK_STATUS(accalloc_reset_peak_memory_stats(0), ACCALLOC_OK);
    CHECK_STATUS(accalloc_reset_accumulated_memory_stats(1), ACCALLOC_OK);
    CHECK_STATUS(accalloc_reset_peak_memory_stats(1), ACCALLOC_OK);
    fresh_expected(&e0);
    fresh_expected(&e1);
    expect_device(0, &e0, "G0 settings: clean device 0");
    expect_device(1, &e1, "G0 settings: clean device 1");

    /* The defaults read as "". Size query, too small, NULL len. */
    CHECK_STATUS(accalloc_get_allocator_settings(NULL, 0, &len), ACCALLOC_OK);
    CHECK_EQ(len, 1);
    get_settings(buf, sizeof buf);
    CHECK_STR(buf, "");
    CHECK_STATUS(accalloc_get_allocator_settings(buf, sizeof buf, NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_set_allocator_settings(NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);

    /* Refused settings: ACCALLOC_ERROR_CONFIG naming the key; the settings in force stay as they were. */
    for (i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        int st = (int)accalloc_set_allocator_settings(bad[i][0]);
        ++g_checks;
        if (st != ACCALLOC_ERROR_CONFIG) {
            ++g_failures;
            fprintf(stderr, "FAIL accalloc_set_allocator_settings(\"%s\") returned %s, expected ACCALLOC_ERROR_CONFIG\n",
                    bad[i][0], accalloc_status_name(st));
        }
        CHECK_CONTAINS(accalloc_last_error_message(), bad[i][1]);
    }
    get_settings(buf, sizeof buf);
    CHECK_STR(buf, "");
    expect_device(1, &e1, "G0 refused settings change nothing");

    /* max_split_size_mb:40 -> max_split_size 41943040 on every device. */
    CHECK_STATUS(accalloc_set_allocator_settings("max_split_size_mb:40"), ACCALLOC_OK);
    e0.max_split_size = 41943040;
    e1.max_split_size = 41943040;
    expect_device(0, &e0, "G0 max_split_size_mb:40, device 0");
    expect_device(1, &e1, "G0 max_split_size_mb:40, device 1");
    get_settings(buf, sizeof buf);
    CHECK_CONTAINS(buf, "max_split_size_mb:40");
    len = 0;
    CHECK_STATUS(accalloc_get_allocator_settings(tiny, sizeof tiny, &len), ACCALLOC_ERROR_BUFFER_TOO_SMALL);
    CHECK_EQ(len, strlen(buf) + 1);
    /* what get returns, set accepts, and it reads back the same */
    snprintf(saved, sizeof saved, "%s", buf);
    CHECK_STATUS(accalloc_set_allocator_settings(saved), ACCALLOC_OK);
    get_settings(buf, sizeof buf);
    CHECK_STR(buf, saved);
    /* a refused string leaves max_split_size_mb:40 in force */
    CHECK_STATUS(accalloc_set_allocator_settings("max_split_size_mb:10"), ACCALLOC_ERROR_CONFIG);
    get_settings(buf, sizeof buf);
    CHECK_STR(buf, saved);

    /* G1: 920 MiB on device 1: >= max_split_size: an oversize allocation in an oversize segment. */
    CHECK_STATUS(accalloc_malloc(&big, (size_t)(920 * MiB), 1, NULL), ACCALLOC_OK);
    SET2(e1, allocation, LARGE, 1, 1, 1, 0);
    SET2(e1, active, LARGE, 1, 1, 1, 0);
    SET2(e1, allocated_bytes, LARGE, 964689920, 964689920, 964689920, 0);
    SET2(e1, active_bytes, LARGE, 964689920, 964689920, 964689920, 0);
    SET2(e1, requested_bytes, LARGE, 964689920, 964689920, 964689920, 0);
    SET2(e1, segment, LARGE, 1, 1, 1, 0);
    SET2(e1, reserved_bytes, LARGE, 964689920, 964689920, 964689920, 0);
    set_stat(&e1.oversize_allocations, 1, 1, 1, 0);
    set_stat(&e1.oversize_segments, 1, 1, 1, 0);
    e1.num_device_alloc = 1;
    expect_device(1, &e1, "G1 malloc(920 MiB) oversize");

    /* G2, G3: 50 MiB, oversize too; freed: a cached oversize segment. */
    CHECK_STATUS(accalloc_malloc(&c1, (size_t)(50 * MiB), 1, NULL), ACCALLOC_OK);
    CHECK_STATUS(accalloc_free(c1), ACCALLOC_OK);
    SET2(e1, allocation, LARGE, 1, 2, 2, 1);
    SET2(e1, active, LARGE, 1, 2, 2, 1);
    SET2(e1, allocated_bytes, LARGE, 964689920, 1017118720, 1017118720, 52428800);
    SET2(e1, active_bytes, LARGE, 964689920, 1017118720, 1017118720, 52428800);
    SET2(e1, requested_bytes, LARGE, 964689920, 1017118720, 1017118720, 52428800);
    SET2(e1, segment, LARGE, 2, 2, 2, 0);
    SET2(e1, reserved_bytes, LARGE, 1017118720, 1017118720, 1017118720, 0);
    set_stat(&e1.oversize_allocations, 1, 2, 2, 1);
    set_stat(&e1.oversize_segments, 2, 2, 2, 0);
    e1.num_device_alloc = 2;
    expect_device(1, &e1, "G3 malloc + free(50 MiB) oversize, cached");

    /* G4, G5: 30 MiB is below max_split_size, so it may not take the cached 50 MiB block (>= 40 MiB):
     * a new 30 MiB segment (not oversize); freed: cached. */
    CHECK_STATUS(accalloc_malloc(&c2, (size_t)(30 * MiB), 1, NULL), ACCALLOC_OK);
    CHECK(c2 != c1);
    CHECK_STATUS(accalloc_free(c2), ACCALLOC_OK);
    SET2(e1, allocation, LARGE, 1, 2, 3, 2);
    SET2(e1, active, LARGE, 1, 2, 3, 2);
    SET2(e1, allocated_bytes, LARGE, 964689920, 1017118720, 1048576000, 83886080);
    SET2(e1, active_bytes, LARGE, 964689920, 1017118720, 1048576000, 83886080);
    SET2(e1, requested_bytes, LARGE, 964689920, 1017118720, 1048576000, 83886080);
    SET2(e1, segment, LARGE, 3, 3, 3, 0);
    SET2(e1, reserved_bytes, LARGE, 1048576000, 1048576000, 1048576000, 0);
    e1.num_device_alloc = 3;
    expect_device(1, &e1, "G5 malloc + free(30 MiB): not from the oversize block");

    /* G6: 36 MiB (< max_split_size): the oversize 50 MiB block is off limits, a new 36 MiB segment does
     * not fit (1000 + 36 MiB > 1 GiB). Before any retry, the smallest cached oversize block of at least
     * max(36, 40) MiB is released (the 50 MiB one) and the device is asked again: it fits. That is not a
     * retry: no sync, num_alloc_retries stays 0, the cached 30 MiB segment stays. */
    CHECK_STATUS(accalloc_malloc(&r, (size_t)(36 * MiB), 1, NULL), ACCALLOC_OK);
    SET2(e1, allocation, LARGE, 2, 2, 4, 2);
    SET2(e1, active, LARGE, 2, 2, 4, 2);
    SET2(e1, allocated_bytes, LARGE, 1002438656, 1017118720, 1086324736, 83886080);
    SET2(e1, active_bytes, LARGE, 1002438656, 1017118720, 1086324736, 83886080);
    SET2(e1, requested_bytes, LARGE, 1002438656, 1017118720, 1086324736, 83886080);
    SET2(e1, segment, LARGE, 3, 3, 4, 1);
    SET2(e1, reserved_bytes, LARGE, 1033895936, 1048576000, 1086324736, 52428800);
    set_stat(&e1.oversize_segments, 1, 2, 2, 1);
    e1.num_device_alloc = 4;
    e1.num_device_free = 1;
    expect_device(1, &e1, "G6 malloc(36 MiB) releases the cached oversize block first, no retry");
    expect_mem_info(1, (uint64_t)(GiB - 1033895936), (uint64_t)GiB);

    /* G7, G8: free both, empty_cache. */
    CHECK_STATUS(accalloc_free(r), ACCALLOC_OK);
    CHECK_STATUS(accalloc_free(big), ACCALLOC_OK);
    SET2(e1, allocation, LARGE, 0, 2, 4, 4);
    SET2(e1, active, LARGE, 0, 2, 4, 4);
    SET2(e1, allocated_bytes, LARGE, 0, 1017118720, 1086324736, 1086324736);
    SET2(e1, active_bytes, LARGE, 0, 1017118720, 1086324736, 1086324736);
    SET2(e1, requested_bytes, LARGE, 0, 1017118720, 1086324736, 1086324736);
    set_stat(&e1.oversize_allocations, 0, 2, 2, 2);
    expect_device(1, &e1, "G7 frees");
    CHECK_STATUS(accalloc_empty_cache(), ACCALLOC_OK);
    SET2(e1, segment, LARGE, 0, 3, 4, 4);
    SET2(e1, reserved_bytes, LARGE, 0, 1048576000, 1086324736, 1086324736);
    set_stat(&e1.oversize_segments, 0, 2, 2, 2);
    e1.num_device_free = 4;
    e1.num_sync_all_streams = 1;
    e0.num_sync_all_streams = 1;
    expect_device(1, &e1, "G8 empty_cache");
    expect_device(0, &e0, "G8 empty_cache, device 0");

    /* H: a request >= max_split_size does not take a cached block >= request + 20 MiB
     * (max_non_split_rounding), and takes a smaller one whole (device 0). */
    CHECK_STATUS(accalloc_malloc(&h1, (size_t)(66 * MiB), 0, NULL), ACCALLOC_OK);
    CHECK_STATUS(accalloc_free(h1), ACCALLOC_OK);
    CHECK_STATUS(accalloc_memory_stat(0, "num_device_alloc", &alloc0), ACCALLOC_OK);
    CHECK_STATUS(accalloc_malloc(&h2, (size_t)(40 * MiB), 0, NULL), ACCALLOC_OK); /* 66 >= 40 + 20: a new segment */
    CHECK(h2 != h1);
    CHECK_STATUS(accalloc_memory_stat(0, "num_device_alloc", &v), ACCALLOC_OK);
    CHECK_EQ(v - alloc0, 1);
    CHECK_STATUS(accalloc_free(h2), ACCALLOC_OK);
    CHECK_STATUS(accalloc_malloc(&h3, (size_t)(48 * MiB), 0, NULL), ACCALLOC_OK); /* 66 < 48 + 20: takes it whole */
    CHECK(h3 == h1);
    CHECK_STATUS(accalloc_memory_stat(0, "num_device_alloc", &v), ACCALLOC_OK);
    CHECK_EQ(v - alloc0, 1);
    CHECK_STATUS(accalloc_memory_allocated(0, &v), ACCALLOC_OK);
    CHECK_EQ(v, 69206016);
    CHECK_STATUS(accalloc_memory_stat(0, "requested_bytes.all.current", &v), ACCALLOC_OK);
    CHECK_EQ(v, 50331648);
    CHECK_STATUS(accalloc_memory_stat(0, "oversize_allocations.current", &v), ACCALLOC_OK);
    CHECK_EQ(v, 1);
    CHECK_STATUS(accalloc_memory_stat(0, "inactive_split.all.current", &v), ACCALLOC_OK);
    CHECK_EQ(v, 0); /* not split */
    CHECK_STATUS(accalloc_free(h3), ACCALLOC_OK);
    CHECK_STATUS(accalloc_empty_cache(), ACCALLOC_OK);

    /* roundup_power2_divisions:4 (every bucket); max_split_size_mb returns to its default (unset). */
    CHECK_STATUS(accalloc_set_allocator_settings("roundup_power2_divisions:4"), ACCALLOC_OK);
    CHECK_STATUS(accalloc_memory_stat(0, "max_split_size", &v), ACCALLOC_OK);
    CHECK_EQ(v, -1);
    CHECK_STATUS(accalloc_memory_stat(1, "max_split_size", &v), ACCALLOC_OK);
    CHECK_EQ(v, -1);
    get_settings(buf, sizeof buf);
    CHECK_CONTAINS(buf, "roundup_power2_divisions");
    CHECK(strstr(buf, "max_split_size_mb") == NULL);
    CHECK_EQ(rounded_by_library(1000), 1024);       /* <= 512 x 4: the usual 512 rounding */
    CHECK_EQ(rounded_by_library(4096), 4096);       /* a power of two stays */
    CHECK_EQ(rounded_by_library(4100), 5120);       /* next multiple of 4096 / 4 */
    CHECK_EQ(rounded_by_library(5242881), 6291456); /* 5 MiB + 1 -> next multiple of 4 MiB / 4 */
    /* the list form: [64:8,256:4,>:2]: buckets up to 64-128 MiB get 8 (the first entry also sets those
     * below it), 128-256 MiB keeps 0, 256-512 MiB gets 4, from 512 MiB on 2. (D = 1 is left out on purpose:
     * current PyTorch rounds to 512 with it, REFERENCE.md's wording would round to a power of two.) */
    CHECK_STATUS(accalloc_set_allocator_settings("roundup_power2_divisions:[64:8,256:4,>:2]"), ACCALLOC_OK);
    CHECK_EQ(rounded_by_library(3145729), 3407872);     /* 3 MiB + 1, D 8: next multiple of 256 KiB */
    CHECK_EQ(rounded_by_library(100 * MiB + 1), 109051904); /* 100 MiB + 1, D 8: next multiple of 8 MiB */
    CHECK_EQ(rounded_by_library(157286401), 157286912); /* 150 MiB + 1, D 0: 512 rounding */
    CHECK_EQ(rounded_by_library(314572801), 335544320); /* 300 MiB + 1, D 4: next multiple of 64 MiB */
    CHECK_EQ(rounded_by_library(545259521), 805306368); /* 520 MiB + 1, D 2: next multiple of 256 MiB */

    /* "" brings the defaults back */
    CHECK_STATUS(accalloc_set_allocator_settings(""), ACCALLOC_OK);
    get_settings(buf, sizeof buf);
    CHECK_STR(buf, "");
    CHECK_EQ(rounded_by_library(4100), 4608);
    CHECK_STATUS(accalloc_memory_stat(0, "max_split_size", &v), ACCALLOC_OK);
    CHECK_EQ(v, -1);
}

/* Run outside ctest without the test environment, the figures below cannot match: say so up front. */
static void require_test_env(void)
{
    const char *cap = getenv("ACCALLOC_HOST_CAPACITY"), *devs = getenv("ACCALLOC_HOST_DEVICES");
    if (cap == NULL || strcmp(cap, "1GiB") != 0 || devs == NULL || strcmp(devs, "2") != 0)
        fprintf(stderr, "note: these checks assume ACCALLOC_HOST_CAPACITY=1GiB ACCALLOC_HOST_DEVICES=2 (ctest sets them); "
                        "got ACCALLOC_HOST_CAPACITY=%s ACCALLOC_HOST_DEVICES=%s\n", cap ? cap : "(unset)", devs ? devs : "(unset)");
    if (getenv("ACCALLOC_CONF") != NULL)
        fprintf(stderr, "note: ACCALLOC_CONF=%s is set; these figures assume the default policy (unset it)\n",
                getenv("ACCALLOC_CONF"));
}

/* ONNX Runtime's allocator without ORT (tests/ort.rs runs it inside ORT): the arguments are checked
 * before the OrtApi is used, so bad ones are a status, never a crash. */
static void section_ort_arguments(void)
{
    void *allocator = (void *)(uintptr_t)0x1;
    int not_an_allocator = 0;
    CHECK_STATUS(accalloc_ort_allocator_create(NULL, 23, ACCALLOC_DEVICE_HOST, 0, &allocator),
                 ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_CONTAINS(accalloc_last_error_message(), "ort_api is NULL");
    CHECK(allocator == (void *)(uintptr_t)0x1); /* untouched on error */
    CHECK_STATUS(accalloc_ort_allocator_create(NULL, 23, ACCALLOC_DEVICE_HOST, 0, NULL),
                 ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_CONTAINS(accalloc_last_error_message(), "out_allocator is NULL");
    CHECK_STATUS(accalloc_ort_allocator_destroy(NULL), ACCALLOC_OK);
    CHECK_STATUS(accalloc_ort_allocator_destroy(&not_an_allocator), ACCALLOC_ERROR_INVALID_POINTER);
}

/* Private pools on device 1, after every other section: figures as deltas of device 1's statistics.
 * A pool's blocks come from its own segments; a live pool keeps its free segments through
 * empty_cache, a released one gives them back and is forgotten; no_split hands out whole blocks. */
static int64_t stat1(const char *key)
{
    int64_t v = -1;
    CHECK_STATUS(accalloc_memory_stat(1, key, &v), ACCALLOC_OK);
    return v;
}

static void section_pools(void)
{
    AccallocPoolId pool = {0, 0}, whole = {0, 0};
    void *in_pool = NULL, *outside = NULL, *again = NULL;
    int64_t uses = -2, segments = -2;
    const int64_t seg0 = stat1("segment.all.allocated");

    CHECK_STATUS(accalloc_empty_cache(), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_create(1, 0, 0, &pool), ACCALLOC_OK);
    CHECK(pool.first == 0 && pool.second >= 1);
    CHECK_STATUS(accalloc_pool_begin(1, pool, ACCALLOC_ROUTE_THREAD, NULL), ACCALLOC_OK);
    CHECK_STATUS(accalloc_malloc(&in_pool, 1000, 1, NULL), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_end(1, pool), ACCALLOC_OK);
    CHECK_STATUS(accalloc_malloc(&outside, 1000, 1, NULL), ACCALLOC_OK);
    CHECK_EQ(stat1("segment.all.allocated") - seg0, 2); /* the pool's free remainder is its own */
    CHECK_STATUS(accalloc_pool_info(1, pool, &uses, &segments), ACCALLOC_OK);
    CHECK_EQ(uses, 2);
    CHECK_EQ(segments, 1);
    {
        /* Its share of reserved_bytes: its one small segment, not the default pools'. */
        AccallocStat all = {0}, small = {0}, large = {0};
        CHECK_STATUS(accalloc_pool_reserved_bytes(1, pool, &all, &small, &large), ACCALLOC_OK);
        CHECK_EQ(all.current, 2 * MiB);
        CHECK_EQ(small.current, 2 * MiB);
        CHECK_EQ(large.allocated, 0);
        CHECK_STATUS(accalloc_pool_reserved_bytes(1, (AccallocPoolId){0, 999}, &all, NULL, NULL),
                     ACCALLOC_ERROR_INVALID_ARGUMENT);
        CHECK_CONTAINS(accalloc_last_error_message(), "does not exist");
    }
    {
        /* Its live allocations (CUDA graph trees' check): in_pool alone, not the default pools'. */
        void *live[2] = {NULL, NULL};
        size_t count = 99;
        CHECK_STATUS(accalloc_pool_live_allocations(1, pool, NULL, 0, &count), ACCALLOC_OK);
        CHECK_EQ(count, 1); /* the count alone */
        CHECK_STATUS(accalloc_pool_live_allocations(1, pool, live, 2, &count), ACCALLOC_OK);
        CHECK_EQ(count, 1);
        CHECK(live[0] == in_pool && live[1] == NULL);
        CHECK_STATUS(accalloc_pool_live_allocations(1, pool, NULL, 2, &count), ACCALLOC_ERROR_INVALID_ARGUMENT);
        CHECK_STATUS(accalloc_pool_live_allocations(1, pool, live, 2, NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
        count = 99;
        CHECK_STATUS(accalloc_pool_live_allocations(1, (AccallocPoolId){0, 999}, live, 2, &count),
                     ACCALLOC_ERROR_INVALID_ARGUMENT);
        CHECK_CONTAINS(accalloc_last_error_message(), "does not exist");
        CHECK_EQ(count, 99); /* nothing written */
        CHECK_STATUS(accalloc_free(in_pool), ACCALLOC_OK);
        CHECK_STATUS(accalloc_pool_live_allocations(1, pool, live, 2, &count), ACCALLOC_OK);
        CHECK_EQ(count, 0);
    }
    {
        /* A checkpoint put back (CUDA graph trees): the 2000-byte block live now is freed, the
         * 1000-byte one live at the checkpoint handed out again, at the same address (1 KiB). */
        AccallocPoolCheckpoint *checkpoint = NULL;
        void *x = NULL, *y = NULL, *freed[1] = {NULL}, *made[1] = {NULL};
        size_t sizes[1] = {0}, freed_count = 9, made_count = 9, count = 9;
        const int64_t base = stat1("allocated_bytes.all.current");
        CHECK_STATUS(accalloc_pool_begin(1, pool, ACCALLOC_ROUTE_THREAD, NULL), ACCALLOC_OK);
        CHECK_STATUS(accalloc_malloc(&x, 1000, 1, NULL), ACCALLOC_OK);
        CHECK_STATUS(accalloc_pool_checkpoint(1, pool, &checkpoint), ACCALLOC_OK);
        CHECK_STATUS(accalloc_pool_checkpoint_allocations(checkpoint, &count), ACCALLOC_OK);
        CHECK_EQ(count, 1);
        CHECK_STATUS(accalloc_free(x), ACCALLOC_OK);
        CHECK_STATUS(accalloc_malloc(&y, 2000, 1, NULL), ACCALLOC_OK);
        CHECK_STATUS(accalloc_pool_end(1, pool), ACCALLOC_OK);
        CHECK(y == x);
        CHECK_EQ(stat1("allocated_bytes.all.current") - base, 2048);
        /* No room to hear of the freed block: refused, nothing changed. */
        CHECK_STATUS(accalloc_pool_checkpoint_restore(checkpoint, freed, 0, &freed_count, made, sizes, 1, &made_count),
                     ACCALLOC_ERROR_INVALID_ARGUMENT);
        CHECK_CONTAINS(accalloc_last_error_message(), "frees 1");
        CHECK_EQ(stat1("allocated_bytes.all.current") - base, 2048);
        CHECK_STATUS(accalloc_pool_checkpoint_restore(checkpoint, NULL, 1, &freed_count, made, sizes, 1, &made_count),
                     ACCALLOC_ERROR_INVALID_ARGUMENT);
        CHECK_STATUS(accalloc_pool_checkpoint_restore(NULL, freed, 1, &freed_count, made, sizes, 1, &made_count),
                     ACCALLOC_ERROR_INVALID_ARGUMENT);
        CHECK_STATUS(accalloc_pool_checkpoint_restore(checkpoint, freed, 1, &freed_count, made, sizes, 1, &made_count),
                     ACCALLOC_OK);
        CHECK_EQ(freed_count, 1);
        CHECK(freed[0] == y);
        CHECK_EQ(made_count, 1);
        CHECK(made[0] == x);
        CHECK_EQ(sizes[0], 1024);
        CHECK_EQ(stat1("allocated_bytes.all.current") - base, 1024);
        CHECK_STATUS(accalloc_free(made[0]), ACCALLOC_OK); /* handed out again: ours to free */
        CHECK_EQ(stat1("allocated_bytes.all.current"), base);
        CHECK_STATUS(accalloc_pool_release(1, pool), ACCALLOC_OK); /* the use this block's begin added */
        CHECK_STATUS(accalloc_pool_checkpoint_destroy(checkpoint), ACCALLOC_OK);
        CHECK_STATUS(accalloc_pool_checkpoint_destroy(NULL), ACCALLOC_OK);
        CHECK_STATUS(accalloc_pool_checkpoint(1, (AccallocPoolId){0, 999}, &checkpoint), ACCALLOC_ERROR_INVALID_ARGUMENT);
        CHECK_STATUS(accalloc_pool_checkpoint(1, pool, NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    }
    CHECK_STATUS(accalloc_free(outside), ACCALLOC_OK);

    /* The pool is live: empty_cache gives back the default segment only; emptyCache(pool) nothing. */
    CHECK_STATUS(accalloc_empty_cache(), ACCALLOC_OK);
    CHECK_EQ(stat1("reserved_bytes.all.current"), 2 * MiB);
    CHECK_STATUS(accalloc_pool_empty_cache(1, pool, 0), ACCALLOC_OK);
    CHECK_EQ(stat1("reserved_bytes.all.current"), 2 * MiB);
    /* Beginning it again finds its cached block. */
    CHECK_STATUS(accalloc_pool_begin(1, pool, ACCALLOC_ROUTE_STREAM, NULL), ACCALLOC_OK);
    CHECK_STATUS(accalloc_malloc(&again, 2000, 1, NULL), ACCALLOC_OK);
    CHECK(again == in_pool);
    CHECK_STATUS(accalloc_pool_end(1, pool), ACCALLOC_OK);
    CHECK_STATUS(accalloc_free(again), ACCALLOC_OK);
    /* accalloc's live-pool empty gives back what PyTorch would keep. */
    CHECK_STATUS(accalloc_pool_empty_cache(1, pool, 1), ACCALLOC_OK);
    CHECK_EQ(stat1("reserved_bytes.all.current"), 0);
    /* Released twice (created, begun twice: three uses), then freeable and forgotten when empty. */
    CHECK_STATUS(accalloc_pool_release(1, pool), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_release(1, pool), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_release(1, pool), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_release(1, pool), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_empty_cache(), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_info(1, pool, &uses, NULL), ACCALLOC_OK);
    CHECK_EQ(uses, -1);

    /* no_split: a 1000-byte request holds its whole 2 MiB segment. */
    CHECK_STATUS(accalloc_pool_create(1, 0, 1, &whole), ACCALLOC_OK);
    CHECK(whole.second > pool.second);
    CHECK_STATUS(accalloc_pool_begin(1, whole, ACCALLOC_ROUTE_THREAD, NULL), ACCALLOC_OK);
    CHECK_STATUS(accalloc_malloc(&in_pool, 1000, 1, NULL), ACCALLOC_OK);
    CHECK_EQ(stat1("allocated_bytes.small_pool.current"), 2 * MiB);
    CHECK_EQ(stat1("requested_bytes.small_pool.current"), 1000);
    CHECK_STATUS(accalloc_pool_begin(1, whole, ACCALLOC_ROUTE_THREAD, NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_CONTAINS(accalloc_last_error_message(), "already go to pool");
    CHECK_STATUS(accalloc_pool_begin(1, whole, 7, NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_pool_end(1, whole), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_end(1, whole), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_free(in_pool), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_release(1, whole), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_release(1, whole), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_create(1, 0, 0, NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_pool_create(9, 0, 0, &pool), ACCALLOC_ERROR_INVALID_DEVICE);
}

/* Observers: a mock network library registers the segments of device 1 as the segment observer
 * tells it, and an OOM observer sees PyTorch's figures. Run last: from the first segment observer on,
 * calls back into accalloc from an observer are refused for the rest of the process. */
struct mock_net {
    uintptr_t base[16];
    size_t size[16];
    int live, events, alloc_seen_in_pool, reentry_status;
    AccallocPoolId pool;
};

static void mock_net_on_segment(const AccallocSegmentEvent *e, void *user)
{
    struct mock_net *net = user;
    void *p = NULL;
    if (e->device_type != accalloc_current_accelerator() || e->device != 1)
        return;
    net->events++;
    if (e->action == ACCALLOC_SEGMENT_ALLOC || e->action == ACCALLOC_SEGMENT_MAP) {
        if (net->live < 16) {
            net->base[net->live] = (uintptr_t)e->address;
            net->size[net->live++] = e->size;
        }
        if (e->pool.first == net->pool.first && e->pool.second == net->pool.second)
            net->alloc_seen_in_pool++;
    } else {
        for (int i = 0; i < net->live; i++)
            if (net->base[i] == (uintptr_t)e->address && net->size[i] == e->size) {
                net->base[i] = net->base[--net->live];
                net->size[i] = net->size[net->live];
                break;
            }
    }
    /* The device is held: a call for its own device type is refused, never a deadlock. */
    net->reentry_status = accalloc_malloc(&p, 16, 1, NULL);
}

struct oom_seen {
    int calls;
    int64_t device;
    size_t alloc_size, limit_or_total, device_free;
};

static void record_oom(AccallocDeviceType type, int64_t device, size_t alloc_size, size_t limit_or_total,
                       size_t device_free, void *user)
{
    struct oom_seen *seen = user;
    (void)type;
    seen->calls++;
    seen->device = device;
    seen->alloc_size = alloc_size;
    seen->limit_or_total = limit_or_total;
    seen->device_free = device_free;
    /* Outside the device's lock: calling accalloc is fine here. */
    accalloc_empty_cache();
}

static void section_observers(void)
{
    struct mock_net net = {0};
    struct oom_seen seen = {0};
    uint64_t segment_handle = 0, oom_handle = 0;
    void *p = NULL, *q = NULL;

    CHECK_STATUS(accalloc_empty_cache(), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_create(1, 0, 1, &net.pool), ACCALLOC_OK);
    CHECK_STATUS(accalloc_segment_observer_add(mock_net_on_segment, &net, &segment_handle), ACCALLOC_OK);
    CHECK_STATUS(accalloc_segment_observer_add(NULL, &net, &segment_handle), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_segment_observer_add(mock_net_on_segment, &net, NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_pool_begin(1, net.pool, ACCALLOC_ROUTE_THREAD, NULL), ACCALLOC_OK);
    CHECK_STATUS(accalloc_malloc(&p, 3 * MiB, 1, NULL), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_end(1, net.pool), ACCALLOC_OK);
    CHECK_STATUS(accalloc_malloc(&q, 1000, 1, NULL), ACCALLOC_OK);
    /* Two segments registered, in the pool a 20 MiB one (3 MiB is a large request) at p. */
    CHECK_EQ(net.live, 2);
    CHECK_EQ(net.alloc_seen_in_pool, 1);
    CHECK(net.base[0] == (uintptr_t)p && net.size[0] == (size_t)(20 * MiB));
    CHECK_EQ(net.reentry_status, ACCALLOC_ERROR_NOT_SUPPORTED);
    CHECK_STATUS(accalloc_free(p), ACCALLOC_OK);
    CHECK_STATUS(accalloc_free(q), ACCALLOC_OK);
    CHECK_STATUS(accalloc_empty_cache(), ACCALLOC_OK); /* the default segment goes; the live pool's stays */
    CHECK_EQ(net.live, 1);
    CHECK_STATUS(accalloc_pool_empty_cache(1, net.pool, 1), ACCALLOC_OK);
    CHECK_EQ(net.live, 0);
    CHECK_EQ(net.events, 4);
    /* After remove returns the observer is never called again. */
    CHECK_STATUS(accalloc_segment_observer_remove(segment_handle), ACCALLOC_OK);
    CHECK_STATUS(accalloc_segment_observer_remove(segment_handle), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_malloc(&p, 1000, 1, NULL), ACCALLOC_OK);
    CHECK_STATUS(accalloc_free(p), ACCALLOC_OK);
    CHECK_EQ(net.events, 4);
    CHECK_STATUS(accalloc_pool_release(1, net.pool), ACCALLOC_OK);

    /* OOM: device 1 has 1 GiB; a 2 GiB request fails, the observer hears of it first. */
    CHECK_STATUS(accalloc_oom_observer_add(record_oom, &seen, &oom_handle), ACCALLOC_OK);
    CHECK_STATUS(accalloc_oom_observer_add(NULL, &seen, &oom_handle), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_malloc(&p, 2048 * MiB, 1, NULL), ACCALLOC_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(seen.calls, 1);
    CHECK_EQ(seen.device, 1);
    CHECK_EQ(seen.alloc_size, 2048 * MiB);
    CHECK_EQ(seen.limit_or_total, 1024 * MiB);
    CHECK_STATUS(accalloc_oom_observer_remove(oom_handle), ACCALLOC_OK);
    CHECK_STATUS(accalloc_oom_observer_remove(oom_handle), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_malloc(&p, 2048 * MiB, 1, NULL), ACCALLOC_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(seen.calls, 1);
}

/* A pool with an allocator of its own (MemPool(allocator=...)): plain memory from aligned_alloc, or
 * with the virtual-memory group, address space from mmap whose pages it maps with mprotect. */
struct own_allocator {
    int allocs, frees, refuse, reentry_status;
    int64_t live_bytes, reservations, mapped_bytes;
};

static int own_raw_alloc(void *ctx, int32_t device, size_t size, void *stream, void **out)
{
    struct own_allocator *a = ctx;
    void *p = NULL;
    (void)device, (void)stream;
    /* Its device is held: a call back into accalloc for it is refused. */
    a->reentry_status = accalloc_malloc(&p, 16, 1, NULL);
    if (a->refuse)
        return ACCALLOC_BACKEND_OUT_OF_MEMORY;
    if (posix_memalign(out, 512, size) != 0)
        return ACCALLOC_BACKEND_OUT_OF_MEMORY;
    a->allocs++;
    a->live_bytes += (int64_t)size;
    return ACCALLOC_BACKEND_OK;
}

static int own_raw_free(void *ctx, int32_t device, void *ptr, size_t size)
{
    struct own_allocator *a = ctx;
    (void)device;
    free(ptr);
    a->frees++;
    a->live_bytes -= (int64_t)size;
    return ACCALLOC_BACKEND_OK;
}

static int own_vm_granularity(void *ctx, int32_t device, size_t *out)
{
    (void)ctx, (void)device;
    *out = 2 << 20;
    return ACCALLOC_BACKEND_OK;
}

static int own_vm_reserve(void *ctx, int32_t device, size_t size, void **out)
{
    struct own_allocator *a = ctx;
    const size_t align = 2 << 20;
    (void)device;
    /* mmap aligns to pages only: reserve more, keep the aligned part. */
    char *raw = mmap(NULL, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED)
        return ACCALLOC_BACKEND_OUT_OF_MEMORY;
    char *start = (char *)(((uintptr_t)raw + align - 1) & ~(uintptr_t)(align - 1));
    if (start > raw)
        munmap(raw, (size_t)(start - raw));
    munmap(start + size, (size_t)(raw + size + align - (start + size)));
    *out = start;
    a->reservations++;
    return ACCALLOC_BACKEND_OK;
}

static int own_vm_map(void *ctx, int32_t device, void *ptr, size_t size)
{
    struct own_allocator *a = ctx;
    (void)device;
    if (mprotect(ptr, size, PROT_READ | PROT_WRITE) != 0)
        return 1;
    a->mapped_bytes += (int64_t)size;
    return ACCALLOC_BACKEND_OK;
}

static int own_vm_unmap(void *ctx, int32_t device, void *ptr, size_t size)
{
    struct own_allocator *a = ctx;
    (void)device;
    madvise(ptr, size, MADV_DONTNEED);
    if (mprotect(ptr, size, PROT_NONE) != 0)
        return 1;
    a->mapped_bytes -= (int64_t)size;
    return ACCALLOC_BACKEND_OK;
}

static int own_vm_release(void *ctx, int32_t device, void *ptr, size_t size)
{
    struct own_allocator *a = ctx;
    (void)device;
    if (munmap(ptr, size) != 0)
        return 1;
    a->reservations--;
    return ACCALLOC_BACKEND_OK;
}

/* The same in PyTorch's pluggable form (the pair CUDAPluggableAllocator loads): NULL is no room. */
static int64_t pluggable_live;
static int pluggable_refuse;

static void *pluggable_alloc(size_t size, int device, void *stream)
{
    void *p = NULL;
    (void)device, (void)stream;
    if (pluggable_refuse || posix_memalign(&p, 512, size) != 0)
        return NULL;
    pluggable_live += (int64_t)size;
    return p;
}

static void pluggable_free(void *ptr, size_t size, int device, void *stream)
{
    (void)device, (void)stream;
    free(ptr);
    pluggable_live -= (int64_t)size;
}

static void section_pool_allocator(void)
{
    struct own_allocator own = {0}, vm = {0};
    AccallocBackendVTable table, broken;
    AccallocPoolId pool = {0, 0}, vm_pool = {0, 0};
    void *p = NULL, *q = NULL;
    int64_t segments = -1;
    const int64_t segments_before = stat1("segment.all.current");

    memset(&table, 0, sizeof table);
    table.struct_size = sizeof table;
    table.context = &own;
    table.raw_alloc = own_raw_alloc;
    table.raw_free = own_raw_free;
    CHECK_STATUS(accalloc_pool_create_with_allocator(1, 0, 0, &table, &pool), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_begin(1, pool, ACCALLOC_ROUTE_THREAD, NULL), ACCALLOC_OK);
    CHECK_STATUS(accalloc_malloc(&p, 1000, 1, NULL), ACCALLOC_OK);
    /* The pool's segment is the allocator's; it counts device-wide as any segment. */
    CHECK_EQ(own.allocs, 1);
    CHECK_EQ(own.live_bytes, 2 * MiB);
    CHECK_EQ(own.reentry_status, ACCALLOC_ERROR_NOT_SUPPORTED);
    CHECK_EQ(stat1("segment.all.current") - segments_before, 1);
    memset(p, 0x5a, 1000);
    /* The allocator has no room: the pool is out of memory; the device is not asked. */
    own.refuse = 1;
    CHECK_STATUS(accalloc_malloc(&q, 3 * MiB, 1, NULL), ACCALLOC_ERROR_OUT_OF_MEMORY);
    own.refuse = 0;
    CHECK_STATUS(accalloc_pool_end(1, pool), ACCALLOC_OK);
    CHECK_STATUS(accalloc_free(p), ACCALLOC_OK); /* found by its address, as any block */
    CHECK_STATUS(accalloc_pool_empty_cache(1, pool, 1), ACCALLOC_OK);
    CHECK_EQ(own.frees, 1);
    CHECK_EQ(own.live_bytes, 0);
    CHECK_STATUS(accalloc_pool_info(1, pool, NULL, &segments), ACCALLOC_OK);
    CHECK_EQ(segments, 0);
    CHECK_STATUS(accalloc_pool_release(1, pool), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_release(1, pool), ACCALLOC_OK);

    /* With its virtual-memory group and expandable segments on, the pool maps its own pages. */
    table.context = &vm;
    table.vm_granularity = own_vm_granularity;
    table.vm_reserve = own_vm_reserve;
    table.vm_map = own_vm_map;
    table.vm_unmap = own_vm_unmap;
    table.vm_release = own_vm_release;
    CHECK_STATUS(accalloc_set_allocator_settings("expandable_segments:True"), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_create_with_allocator(1, 0, 0, &table, &vm_pool), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_begin(1, vm_pool, ACCALLOC_ROUTE_THREAD, NULL), ACCALLOC_OK);
    CHECK_STATUS(accalloc_malloc(&p, 5 * MiB, 1, NULL), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_end(1, vm_pool), ACCALLOC_OK);
    CHECK_EQ(vm.allocs, 0);
    CHECK_EQ(vm.reservations, 1);
    CHECK_EQ(vm.mapped_bytes, 20 * MiB); /* one large page */
    memset(p, 0x6b, 5 * MiB);          /* really mapped */
    CHECK_STATUS(accalloc_free(p), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_empty_cache(1, vm_pool, 1), ACCALLOC_OK);
    CHECK_EQ(vm.mapped_bytes, 0);
    CHECK_EQ(vm.reservations, 0);
    CHECK_STATUS(accalloc_pool_release(1, vm_pool), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_release(1, vm_pool), ACCALLOC_OK);
    CHECK_STATUS(accalloc_set_allocator_settings("expandable_segments:False"), ACCALLOC_OK);

    /* PyTorch's pluggable pair: its segments are the pair's; NULL is the pool's out of memory. */
    CHECK_STATUS(accalloc_pool_create_with_functions(1, 0, 0, pluggable_alloc, pluggable_free, &pool), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_begin(1, pool, ACCALLOC_ROUTE_THREAD, NULL), ACCALLOC_OK);
    CHECK_STATUS(accalloc_malloc(&p, 3 * MiB, 1, NULL), ACCALLOC_OK);
    CHECK_EQ(pluggable_live, 20 * MiB);
    pluggable_refuse = 1;
    CHECK_STATUS(accalloc_malloc(&q, 30 * MiB, 1, NULL), ACCALLOC_ERROR_OUT_OF_MEMORY);
    pluggable_refuse = 0;
    CHECK_STATUS(accalloc_pool_end(1, pool), ACCALLOC_OK);
    CHECK_STATUS(accalloc_free(p), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_release(1, pool), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_release(1, pool), ACCALLOC_OK);
    CHECK_STATUS(accalloc_empty_cache(), ACCALLOC_OK); /* freeable: back to the pair, the pool forgotten */
    CHECK_EQ(pluggable_live, 0);
    CHECK_STATUS(accalloc_pool_create_with_functions(1, 0, 0, pluggable_alloc, NULL, &pool),
                 ACCALLOC_ERROR_INVALID_ARGUMENT);

    /* A table that cannot serve is refused, nothing made. */
    CHECK_STATUS(accalloc_pool_create_with_allocator(1, 0, 0, NULL, &pool), ACCALLOC_ERROR_INVALID_ARGUMENT);
    broken = table;
    broken.raw_free = NULL;
    CHECK_STATUS(accalloc_pool_create_with_allocator(1, 0, 0, &broken, &pool), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_CONTAINS(accalloc_last_error_message(), "raw_free is NULL");
    broken = table;
    broken.struct_size = 8;
    CHECK_STATUS(accalloc_pool_create_with_allocator(1, 0, 0, &broken, &pool), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_pool_create_with_allocator(1, 0, 0, &table, NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_empty_cache(), ACCALLOC_OK);
}

/* Pool ids a framework hands out itself (PyTorch's createOrIncrefPool, setNoSplit) and a route by a
 * filter of its own (beginAllocateToPool's, as a CUDA graph's capture test). */
static int accept_stream_7(void *stream, void *context)
{
    ++*(int *)context;
    return stream == (void *)(uintptr_t)7;
}

static void mark_released(void *context) { *(int *)context = -1; }

static void section_pool_ids_and_filters(void)
{
    AccallocPoolId graph = {3, 0};
    void *p = NULL, *q = NULL;
    int calls = 0, released;
    int64_t uses = 0;
    const int64_t small_before = stat1("allocated_bytes.small_pool.current");

    CHECK_STATUS(accalloc_pool_retain(1, graph), ACCALLOC_OK); /* made, one use */
    CHECK_STATUS(accalloc_pool_set_flags(1, graph, 0, 1), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_begin_filtered(1, graph, accept_stream_7, &calls, mark_released, 1), ACCALLOC_OK);
    CHECK_STATUS(accalloc_malloc(&p, 1000, 1, (void *)(uintptr_t)7), ACCALLOC_OK); /* the graph's */
    CHECK_STATUS(accalloc_malloc(&q, 1000, 1, NULL), ACCALLOC_OK);                 /* not accepted */
    CHECK(calls >= 2);
    /* no_split in the graph's pool: its 1000 B holds the whole 2 MiB segment; q splits a default one. */
    CHECK_EQ(stat1("allocated_bytes.small_pool.current") - small_before, 2 * MiB + 1024);
    CHECK_STATUS(accalloc_pool_info(1, graph, &uses, NULL), ACCALLOC_OK);
    CHECK_EQ(uses, 2);
    CHECK_STATUS(accalloc_pool_end(1, graph), ACCALLOC_OK);
    CHECK_EQ(calls, -1); /* the filter's context is released once its route ended */
    CHECK_STATUS(accalloc_free(p), ACCALLOC_OK);
    CHECK_STATUS(accalloc_free(q), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_release(1, graph), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_release(1, graph), ACCALLOC_OK);
    CHECK_STATUS(accalloc_empty_cache(), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_info(1, graph, &uses, NULL), ACCALLOC_OK);
    CHECK_EQ(uses, -1);
    /* Misuse: refused, and a context given with a refused begin is released at once. */
    released = 0;
    CHECK_STATUS(accalloc_pool_begin_filtered(1, graph, NULL, &released, mark_released, 1),
                 ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_EQ(released, -1);
    released = 0;
    CHECK_STATUS(accalloc_pool_begin_filtered(1, (AccallocPoolId){0, 0}, accept_stream_7, &released, mark_released, 1),
                 ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_EQ(released, -1);
    CHECK_STATUS(accalloc_pool_set_flags(1, (AccallocPoolId){9, 0}, 1, 0), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_pool_retain(1, (AccallocPoolId){0, 0}), ACCALLOC_ERROR_INVALID_ARGUMENT);
}

/* Sleep and wake: a tag's pool gives its memory back to the device and brings it back at the same
 * addresses, with its contents when a backup was asked for (the host and CUDA both copy). */
static void section_sleep(void)
{
    AccallocPoolId tag = {0, 0}, plain = {0, 0};
    void *weights = NULL, *p = NULL;
    uint64_t free_running = 0, free_paused = 0, total = 0;
    int64_t paused = -2;
    char *text = NULL;
    size_t len = 0;

    CHECK_STATUS(accalloc_empty_cache(), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_create(1, 0, 0, &tag), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_set_sleepable(1, tag), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_begin(1, tag, ACCALLOC_ROUTE_THREAD, NULL), ACCALLOC_OK);
    CHECK_STATUS(accalloc_malloc(&weights, 5 * MiB, 1, NULL), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_end(1, tag), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_release(1, tag), ACCALLOC_OK); /* the begin's use */
    /* Expandable although the settings say no: one 20 MiB page, no segment. */
    CHECK_EQ(stat1("reserved_bytes.all.current"), 20 * MiB);
    CHECK_EQ(stat1("segment.all.current"), 0);
    if (is_host())
        memset(weights, 0x3c, 5 * MiB);
    CHECK_STATUS(accalloc_mem_get_info(1, &free_running, &total), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_pause(1, tag, 1), ACCALLOC_OK); /* with a backup, on every backend here */
    CHECK_STATUS(accalloc_mem_get_info(1, &free_paused, &total), ACCALLOC_OK);
    CHECK_EQ(free_paused - free_running, 20 * MiB);
    CHECK_STATUS(accalloc_pool_paused_bytes(1, tag, &paused), ACCALLOC_OK);
    CHECK_EQ(paused, 20 * MiB);
    CHECK_EQ(stat1("allocated_bytes.all.current"), 5 * MiB); /* the books describe the blocks */
    CHECK_EQ(stat1("reserved_bytes.all.current"), 20 * MiB);
    /* The summary has a row for it, and the snapshot tells the segment's paused bytes. */
    text = text_call_summary(1, 1);
    if (text != NULL)
        CHECK_CONTAINS(text, "| Paused memory         |  20480 KiB |  20480 KiB |  20480 KiB |      0 B   |");
    free(text);
    CHECK_STATUS(accalloc_memory_snapshot_json(NULL, 0, &len), ACCALLOC_OK);
    text = (char *)malloc(len);
    if (text != NULL) {
        CHECK_STATUS(accalloc_memory_snapshot_json(text, len, &len), ACCALLOC_OK);
        CHECK_CONTAINS(text, "\"paused_size\":20971520");
    }
    free(text);
    /* Its memory is paused: what a framework asks before running a kernel on it. */
    {
        AccallocPoolId at = {9, 9};
        void *outside = NULL;
        CHECK_STATUS(accalloc_pool_paused_at(1, (char *)weights + 100, 4, &at), ACCALLOC_OK);
        CHECK(at.first == tag.first && at.second == tag.second);
        CHECK_STATUS(accalloc_malloc(&outside, 1000, 1, NULL), ACCALLOC_OK);
        CHECK_STATUS(accalloc_pool_paused_at(1, outside, 1000, &at), ACCALLOC_OK);
        CHECK(at.first == 0 && at.second == 0);
        CHECK_STATUS(accalloc_free(outside), ACCALLOC_OK);
        CHECK_STATUS(accalloc_pool_paused_at(1, weights, 4, NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
        CHECK_STATUS(accalloc_pool_paused_at(7, weights, 4, &at), ACCALLOC_ERROR_INVALID_DEVICE);
    }
    /* No allocation in a paused tag. */
    CHECK_STATUS(accalloc_pool_begin(1, tag, ACCALLOC_ROUTE_THREAD, NULL), ACCALLOC_OK);
    CHECK_STATUS(accalloc_malloc(&p, 1000, 1, NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_CONTAINS(accalloc_last_error_message(), "paused");
    CHECK_STATUS(accalloc_pool_end(1, tag), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_release(1, tag), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_resume(1, tag), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_paused_bytes(1, tag, &paused), ACCALLOC_OK);
    CHECK_EQ(paused, 0);
    {
        AccallocPoolId at = {9, 9};
        CHECK_STATUS(accalloc_pool_paused_at(1, weights, 5 * MiB, &at), ACCALLOC_OK);
        CHECK(at.first == 0 && at.second == 0); /* running again */
    }
    if (is_host()) {
        /* Same address, same contents. */
        const unsigned char *bytes = weights;
        size_t wrong = 0;
        for (size_t i = 0; i < (size_t)(5 * MiB); i++)
            wrong += bytes[i] != 0x3c;
        CHECK_EQ(wrong, 0);
    }
    CHECK_STATUS(accalloc_free(weights), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_release(1, tag), ACCALLOC_OK);
    CHECK_STATUS(accalloc_empty_cache(), ACCALLOC_OK);
    CHECK_EQ(stat1("reserved_bytes.all.current"), 0);

    /* Misuse: refused, nothing changed. */
    CHECK_STATUS(accalloc_pool_create(1, 0, 0, &plain), ACCALLOC_OK);
    CHECK_STATUS(accalloc_pool_pause(1, plain, 0), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_CONTAINS(accalloc_last_error_message(), "not sleepable");
    CHECK_STATUS(accalloc_pool_resume(1, (AccallocPoolId){0, 999}), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_pool_set_sleepable(1, (AccallocPoolId){0, 999}), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_pool_paused_bytes(1, (AccallocPoolId){0, 999}, &paused), ACCALLOC_OK);
    CHECK_EQ(paused, -1);
    CHECK_STATUS(accalloc_pool_paused_bytes(1, plain, NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(accalloc_pool_release(1, plain), ACCALLOC_OK);
    CHECK_STATUS(accalloc_empty_cache(), ACCALLOC_OK);
}

/* planned_placement seen through accalloc_planner_stats: off, then on for a repeating step (each
 * request of the last step given its planned address), then off again. */
static void chain_step(void)
{
    void *previous = NULL;
    for (size_t i = 0; i < 40; i++) {
        void *p = NULL;
        CHECK_STATUS(accalloc_malloc(&p, 2 * MiB + i * 4096, 0, NULL), ACCALLOC_OK);
        if (previous != NULL)
            CHECK_STATUS(accalloc_free(previous), ACCALLOC_OK);
        previous = p;
    }
    CHECK_STATUS(accalloc_free(previous), ACCALLOC_OK);
}

static void section_planner(void)
{
    AccallocPlannerStats stats = {.struct_size = sizeof(AccallocPlannerStats)};
    CHECK_STATUS(accalloc_planner_stats(0, &stats), ACCALLOC_OK);
    CHECK_EQ(stats.struct_size, sizeof(AccallocPlannerStats));
    CHECK_EQ(stats.enabled, 0);
    CHECK_EQ(stats.plans, 0);

    CHECK_STATUS(accalloc_set_allocator_settings("planned_placement:True"), ACCALLOC_OK);
    for (int step = 0; step < 6; step++)
        chain_step();
    CHECK_STATUS(accalloc_planner_stats(0, &stats), ACCALLOC_OK);
    CHECK_EQ(stats.enabled, 1);
    CHECK_EQ(stats.in_force, 1);
    CHECK(stats.plans >= 1);
    int64_t advised = stats.advised, conflicts = stats.conflicts, from_parked = stats.from_parked;
    chain_step();
    CHECK_STATUS(accalloc_planner_stats(-1, &stats), ACCALLOC_OK);
    CHECK_EQ(stats.advised - advised, 40);
    CHECK_EQ(stats.conflicts, conflicts);
    /* Some of them took the block the step before freed at their address (the fast path). */
    CHECK(stats.from_parked > from_parked);
    CHECK(stats.from_parked - from_parked <= 40);
    /* The plan's floor: at least the step's two blocks live at once (more where long-lived blocks
     * lie around it), and no more than what the plan spans. */
    CHECK(stats.plan_floor >= (int64_t)(4 * MiB + 77 * 4096));
    CHECK(stats.plan_floor <= stats.plan_height);
    /* The snapshot shows the plan's region: the segment it lies in says which part. */
    {
        size_t len = 0;
        CHECK_STATUS(accalloc_memory_snapshot_json(NULL, 0, &len), ACCALLOC_OK);
        char *text = (char *)malloc(len);
        if (text != NULL) {
            CHECK_STATUS(accalloc_memory_snapshot_json(text, len, &len), ACCALLOC_OK);
            CHECK_CONTAINS(text, "\"planned_range\":[");
        }
        free(text);
    }

    CHECK_STATUS(accalloc_planner_stats(0, NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    AccallocPlannerStats tiny = {.struct_size = 2};
    CHECK_STATUS(accalloc_planner_stats(0, &tiny), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_CONTAINS(accalloc_last_error_message(), "struct_size");
    CHECK_STATUS(accalloc_planner_stats(99, &stats), ACCALLOC_ERROR_INVALID_DEVICE);

    CHECK_STATUS(accalloc_set_allocator_settings("planned_placement:False"), ACCALLOC_OK);
    CHECK_STATUS(accalloc_planner_stats(0, &stats), ACCALLOC_OK);
    CHECK_EQ(stats.enabled, 0);
    /* No planner, no planned part. */
    {
        size_t len = 0;
        CHECK_STATUS(accalloc_memory_snapshot_json(NULL, 0, &len), ACCALLOC_OK);
        char *text = (char *)malloc(len);
        if (text != NULL) {
            CHECK_STATUS(accalloc_memory_snapshot_json(text, len, &len), ACCALLOC_OK);
            CHECK(strstr(text, "planned_range") == NULL);
        }
        free(text);
    }
    CHECK_STATUS(accalloc_empty_cache(), ACCALLOC_OK);
}

int main(void)
{
    require_test_env();
    section_metadata();
    section_initial();
    check_json(0, "fresh json");
    section_phase_a();
    section_phase_b();
    section_phase_c();
    section_phase_e();
    check_json(0, "device 0 json after phase E");
    section_phase_d();
    section_fraction();
    section_streams();
    section_record_stream();
    section_pinned_host();
    section_summary_snapshot();
    section_allocation_info();
    section_errors();
    section_ort_arguments();
    section_threads();
    section_settings();
    section_pools();
    section_pool_ids_and_filters();
    section_sleep();
    section_observers();
    section_pool_allocator();
    section_planner();

    CHECK_STATUS(accalloc_empty_cache(), ACCALLOC_OK);
    {
        int64_t v = -1;
        CHECK_STATUS(accalloc_memory_reserved(0, &v), ACCALLOC_OK);
        CHECK_EQ(v, 0);
        CHECK_STATUS(accalloc_memory_reserved(1, &v), ACCALLOC_OK);
        CHECK_EQ(v, 0);
    }

    printf("test_api: %d checks, %d failed\n", g_checks, g_failures);
    return g_failures == 0 ? 0 : 1;
}
