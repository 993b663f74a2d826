/* Small helpers shared by the C test programs: checks that count failures and keep going, the list of
 * the 122 PyTorch flat statistic keys, and the mapping from a key to its AccallocDeviceStats field.
 * Include after accalloc.h. Everything here is static: each test program is one translation unit. */
#ifndef ACCALLOC_TEST_UTIL_H
#define ACCALLOC_TEST_UTIL_H

#include <dlfcn.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether the tests run on the CUDA backend (ACCALLOC_DEVICE=cuda: scripts/test-all.sh runs the suites
 * that apply on the CUDA driver model too); otherwise on the host backend. */
static inline int accalloc_test_on_cuda(void)
{
    const char *device = getenv("ACCALLOC_DEVICE");
    return device != NULL && strcmp(device, "cuda") == 0;
}

/* A stream of `device` for the tests' "other stream": on the host backend any handle is a stream, so
 * `fake`; on CUDA a real CUstream, created through the libcuda accalloc loaded (the driver checks
 * handles). NULL when CUDA is meant but no stream can be made. */
static inline void *accalloc_test_stream(int device, uintptr_t fake)
{
    typedef int (*device_get_fn)(int *, int);
    typedef int (*retain_fn)(void **, int);
    typedef int (*set_current_fn)(void *);
    typedef int (*stream_create_fn)(void **, unsigned);
    device_get_fn device_get;
    retain_fn retain;
    set_current_fn set_current;
    stream_create_fn stream_create;
    void *cuda, *raw, *context = NULL, *stream = NULL;
    int handle = 0;
    if (!accalloc_test_on_cuda())
        return (void *)fake;
    cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (cuda == NULL)
        return NULL;
#define ACCALLOC_TEST_LOAD(var, name) (raw = dlsym(cuda, name), memcpy(&(var), &raw, sizeof(var)), raw != NULL)
    if (!ACCALLOC_TEST_LOAD(device_get, "cuDeviceGet") || !ACCALLOC_TEST_LOAD(retain, "cuDevicePrimaryCtxRetain") ||
        !ACCALLOC_TEST_LOAD(set_current, "cuCtxSetCurrent") || !ACCALLOC_TEST_LOAD(stream_create, "cuStreamCreate"))
        return NULL;
#undef ACCALLOC_TEST_LOAD
    if (device_get(&handle, device) != 0 || retain(&context, handle) != 0 || set_current(context) != 0 ||
        stream_create(&stream, 1 /* CU_STREAM_NON_BLOCKING */) != 0)
        return NULL;
    return stream;
}

static int g_checks = 0;
static int g_failures = 0;

static inline void check_true(int ok, const char *file, int line, const char *what)
{
    ++g_checks;
    if (!ok) {
        ++g_failures;
        fprintf(stderr, "FAIL %s:%d: %s\n", file, line, what);
    }
}

static inline void check_i64(int64_t got, int64_t want, const char *file, int line, const char *what)
{
    ++g_checks;
    if (got != want) {
        ++g_failures;
        fprintf(stderr, "FAIL %s:%d: %s: expected %" PRId64 ", got %" PRId64 "\n", file, line, what, want, got);
    }
}

static inline void check_str(const char *got, const char *want, const char *file, int line, const char *what)
{
    ++g_checks;
    if (got == NULL || strcmp(got, want) != 0) {
        ++g_failures;
        fprintf(stderr, "FAIL %s:%d: %s: expected \"%s\", got %s%s%s\n", file, line, what, want,
                got ? "\"" : "", got ? got : "NULL", got ? "\"" : "");
    }
}

static inline void check_contains(const char *text, const char *needle, const char *file, int line, const char *what)
{
    ++g_checks;
    if (text == NULL || strstr(text, needle) == NULL) {
        ++g_failures;
        fprintf(stderr, "FAIL %s:%d: %s: \"%s\" does not contain \"%s\"\n", file, line, what,
                text ? text : "(NULL)", needle);
    }
}

