/* dlopen: the way a framework that loads accalloc at run time uses it. This program is not linked
 * against libaccalloc: it takes only types and constants from accalloc.h, dlopens the library (path in
 * argv[1], else the path CMake compiled in), dlsyms every function, does a malloc/free/stats round trip
 * and checks error paths through the function pointers, then dlcloses it.
 * Run with ACCALLOC_HOST_CAPACITY=1GiB and ACCALLOC_HOST_DEVICES=2. */
#include "accalloc.h"

#include <dlfcn.h>
#include <stdlib.h>

#include "accalloc_test_util.h"

#ifndef ACCALLOC_DEFAULT_PATH
#define ACCALLOC_DEFAULT_PATH "libaccalloc.so"
#endif

/* The function pointer types, written out by hand. TYPECHECK compares each with the header's prototype
 * inside sizeof (never evaluated, so no reference to the symbol reaches the linker): a typedef that
 * disagrees with accalloc.h is a compile error under -Werror. */
typedef AccallocStatus (*malloc_fn)(void **, size_t, int32_t, void *);
typedef AccallocStatus (*free_fn)(void *);
typedef AccallocStatus (*void_status_fn)(void);
typedef AccallocStatus (*stats_fn)(int32_t, AccallocDeviceStats *);
typedef AccallocStatus (*i64_fn)(int32_t, int64_t *);
typedef AccallocStatus (*device_fn)(int32_t);
typedef AccallocStatus (*stat_fn)(int32_t, const char *, int64_t *);
typedef AccallocStatus (*json_fn)(int32_t, char *, size_t, size_t *);
typedef AccallocStatus (*meminfo_fn)(int32_t, uint64_t *, uint64_t *);
typedef AccallocStatus (*fraction_fn)(double, int32_t);
typedef AccallocStatus (*fraction_out_fn)(double *, int32_t);
typedef AccallocStatus (*i32_out_fn)(int32_t *);
typedef AccallocDeviceType (*accel_fn)(void);
typedef const char *(*type_name_fn)(AccallocDeviceType);
typedef const char *(*status_name_fn)(int32_t);
typedef const char *(*cstr_fn)(void);
typedef uint32_t (*abi_fn)(void);
typedef AccallocStatus (*check_abi_fn)(uint32_t);
typedef AccallocStatus (*set_settings_fn)(const char *);
typedef AccallocStatus (*record_stream_fn)(void *, void *);
typedef AccallocStatus (*summary_fn)(int32_t, int32_t, char *, size_t, size_t *);
typedef AccallocStatus (*snapshot_fn)(char *, size_t, size_t *);
typedef AccallocStatus (*history_fn)(int32_t, size_t);
typedef AccallocStatus (*get_settings_fn)(char *, size_t, size_t *);
typedef AccallocStatus (*ort_create_fn)(const void *, uint32_t, AccallocDeviceType, int32_t, void **);
typedef AccallocStatus (*ort_destroy_fn)(void *);
typedef AccallocStatus (*host_malloc_fn)(void **, size_t);
typedef AccallocStatus (*pool_create_fn)(int32_t, int32_t, int32_t, AccallocPoolId *);
typedef AccallocStatus (*pool_begin_fn)(int32_t, AccallocPoolId, int32_t, void *);
typedef AccallocStatus (*pool_fn)(int32_t, AccallocPoolId);
typedef AccallocStatus (*pool_empty_fn)(int32_t, AccallocPoolId, int32_t);
typedef AccallocStatus (*pool_info_fn)(int32_t, AccallocPoolId, int64_t *, int64_t *);
typedef AccallocStatus (*segment_observer_add_fn)(AccallocSegmentObserver, void *, uint64_t *);
typedef AccallocStatus (*oom_observer_add_fn)(AccallocOomObserver, void *, uint64_t *);
typedef AccallocStatus (*observer_remove_fn)(uint64_t);
typedef AccallocStatus (*pool_create_with_allocator_fn)(int32_t, int32_t, int32_t, const AccallocBackendVTable *,
                                                       AccallocPoolId *);
typedef AccallocStatus (*pool_id_fn)(int32_t, AccallocPoolId);
typedef AccallocStatus (*pool_pause_fn)(int32_t, AccallocPoolId, int32_t);
typedef AccallocStatus (*pool_paused_bytes_fn)(int32_t, AccallocPoolId, int64_t *);
typedef AccallocStatus (*pool_live_allocations_fn)(int32_t, AccallocPoolId, void **, size_t, size_t *);
typedef AccallocStatus (*pool_checkpoint_fn)(int32_t, AccallocPoolId, AccallocPoolCheckpoint **);
typedef AccallocStatus (*pool_checkpoint_allocations_fn)(const AccallocPoolCheckpoint *, size_t *);
typedef AccallocStatus (*pool_checkpoint_restore_fn)(const AccallocPoolCheckpoint *, void **, size_t, size_t *, void **,
                                                     size_t *, size_t, size_t *);
typedef AccallocStatus (*pool_checkpoint_destroy_fn)(AccallocPoolCheckpoint *);
typedef AccallocStatus (*planner_stats_fn)(int32_t, AccallocPlannerStats *);
typedef AccallocStatus (*pool_paused_at_fn)(int32_t, const void *, size_t, AccallocPoolId *);
typedef AccallocStatus (*pool_create_with_functions_fn)(int32_t, int32_t, int32_t, AccallocPluggableAlloc,
                                                       AccallocPluggableFree, AccallocPoolId *);
typedef AccallocStatus (*pool_set_flags_fn)(int32_t, AccallocPoolId, int32_t, int32_t);
typedef AccallocStatus (*pool_begin_filtered_fn)(int32_t, AccallocPoolId, AccallocPoolFilter, void *,
                                                 AccallocPoolFilterRelease, int32_t);
typedef AccallocStatus (*pool_reserved_fn)(int32_t, AccallocPoolId, AccallocStat *, AccallocStat *, AccallocStat *);

