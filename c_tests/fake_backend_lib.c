/* A backend written in C, as a shared library for `accalloc replay --backend`: memory from the C
 * library, 1 GiB per device, two devices, no events and no virtual memory. */
#include <stdlib.h>
#include <string.h>

#include "accalloc.h"

#define CAPACITY ((size_t)1 << 30)

static size_t used[2];

static int32_t device_count(void *ctx, int32_t *out) { (void)ctx; *out = 2; return ACCALLOC_BACKEND_OK; }

static int32_t raw_alloc(void *ctx, int32_t device, size_t size, void *stream, void **out)
{
    (void)ctx;
    (void)stream;
    if (used[device] + size > CAPACITY || posix_memalign(out, 512, size) != 0)
        return ACCALLOC_BACKEND_OUT_OF_MEMORY;
    used[device] += size;
    return ACCALLOC_BACKEND_OK;
}

static int32_t raw_free(void *ctx, int32_t device, void *ptr, size_t size)
{
    (void)ctx;
    used[device] -= size;
    free(ptr);
    return ACCALLOC_BACKEND_OK;
}

static int32_t mem_get_info(void *ctx, int32_t device, uint64_t *free_bytes, uint64_t *total)
{
    (void)ctx;
    *total = CAPACITY;
    *free_bytes = CAPACITY - used[device];
    return ACCALLOC_BACKEND_OK;
}

int32_t accalloc_backend_entry(AccallocBackendVTable *table, const char **name)
{
    size_t size = table->struct_size;
    memset(table, 0, size);
    table->struct_size = size;
    table->device_count = device_count;
    table->raw_alloc = raw_alloc;
    table->raw_free = raw_free;
    table->mem_get_info = mem_get_info;
    *name = "fakelib";
    return 0;
}
