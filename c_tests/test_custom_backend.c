/* A backend written in C: a fake accelerator backed by malloc with 64 MiB per device and events that
 * this program completes itself. Registered through accalloc_register_backend, it gets the whole caching
 * allocator: caching, splitting, stream deferral, the OOM retry, statistics, summary and snapshot, all
 * through the `_on` forms of the API, side by side with the host backend. Two host devices are used
 * from two threads at once and their statistics stay separate. */
#define _DEFAULT_SOURCE /* mmap's MAP_ANONYMOUS, madvise */
#include <pthread.h>
#include <stddef.h>
#include <sys/mman.h>
#include <stdlib.h>
#include <string.h>

#include "accalloc.h"
#include "accalloc_test_util.h"

#define FAKE_DEVICES 2
#define FAKE_CAPACITY (64u << 20)
#define MiB (1 << 20)

/* --- the fake accelerator ------------------------------------------------------------------------- */

typedef struct FakeEvent {
    void *stream;
    int recorded;
    int complete;
} FakeEvent;

#define MAX_EVENTS 64

typedef struct Fake {
    size_t used[FAKE_DEVICES];
    int raw_allocs;
    int raw_frees;
    int fail_with_code; /* non-zero: raw_alloc returns it */
    FakeEvent *events[MAX_EVENTS];
    int live_events;
    int host_allocs; /* pinned host memory handed out and given back */
    int host_frees;
} Fake;

static Fake g_fake;

static int32_t fake_device_count(void *ctx, int32_t *out)
{
    (void)ctx;
    *out = FAKE_DEVICES;
    return ACCALLOC_BACKEND_OK;
}

static int32_t fake_raw_alloc(void *ctx, int32_t device, size_t size, void *stream, void **out)
{
    Fake *fake = (Fake *)ctx;
    void *ptr = NULL;
    (void)stream;
    if (fake->fail_with_code)
        return fake->fail_with_code;
    if (fake->used[device] + size > FAKE_CAPACITY)
        return ACCALLOC_BACKEND_OUT_OF_MEMORY;
    if (posix_memalign(&ptr, 512, size) != 0)
        return ACCALLOC_BACKEND_OUT_OF_MEMORY;
    fake->used[device] += size;
    fake->raw_allocs++;
    *out = ptr;
    return ACCALLOC_BACKEND_OK;
}

static int32_t fake_raw_free(void *ctx, int32_t device, void *ptr, size_t size)
{
    Fake *fake = (Fake *)ctx;
    fake->used[device] -= size;
    fake->raw_frees++;
    free(ptr);
    return ACCALLOC_BACKEND_OK;
}

static int32_t fake_mem_get_info(void *ctx, int32_t device, uint64_t *free_bytes, uint64_t *total)
{
    Fake *fake = (Fake *)ctx;
    *total = FAKE_CAPACITY;
    *free_bytes = FAKE_CAPACITY - fake->used[device];
    return ACCALLOC_BACKEND_OK;
}

static int32_t fake_event_create(void *ctx, int32_t device, void **out)
{
    Fake *fake = (Fake *)ctx;
    int i;
    FakeEvent *event = (FakeEvent *)calloc(1, sizeof *event);
    (void)device;
    for (i = 0; i < MAX_EVENTS; i++) {
        if (!fake->events[i]) {
            fake->events[i] = event;
            break;
        }
    }
    fake->live_events++;
    *out = event;
    return ACCALLOC_BACKEND_OK;
}

static int32_t fake_event_record(void *ctx, int32_t device, void *event, void *stream)
{
    FakeEvent *e = (FakeEvent *)event;
    (void)ctx;
    (void)device;
    e->stream = stream;
    e->recorded = 1;
    e->complete = 0;
    return ACCALLOC_BACKEND_OK;
}

static int32_t fake_event_query(void *ctx, int32_t device, void *event, int32_t *complete)
{
    (void)ctx;
    (void)device;
    *complete = ((FakeEvent *)event)->complete;
    return ACCALLOC_BACKEND_OK;
}

static int32_t fake_event_synchronize(void *ctx, int32_t device, void *event)
{
    (void)ctx;
    (void)device;
    ((FakeEvent *)event)->complete = 1;
    return ACCALLOC_BACKEND_OK;
}

static int32_t fake_event_destroy(void *ctx, int32_t device, void *event)
{
    Fake *fake = (Fake *)ctx;
    int i;
    (void)device;
    for (i = 0; i < MAX_EVENTS; i++) {
        if (fake->events[i] == event)
            fake->events[i] = NULL;
    }
    fake->live_events--;
    free(event);
    return ACCALLOC_BACKEND_OK;
}

/* The work queued on `stream` finishes: its events complete. */
static void fake_complete_stream(void *stream)
{
    int i;
    for (i = 0; i < MAX_EVENTS; i++) {
        if (g_fake.events[i] && g_fake.events[i]->stream == stream)
            g_fake.events[i]->complete = 1;
    }
}

/* Pinned host memory: plain malloc here; a real backend page-locks it (cudaHostAlloc and the like). */
static int32_t fake_host_alloc(void *ctx, size_t size, void **out)
{
    Fake *f = (Fake *)ctx;
    *out = malloc(size);
    if (*out == NULL)
        return ACCALLOC_BACKEND_OUT_OF_MEMORY;
    f->host_allocs++;
    return ACCALLOC_BACKEND_OK;
}

