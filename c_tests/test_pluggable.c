/* The pluggable-allocator functions as PyTorch's CUDAPluggableAllocator uses them: the library is
 * dlopened and the functions are looked up by name. On a machine without a GPU they act on the host. */
#include <dlfcn.h>

#include "accalloc.h"
#include "accalloc_test_util.h"

typedef void *(*alloc_fn)(size_t, int, void *);
typedef void (*free_fn)(void *, size_t, int, void *);
typedef void (*init_fn)(int);
typedef void (*reset_fn)(void);
typedef void (*fraction_fn)(double, int);
typedef void (*record_fn)(void *, void *);
typedef AccallocStatus (*stat_fn)(int32_t, const char *, int64_t *);

static void *lookup(void *lib, const char *name)
{
    void *symbol = dlsym(lib, name);
    CHECK(symbol != NULL);
    if (!symbol)
        fprintf(stderr, "missing symbol %s\n", name);
    return symbol;
}

int main(int argc, char **argv)
{
    void *lib = dlopen(argc > 1 ? argv[1] : ACCALLOC_DEFAULT_PATH, RTLD_NOW | RTLD_LOCAL);
    alloc_fn alloc;
    free_fn release;
    init_fn init;
    reset_fn reset;
    fraction_fn fraction;
    record_fn record;
    stat_fn stat;
    void *a, *b, *c;
    int64_t value = -1;

    if (!lib) {
        fprintf(stderr, "dlopen failed: %s\n", dlerror());
        return 1;
    }
    /* The names PyTorch is given. */
    *(void **)&alloc = lookup(lib, "accalloc_pluggable_malloc");
    *(void **)&release = lookup(lib, "accalloc_pluggable_free");
    *(void **)&init = lookup(lib, "accalloc_pluggable_init");
    *(void **)&reset = lookup(lib, "accalloc_pluggable_empty_cache");
    *(void **)&fraction = lookup(lib, "accalloc_pluggable_set_memory_fraction");
    *(void **)&record = lookup(lib, "accalloc_pluggable_record_stream");
    *(void **)&stat = lookup(lib, "accalloc_memory_stat");
    if (g_failures)
        return 1;

    init(1);
    a = alloc(1000, 0, NULL);
    b = alloc(5 << 20, 0, NULL);
    CHECK(a != NULL && b != NULL);
    CHECK(((uintptr_t)a % 512) == 0);
    CHECK_EQ(stat(0, "allocated_bytes.all.current", &value), ACCALLOC_OK);
    CHECK_EQ(value, 1024 + (5 << 20));
    record(a, (void *)0x700);
    release(a, 1000, 0, NULL);
    release(b, 5 << 20, 0, NULL);
    CHECK_EQ(stat(0, "allocated_bytes.all.current", &value), ACCALLOC_OK);
    CHECK_EQ(value, 0);
    reset();
    c = alloc(1000, 0, NULL); /* the pending block returned: the small segment is cached again */
    release(c, 1000, 0, NULL);
    reset();
    CHECK_EQ(stat(0, "reserved_bytes.all.current", &value), ACCALLOC_OK);
    CHECK_EQ(value, 0);
    CHECK_EQ(stat(0, "num_sync_all_streams", &value), ACCALLOC_OK);
    CHECK_EQ(value, 2);
    fraction(0.5, 0);
    CHECK(alloc((size_t)700 << 20, 0, NULL) == NULL); /* past half of the 1 GiB device: NULL, reason on stderr */
    CHECK_EQ(stat(0, "num_ooms", &value), ACCALLOC_OK);
    CHECK_EQ(value, 1);
    release((void *)&value, 8, 0, NULL); /* not ours: reported, nothing changes */
    CHECK_EQ(stat(0, "allocation.all.freed", &value), ACCALLOC_OK);
    CHECK_EQ(value, 3);
    dlclose(lib);
    printf("%d checks, %d failed\n", g_checks, g_failures);
    return g_failures == 0 ? 0 : 1;
}
