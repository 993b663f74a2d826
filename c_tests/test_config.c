/* config_*: the host backend's environment configuration.
 *
 *   test_config error VAR [WORD]   run with VAR set to a bad value: every call that needs the devices
 *                                  returns ACCALLOC_ERROR_CONFIG with a message naming VAR (and WORD), every
 *                                  time; the calls that need no device still work.
 *   test_config ok COUNT CAPACITY [MAX_SPLIT_SIZE]
 *                                  run with a good configuration: COUNT devices of CAPACITY bytes (and
 *                                  the max_split_size that ACCALLOC_CONF sets). */
#include "accalloc.h"

#include "accalloc_test_util.h"

#define CHECK_STATUS(call, want) CHECK_STATUS_WITH(call, want, accalloc_status_name, accalloc_last_error_message)

static const char *g_word = NULL;

static void expect_config_error(int st, const char *call, const char *var)
{
    const char *msg = accalloc_last_error_message();
    ++g_checks;
    if (st != ACCALLOC_ERROR_CONFIG) {
        ++g_failures;
        fprintf(stderr, "FAIL %s returned %s, expected ACCALLOC_ERROR_CONFIG (message: \"%s\")\n", call,
                accalloc_status_name((AccallocStatus)st), msg);
        return;
    }
    ++g_checks;
    if (msg == NULL || strstr(msg, var) == NULL) {
        ++g_failures;
        fprintf(stderr, "FAIL %s: message \"%s\" does not name %s\n", call, msg ? msg : "(NULL)", var);
    }
    if (g_word != NULL) {
        ++g_checks;
        if (msg == NULL || strstr(msg, g_word) == NULL) {
            ++g_failures;
            fprintf(stderr, "FAIL %s: message \"%s\" does not name %s\n", call, msg ? msg : "(NULL)", g_word);
        }
    }
}

static int run_error(const char *var)
{
    int32_t n = -1;
    int64_t v = -1;
    uint64_t fr = 0, tot = 0;
    void *p = NULL;
    AccallocDeviceStats s;
    size_t len = 0;
    int round;

    printf("%s=%s\n", var, getenv(var) ? getenv(var) : "(unset)");
    for (round = 0; round < 2; ++round) { /* the error is reported again, not only the first time */
        expect_config_error((int)accalloc_device_count(&n), "accalloc_device_count", var);
        expect_config_error((int)accalloc_malloc(&p, 1000, 0, NULL), "accalloc_malloc", var);
        expect_config_error((int)accalloc_malloc(&p, 1000, -1, NULL), "accalloc_malloc(device -1)", var);
        expect_config_error((int)accalloc_memory_allocated(0, &v), "accalloc_memory_allocated", var);
        expect_config_error((int)accalloc_memory_stat(0, "num_ooms", &v), "accalloc_memory_stat", var);
        memset(&s, 0, sizeof s);
        s.struct_size = sizeof s;
        expect_config_error((int)accalloc_get_device_stats(0, &s), "accalloc_get_device_stats", var);
        expect_config_error((int)accalloc_memory_stats_json(0, NULL, 0, &len), "accalloc_memory_stats_json", var);
        expect_config_error((int)accalloc_mem_get_info(0, &fr, &tot), "accalloc_mem_get_info", var);
        expect_config_error((int)accalloc_set_device(0), "accalloc_set_device", var);
        expect_config_error((int)accalloc_empty_cache(), "accalloc_empty_cache", var);
    }
    printf("message: %s\n", accalloc_last_error_message());
    /* what needs no device keeps working */
    CHECK_STR(accalloc_version(), "0.1.0");
    CHECK_EQ(accalloc_abi_version(), ACCALLOC_ABI_VERSION);
    CHECK_STR(accalloc_status_name(ACCALLOC_ERROR_CONFIG), "ACCALLOC_ERROR_CONFIG");
    CHECK_STR(accalloc_device_type_name(ACCALLOC_DEVICE_HOST), "host");
    return 0;
}

static int run_ok(int32_t want_count, int64_t want_capacity, int64_t want_max_split)
{
    int32_t n = -1;
    uint64_t fr = 0, tot = 0;
    void *p = NULL;
    int64_t v = -1;
    int32_t d;

    CHECK_STATUS(accalloc_device_count(&n), ACCALLOC_OK);
    CHECK_EQ(n, want_count);
    for (d = 0; d < want_count; ++d) {
        CHECK_STATUS(accalloc_memory_stat(d, "max_split_size", &v), ACCALLOC_OK);
        CHECK_EQ(v, want_max_split);
        CHECK_STATUS(accalloc_mem_get_info(d, &fr, &tot), ACCALLOC_OK);
        CHECK_EQ(tot, want_capacity);
        CHECK_EQ(fr, want_capacity);
    }
    CHECK_STATUS(accalloc_mem_get_info(want_count, &fr, &tot), ACCALLOC_ERROR_INVALID_DEVICE);
    CHECK_STATUS(accalloc_malloc(&p, 1000, want_count, NULL), ACCALLOC_ERROR_INVALID_DEVICE);
    /* the last device works */
    CHECK_STATUS(accalloc_malloc(&p, 1000, want_count - 1, NULL), ACCALLOC_OK);
    CHECK_STATUS(accalloc_memory_allocated(want_count - 1, &v), ACCALLOC_OK);
    CHECK_EQ(v, 1024);
    CHECK_STATUS(accalloc_free(p), ACCALLOC_OK);
    /* the capacity is the limit: one byte more than it cannot be had */
    CHECK_STATUS(accalloc_malloc(&p, (size_t)want_capacity + 1, 0, NULL), ACCALLOC_ERROR_OUT_OF_MEMORY);
    CHECK_STATUS(accalloc_malloc(&p, (size_t)want_capacity, 0, NULL), ACCALLOC_OK);
    CHECK_STATUS(accalloc_free(p), ACCALLOC_OK);
    CHECK_STATUS(accalloc_empty_cache(), ACCALLOC_OK);
    return 0;
}

int main(int argc, char **argv)
{
    if ((argc == 3 || argc == 4) && strcmp(argv[1], "error") == 0) {
        g_word = argc == 4 ? argv[3] : NULL;
        run_error(argv[2]);
    } else if ((argc == 4 || argc == 5) && strcmp(argv[1], "ok") == 0) {
        run_ok((int32_t)atoi(argv[2]), (int64_t)strtoll(argv[3], NULL, 10),
               argc == 5 ? (int64_t)strtoll(argv[4], NULL, 10) : -1);
    } else {
        fprintf(stderr, "usage: %s error VAR [WORD] | ok COUNT CAPACITY [MAX_SPLIT_SIZE]\n", argv[0]);
        return 2;
    }
    printf("test_config: %d checks, %d failed\n", g_checks, g_failures);
    return g_failures == 0 && g_checks > 0 ? 0 : 1;
}