static int32_t fake_host_free(void *ctx, void *ptr, size_t size)
{
    Fake *f = (Fake *)ctx;
    (void)size;
    free(ptr);
    f->host_frees++;
    return ACCALLOC_BACKEND_OK;
}

/* Copies between the fake device's memory (plain heap memory here) and the host's: sleep's backups. */
static int32_t fake_copy(void *ctx, int32_t device, void *dst, const void *src, size_t size)
{
    (void)ctx, (void)device;
    memcpy(dst, src, size);
    return ACCALLOC_BACKEND_OK;
}

static AccallocBackendVTable fake_table(void)
{
    AccallocBackendVTable table;
    memset(&table, 0, sizeof table);
    table.struct_size = sizeof table;
    table.context = &g_fake;
    table.device_count = fake_device_count;
    table.raw_alloc = fake_raw_alloc;
    table.raw_free = fake_raw_free;
    table.mem_get_info = fake_mem_get_info;
    table.event_create = fake_event_create;
    table.event_record = fake_event_record;
    table.event_query = fake_event_query;
    table.event_synchronize = fake_event_synchronize;
    table.event_destroy = fake_event_destroy;
    table.host_alloc = fake_host_alloc;
    table.host_free = fake_host_free;
    table.copy_to_host = fake_copy;
    table.copy_from_host = fake_copy;
    return table;
}

/* --- helpers ---------------------------------------------------------------------------------------- */

#define EXPECT(call, want) CHECK_STATUS_WITH(call, want, accalloc_status_name, accalloc_last_error_message)

static int64_t stat_on(AccallocDeviceType type, int32_t device, const char *key)
{
    int64_t value = -12345;
    EXPECT(accalloc_memory_stat_on(type, device, key, &value), ACCALLOC_OK);
    return value;
}

/* --- two host devices from two threads -------------------------------------------------------------- */

typedef struct Worker {
    int32_t device;
    size_t size;
    int rounds;
    int failures;
} Worker;

static void *host_worker(void *arg)
{
    Worker *w = (Worker *)arg;
    int i;
    if (accalloc_set_device_on(ACCALLOC_DEVICE_HOST, w->device) != ACCALLOC_OK)
        w->failures++;
    for (i = 0; i < w->rounds; i++) {
        void *p = NULL;
        if (accalloc_malloc_on(ACCALLOC_DEVICE_HOST, &p, w->size, -1, NULL) != ACCALLOC_OK || accalloc_free(p) != ACCALLOC_OK)
            w->failures++;
    }
    return NULL;
}

static void test_two_host_devices_from_two_threads(void)
{
    Worker workers[2] = {{0, 1000, 3000, 0}, {1, 3 * MiB, 2000, 0}};
    pthread_t threads[2];
    int i;
    for (i = 0; i < 2; i++)
        CHECK(pthread_create(&threads[i], NULL, host_worker, &workers[i]) == 0);
    for (i = 0; i < 2; i++) {
        pthread_join(threads[i], NULL);
        CHECK_EQ(workers[i].failures, 0);
    }
    CHECK_EQ(stat_on(ACCALLOC_DEVICE_HOST, 0, "allocation.all.allocated"), 3000);
    CHECK_EQ(stat_on(ACCALLOC_DEVICE_HOST, 0, "allocated_bytes.small_pool.allocated"), 3000 * 1024);
    CHECK_EQ(stat_on(ACCALLOC_DEVICE_HOST, 0, "allocated_bytes.large_pool.allocated"), 0);
    CHECK_EQ(stat_on(ACCALLOC_DEVICE_HOST, 1, "allocation.all.allocated"), 2000);
    CHECK_EQ(stat_on(ACCALLOC_DEVICE_HOST, 1, "allocated_bytes.large_pool.allocated"), (int64_t)2000 * 3 * MiB);
    CHECK_EQ(stat_on(ACCALLOC_DEVICE_HOST, 1, "allocated_bytes.small_pool.allocated"), 0);
    EXPECT(accalloc_empty_cache_on(ACCALLOC_DEVICE_HOST), ACCALLOC_OK);
}

/* --- registration ----------------------------------------------------------------------------------- */