#define CHECK(cond) check_true((cond) ? 1 : 0, __FILE__, __LINE__, #cond)
#define CHECK_EQ(got, want) check_i64((int64_t)(got), (int64_t)(want), __FILE__, __LINE__, #got)
#define CHECK_STR(got, want) check_str((got), (want), __FILE__, __LINE__, #got)
#define CHECK_CONTAINS(text, needle) check_contains((text), (needle), __FILE__, __LINE__, #text)

/* A call that returns an AccallocStatus: on a mismatch, say which status came back and the library's message. */
#define CHECK_STATUS_WITH(call, want, name_fn, msg_fn)                                                     \
    do {                                                                                                   \
        int st_got_ = (int)(call);                                                                         \
        int st_want_ = (int)(want);                                                                        \
        ++g_checks;                                                                                        \
        if (st_got_ != st_want_) {                                                                         \
            ++g_failures;                                                                                  \
            fprintf(stderr, "FAIL %s:%d: %s: expected %s, got %d (%s); last error: \"%s\"\n", __FILE__,     \
                    __LINE__, #call, #want, st_got_, name_fn((AccallocStatus)st_got_), msg_fn());               \
        }                                                                                                  \
    } while (0)

/* ---- the 122 flat keys ---- */
#define ACCALLOC_N_FAMILIES 9
#define ACCALLOC_N_KEYS 122
#define ACCALLOC_KEY_MAX 64

static const char *const ACCALLOC_FAMILY_NAMES[ACCALLOC_N_FAMILIES] = {
    "allocation", "segment", "active", "inactive_split", "allocated_bytes",
    "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes",
};
static const size_t ACCALLOC_FAMILY_OFFSETS[ACCALLOC_N_FAMILIES] = {
    offsetof(AccallocDeviceStats, allocation),     offsetof(AccallocDeviceStats, segment),
    offsetof(AccallocDeviceStats, active),         offsetof(AccallocDeviceStats, inactive_split),
    offsetof(AccallocDeviceStats, allocated_bytes), offsetof(AccallocDeviceStats, reserved_bytes),
    offsetof(AccallocDeviceStats, active_bytes),   offsetof(AccallocDeviceStats, inactive_split_bytes),
    offsetof(AccallocDeviceStats, requested_bytes),
};
static const char *const ACCALLOC_POOL_NAMES[3] = {"all", "small_pool", "large_pool"};
static const int ACCALLOC_POOL_INDEX[3] = {ACCALLOC_STAT_ALL, ACCALLOC_STAT_SMALL_POOL, ACCALLOC_STAT_LARGE_POOL};
static const char *const ACCALLOC_FIELD_NAMES[4] = {"current", "peak", "allocated", "freed"};

static inline int64_t *accalloc_stat_field(AccallocStat *s, int field)
{
    switch (field) {
    case 0: return &s->current;
    case 1: return &s->peak;
    case 2: return &s->allocated;
    default: return &s->freed;
    }
}

/* Key number k (0..121, in generation order, not sorted): its name and its field in *s. */
static inline int64_t *accalloc_key(AccallocDeviceStats *s, int k, char name[ACCALLOC_KEY_MAX])
{
    if (k < ACCALLOC_N_FAMILIES * 12) {
        int fam = k / 12, pool = (k / 4) % 3, field = k % 4;
        AccallocStat *arr = (AccallocStat *)(void *)((char *)s + ACCALLOC_FAMILY_OFFSETS[fam]);
        sprintf(name, "%s.%s.%s", ACCALLOC_FAMILY_NAMES[fam], ACCALLOC_POOL_NAMES[pool], ACCALLOC_FIELD_NAMES[field]);
        return accalloc_stat_field(&arr[ACCALLOC_POOL_INDEX[pool]], field);
    }
    k -= ACCALLOC_N_FAMILIES * 12;
    if (k < 8) {
        AccallocStat *st = k < 4 ? &s->oversize_allocations : &s->oversize_segments;
        sprintf(name, "%s.%s", k < 4 ? "oversize_allocations" : "oversize_segments", ACCALLOC_FIELD_NAMES[k % 4]);
        return accalloc_stat_field(st, k % 4);
    }
    k -= 8;
    switch (k) {
    case 0: strcpy(name, "num_alloc_retries"); return &s->num_alloc_retries;
    case 1: strcpy(name, "num_ooms"); return &s->num_ooms;
    case 2: strcpy(name, "num_sync_all_streams"); return &s->num_sync_all_streams;
    case 3: strcpy(name, "num_device_alloc"); return &s->num_device_alloc;
    case 4: strcpy(name, "num_device_free"); return &s->num_device_free;
    default: strcpy(name, "max_split_size"); return &s->max_split_size;
    }
}

static inline int accalloc_cmp_str(const void *a, const void *b)
{
    return strcmp((const char *)a, (const char *)b);
}

/* All 122 key names, sorted by byte value (Python's sorted(), which memory_stats() uses). */
static inline void accalloc_sorted_keys(char keys[ACCALLOC_N_KEYS][ACCALLOC_KEY_MAX])
{
    AccallocDeviceStats dummy;
    int k;
    memset(&dummy, 0, sizeof dummy);
    for (k = 0; k < ACCALLOC_N_KEYS; ++k)
        (void)accalloc_key(&dummy, k, keys[k]);
    qsort(keys, ACCALLOC_N_KEYS, ACCALLOC_KEY_MAX, accalloc_cmp_str);
}

/* A minimal parser for the flat JSON object of memory_stats_json: {"key": integer, ...}.
 * Fills keys/values in document order; returns the number of pairs, or -1 (with a reason) when the text
 * is not one such object. */
static inline int accalloc_parse_flat_json(const char *text, char keys[][ACCALLOC_KEY_MAX], int64_t *values, int max_pairs,
                               const char **why)
{
    const char *p = text;
    int n = 0;
#define ACCALLOC_SKIP_WS() while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t') ++p
    ACCALLOC_SKIP_WS();
    if (*p++ != '{') { *why = "does not start with '{'"; return -1; }
    ACCALLOC_SKIP_WS();
    if (*p == '}') { ++p; goto done; }
    for (;;) {
        const char *start;
        char *end;
        size_t len;
        ACCALLOC_SKIP_WS();
        if (*p++ != '"') { *why = "expected '\"' before a key"; return -1; }
        start = p;
        while (*p && *p != '"' && *p != '\\') ++p;
        if (*p != '"') { *why = "unterminated key or escape in a key"; return -1; }
        len = (size_t)(p - start);
        if (len == 0 || len >= ACCALLOC_KEY_MAX) { *why = "empty or too long key"; return -1; }
        if (n >= max_pairs) { *why = "more pairs than expected"; return -1; }
        memcpy(keys[n], start, len);
        keys[n][len] = '\0';
        ++p;
        ACCALLOC_SKIP_WS();
        if (*p++ != ':') { *why = "expected ':' after a key"; return -1; }
        ACCALLOC_SKIP_WS();
        if (!(*p == '-' || (*p >= '0' && *p <= '9'))) { *why = "value is not an integer"; return -1; }
        values[n] = (int64_t)strtoll(p, &end, 10);
        if (end == p || *end == '.' || *end == 'e' || *end == 'E') { *why = "value is not an integer"; return -1; }
        p = end;
        ++n;
        ACCALLOC_SKIP_WS();
        if (*p == ',') { ++p; continue; }
        if (*p == '}') { ++p; break; }
        *why = "expected ',' or '}' after a value";
        return -1;
    }
done:
    ACCALLOC_SKIP_WS();
    if (*p != '\0') { *why = "text after the closing '}'"; return -1; }
#undef ACCALLOC_SKIP_WS
    return n;
}

#endif /* ACCALLOC_TEST_UTIL_H */