/* PyTorch's pluggable pair over the heap. */
static void *heap_pair_alloc(size_t size, int device, void *stream)
{
    void *p = NULL;
    (void)device, (void)stream;
    return posix_memalign(&p, 512, size) == 0 ? p : NULL;
}

static void heap_pair_free(void *ptr, size_t size, int device, void *stream)
{
    (void)size, (void)device, (void)stream;
    free(ptr);
}

/* A filter that takes every stream. */
static int every_stream(void *stream, void *context)
{
    (void)stream, (void)context;
    return 1;
}

/* A pool allocator from the heap: counts the bytes it holds. */
static int heap_alloc(void *ctx, int32_t device, size_t size, void *stream, void **out)
{
    (void)device, (void)stream;
    if (posix_memalign(out, 512, size) != 0)
        return ACCALLOC_BACKEND_OUT_OF_MEMORY;
    *(int64_t *)ctx += (int64_t)size;
    return ACCALLOC_BACKEND_OK;
}

static int heap_free(void *ctx, int32_t device, void *ptr, size_t size)
{
    (void)device;
    free(ptr);
    *(int64_t *)ctx -= (int64_t)size;
    return ACCALLOC_BACKEND_OK;
}

/* Observers: each counts its calls; the segment observer the bytes it was told are live. */
static void count_segment(const AccallocSegmentEvent *e, void *user)
{
    int64_t *live = user;
    *live += (e->action == ACCALLOC_SEGMENT_ALLOC || e->action == ACCALLOC_SEGMENT_MAP) ? (int64_t)e->size
                                                                                        : -(int64_t)e->size;
}

static void note_limit(AccallocDeviceType type, int64_t device, size_t alloc_size, size_t limit_or_total,
                       size_t device_free, void *user)
{
    (void)type, (void)device, (void)alloc_size, (void)device_free;
    *(size_t *)user = limit_or_total;
}
typedef AccallocStatus (*host_record_stream_fn)(const void *, int32_t, void *, bool *);
typedef AccallocStatus (*host_is_pinned_fn)(const void *, bool *);
typedef AccallocStatus (*allocation_info_fn)(const void *, uint64_t *, AccallocDeviceType *, int32_t *);
typedef AccallocStatus (*host_json_fn)(char *, size_t, size_t *);
typedef AccallocStatus (*host_stat_fn)(const char *, int64_t *);

#define TYPECHECK(type, fn) (void)sizeof(&fn == (type)0)

static void *g_lib;
static int g_missing;

static void *sym(const char *name)
{
    void *p;
    dlerror();
    p = dlsym(g_lib, name);
    if (p == NULL) {
        const char *e = dlerror();
        ++g_missing;
        fprintf(stderr, "FAIL dlsym(\"%s\"): %s\n", name, e ? e : "NULL");
    }
    return p;
}

/* Object pointer to function pointer, the POSIX way, without a pedantic cast. */
#define LOAD(var, name)                       \
    do {                                      \
        void *raw_ = sym(name);               \
        memcpy(&(var), &raw_, sizeof(var));   \
    } while (0)

static status_name_fn p_status_name;
static cstr_fn p_last_error;