static AccallocDeviceType test_registration(void)
{
    AccallocBackendVTable table = fake_table();
    AccallocDeviceType type = -1, other = -1;

    EXPECT(accalloc_register_backend(NULL, &table, &type), ACCALLOC_ERROR_INVALID_ARGUMENT);
    EXPECT(accalloc_register_backend("fakeacc", NULL, &type), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_CONTAINS(accalloc_last_error_message(), "vtable is NULL");
    EXPECT(accalloc_register_backend("fakeacc", &table, NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    table.struct_size = 8;
    EXPECT(accalloc_register_backend("fakeacc", &table, &type), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_CONTAINS(accalloc_last_error_message(), "struct_size is 8");
    table = fake_table();
    table.raw_free = NULL;
    EXPECT(accalloc_register_backend("fakeacc", &table, &type), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_CONTAINS(accalloc_last_error_message(), "the required entry raw_free is NULL");
    table = fake_table();
    EXPECT(accalloc_register_backend("bad name!", &table, &type), ACCALLOC_ERROR_INVALID_ARGUMENT);
    EXPECT(accalloc_register_backend("host", &table, &type), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_EQ(type, -1);

    EXPECT(accalloc_register_backend("fakeacc", &table, &type), ACCALLOC_OK);
    CHECK(type >= 2);
    CHECK_STR(accalloc_device_type_name(type), "fakeacc");
    EXPECT(accalloc_register_backend("fakeacc", &table, &other), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_CONTAINS(accalloc_last_error_message(), "registered already");
    EXPECT(accalloc_set_accelerator(99), ACCALLOC_ERROR_INVALID_ARGUMENT);
    return type;
}

/* --- the fake accelerator through the public API ----------------------------------------------------- */

static void test_caching_and_splitting(AccallocDeviceType type)
{
    void *p = NULL, *q = NULL, *again = NULL;
    int32_t count = 0;
    uint64_t free_bytes = 0, total = 0;

    EXPECT(accalloc_device_count_on(type, &count), ACCALLOC_OK);
    CHECK_EQ(count, FAKE_DEVICES);
    EXPECT(accalloc_malloc_on(type, &p, 1000, 0, NULL), ACCALLOC_OK);
    CHECK_EQ(g_fake.raw_allocs, 1);
    CHECK_EQ(g_fake.used[0], 2 * MiB); /* a small segment */
    EXPECT(accalloc_malloc_on(type, &q, 1000, 0, NULL), ACCALLOC_OK);
    CHECK((char *)q == (char *)p + 1024); /* split from the same segment */
    CHECK_EQ(g_fake.raw_allocs, 1);
    CHECK_EQ(stat_on(type, 0, "allocated_bytes.all.current"), 2048);
    CHECK_EQ(stat_on(type, 0, "inactive_split_bytes.small_pool.current"), 2 * MiB - 2048);
    EXPECT(accalloc_mem_get_info_on(type, 0, &free_bytes, &total), ACCALLOC_OK);
    CHECK_EQ(total, FAKE_CAPACITY);
    CHECK_EQ(free_bytes, FAKE_CAPACITY - 2 * MiB);
    EXPECT(accalloc_free(p), ACCALLOC_OK);
    EXPECT(accalloc_malloc_on(type, &again, 900, 0, NULL), ACCALLOC_OK);
    CHECK(again == p); /* cached: the backend is not asked again */
    CHECK_EQ(g_fake.raw_allocs, 1);
    EXPECT(accalloc_free(again), ACCALLOC_OK);
    EXPECT(accalloc_free(q), ACCALLOC_OK);
    /* The host's statistics are its own. */
    CHECK_EQ(stat_on(ACCALLOC_DEVICE_HOST, 0, "allocated_bytes.all.current"), 0);
    CHECK_EQ(stat_on(type, 0, "allocation.all.allocated"), 3);
    CHECK_EQ(stat_on(type, 1, "allocation.all.allocated"), 0);
}

static void test_stream_deferral(AccallocDeviceType type)
{
    void *stream_a = (void *)0x100, *stream_b = (void *)0x200;
    void *p = NULL, *q = NULL, *r = NULL;
    EXPECT(accalloc_malloc_on(type, &p, 4096, 1, stream_a), ACCALLOC_OK);
    EXPECT(accalloc_record_stream(p, stream_b), ACCALLOC_OK);
    EXPECT(accalloc_free(p), ACCALLOC_OK);
    CHECK_EQ(g_fake.live_events, 1);
    CHECK_EQ(stat_on(type, 1, "active_bytes.all.current"), 4096); /* waiting on stream b */
    CHECK_EQ(stat_on(type, 1, "allocated_bytes.all.current"), 0);
    EXPECT(accalloc_malloc_on(type, &q, 4096, 1, stream_a), ACCALLOC_OK);
    CHECK(q != p); /* not reusable until stream b's work is done */
    EXPECT(accalloc_free(q), ACCALLOC_OK);
    fake_complete_stream(stream_b);
    EXPECT(accalloc_malloc_on(type, &r, 4096, 1, stream_a), ACCALLOC_OK);
    CHECK(r == p);
    CHECK_EQ(g_fake.live_events, 0);
    EXPECT(accalloc_free(r), ACCALLOC_OK);
    /* empty_cache synchronizes whatever is still pending. */
    EXPECT(accalloc_malloc_on(type, &p, 4096, 1, stream_a), ACCALLOC_OK);
    EXPECT(accalloc_record_stream(p, stream_b), ACCALLOC_OK);
    EXPECT(accalloc_free(p), ACCALLOC_OK);
    EXPECT(accalloc_empty_cache_on(type), ACCALLOC_OK);
    CHECK_EQ(g_fake.live_events, 0);
    CHECK_EQ(stat_on(type, 1, "reserved_bytes.all.current"), 0);
    CHECK_EQ(stat_on(type, 1, "num_sync_all_streams"), 1);
}

/* The host caching allocator over the fake's host_alloc / host_free, its reuse held back by the fake's
 * events; a table from an older header (struct_size ending before host_alloc) registers without it. */
static void test_pinned_host(AccallocDeviceType type)
{
    void *stream_b = (void *)0x200;
    void *p = NULL, *q = NULL, *r = NULL;
    AccallocBackendVTable old = fake_table();
    AccallocDeviceType old_type = -1;
    int64_t value = -1;
    bool recorded = false;
    char text[2048];
    size_t len = 0;

    EXPECT(accalloc_host_malloc_on(type, &p, 3000), ACCALLOC_OK); /* 4,096 */
    CHECK_EQ(g_fake.host_allocs, 1);
    EXPECT(accalloc_host_record_stream(p, 1, stream_b, &recorded), ACCALLOC_OK);
    CHECK(recorded);
    EXPECT(accalloc_host_free(p), ACCALLOC_OK);
    CHECK_EQ(g_fake.live_events, 1);
    EXPECT(accalloc_host_malloc_on(type, &q, 4096), ACCALLOC_OK);
    CHECK(q != p); /* stream b has not finished: a new block */
    EXPECT(accalloc_host_free(q), ACCALLOC_OK);
    fake_complete_stream(stream_b);
    EXPECT(accalloc_host_malloc_on(type, &r, 4000), ACCALLOC_OK);
    CHECK(r == p); /* the event completed: p reused (freed before q, it joins the list after it) */
    CHECK_EQ(g_fake.live_events, 0);
    EXPECT(accalloc_host_memory_stat_on(type, "active_requests.current", &value), ACCALLOC_OK);
    CHECK_EQ(value, 1);
    EXPECT(accalloc_host_memory_stats_json_on(type, text, sizeof text, &len), ACCALLOC_OK);
    CHECK_CONTAINS(text, "\"allocated_bytes.current\":8192,");
    CHECK_CONTAINS(text, "\"num_host_alloc\":2,");
    EXPECT(accalloc_host_free(r), ACCALLOC_OK);
    EXPECT(accalloc_host_empty_cache_on(type), ACCALLOC_OK);
    CHECK_EQ(g_fake.host_frees, 2);
    EXPECT(accalloc_host_reset_peak_memory_stats_on(type), ACCALLOC_OK);
    EXPECT(accalloc_host_reset_accumulated_memory_stats_on(type), ACCALLOC_OK);
    EXPECT(accalloc_host_memory_stat_on(type, "num_host_free", &value), ACCALLOC_OK);
    CHECK_EQ(value, 0);
    /* The host accelerator's own cache is another one. */
    EXPECT(accalloc_host_memory_stat_on(ACCALLOC_DEVICE_HOST, "num_host_alloc", &value), ACCALLOC_OK);
    CHECK_EQ(value, 0);

    old.struct_size = offsetof(AccallocBackendVTable, host_alloc);
    old.host_alloc = NULL; /* an older caller's struct ends before these */
    old.host_free = NULL;
    EXPECT(accalloc_register_backend("oldtable", &old, &old_type), ACCALLOC_OK);
    EXPECT(accalloc_host_malloc_on(old_type, &p, 64), ACCALLOC_ERROR_NOT_SUPPORTED);
    CHECK_CONTAINS(accalloc_last_error_message(), "the oldtable backend has no pinned host memory");
    EXPECT(accalloc_host_memory_stat_on(old_type, "num_host_alloc", &value), ACCALLOC_ERROR_NOT_SUPPORTED);
}

/* Private pools on the fake accelerator, through the _on forms: a pool routed by stream, its
 * segment the fake's, given back once the pool is released and emptied. */
static void test_pools(AccallocDeviceType type)
{
    void *stream_a = (void *)0x100;
    AccallocPoolId pool;
    void *p = NULL, *q = NULL;
    int64_t uses = 0, segments = 0;
    int allocs = g_fake.raw_allocs;

    EXPECT(accalloc_pool_create_on(type, 0, 0, 0, &pool), ACCALLOC_OK);
    EXPECT(accalloc_pool_begin_on(type, 0, pool, ACCALLOC_ROUTE_STREAM, stream_a), ACCALLOC_OK);
    EXPECT(accalloc_malloc_on(type, &p, 4096, 0, stream_a), ACCALLOC_OK); /* the pool's */
    EXPECT(accalloc_malloc_on(type, &q, 4096, 0, NULL), ACCALLOC_OK);     /* another stream: default */
    EXPECT(accalloc_pool_end_on(type, 0, pool), ACCALLOC_OK);
    CHECK_EQ(g_fake.raw_allocs - allocs, 2);
    EXPECT(accalloc_pool_info_on(type, 0, pool, &uses, &segments), ACCALLOC_OK);
    CHECK_EQ(uses, 2);
    CHECK_EQ(segments, 1);
    {
        /* Its live allocations, and a checkpoint put back once p is freed: p is handed out again. */
        void *live[2] = {NULL, NULL}, *freed[1] = {NULL}, *made[1] = {NULL};
        size_t count = 0, freed_count = 9, made_count = 9, sizes[1] = {0};
        AccallocPoolCheckpoint *checkpoint = NULL;
        EXPECT(accalloc_pool_live_allocations_on(type, 0, pool, live, 2, &count), ACCALLOC_OK);
        CHECK_EQ(count, 1);
        CHECK_EQ((uintptr_t)live[0], (uintptr_t)p);
        EXPECT(accalloc_pool_checkpoint_on(type, 0, pool, &checkpoint), ACCALLOC_OK);
        EXPECT(accalloc_free(p), ACCALLOC_OK);
        EXPECT(accalloc_pool_checkpoint_restore(checkpoint, freed, 1, &freed_count, made, sizes, 1, &made_count),
               ACCALLOC_OK);
        CHECK_EQ(freed_count, 0);
        CHECK_EQ(made_count, 1);
        CHECK_EQ((uintptr_t)made[0], (uintptr_t)p);
        CHECK_EQ(sizes[0], 4096);
        EXPECT(accalloc_pool_checkpoint_destroy(checkpoint), ACCALLOC_OK);
    }
    EXPECT(accalloc_free(p), ACCALLOC_OK);
    EXPECT(accalloc_free(q), ACCALLOC_OK);
    EXPECT(accalloc_pool_empty_cache_on(type, 0, pool, 1), ACCALLOC_OK); /* live, emptied anyway */
    EXPECT(accalloc_pool_info_on(type, 0, pool, NULL, &segments), ACCALLOC_OK);
    CHECK_EQ(segments, 0);
    {
        /* The pool's reserved bytes: its one 2 MiB segment came and went. */
        AccallocStat all = {0}, small = {0};
        EXPECT(accalloc_pool_reserved_bytes_on(type, 0, pool, &all, &small, NULL), ACCALLOC_OK);
        CHECK_EQ(all.current, 0);
        CHECK_EQ(small.peak, 2 << 20);
        CHECK_EQ(all.freed, 2 << 20);
    }
    EXPECT(accalloc_pool_release_on(type, 0, pool), ACCALLOC_OK);
    EXPECT(accalloc_pool_release_on(type, 0, pool), ACCALLOC_OK);
    EXPECT(accalloc_empty_cache_on(type), ACCALLOC_OK);
    EXPECT(accalloc_pool_info_on(type, 0, pool, &uses, NULL), ACCALLOC_OK);
    CHECK_EQ(uses, -1);
    CHECK_EQ(stat_on(type, 0, "reserved_bytes.all.current"), 0);
}

/* A pool of the registered device whose segments come from the heap instead of the backend. */
static int heap_alloc(void *ctx, int32_t device, size_t size, void *stream, void **out)
{
    (void)device, (void)stream;
    if (posix_memalign(out, 512, size) != 0)
        return ACCALLOC_BACKEND_OUT_OF_MEMORY;
    ++*(int *)ctx;
    return ACCALLOC_BACKEND_OK;
}

static int heap_free(void *ctx, int32_t device, void *ptr, size_t size)
{
    (void)device, (void)size;
    free(ptr);
    --*(int *)ctx;
    return ACCALLOC_BACKEND_OK;
}

static int take_every_stream(void *stream, void *context)
{
    (void)stream, (void)context;
    return 1;
}

static void *pair_alloc(size_t size, int device, void *stream)
{
    void *p = NULL;
    (void)device, (void)stream;
    return posix_memalign(&p, 512, size) == 0 ? p : NULL;
}

static void pair_free(void *ptr, size_t size, int device, void *stream)
{
    (void)size, (void)device, (void)stream;
    free(ptr);
}

static void test_pool_allocator(AccallocDeviceType type)
{
    AccallocBackendVTable heap;
    AccallocPoolId pool;
    int held = 0, allocs = g_fake.raw_allocs;
    void *p = NULL;

    memset(&heap, 0, sizeof heap);
    heap.struct_size = sizeof heap;
    heap.context = &held;
    heap.raw_alloc = heap_alloc;
    heap.raw_free = heap_free;
    EXPECT(accalloc_pool_create_with_allocator_on(type, 0, 0, 0, &heap, &pool), ACCALLOC_OK);
    EXPECT(accalloc_pool_begin_on(type, 0, pool, ACCALLOC_ROUTE_THREAD, NULL), ACCALLOC_OK);
    EXPECT(accalloc_malloc_on(type, &p, 4096, 0, NULL), ACCALLOC_OK);
    EXPECT(accalloc_pool_end_on(type, 0, pool), ACCALLOC_OK);
    CHECK_EQ(held, 1);
    CHECK_EQ(g_fake.raw_allocs - allocs, 0); /* the backend was not asked */
    EXPECT(accalloc_free(p), ACCALLOC_OK);
    EXPECT(accalloc_pool_empty_cache_on(type, 0, pool, 1), ACCALLOC_OK);
    CHECK_EQ(held, 0);
    EXPECT(accalloc_pool_release_on(type, 0, pool), ACCALLOC_OK);
    EXPECT(accalloc_pool_release_on(type, 0, pool), ACCALLOC_OK);
    EXPECT(accalloc_empty_cache_on(type), ACCALLOC_OK);

    /* A pool id of the caller's, routed by a filter, on the registered device. */
    pool.first = 4;
    pool.second = 0;
    EXPECT(accalloc_pool_retain_on(type, 0, pool), ACCALLOC_OK);
    EXPECT(accalloc_pool_set_flags_on(type, 0, pool, 1, 0), ACCALLOC_OK);
    EXPECT(accalloc_pool_begin_filtered_on(type, 0, pool, take_every_stream, NULL, NULL, 0), ACCALLOC_OK);
    EXPECT(accalloc_malloc_on(type, &p, 4096, 0, NULL), ACCALLOC_OK);
    EXPECT(accalloc_pool_end_on(type, 0, pool), ACCALLOC_OK);
    {
        int64_t uses = 0, segments = 0;
        EXPECT(accalloc_pool_info_on(type, 0, pool, &uses, &segments), ACCALLOC_OK);
        CHECK_EQ(uses, 2);
        CHECK_EQ(segments, 1);
    }
    EXPECT(accalloc_free(p), ACCALLOC_OK);
    EXPECT(accalloc_pool_release_on(type, 0, pool), ACCALLOC_OK);
    EXPECT(accalloc_pool_release_on(type, 0, pool), ACCALLOC_OK);
    EXPECT(accalloc_empty_cache_on(type), ACCALLOC_OK);

    /* PyTorch's pluggable pair on the registered device: the backend is not asked either. */
    allocs = g_fake.raw_allocs;
    EXPECT(accalloc_pool_create_with_functions_on(type, 0, 0, 0, pair_alloc, pair_free, &pool), ACCALLOC_OK);
    EXPECT(accalloc_pool_begin_on(type, 0, pool, ACCALLOC_ROUTE_THREAD, NULL), ACCALLOC_OK);
    EXPECT(accalloc_malloc_on(type, &p, 4096, 0, NULL), ACCALLOC_OK);
    EXPECT(accalloc_pool_end_on(type, 0, pool), ACCALLOC_OK);
    CHECK_EQ(g_fake.raw_allocs - allocs, 0);
    EXPECT(accalloc_free(p), ACCALLOC_OK);
    EXPECT(accalloc_pool_release_on(type, 0, pool), ACCALLOC_OK);
    EXPECT(accalloc_pool_release_on(type, 0, pool), ACCALLOC_OK);
    EXPECT(accalloc_empty_cache_on(type), ACCALLOC_OK);
}

/* Sleep needs virtual memory, which the fake backend has not: refused, naming it, nothing changed. */
static void test_sleep_without_virtual_memory(AccallocDeviceType type)
{
    AccallocPoolId pool;
    int64_t paused = -2;
    EXPECT(accalloc_pool_create_on(type, 0, 0, 0, &pool), ACCALLOC_OK);
    EXPECT(accalloc_pool_set_sleepable_on(type, 0, pool), ACCALLOC_ERROR_NOT_SUPPORTED);
    CHECK_CONTAINS(accalloc_last_error_message(), "virtual memory");
    EXPECT(accalloc_pool_pause_on(type, 0, pool, 0), ACCALLOC_ERROR_NOT_SUPPORTED);
    EXPECT(accalloc_pool_resume_on(type, 0, pool), ACCALLOC_ERROR_NOT_SUPPORTED);
    EXPECT(accalloc_pool_paused_bytes_on(type, 0, pool, &paused), ACCALLOC_OK);
    CHECK_EQ(paused, 0);
    {
        /* planned_placement's planner of this device type: off, as its settings are. */
        AccallocPlannerStats planner = {.struct_size = sizeof(AccallocPlannerStats)};
        EXPECT(accalloc_planner_stats_on(type, 0, &planner), ACCALLOC_OK);
        CHECK_EQ(planner.enabled, 0);
        EXPECT(accalloc_planner_stats_on(type, 0, NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    }
    EXPECT(accalloc_pool_release_on(type, 0, pool), ACCALLOC_OK);
    EXPECT(accalloc_empty_cache_on(type), ACCALLOC_OK);
}

/* A pool allocator with virtual memory, from mmap: reserve = PROT_NONE address space, map = read and
 * write with fresh pages, unmap = the pages back to the system and no access, as a device's
 * cuMemUnmap leaves the addresses. `mapped` counts the bytes with memory behind them. */
static size_t g_vm_mapped;

static int vm_granularity(void *ctx, int32_t device, size_t *out)
{
    (void)ctx, (void)device;
    *out = 2 * MiB;
    return ACCALLOC_BACKEND_OK;
}

static int vm_reserve(void *ctx, int32_t device, size_t size, void **out)
{
    /* Twice the size, trimmed to a 2 MiB-aligned start: accalloc wants reservations aligned. */
    char *base = (char *)mmap(NULL, size + 2 * MiB, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    char *aligned;
    (void)ctx, (void)device;
    if (base == MAP_FAILED)
        return ACCALLOC_BACKEND_OUT_OF_MEMORY;
    aligned = (char *)(((uintptr_t)base + 2 * MiB - 1) & ~(uintptr_t)(2 * MiB - 1));
    if (aligned > base)
        munmap(base, (size_t)(aligned - base));
    munmap(aligned + size, (size_t)(base + size + 2 * MiB - (aligned + size)));
    *out = aligned;
    return ACCALLOC_BACKEND_OK;
}

static int vm_map(void *ctx, int32_t device, void *ptr, size_t size)
{
    (void)ctx, (void)device;
    if (mprotect(ptr, size, PROT_READ | PROT_WRITE) != 0)
        return 1;
    g_vm_mapped += size;
    return ACCALLOC_BACKEND_OK;
}

static int vm_unmap(void *ctx, int32_t device, void *ptr, size_t size)
{
    (void)ctx, (void)device;
    if (madvise(ptr, size, MADV_DONTNEED) != 0 || mprotect(ptr, size, PROT_NONE) != 0)
        return 1;
    g_vm_mapped -= size;
    return ACCALLOC_BACKEND_OK;
}

static int vm_release(void *ctx, int32_t device, void *ptr, size_t size)
{
    (void)ctx, (void)device;
    return munmap(ptr, size) == 0 ? ACCALLOC_BACKEND_OK : 1;
}

/* Sleep on the registered device, in a pool whose pages come from the mmap allocator above: the
 * weights are backed up through the fake's copy entries and come back with their bytes, at the
 * same address; the pages go back meanwhile. */
static void test_sleep_with_backup(AccallocDeviceType type)
{
    AccallocBackendVTable vm;
    AccallocPoolId pool;
    unsigned char *weights = NULL;
    int held = 0;
    int64_t paused = -1;
    size_t i;

    memset(&vm, 0, sizeof vm);
    vm.struct_size = sizeof vm;
    vm.context = &held;
    vm.raw_alloc = heap_alloc;
    vm.raw_free = heap_free;
    vm.vm_granularity = vm_granularity;
    vm.vm_reserve = vm_reserve;
    vm.vm_map = vm_map;
    vm.vm_unmap = vm_unmap;
    vm.vm_release = vm_release;
    EXPECT(accalloc_pool_create_with_allocator_on(type, 0, 0, 0, &vm, &pool), ACCALLOC_OK);
    EXPECT(accalloc_pool_set_sleepable_on(type, 0, pool), ACCALLOC_OK);
    EXPECT(accalloc_pool_begin_on(type, 0, pool, ACCALLOC_ROUTE_THREAD, NULL), ACCALLOC_OK);
    EXPECT(accalloc_malloc_on(type, (void **)&weights, 3 * MiB, 0, NULL), ACCALLOC_OK);
    EXPECT(accalloc_pool_end_on(type, 0, pool), ACCALLOC_OK);
    for (i = 0; i < 3 * MiB; i++)
        weights[i] = (unsigned char)(i * 7 + 3);
    CHECK(g_vm_mapped >= 3 * MiB);
    EXPECT(accalloc_pool_pause_on(type, 0, pool, 1), ACCALLOC_OK);
    CHECK_EQ(g_vm_mapped, 0);
    EXPECT(accalloc_pool_paused_bytes_on(type, 0, pool, &paused), ACCALLOC_OK);
    CHECK(paused >= 3 * MiB);
    {
        AccallocPoolId at = {0, 0};
        EXPECT(accalloc_pool_paused_at_on(type, 0, weights + 5, 10, &at), ACCALLOC_OK);
        CHECK(at.first == pool.first && at.second == pool.second);
    }
    EXPECT(accalloc_pool_resume_on(type, 0, pool), ACCALLOC_OK);
    CHECK(g_vm_mapped >= 3 * MiB);
    for (i = 0; i < 3 * MiB; i++) {
        if (weights[i] != (unsigned char)(i * 7 + 3))
            break;
    }
    CHECK_EQ(i, 3 * MiB); /* every byte came back */
    EXPECT(accalloc_free(weights), ACCALLOC_OK);
    EXPECT(accalloc_pool_release_on(type, 0, pool), ACCALLOC_OK); /* the begin's use */
    EXPECT(accalloc_pool_release_on(type, 0, pool), ACCALLOC_OK); /* the creation's */
    EXPECT(accalloc_empty_cache_on(type), ACCALLOC_OK);
    CHECK_EQ(g_vm_mapped, 0);
    CHECK_EQ(held, 0);
}

static void test_out_of_memory_and_errors(AccallocDeviceType type)
{
    void *big = NULL, *bigger = NULL, *none = NULL;
    EXPECT(accalloc_malloc_on(type, &big, 40 * MiB, 0, NULL), ACCALLOC_OK);
    EXPECT(accalloc_free(big), ACCALLOC_OK);
    /* 40 MiB cached + 2 MiB small segment + 50 MiB > 64 MiB: the cached segments go, then it fits. */
    EXPECT(accalloc_malloc_on(type, &bigger, 50 * MiB, 0, NULL), ACCALLOC_OK);
    CHECK_EQ(stat_on(type, 0, "num_alloc_retries"), 1);
    CHECK_EQ(stat_on(type, 0, "num_ooms"), 0);
    EXPECT(accalloc_malloc_on(type, &none, 30 * MiB, 0, NULL), ACCALLOC_ERROR_OUT_OF_MEMORY);
    CHECK_CONTAINS(accalloc_last_error_message(), "fakeacc out of memory. Tried to allocate 30.00 MiB. Device 0 has a total capacity of 64.00 MiB");
    CHECK(none == NULL);
    CHECK_EQ(stat_on(type, 0, "num_ooms"), 1);
    EXPECT(accalloc_free(bigger), ACCALLOC_OK);

    g_fake.fail_with_code = 77;
    EXPECT(accalloc_malloc_on(type, &none, 200 * 1024 * 1024 / 8, 1, NULL), ACCALLOC_ERROR_BACKEND);
    CHECK_CONTAINS(accalloc_last_error_message(), "fakeacc backend: raw_alloc on device 1 failed");
    CHECK_CONTAINS(accalloc_last_error_message(), "code 77");
    g_fake.fail_with_code = 0;
}

static void test_every_on_form(AccallocDeviceType type)
{
    AccallocDeviceStats stats;
    int64_t value = 0;
    int32_t device = -1;
    size_t len = 0;
    char text[8192];
    void *p = NULL;

    EXPECT(accalloc_set_device_on(type, 1), ACCALLOC_OK);
    EXPECT(accalloc_current_device_on(type, &device), ACCALLOC_OK);
    CHECK_EQ(device, 1);
    EXPECT(accalloc_current_device_on(ACCALLOC_DEVICE_HOST, &device), ACCALLOC_OK);
    CHECK_EQ(device, 0); /* each accelerator has its own current device */
    EXPECT(accalloc_set_allocator_settings_on(type, "max_split_size_mb:32"), ACCALLOC_OK);
    EXPECT(accalloc_get_allocator_settings_on(type, text, sizeof text, &len), ACCALLOC_OK);
    CHECK_STR(text, "max_split_size_mb:32");
    EXPECT(accalloc_get_allocator_settings_on(ACCALLOC_DEVICE_HOST, text, sizeof text, &len), ACCALLOC_OK);
    CHECK_STR(text, "");
    EXPECT(accalloc_record_memory_history_on(type, 1, 100), ACCALLOC_OK);
    EXPECT(accalloc_set_memory_fraction_on(type, 0.5, -1), ACCALLOC_OK);
    {
        double fraction = 0.0;
        EXPECT(accalloc_get_memory_fraction_on(type, &fraction, -1), ACCALLOC_OK);
        CHECK(fraction == 0.5);
        EXPECT(accalloc_get_memory_fraction_on(ACCALLOC_DEVICE_HOST, &fraction, 0), ACCALLOC_OK);
        CHECK(fraction == 1.0); /* the host accelerator keeps none */
    }
    EXPECT(accalloc_malloc_on(type, &p, 33 * MiB, -1, NULL), ACCALLOC_ERROR_OUT_OF_MEMORY); /* past 32 MiB allowed */
    CHECK_CONTAINS(accalloc_last_error_message(), "32.00 MiB allowed;");
    EXPECT(accalloc_malloc_on(type, &p, 5 * MiB, -1, NULL), ACCALLOC_OK);
    EXPECT(accalloc_max_memory_allocated_on(type, -1, &value), ACCALLOC_OK);
    CHECK_EQ(value, 5 * MiB);
    EXPECT(accalloc_memory_allocated_on(type, -1, &value), ACCALLOC_OK);
    CHECK_EQ(value, 5 * MiB);
    EXPECT(accalloc_memory_reserved_on(type, -1, &value), ACCALLOC_OK);
    CHECK_EQ(value, 20 * MiB);
    EXPECT(accalloc_max_memory_reserved_on(type, -1, &value), ACCALLOC_OK);
    CHECK(value >= 20 * MiB);
    memset(&stats, 0, sizeof stats);
    stats.struct_size = sizeof stats;
    EXPECT(accalloc_get_device_stats_on(type, -1, &stats), ACCALLOC_OK);
    CHECK_EQ(stats.max_split_size, 32 * MiB);
    CHECK_EQ(stats.allocation[ACCALLOC_STAT_LARGE_POOL].current, 1);
    EXPECT(accalloc_memory_stats_json_on(type, -1, text, sizeof text, &len), ACCALLOC_OK);
    CHECK_CONTAINS(text, "\"allocated_bytes.all.current\":5242880");
    EXPECT(accalloc_memory_summary_on(type, -1, 1, text, sizeof text, &len), ACCALLOC_OK);
    CHECK_CONTAINS(text, "accalloc fakeacc memory summary, device ID 1");
    EXPECT(accalloc_memory_snapshot_json_on(type, NULL, 0, &len), ACCALLOC_OK);
    {
        char *snapshot = (char *)malloc(len);
        EXPECT(accalloc_memory_snapshot_json_on(type, snapshot, len, &len), ACCALLOC_OK);
        CHECK_CONTAINS(snapshot, "\"segment_type\":\"large\"");
        CHECK_CONTAINS(snapshot, "\"action\":\"alloc\"");
        free(snapshot);
    }
    EXPECT(accalloc_free(p), ACCALLOC_OK);
    EXPECT(accalloc_reset_peak_memory_stats_on(type, -1), ACCALLOC_OK);
    EXPECT(accalloc_max_memory_allocated_on(type, -1, &value), ACCALLOC_OK);
    CHECK_EQ(value, 0);
    EXPECT(accalloc_reset_accumulated_memory_stats_on(type, -1), ACCALLOC_OK);
    CHECK_EQ(stat_on(type, -1, "allocation.all.allocated"), 0);
    EXPECT(accalloc_record_memory_history_on(type, 0, 0), ACCALLOC_OK);
    EXPECT(accalloc_malloc_on(42, &p, 64, 0, NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_CONTAINS(accalloc_last_error_message(), "device type 42 does not exist");
}

static void test_current_accelerator(AccallocDeviceType type)
{
    void *p = NULL;
    int64_t value = 0;
    CHECK_EQ(accalloc_current_accelerator(), accalloc_test_on_cuda() ? ACCALLOC_DEVICE_CUDA : ACCALLOC_DEVICE_HOST);
    EXPECT(accalloc_set_accelerator(type), ACCALLOC_OK);
    CHECK_EQ(accalloc_current_accelerator(), type);
    EXPECT(accalloc_malloc(&p, 3000, 0, NULL), ACCALLOC_OK); /* plain calls now go to the fake accelerator */
    EXPECT(accalloc_memory_allocated(0, &value), ACCALLOC_OK);
    CHECK_EQ(value, 3072);
    EXPECT(accalloc_free(p), ACCALLOC_OK);
    EXPECT(accalloc_empty_cache(), ACCALLOC_OK);
    EXPECT(accalloc_set_accelerator(ACCALLOC_DEVICE_HOST), ACCALLOC_OK);
    EXPECT(accalloc_memory_allocated(0, &value), ACCALLOC_OK);
    CHECK_EQ(value, 0);
}

int main(void)
{
    AccallocDeviceType type;
    test_two_host_devices_from_two_threads();
    type = test_registration();
    test_caching_and_splitting(type);
    test_stream_deferral(type);
    test_pinned_host(type);
    test_pools(type);
    test_pool_allocator(type);
    test_sleep_without_virtual_memory(type);
    test_sleep_with_backup(type);
    test_out_of_memory_and_errors(type);
    test_every_on_form(type);
    test_current_accelerator(type);
    EXPECT(accalloc_empty_cache_on(type), ACCALLOC_OK);
    CHECK_EQ(g_fake.used[0] + g_fake.used[1], 0); /* every segment went back to the fake device */
    CHECK_EQ(g_fake.raw_allocs, g_fake.raw_frees);
    printf("%d checks, %d failed\n", g_checks, g_failures);
    return g_failures == 0 ? 0 : 1;
}
