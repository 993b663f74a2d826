/* dlopen: the way a framework that loads accalloc at run time uses it. This program is not linked
 * against libaccalloc: it takes only types and constants from accalloc.h, dlopens the library (path in
 * argv[1], else the path CMake compiled in), dlsyms every function, does a malloc/free/stats round trip
 * and checks error paths through the function pointers, then dlcloses it.
 * Run with ACC_HOST_CAPACITY=1GiB and ACC_HOST_DEVICES=2. */
#include "accalloc.h"

#include <dlfcn.h>

#include "acc_test_util.h"

#ifndef ACCALLOC_DEFAULT_PATH
#define ACCALLOC_DEFAULT_PATH "libaccalloc.so"
#endif

/* The function pointer types, written out by hand. TYPECHECK compares each with the header's prototype
 * inside sizeof (never evaluated, so no reference to the symbol reaches the linker): a typedef that
 * disagrees with accalloc.h is a compile error under -Werror. */
typedef AccStatus (*malloc_fn)(void **, size_t, int32_t, void *);
typedef AccStatus (*free_fn)(void *);
typedef AccStatus (*void_status_fn)(void);
typedef AccStatus (*stats_fn)(int32_t, AccDeviceStats *);
typedef AccStatus (*i64_fn)(int32_t, int64_t *);
typedef AccStatus (*device_fn)(int32_t);
typedef AccStatus (*stat_fn)(int32_t, const char *, int64_t *);
typedef AccStatus (*json_fn)(int32_t, char *, size_t, size_t *);
typedef AccStatus (*meminfo_fn)(int32_t, uint64_t *, uint64_t *);
typedef AccStatus (*fraction_fn)(double, int32_t);
typedef AccStatus (*i32_out_fn)(int32_t *);
typedef AccDeviceType (*accel_fn)(void);
typedef const char *(*type_name_fn)(AccDeviceType);
typedef const char *(*status_name_fn)(int32_t);
typedef const char *(*cstr_fn)(void);
typedef uint32_t (*abi_fn)(void);
typedef AccStatus (*check_abi_fn)(uint32_t);
typedef AccStatus (*set_settings_fn)(const char *);
typedef AccStatus (*record_stream_fn)(void *, void *);
typedef AccStatus (*summary_fn)(int32_t, int32_t, char *, size_t, size_t *);
typedef AccStatus (*snapshot_fn)(char *, size_t, size_t *);
typedef AccStatus (*history_fn)(int32_t, size_t);
typedef AccStatus (*get_settings_fn)(char *, size_t, size_t *);

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
    const char *cap = getenv("ACC_HOST_CAPACITY"), *devs = getenv("ACC_HOST_DEVICES");
    if (cap == NULL || strcmp(cap, "1GiB") != 0 || devs == NULL || strcmp(devs, "2") != 0)
        fprintf(stderr, "note: these checks assume ACC_HOST_CAPACITY=1GiB ACC_HOST_DEVICES=2 (ctest sets them); "
                        "got ACC_HOST_CAPACITY=%s ACC_HOST_DEVICES=%s\n", cap ? cap : "(unset)", devs ? devs : "(unset)");
    if (getenv("ACC_ALLOC_CONF") != NULL)
        fprintf(stderr, "note: ACC_ALLOC_CONF=%s is set; these figures assume the default policy (unset it)\n",
                getenv("ACC_ALLOC_CONF"));
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
    char settings[256];
    AccDeviceStats s;
    void *ptr = NULL;
    int local = 0;
    int64_t v = -1;
    uint64_t fr = 0, tot = 0;
    int32_t n = -1;
    size_t len = 0;
    char *json;

    require_test_env();
    TYPECHECK(malloc_fn, acc_malloc);
    TYPECHECK(free_fn, acc_free);
    TYPECHECK(void_status_fn, acc_empty_cache);
    TYPECHECK(stats_fn, acc_get_device_stats);
    TYPECHECK(i64_fn, acc_memory_allocated);
    TYPECHECK(i64_fn, acc_max_memory_allocated);
    TYPECHECK(i64_fn, acc_memory_reserved);
    TYPECHECK(i64_fn, acc_max_memory_reserved);
    TYPECHECK(device_fn, acc_reset_accumulated_memory_stats);
    TYPECHECK(device_fn, acc_reset_peak_memory_stats);
    TYPECHECK(device_fn, acc_set_device);
    TYPECHECK(stat_fn, acc_memory_stat);
    TYPECHECK(json_fn, acc_memory_stats_json);
    TYPECHECK(meminfo_fn, acc_mem_get_info);
    TYPECHECK(fraction_fn, acc_set_memory_fraction);
    TYPECHECK(i32_out_fn, acc_device_count);
    TYPECHECK(i32_out_fn, acc_current_device);
    TYPECHECK(accel_fn, acc_current_accelerator);
    TYPECHECK(type_name_fn, acc_device_type_name);
    TYPECHECK(status_name_fn, acc_status_name);
    TYPECHECK(cstr_fn, acc_last_error_message);
    TYPECHECK(cstr_fn, acc_version);
    TYPECHECK(abi_fn, acc_abi_version);
    TYPECHECK(check_abi_fn, acc_check_abi);
    TYPECHECK(set_settings_fn, acc_set_allocator_settings);
    TYPECHECK(get_settings_fn, acc_get_allocator_settings);
    TYPECHECK(record_stream_fn, acc_record_stream);
    TYPECHECK(summary_fn, acc_memory_summary);
    TYPECHECK(snapshot_fn, acc_memory_snapshot_json);
    TYPECHECK(history_fn, acc_record_memory_history);

    /* Not linked: nothing named acc_malloc is in the process before dlopen. */
    CHECK(dlsym(RTLD_DEFAULT, "acc_malloc") == NULL);

    g_lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (g_lib == NULL) {
        fprintf(stderr, "FAIL dlopen(\"%s\"): %s\n", path, dlerror());
        return 1;
    }
    LOAD(p_malloc, "acc_malloc");
    LOAD(p_free, "acc_free");
    LOAD(p_empty_cache, "acc_empty_cache");
    LOAD(p_get_device_stats, "acc_get_device_stats");
    LOAD(p_memory_allocated, "acc_memory_allocated");
    LOAD(p_max_memory_allocated, "acc_max_memory_allocated");
    LOAD(p_memory_reserved, "acc_memory_reserved");
    LOAD(p_max_memory_reserved, "acc_max_memory_reserved");
    LOAD(p_reset_accumulated, "acc_reset_accumulated_memory_stats");
    LOAD(p_reset_peak, "acc_reset_peak_memory_stats");
    LOAD(p_memory_stat, "acc_memory_stat");
    LOAD(p_stats_json, "acc_memory_stats_json");
    LOAD(p_mem_get_info, "acc_mem_get_info");
    LOAD(p_set_memory_fraction, "acc_set_memory_fraction");
    LOAD(p_device_count, "acc_device_count");
    LOAD(p_current_device, "acc_current_device");
    LOAD(p_set_device, "acc_set_device");
    LOAD(p_current_accelerator, "acc_current_accelerator");
    LOAD(p_device_type_name, "acc_device_type_name");
    LOAD(p_status_name, "acc_status_name");
    LOAD(p_last_error, "acc_last_error_message");
    LOAD(p_version, "acc_version");
    LOAD(p_abi_version, "acc_abi_version");
    LOAD(p_check_abi, "acc_check_abi");
    LOAD(p_set_settings, "acc_set_allocator_settings");
    LOAD(p_get_settings, "acc_get_allocator_settings");
    LOAD(p_record_stream, "acc_record_stream");
    LOAD(p_summary, "acc_memory_summary");
    LOAD(p_snapshot, "acc_memory_snapshot_json");
    LOAD(p_history, "acc_record_memory_history");
    if (g_missing) {
        fprintf(stderr, "FAIL %d functions missing from %s\n", g_missing, path);
        return 1;
    }
    /* RTLD_LOCAL: the symbols stay private to the handle. */
    CHECK(dlsym(RTLD_DEFAULT, "acc_malloc") == NULL);

    CHECK_STR(p_version(), "0.1.0");
    CHECK_EQ(p_abi_version(), ACC_ABI_VERSION);
    /* A program loading the library by hand checks its ABI the same way. */
    CHECK_EQ(p_check_abi(ACC_ABI_VERSION), ACC_OK);
    CHECK_STR(p_last_error(), "");
    CHECK_STR(p_status_name(ACC_ERROR_OUT_OF_MEMORY), "ACC_ERROR_OUT_OF_MEMORY");
    CHECK_STR(p_status_name(77), "ACC_ERROR_UNKNOWN");
    CHECK_EQ(p_current_accelerator(), ACC_DEVICE_HOST);
    CHECK_STR(p_device_type_name(p_current_accelerator()), "host");
    CHECK_STATUS(p_device_count(&n), ACC_OK);
    CHECK_EQ(n, 2);
    CHECK_STATUS(p_current_device(&n), ACC_OK);
    CHECK_EQ(n, 0);

    /* Round trip: malloc(1000) -> 1024 allocated out of a 2 MiB segment; free; empty_cache. */
    CHECK_STATUS(p_malloc(&ptr, 1000, -1, NULL), ACC_OK);
    CHECK(ptr != NULL);
    if (ptr != NULL && p_current_accelerator() == ACC_DEVICE_HOST)
        memset(ptr, 0xCD, 1000);
    CHECK_STATUS(p_memory_allocated(0, &v), ACC_OK);
    CHECK_EQ(v, 1024);
    CHECK_STATUS(p_max_memory_allocated(0, &v), ACC_OK);
    CHECK_EQ(v, 1024);
    CHECK_STATUS(p_memory_reserved(0, &v), ACC_OK);
    CHECK_EQ(v, 2097152);
    CHECK_STATUS(p_max_memory_reserved(0, &v), ACC_OK);
    CHECK_EQ(v, 2097152);
    CHECK_STATUS(p_memory_stat(0, "requested_bytes.all.current", &v), ACC_OK);
    CHECK_EQ(v, 1000);
    CHECK_STATUS(p_memory_stat(0, "inactive_split_bytes.small_pool.current", &v), ACC_OK);
    CHECK_EQ(v, 2096128);
    CHECK_STATUS(p_mem_get_info(0, &fr, &tot), ACC_OK);
    CHECK_EQ(tot, 1073741824);
    CHECK_EQ(fr, 1073741824 - 2097152);
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    CHECK_STATUS(p_get_device_stats(0, &s), ACC_OK);
    CHECK_EQ(s.allocation[ACC_STAT_ALL].current, 1);
    CHECK_EQ(s.segment[ACC_STAT_SMALL_POOL].current, 1);
    CHECK_EQ(s.segment[ACC_STAT_LARGE_POOL].current, 0);
    CHECK_EQ(s.num_device_alloc, 1);
    CHECK_EQ(s.max_split_size, -1);

    CHECK_STATUS(p_stats_json(0, NULL, 0, &len), ACC_OK);
    json = (char *)malloc(len);
    if (json != NULL) {
        CHECK_STATUS(p_stats_json(0, json, len, &len), ACC_OK);
        CHECK_CONTAINS(json, "\"allocated_bytes.all.current\"");
        CHECK_CONTAINS(json, "\"max_split_size\"");
        free(json);
    }

    CHECK_STATUS(p_history(1, 32), ACC_OK);
    CHECK_STATUS(p_summary(0, 0, NULL, 0, &len), ACC_OK);
    json = (char *)malloc(len);
    if (json != NULL) {
        CHECK_STATUS(p_summary(0, 0, json, len, &len), ACC_OK);
        CHECK_CONTAINS(json, "| Allocations           |       1    |       1    |       1    |       0    |");
        free(json);
    }
    CHECK_STATUS(p_record_stream(ptr, (void *)(uintptr_t)0x3000), ACC_OK);
    CHECK_STATUS(p_free(ptr), ACC_OK);
    CHECK_STATUS(p_memory_allocated(0, &v), ACC_OK);
    CHECK_EQ(v, 0);
    CHECK_STATUS(p_record_stream(ptr, NULL), ACC_ERROR_INVALID_POINTER); /* freed */
    CHECK_STATUS(p_snapshot(NULL, 0, &len), ACC_OK);
    json = (char *)malloc(len);
    if (json != NULL) {
        CHECK_STATUS(p_snapshot(json, len, &len), ACC_OK);
        CHECK_CONTAINS(json, "\"active_pending_free\""); /* freed, waiting on the recorded stream */
        CHECK_CONTAINS(json, "\"free_requested\"");
        free(json);
    }
    CHECK_STATUS(p_history(0, 0), ACC_OK);
    CHECK_STATUS(p_history(1, 0), ACC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(p_summary(7, 0, NULL, 0, &len), ACC_ERROR_INVALID_DEVICE);
    CHECK_STATUS(p_snapshot(NULL, 0, NULL), ACC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(p_memory_reserved(0, &v), ACC_OK);
    CHECK_EQ(v, 2097152);
    CHECK_STATUS(p_empty_cache(), ACC_OK);
    CHECK_STATUS(p_memory_reserved(0, &v), ACC_OK);
    CHECK_EQ(v, 0);
    CHECK_STATUS(p_memory_stat(0, "num_device_free", &v), ACC_OK);
    CHECK_EQ(v, 1);
    CHECK_STATUS(p_reset_peak(0), ACC_OK);
    CHECK_STATUS(p_max_memory_allocated(0, &v), ACC_OK);
    CHECK_EQ(v, 0);
    CHECK_STATUS(p_reset_accumulated(0), ACC_OK);
    CHECK_STATUS(p_memory_stat(0, "allocation.all.allocated", &v), ACC_OK);
    CHECK_EQ(v, 0);
    CHECK_STATUS(p_memory_stat(0, "num_device_free", &v), ACC_OK);
    CHECK_EQ(v, 0);

    /* Device selection and the fraction through the pointers. */
    CHECK_STATUS(p_set_device(1), ACC_OK);
    CHECK_STATUS(p_current_device(&n), ACC_OK);
    CHECK_EQ(n, 1);
    CHECK_STATUS(p_set_memory_fraction(0.25, -1), ACC_OK);
    CHECK_STATUS(p_malloc(&ptr, (size_t)300 << 20, -1, NULL), ACC_ERROR_OUT_OF_MEMORY); /* 300 MiB > 256 MiB */
    CHECK_CONTAINS(p_last_error(), "out of memory");
    CHECK_STATUS(p_memory_stat(1, "num_ooms", &v), ACC_OK);
    CHECK_EQ(v, 1);
    CHECK_STATUS(p_set_memory_fraction(1.0, -1), ACC_OK);
    CHECK_STATUS(p_set_device(0), ACC_OK);

    /* Allocator settings through the pointers. */
    CHECK_STATUS(p_get_settings(settings, sizeof settings, &len), ACC_OK);
    CHECK_STR(settings, "");
    CHECK_STATUS(p_set_settings("max_split_size_mb:64"), ACC_OK);
    CHECK_STATUS(p_memory_stat(0, "max_split_size", &v), ACC_OK);
    CHECK_EQ(v, 67108864);
    CHECK_STATUS(p_get_settings(settings, sizeof settings, &len), ACC_OK);
    CHECK_CONTAINS(settings, "max_split_size_mb:64");
    CHECK_STATUS(p_set_settings("no_such_key:1"), ACC_ERROR_CONFIG);
    CHECK_CONTAINS(p_last_error(), "no_such_key");
    CHECK_STATUS(p_get_settings(NULL, 0, NULL), ACC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(p_set_settings(""), ACC_OK);
    CHECK_STATUS(p_memory_stat(0, "max_split_size", &v), ACC_OK);
    CHECK_EQ(v, -1);

    /* Error paths. */
    CHECK_STATUS(p_free(&local), ACC_ERROR_INVALID_POINTER);
    CHECK(strlen(p_last_error()) > 0);
    CHECK_STATUS(p_free(NULL), ACC_OK);
    CHECK_STATUS(p_malloc(NULL, 16, 0, NULL), ACC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(p_malloc(&ptr, 16, 2, NULL), ACC_ERROR_INVALID_DEVICE);
    CHECK_STATUS(p_malloc(&ptr, (size_t)1 << 40, 0, NULL), ACC_ERROR_OUT_OF_MEMORY);
    CHECK_CONTAINS(p_last_error(), "Tried to allocate 1024.00 GiB");
    CHECK_STATUS(p_memory_stat(0, "not.a.key", &v), ACC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(p_memory_stat(0, "allocated_bytes.all.current", NULL), ACC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(p_memory_allocated(5, &v), ACC_ERROR_INVALID_DEVICE);
    CHECK_STATUS(p_max_memory_allocated(0, NULL), ACC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(p_memory_reserved(-3, &v), ACC_ERROR_INVALID_DEVICE);
    CHECK_STATUS(p_max_memory_reserved(0, NULL), ACC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(p_reset_accumulated(2), ACC_ERROR_INVALID_DEVICE);
    CHECK_STATUS(p_reset_peak(2), ACC_ERROR_INVALID_DEVICE);
    CHECK_STATUS(p_get_device_stats(0, NULL), ACC_ERROR_INVALID_ARGUMENT);
    s.struct_size = 0;
    CHECK_STATUS(p_get_device_stats(0, &s), ACC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(p_stats_json(0, NULL, 0, NULL), ACC_ERROR_INVALID_ARGUMENT);
    {
        char small[8];
        memset(small, 'Q', sizeof small);
        CHECK_STATUS(p_stats_json(0, small, sizeof small, &len), ACC_ERROR_BUFFER_TOO_SMALL);
        CHECK(small[0] == 'Q' && small[7] == 'Q');
    }
    CHECK_STATUS(p_mem_get_info(0, NULL, &tot), ACC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(p_set_memory_fraction(1.5, 0), ACC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(p_device_count(NULL), ACC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(p_current_device(NULL), ACC_ERROR_INVALID_ARGUMENT);
    CHECK_STATUS(p_set_device(2), ACC_ERROR_INVALID_DEVICE);
    CHECK_STATUS(p_memory_allocated(0, &v), ACC_OK);
    CHECK_EQ(v, 0); /* none of the failures allocated anything */

    CHECK(dlclose(g_lib) == 0);

    printf("test_dlopen: %d checks, %d failed\n", g_checks, g_failures);
    return g_failures == 0 ? 0 : 1;
}
