/* config_*: the host backend's environment configuration.
 *
 *   test_config error VAR [WORD]   run with VAR set to a bad value: every call that needs the devices
 *                                  returns ACC_ERROR_CONFIG with a message naming VAR (and WORD), every
 *                                  time; the calls that need no device still work.
 *   test_config ok COUNT CAPACITY [MAX_SPLIT_SIZE]
 *                                  run with a good configuration: COUNT devices of CAPACITY bytes (and
 *                                  the max_split_size that ACC_ALLOC_CONF sets). */
#include "accalloc.h"

#include "acc_test_util.h"

#define CHECK_STATUS(call, want) CHECK_STATUS_WITH(call, want, acc_status_name, acc_last_error_message)

static const char *g_word = NULL;

static void expect_config_error(int st, const char *call, const char *var)
{
    const char *msg = acc_last_error_message();
    ++g_checks;
    if (st != ACC_ERROR_CONFIG) {
        ++g_failures;
        fprintf(stderr, "FAIL %s returned %s, expected ACC_ERROR_CONFIG (message: \"%s\")\n", call,
                acc_status_name((AccStatus)st), msg);
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
    AccDeviceStats s;
    size_t len = 0;
    int round;

    printf("%s=%s\n", var, getenv(var) ? getenv(var) : "(unset)");
    for (round = 0; round < 2; ++round) { /* the error is reported again, not only the first time */
        expect_config_error((int)acc_device_count(&n), "acc_device_count", var);
        expect_config_error((int)acc_malloc(&p, 1000, 0, NULL), "acc_malloc", var);
        expect_config_error((int)acc_malloc(&p, 1000, -1, NULL), "acc_malloc(device -1)", var);
        expect_config_error((int)acc_memory_allocated(0, &v), "acc_memory_allocated", var);
        expect_config_error((int)acc_memory_stat(0, "num_ooms", &v), "acc_memory_stat", var);
        memset(&s, 0, sizeof s);
        s.struct_size = sizeof s;
        expect_config_error((int)acc_get_device_stats(0, &s), "acc_get_device_stats", var);
        expect_config_error((int)acc_memory_stats_json(0, NULL, 0, &len), "acc_memory_stats_json", var);
        expect_config_error((int)acc_mem_get_info(0, &fr, &tot), "acc_mem_get_info", var);
        expect_config_error((int)acc_set_device(0), "acc_set_device", var);
        expect_config_error((int)acc_empty_cache(), "acc_empty_cache", var);
    }
    printf("message: %s\n", acc_last_error_message());
    /* what needs no device keeps working */
    CHECK_STR(acc_version(), "0.1.0");
    CHECK_EQ(acc_abi_version(), ACC_ABI_VERSION);
    CHECK_STR(acc_status_name(ACC_ERROR_CONFIG), "ACC_ERROR_CONFIG");
    CHECK_STR(acc_device_type_name(ACC_DEVICE_HOST), "host");
    return 0;
}

static int run_ok(int32_t want_count, int64_t want_capacity, int64_t want_max_split)
{
    int32_t n = -1;
    uint64_t fr = 0, tot = 0;
    void *p = NULL;
    int64_t v = -1;
    int32_t d;

    CHECK_STATUS(acc_device_count(&n), ACC_OK);
    CHECK_EQ(n, want_count);
    for (d = 0; d < want_count; ++d) {
        CHECK_STATUS(acc_memory_stat(d, "max_split_size", &v), ACC_OK);
        CHECK_EQ(v, want_max_split);
        CHECK_STATUS(acc_mem_get_info(d, &fr, &tot), ACC_OK);
        CHECK_EQ(tot, want_capacity);
        CHECK_EQ(fr, want_capacity);
    }
    CHECK_STATUS(acc_mem_get_info(want_count, &fr, &tot), ACC_ERROR_INVALID_DEVICE);
    CHECK_STATUS(acc_malloc(&p, 1000, want_count, NULL), ACC_ERROR_INVALID_DEVICE);
    /* the last device works */
    CHECK_STATUS(acc_malloc(&p, 1000, want_count - 1, NULL), ACC_OK);
    CHECK_STATUS(acc_memory_allocated(want_count - 1, &v), ACC_OK);
    CHECK_EQ(v, 1024);
    CHECK_STATUS(acc_free(p), ACC_OK);
    /* the capacity is the limit: one byte more than it cannot be had */
    CHECK_STATUS(acc_malloc(&p, (size_t)want_capacity + 1, 0, NULL), ACC_ERROR_OUT_OF_MEMORY);
    CHECK_STATUS(acc_malloc(&p, (size_t)want_capacity, 0, NULL), ACC_OK);
    CHECK_STATUS(acc_free(p), ACC_OK);
    CHECK_STATUS(acc_empty_cache(), ACC_OK);
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