#define CHECK_STATUS(call, want) CHECK_STATUS_WITH(call, want, p_status_name, p_last_error)


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

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : ACCALLOC_DEFAULT_PATH;
    malloc_fn p_malloc;
    free_fn p_free;
    void_status_fn p_empty_cache;
    stats_fn p_get_device_stats;
    i64_fn p_memory_allocated, p_max_memory_allocated, p_memory_reserved, p_max_memory_reserved;
    device_fn p_reset_accumulated, p_reset_peak, p_set_device;
    stat_fn p_memory_stat;
    json_fn p_stats_json;
    meminfo_fn p_mem_get_info;
    fraction_fn p_set_memory_fraction;
    fraction_out_fn p_get_memory_fraction;
    i32_out_fn p_device_count, p_current_device;
    accel_fn p_current_accelerator;
    type_name_fn p_device_type_name;
    cstr_fn p_version;
    abi_fn p_abi_version;
    check_abi_fn p_check_abi;
    set_settings_fn p_set_settings;
    get_settings_fn p_get_settings;
    record_stream_fn p_record_stream;
    summary_fn p_summary;
    snapshot_fn p_snapshot;
    history_fn p_history;
    ort_create_fn p_ort_create;
    ort_destroy_fn p_ort_destroy;
    host_malloc_fn p_host_malloc;
    free_fn p_host_free;
    host_record_stream_fn p_host_record_stream;
    host_is_pinned_fn p_host_is_pinned;
    allocation_info_fn p_allocation_info;
    void_status_fn p_host_empty_cache, p_host_reset_accumulated, p_host_reset_peak;
    host_json_fn p_host_stats_json;
    host_stat_fn p_host_stat;
    bool pinned = false;
    pool_create_fn p_pool_create;
    pool_begin_fn p_pool_begin;
    pool_fn p_pool_end, p_pool_release;
    pool_empty_fn p_pool_empty_cache;
    pool_info_fn p_pool_info;
    pool_reserved_fn p_pool_reserved_bytes;
    pool_create_with_allocator_fn p_pool_create_with_allocator;
    pool_id_fn p_pool_retain, p_pool_set_sleepable, p_pool_resume;
    pool_pause_fn p_pool_pause;
    pool_paused_bytes_fn p_pool_paused_bytes;
    pool_live_allocations_fn p_pool_live_allocations;
    pool_checkpoint_fn p_pool_checkpoint;
    pool_checkpoint_allocations_fn p_pool_checkpoint_allocations;
    pool_checkpoint_restore_fn p_pool_checkpoint_restore;
    pool_checkpoint_destroy_fn p_pool_checkpoint_destroy;
    planner_stats_fn p_planner_stats;
    pool_paused_at_fn p_pool_paused_at;
    int64_t paused = -2;
    pool_create_with_functions_fn p_pool_create_with_functions;
    pool_set_flags_fn p_pool_set_flags;
    pool_begin_filtered_fn p_pool_begin_filtered;
    AccallocPoolId graph = {5, 0};
    AccallocBackendVTable heap = {0};
    int64_t heap_bytes = 0;
    AccallocStat pool_reserved = {0};
    AccallocPoolId pool;
    int64_t uses = 0, held = 0;
    segment_observer_add_fn p_segment_observer_add;
    oom_observer_add_fn p_oom_observer_add;
    observer_remove_fn p_segment_observer_remove, p_oom_observer_remove;
    uint64_t segment_handle = 0, oom_handle = 0;
    int64_t live_bytes = 0;
    size_t oom_limit = 0;
    char settings[256];
    AccallocDeviceStats s;
    void *ptr = NULL;
    int local = 0;
    int64_t v = -1;
    uint64_t fr = 0, tot = 0;
    int32_t n = -1;
    size_t len = 0;
    char *json;

    require_test_env();
    TYPECHECK(malloc_fn, accalloc_malloc);
    TYPECHECK(free_fn, accalloc_free);
    TYPECHECK(void_status_fn, accalloc_empty_cache);
    TYPECHECK(stats_fn, accalloc_get_device_stats);
    TYPECHECK(i64_fn, accalloc_memory_allocated);
    TYPECHECK(i64_fn, accalloc_max_memory_allocated);
    TYPECHECK(i64_fn, accalloc_memory_reserved);
    TYPECHECK(i64_fn, accalloc_max_memory_reserved);
    TYPECHECK(device_fn, accalloc_reset_accumulated_memory_stats);
    TYPECHECK(device_fn, accalloc_reset_peak_memory_stats);
    TYPECHECK(device_fn, accalloc_set_device);
    TYPECHECK(stat_fn, accalloc_memory_stat);
    TYPECHECK(json_fn, accalloc_memory_stats_json);
    TYPECHECK(meminfo_fn, accalloc_mem_get_info);
    TYPECHECK(fraction_fn, accalloc_set_memory_fraction);
    TYPECHECK(fraction_out_fn, accalloc_get_memory_fraction);
    TYPECHECK(i32_out_fn, accalloc_device_count);
    TYPECHECK(i32_out_fn, accalloc_current_device);
    TYPECHECK(accel_fn, accalloc_current_accelerator);
    TYPECHECK(type_name_fn, accalloc_device_type_name);
    TYPECHECK(status_name_fn, accalloc_status_name);
    TYPECHECK(cstr_fn, accalloc_last_error_message);
    TYPECHECK(cstr_fn, accalloc_version);
    TYPECHECK(abi_fn, accalloc_abi_version);
    TYPECHECK(check_abi_fn, accalloc_check_abi);
    TYPECHECK(set_settings_fn, accalloc_set_allocator_settings);
    TYPECHECK(get_settings_fn, accalloc_get_allocator_settings);
    TYPECHECK(record_stream_fn, accalloc_record_stream);
    TYPECHECK(summary_fn, accalloc_memory_summary);
    TYPECHECK(snapshot_fn, accalloc_memory_snapshot_json);
    TYPECHECK(history_fn, accalloc_record_memory_history);
    TYPECHECK(ort_create_fn, accalloc_ort_allocator_create);
    TYPECHECK(ort_destroy_fn, accalloc_ort_allocator_destroy);
    TYPECHECK(host_malloc_fn, accalloc_host_malloc);
    TYPECHECK(free_fn, accalloc_host_free);
    TYPECHECK(host_record_stream_fn, accalloc_host_record_stream);
    TYPECHECK(host_is_pinned_fn, accalloc_host_is_pinned);
    TYPECHECK(allocation_info_fn, accalloc_allocation_info);
    TYPECHECK(void_status_fn, accalloc_host_empty_cache);
    TYPECHECK(void_status_fn, accalloc_host_reset_accumulated_memory_stats);
    TYPECHECK(void_status_fn, accalloc_host_reset_peak_memory_stats);
    TYPECHECK(host_json_fn, accalloc_host_memory_stats_json);
    TYPECHECK(host_stat_fn, accalloc_host_memory_stat);
    TYPECHECK(pool_create_fn, accalloc_pool_create);
    TYPECHECK(pool_begin_fn, accalloc_pool_begin);
    TYPECHECK(pool_fn, accalloc_pool_end);
    TYPECHECK(pool_fn, accalloc_pool_release);
    TYPECHECK(pool_empty_fn, accalloc_pool_empty_cache);
    TYPECHECK(pool_info_fn, accalloc_pool_info);
    TYPECHECK(pool_reserved_fn, accalloc_pool_reserved_bytes);
    TYPECHECK(pool_create_with_allocator_fn, accalloc_pool_create_with_allocator);
    TYPECHECK(pool_id_fn, accalloc_pool_retain);
    TYPECHECK(pool_id_fn, accalloc_pool_set_sleepable);
    TYPECHECK(pool_id_fn, accalloc_pool_resume);
    TYPECHECK(pool_pause_fn, accalloc_pool_pause);
    TYPECHECK(pool_paused_bytes_fn, accalloc_pool_paused_bytes);
    TYPECHECK(pool_live_allocations_fn, accalloc_pool_live_allocations);
    TYPECHECK(pool_checkpoint_fn, accalloc_pool_checkpoint);
    TYPECHECK(pool_checkpoint_allocations_fn, accalloc_pool_checkpoint_allocations);
    TYPECHECK(pool_checkpoint_restore_fn, accalloc_pool_checkpoint_restore);
    TYPECHECK(pool_checkpoint_destroy_fn, accalloc_pool_checkpoint_destroy);
    TYPECHECK(planner_stats_fn, accalloc_planner_stats);
    TYPECHECK(pool_paused_at_fn, accalloc_pool_paused_at);
    TYPECHECK(pool_create_with_functions_fn, accalloc_pool_create_with_functions);
    TYPECHECK(pool_set_flags_fn, accalloc_pool_set_flags);
    TYPECHECK(pool_begin_filtered_fn, accalloc_pool_begin_filtered);
    TYPECHECK(segment_observer_add_fn, accalloc_segment_observer_add);
    TYPECHECK(observer_remove_fn, accalloc_segment_observer_remove);
    TYPECHECK(oom_observer_add_fn, accalloc_oom_observer_add);
    TYPECHECK(observer_remove_fn, accalloc_oom_observer_remove);

    /* Not linked: nothing named accalloc_malloc is in the process before dlopen. */
    CHECK(dlsym(RTLD_DEFAULT, "accalloc_malloc") == NULL);

    g_lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (g_lib == NULL) {
        fprintf(stderr, "FAIL dlopen(\"%s\"): %s\n", path, dlerror());
        return 1;
    }
    LOAD(p_malloc, "accalloc_malloc");
    LOAD(p_free, "accalloc_free");
    LOAD(p_empty_cache, "accalloc_empty_cache");
    LOAD(p_get_device_stats, "accalloc_get_device_stats");
    LOAD(p_memory_allocated, "accalloc_memory_allocated");
    LOAD(p_max_memory_allocated, "accalloc_max_memory_allocated");
    LOAD(p_memory_reserved, "accalloc_memory_reserved");
    LOAD(p_max_memory_reserved, "accalloc_max_memory_reserved");
    LOAD(p_reset_accumulated, "accalloc_reset_accumulated_memory_stats");
    LOAD(p_reset_peak, "accalloc_reset_peak_memory_stats");
    LOAD(p_memory_stat, "accalloc_memory_stat");
    LOAD(p_stats_json, "accalloc_memory_stats_json");
    LOAD(p_mem_get_info, "accalloc_mem_get_info");
    LOAD(p_set_memory_fraction, "accalloc_set_memory_fraction");
    LOAD(p_get_memory_fraction, "accalloc_get_memory_fraction");
    LOAD(p_device_count, "accalloc_device_count");
    LOAD(p_current_device, "accalloc_current_device");
    LOAD(p_set_device, "accalloc_set_device");
    LOAD(p_current_accelerator, "accalloc_current_accelerator");
    LOAD(p_device_type_name, "accalloc_device_type_name");
    LOAD(p_status_name, "accalloc_status_name");
    LOAD(p_last_error, "accalloc_last_error_message");
    LOAD(p_version, "accalloc_version");
    LOAD(p_abi_version, "accalloc_abi_version");
    LOAD(p_check_abi, "accalloc_check_abi");
    LOAD(p_set_settings, "accalloc_set_allocator_settings");
    LOAD(p_get_settings, "accalloc_get_allocator_settings");
    LOAD(p_record_stream, "accalloc_record_stream");
    LOAD(p_summary, "accalloc_memory_summary");
    LOAD(p_snapshot, "accalloc_memory_snapshot_json");
    LOAD(p_history, "accalloc_record_memory_history");
    LOAD(p_ort_create, "accalloc_ort_allocator_create");
    LOAD(p_ort_destroy, "accalloc_ort_allocator_destroy");
    LOAD(p_host_malloc, "accalloc_host_malloc");
    LOAD(p_host_free, "accalloc_host_free");
    LOAD(p_host_record_stream, "accalloc_host_record_stream");
    LOAD(p_host_is_pinned, "accalloc_host_is_pinned");
    LOAD(p_allocation_info, "accalloc_allocation_info");
    LOAD(p_host_empty_cache, "accalloc_host_empty_cache");
    LOAD(p_host_reset_accumulated, "accalloc_host_reset_accumulated_memory_stats");
    LOAD(p_host_reset_peak, "accalloc_host_reset_peak_memory_stats");
    LOAD(p_host_stats_json, "accalloc_host_memory_stats_json");
    LOAD(p_host_stat, "accalloc_host_memory_stat");
    LOAD(p_pool_create, "accalloc_pool_create");
    LOAD(p_pool_begin, "accalloc_pool_begin");
    LOAD(p_pool_end, "accalloc_pool_end");
    LOAD(p_pool_release, "accalloc_pool_release");
    LOAD(p_pool_empty_cache, "accalloc_pool_empty_cache");
    LOAD(p_pool_info, "accalloc_pool_info");
    LOAD(p_pool_reserved_bytes, "accalloc_pool_reserved_bytes");
    LOAD(p_pool_create_with_allocator, "accalloc_pool_create_with_allocator");
    LOAD(p_pool_retain, "accalloc_pool_retain");
    LOAD(p_pool_set_sleepable, "accalloc_pool_set_sleepable");
    LOAD(p_pool_resume, "accalloc_pool_resume");
    LOAD(p_pool_pause, "accalloc_pool_pause");
    LOAD(p_pool_paused_bytes, "accalloc_pool_paused_bytes");
    LOAD(p_pool_live_allocations, "accalloc_pool_live_allocations");
    LOAD(p_pool_checkpoint, "accalloc_pool_checkpoint");
    LOAD(p_pool_checkpoint_allocations, "accalloc_pool_checkpoint_allocations");
    LOAD(p_pool_checkpoint_restore, "accalloc_pool_checkpoint_restore");
    LOAD(p_pool_checkpoint_destroy, "accalloc_pool_checkpoint_destroy");
    LOAD(p_planner_stats, "accalloc_planner_stats");
    LOAD(p_pool_paused_at, "accalloc_pool_paused_at");
    LOAD(p_pool_create_with_functions, "accalloc_pool_create_with_functions");
    LOAD(p_pool_set_flags, "accalloc_pool_set_flags");
    LOAD(p_pool_begin_filtered, "accalloc_pool_begin_filtered");
    LOAD(p_segment_observer_add, "accalloc_segment_observer_add");
    LOAD(p_segment_observer_remove, "accalloc_segment_observer_remove");
    LOAD(p_oom_observer_add, "accalloc_oom_observer_add");
    LOAD(p_oom_observer_remove, "accalloc_oom_observer_remove");
    if (g_missing) {
        fprintf(stderr, "FAIL %d functions missing from %s\n", g_missing, path);
        return 1;
    }
    /* RTLD_LOCAL: the symbols stay private to the handle. */
    CHECK(dlsym(RTLD_DEFAULT, "accalloc_malloc") == NULL);

    CHECK_STR(p_version(), "0.1.0");
    CHECK_EQ(p_abi_version(), ACCALLOC_ABI_VERSION);
    /* A program loading the library by hand checks its ABI the same way. */
    CHECK_EQ(p_check_abi(ACCALLOC_ABI_VERSION), ACCALLOC_OK);
    CHECK_STR(p_last_error(), "");
    CHECK_STR(p_status_name(ACCALLOC_ERROR_OUT_OF_MEMORY), "ACCALLOC_ERROR_OUT_OF_MEMORY");
    CHECK_STR(p_status_name(77), "ACCALLOC_ERROR_UNKNOWN");
    CHECK_EQ(p_current_accelerator(), accalloc_test_on_cuda() ? ACCALLOC_DEVICE_CUDA : ACCALLOC_DEVICE_HOST);
    CHECK_STR(p_device_type_name(p_current_accelerator()), accalloc_test_on_cuda() ? "cuda" : "host");
    /* ONNX Runtime's allocator: a NULL OrtApi is refused before anything else is touched. */
    CHECK_STATUS(p_ort_create(NULL, 23, ACCALLOC_DEVICE_HOST, 0, &ptr), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK(ptr == NULL);
    CHECK_STATUS(p_ort_destroy(NULL), ACCALLOC_OK);
    CHECK_STATUS(p_device_count(&n), ACCALLOC_OK);
    CHECK_EQ(n, 2);
    CHECK_STATUS(p_current_device(&n), ACCALLOC_OK);
    CHECK_EQ(n, 0);

    /* Round trip: malloc(1000) -> 1024 allocated out of a 2 MiB segment; free; empty_cache. */
    CHECK_STATUS(p_malloc(&ptr, 1000, -1, NULL), ACCALLOC_OK);
    CHECK(ptr != NULL);
    if (ptr != NULL && p_current_accelerator() == ACCALLOC_DEVICE_HOST)
        memset(ptr, 0xCD, 1000);
    CHECK_STATUS(p_memory_allocated(0, &v), ACCALLOC_OK);
    CHECK_EQ(v, 1024);
    CHECK_STATUS(p_max_memory_allocated(0, &v), ACCALLOC_OK);
    CHECK_EQ(v, 1024);
    CHECK_STATUS(p_memory_reserved(0, &v), ACCALLOC_OK);
    CHECK_EQ(v, 2097152);
    CHECK_STATUS(p_max_memory_reserved(0, &v), ACCALLOC_OK);
    CHECK_EQ(v, 2097152);
    CHECK_STATUS(p_memory_stat(0, "requested_bytes.all.current", &v), ACCALLOC_OK);
    CHECK_EQ(v, 1000);
    {
        uint64_t size = 0;
        int32_t device = -1;
        CHECK_STATUS(p_allocation_info(ptr, &size, NULL, &device), ACCALLOC_OK);
        CHECK_EQ(size, 1024);
        CHECK_EQ(device, 0);
    }
    CHECK_STATUS(p_memory_stat(0, "inactive_split_bytes.small_pool.current", &v), ACCALLOC_OK);
    CHECK_EQ(v, 2096128);
    CHECK_STATUS(p_mem_get_info(0, &fr, &tot), ACCALLOC_OK);
    CHECK_EQ(tot, 1073741824);
    CHECK_EQ(fr, 1073741824 - 2097152);
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    CHECK_STATUS(p_get_device_stats(0, &s), ACCALLOC_OK);
    CHECK_EQ(s.allocation[ACCALLOC_STAT_ALL].current, 1);
    CHECK_EQ(s.segment[ACCALLOC_STAT_SMALL_POOL].current, 1);
    CHECK_EQ(s.segment[ACCALLOC_STAT_LARGE_POOL].current, 0);
    CHECK_EQ(s.num_device_alloc, 1);
    CHECK_EQ(s.max_split_size, -1);

    CHECK_STATUS(p_stats_json(0, NULL, 0, &len), ACCALLOC_OK);
    json = (char *)malloc(len);
    if (json != NULL) {
        CHECK_STATUS(p_stats_json(0, json, len, &len), ACCALLOC_OK);
        CHECK_CONTAINS(json, "\"allocated_bytes.all.current\"");
        CHECK_CONTAINS(json, "\"max_split_size\"");
        free(json);
    }

    CHECK_STATUS(p_history(1, 32), ACCALLOC_OK);
    CHECK_STATUS(p_summary(0, 0, NULL, 0, &len), ACCALLOC_OK);
    json = (char *)malloc(len);
    if (json != NULL) {
        CHECK_STATUS(p_summary(0, 0, json, len, &len), ACCALLOC_OK);
        CHECK_CONTAINS(json, "| Allocations           |       1    |       1    |       1    |       0    |");
        free(json);
    }
    CHECK_STATUS(p_record_stream(ptr, accalloc_test_stream(0, 0x3000)), ACCALLOC_OK);
    CHECK_STATUS(p_free(ptr), ACCALLOC_OK);
    CHECK_STATUS(p_memory_allocated(0, &v), ACCALLOC_OK);
    CHECK_EQ(v, 0);
    CHECK_STATUS(p_record_stream(ptr, NULL), ACCALLOC_ERROR_INVALID_POINTER); /* freed */
    CHECK_STATUS(p_snapshot(NULL, 0, &len), ACCALLOC_OK);
    json = (char *)malloc(len);
    if (json != NULL) {
        CHECK_STATUS(p_snapshot(json, len, &len), ACCALLOC_OK);
        CHECK_CONTAINS(json, "\"active_pending_free\""); /* freed, waiting on the recorded stream */
        CHECK_CONTAINS(json, "\"free_requested\"");
        free(json);
    }
    CHECK_STATUS(p_history(0, 0), ACCALLOC_OK);
    CHECK_STATUS(p_history(1, 0), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(p_summary(7, 0, NULL, 0, &len), ACCALLOC_ERROR_INVALID_DEVICE);
    CHECK_STATUS(p_snapshot(NULL, 0, NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(p_memory_reserved(0, &v), ACCALLOC_OK);
    CHECK_EQ(v, 2097152);
    CHECK_STATUS(p_empty_cache(), ACCALLOC_OK);
    CHECK_STATUS(p_memory_reserved(0, &v), ACCALLOC_OK);
    CHECK_EQ(v, 0);
    CHECK_STATUS(p_memory_stat(0, "num_device_free", &v), ACCALLOC_OK);
    CHECK_EQ(v, 1);
    CHECK_STATUS(p_reset_peak(0), ACCALLOC_OK);
    CHECK_STATUS(p_max_memory_allocated(0, &v), ACCALLOC_OK);
    CHECK_EQ(v, 0);
    CHECK_STATUS(p_reset_accumulated(0), ACCALLOC_OK);
    CHECK_STATUS(p_memory_stat(0, "allocation.all.allocated", &v), ACCALLOC_OK);
    CHECK_EQ(v, 0);

    /* Pinned host memory: 1000 bytes round to 1024; reused after a free; given back by empty. */
    CHECK_STATUS(p_host_malloc(&ptr, 1000), ACCALLOC_OK);
    CHECK(ptr != NULL);
    if (ptr != NULL)
        memset(ptr, 0xAB, 1024);
    CHECK_STATUS(p_host_is_pinned(ptr, &pinned), ACCALLOC_OK);
    CHECK(pinned);
    CHECK_STATUS(p_host_record_stream(ptr, 0, accalloc_test_stream(0, 0x3000), &pinned), ACCALLOC_OK);
    CHECK(pinned);
    CHECK_STATUS(p_host_stat("allocated_bytes.current", &v), ACCALLOC_OK);
    CHECK_EQ(v, 1024);
    CHECK_STATUS(p_host_free(ptr), ACCALLOC_OK);
    CHECK_STATUS(p_host_stats_json(NULL, 0, &len), ACCALLOC_OK);
    json = (char *)malloc(len);
    if (json != NULL) {
        CHECK_STATUS(p_host_stats_json(json, len, &len), ACCALLOC_OK);
        CHECK_CONTAINS(json, "\"active_requests.current\":1,"); /* still waiting for the stream's event */
        free(json);
    }
    CHECK_STATUS(p_host_empty_cache(), ACCALLOC_OK); /* processes the (completed) event first */
    CHECK_STATUS(p_host_stat("allocations.current", &v), ACCALLOC_OK);
    CHECK_EQ(v, 0);
    CHECK_STATUS(p_host_reset_peak(), ACCALLOC_OK);
    CHECK_STATUS(p_host_reset_accumulated(), ACCALLOC_OK);
    CHECK_STATUS(p_host_stat("num_host_free", &v), ACCALLOC_OK);
    CHECK_EQ(v, 0);

    /* A private pool: its own segment, kept while it lives, forgotten once released and emptied; a
     * segment observer sees it come (2 MiB live) and go. */
    CHECK_STATUS(p_segment_observer_add(count_segment, &live_bytes, &segment_handle), ACCALLOC_OK);
    CHECK_STATUS(p_pool_create(0, 0, 0, &pool), ACCALLOC_OK);
    CHECK_STATUS(p_pool_begin(0, pool, ACCALLOC_ROUTE_THREAD, NULL), ACCALLOC_OK);
    CHECK_STATUS(p_malloc(&ptr, 1000, 0, NULL), ACCALLOC_OK);
    CHECK_STATUS(p_pool_end(0, pool), ACCALLOC_OK);
    {
        /* Its one live allocation; a checkpoint put back after its free hands it out again. */
        void *live[1] = {NULL}, *made[1] = {NULL};
        size_t count = 0, freed_count = 9, made_count = 9, sizes[1] = {0};
        AccallocPoolCheckpoint *checkpoint = NULL;
        CHECK_STATUS(p_pool_live_allocations(0, pool, live, 1, &count), ACCALLOC_OK);
        CHECK_EQ(count, 1);
        CHECK(live[0] == ptr);
        CHECK_STATUS(p_pool_checkpoint(0, pool, &checkpoint), ACCALLOC_OK);
        CHECK_STATUS(p_pool_checkpoint_allocations(checkpoint, &count), ACCALLOC_OK);
        CHECK_EQ(count, 1);
        CHECK_STATUS(p_free(ptr), ACCALLOC_OK);
        CHECK_STATUS(p_pool_checkpoint_restore(checkpoint, NULL, 0, &freed_count, made, sizes, 1, &made_count),
                     ACCALLOC_OK);
        CHECK_EQ(freed_count, 0);
        CHECK_EQ(made_count, 1);
        CHECK(made[0] == ptr);
        CHECK_EQ(sizes[0], 1024);
        CHECK_STATUS(p_pool_checkpoint_destroy(checkpoint), ACCALLOC_OK);
    }
    CHECK_STATUS(p_free(ptr), ACCALLOC_OK);
    CHECK_STATUS(p_empty_cache(), ACCALLOC_OK);
    CHECK_STATUS(p_pool_info(0, pool, &uses, &held), ACCALLOC_OK);
    CHECK_EQ(uses, 2);
    CHECK_EQ(held, 1);
    CHECK_STATUS(p_pool_empty_cache(0, pool, 0), ACCALLOC_OK); /* live: PyTorch's empty keeps it */
    CHECK_STATUS(p_pool_info(0, pool, NULL, &held), ACCALLOC_OK);
    CHECK_EQ(held, 1);
    CHECK_EQ(live_bytes, 2 << 20);
    CHECK_STATUS(p_pool_reserved_bytes(0, pool, &pool_reserved, NULL, NULL), ACCALLOC_OK);
    CHECK_EQ(pool_reserved.current, 2 << 20);
    CHECK_STATUS(p_pool_release(0, pool), ACCALLOC_OK);
    CHECK_STATUS(p_pool_release(0, pool), ACCALLOC_OK);
    CHECK_STATUS(p_empty_cache(), ACCALLOC_OK);
    CHECK_STATUS(p_pool_info(0, pool, &uses, &held), ACCALLOC_OK);
    CHECK_EQ(uses, -1);
    CHECK_EQ(live_bytes, 0);
    CHECK_STATUS(p_segment_observer_remove(segment_handle), ACCALLOC_OK);
    CHECK_STATUS(p_memory_stat(0, "num_device_free", &v), ACCALLOC_OK);
    CHECK_EQ(v, 1); /* the pool's segment */
    CHECK_STATUS(p_reset_accumulated(0), ACCALLOC_OK);
    CHECK_STATUS(p_memory_stat(0, "num_device_free", &v), ACCALLOC_OK);
    CHECK_EQ(v, 0);

    /* A pool whose segments come from an allocator of its own (the heap here). */
    heap.struct_size = sizeof heap;
    heap.context = &heap_bytes;
    heap.raw_alloc = heap_alloc;
    heap.raw_free = heap_free;
    CHECK_STATUS(p_pool_create_with_allocator(0, 0, 0, &heap, &pool), ACCALLOC_OK);
    CHECK_STATUS(p_pool_begin(0, pool, ACCALLOC_ROUTE_THREAD, NULL), ACCALLOC_OK);
    CHECK_STATUS(p_malloc(&ptr, 1000, 0, NULL), ACCALLOC_OK);
    CHECK_STATUS(p_pool_end(0, pool), ACCALLOC_OK);
    CHECK_EQ(heap_bytes, 2 << 20);
    CHECK_STATUS(p_free(ptr), ACCALLOC_OK);
    CHECK_STATUS(p_pool_release(0, pool), ACCALLOC_OK);
    CHECK_STATUS(p_pool_release(0, pool), ACCALLOC_OK);
    CHECK_STATUS(p_empty_cache(), ACCALLOC_OK); /* freeable: its segment goes back to the heap */
    CHECK_EQ(heap_bytes, 0);

    /* Sleep and wake of a tag's pool: its page paused and resumed, the contents kept. */
    CHECK_STATUS(p_pool_create(0, 0, 0, &pool), ACCALLOC_OK);
    CHECK_STATUS(p_pool_set_sleepable(0, pool), ACCALLOC_OK);
    CHECK_STATUS(p_pool_begin(0, pool, ACCALLOC_ROUTE_THREAD, NULL), ACCALLOC_OK);
    CHECK_STATUS(p_malloc(&ptr, 1000, 0, NULL), ACCALLOC_OK);
    CHECK_STATUS(p_pool_end(0, pool), ACCALLOC_OK);
    if (!accalloc_test_on_cuda())
        ((unsigned char *)ptr)[999] = 0x5d;
    CHECK_STATUS(p_pool_pause(0, pool, 1), ACCALLOC_OK);
    CHECK_STATUS(p_pool_paused_bytes(0, pool, &paused), ACCALLOC_OK);
    CHECK_EQ(paused, 2 << 20);
    {
        AccallocPoolId at = {0, 0};
        CHECK_STATUS(p_pool_paused_at(0, (char *)ptr + 999, 1, &at), ACCALLOC_OK);
        CHECK(at.first == pool.first && at.second == pool.second);
    }
    CHECK_STATUS(p_pool_resume(0, pool), ACCALLOC_OK);
    if (!accalloc_test_on_cuda())
        CHECK_EQ(((unsigned char *)ptr)[999], 0x5d);
    CHECK_STATUS(p_free(ptr), ACCALLOC_OK);
    CHECK_STATUS(p_pool_release(0, pool), ACCALLOC_OK);
    CHECK_STATUS(p_pool_release(0, pool), ACCALLOC_OK);
    CHECK_STATUS(p_empty_cache(), ACCALLOC_OK);

    /* planned_placement's planner: off by default. */
    {
        AccallocPlannerStats planner = {.struct_size = sizeof(AccallocPlannerStats)};
        CHECK_STATUS(p_planner_stats(0, &planner), ACCALLOC_OK);
        CHECK_EQ(planner.enabled, 0);
        CHECK_STATUS(p_planner_stats(0, NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    }

    /* A pool over PyTorch's pluggable pair. */
    CHECK_STATUS(p_pool_create_with_functions(0, 0, 0, heap_pair_alloc, heap_pair_free, &pool), ACCALLOC_OK);
    CHECK_STATUS(p_pool_begin(0, pool, ACCALLOC_ROUTE_THREAD, NULL), ACCALLOC_OK);
    CHECK_STATUS(p_malloc(&ptr, 1000, 0, NULL), ACCALLOC_OK);
    CHECK_STATUS(p_pool_end(0, pool), ACCALLOC_OK);
    CHECK_STATUS(p_free(ptr), ACCALLOC_OK);
    CHECK_STATUS(p_pool_empty_cache(0, pool, 1), ACCALLOC_OK);
    CHECK_STATUS(p_pool_info(0, pool, NULL, &held), ACCALLOC_OK);
    CHECK_EQ(held, 0);
    CHECK_STATUS(p_pool_release(0, pool), ACCALLOC_OK);
    CHECK_STATUS(p_pool_release(0, pool), ACCALLOC_OK);

    /* A pool id of the caller's, routed by a filter: a no_split graph pool takes the whole segment. */
    CHECK_STATUS(p_pool_retain(0, graph), ACCALLOC_OK);
    CHECK_STATUS(p_pool_set_flags(0, graph, 0, 1), ACCALLOC_OK);
    CHECK_STATUS(p_pool_begin_filtered(0, graph, every_stream, NULL, NULL, 1), ACCALLOC_OK);
    CHECK_STATUS(p_malloc(&ptr, 1000, 0, NULL), ACCALLOC_OK);
    CHECK_STATUS(p_pool_end(0, graph), ACCALLOC_OK);
    CHECK_STATUS(p_memory_stat(0, "allocated_bytes.all.current", &v), ACCALLOC_OK);
    CHECK_EQ(v, 2 << 20);
    CHECK_STATUS(p_free(ptr), ACCALLOC_OK);
    CHECK_STATUS(p_pool_release(0, graph), ACCALLOC_OK);
    CHECK_STATUS(p_pool_release(0, graph), ACCALLOC_OK);
    CHECK_STATUS(p_empty_cache(), ACCALLOC_OK);

    /* Device selection and the fraction through the pointers. */
    CHECK_STATUS(p_set_device(1), ACCALLOC_OK);
    CHECK_STATUS(p_current_device(&n), ACCALLOC_OK);
    CHECK_EQ(n, 1);
    CHECK_STATUS(p_set_memory_fraction(0.25, -1), ACCALLOC_OK);
    {
        double fraction = 0.0;
        CHECK_STATUS(p_get_memory_fraction(&fraction, -1), ACCALLOC_OK);
        CHECK(fraction == 0.25);
        CHECK_STATUS(p_get_memory_fraction(NULL, -1), ACCALLOC_ERROR_INVALID_ARGUMENT);
    }
    CHECK_STATUS(p_oom_observer_add(note_limit, &oom_limit, &oom_handle), ACCALLOC_OK);
    CHECK_STATUS(p_malloc(&ptr, (size_t)300 << 20, -1, NULL), ACCALLOC_ERROR_OUT_OF_MEMORY); /* 300 MiB > 256 MiB */
    CHECK_EQ(oom_limit, 256 << 20); /* the observer heard of it, with the fraction's limit */
    CHECK_STATUS(p_oom_observer_remove(oom_handle), ACCALLOC_OK);
    CHECK_CONTAINS(p_last_error(), "out of memory");
    CHECK_STATUS(p_memory_stat(1, "num_ooms", &v), ACCALLOC_OK);
    CHECK_EQ(v, 1);
    CHECK_STATUS(p_set_memory_fraction(1.0, -1), ACCALLOC_OK);
    CHECK_STATUS(p_set_device(0), ACCALLOC_OK);

    /* Allocator settings through the pointers. */
    CHECK_STATUS(p_get_settings(settings, sizeof settings, &len), ACCALLOC_OK);
    CHECK_STR(settings, "");
    CHECK_STATUS(p_set_settings("max_split_size_mb:64"), ACCALLOC_OK);
    CHECK_STATUS(p_memory_stat(0, "max_split_size", &v), ACCALLOC_OK);
    CHECK_EQ(v, 67108864);
    CHECK_STATUS(p_get_settings(settings, sizeof settings, &len), ACCALLOC_OK);
    CHECK_CONTAINS(settings, "max_split_size_mb:64");
    CHECK_STATUS(p_set_settings("no_such_key:1"), ACCALLOC_ERROR_CONFIG);
    CHECK_CONTAINS(p_last_error(), "no_such_key");
    CHECK_STATUS(p_get_settings(NULL, 0, NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(p_set_settings(""), ACCALLOC_OK);
    CHECK_STATUS(p_memory_stat(0, "max_split_size", &v), ACCALLOC_OK);
    CHECK_EQ(v, -1);

    /* Error paths. */
    CHECK_STATUS(p_free(&local), ACCALLOC_ERROR_INVALID_POINTER);
    CHECK(strlen(p_last_error()) > 0);
    CHECK_STATUS(p_free(NULL), ACCALLOC_OK);
    CHECK_STATUS(p_malloc(NULL, 16, 0, NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(p_malloc(&ptr, 16, 2, NULL), ACCALLOC_ERROR_INVALID_DEVICE);
    CHECK_STATUS(p_malloc(&ptr, (size_t)1 << 40, 0, NULL), ACCALLOC_ERROR_OUT_OF_MEMORY);
    CHECK_CONTAINS(p_last_error(), "Tried to allocate 1024.00 GiB");
    CHECK_STATUS(p_memory_stat(0, "not.a.key", &v), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(p_memory_stat(0, "allocated_bytes.all.current", NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(p_memory_allocated(5, &v), ACCALLOC_ERROR_INVALID_DEVICE);
    CHECK_STATUS(p_max_memory_allocated(0, NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(p_memory_reserved(-3, &v), ACCALLOC_ERROR_INVALID_DEVICE);
    CHECK_STATUS(p_max_memory_reserved(0, NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(p_reset_accumulated(2), ACCALLOC_ERROR_INVALID_DEVICE);
    CHECK_STATUS(p_reset_peak(2), ACCALLOC_ERROR_INVALID_DEVICE);
    CHECK_STATUS(p_get_device_stats(0, NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    s.struct_size = 0;
    CHECK_STATUS(p_get_device_stats(0, &s), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(p_stats_json(0, NULL, 0, NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    {
        char small[8];
        memset(small, 'Q', sizeof small);
        CHECK_STATUS(p_stats_json(0, small, sizeof small, &len), ACCALLOC_ERROR_BUFFER_TOO_SMALL);
        CHECK(small[0] == 'Q' && small[7] == 'Q');
    }
    CHECK_STATUS(p_mem_get_info(0, NULL, &tot), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(p_set_memory_fraction(1.5, 0), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(p_device_count(NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(p_current_device(NULL), ACCALLOC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(p_set_device(2), ACCALLOC_ERROR_INVALID_DEVICE);
    CHECK_STATUS(p_memory_allocated(0, &v), ACCALLOC_OK);
    CHECK_EQ(v, 0); /* none of the failures allocated anything */

    CHECK(dlclose(g_lib) == 0);

    printf("test_dlopen: %d checks, %d failed\n", g_checks, g_failures);
    return g_failures == 0 ? 0 : 1;
}
