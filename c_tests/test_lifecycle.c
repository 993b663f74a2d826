/* accalloc at the edges of a process's life: calls made from a thread's TLS destructor (a pthread key
 * destructor runs after the thread's other thread-local storage, Rust's included, has been torn down)
 * and from an atexit handler (after main returned, when the main thread's thread-locals are gone; C++
 * global destructors run from the same place). Each call must answer with its status and message as
 * anywhere else: no abort, no ACCALLOC_ERROR_INTERNAL. Before the fix this program died with SIGABRT. */
#include "accalloc.h"
#include "accalloc_test_util.h"

#include <pthread.h>
#include <unistd.h>

#define EXPECT(call, want) CHECK_STATUS_WITH(call, want, accalloc_status_name, accalloc_last_error_message)

static pthread_key_t g_key;

/* The calls a late caller makes: allocate and free on the current device, a failing free, its message. */
static void late_calls(const char *where)
{
    void *p = NULL;
    int dummy = 0;
    int32_t device = -1;
    int64_t allocated = -1;
    fprintf(stderr, "late calls from %s\n", where);
    EXPECT(accalloc_malloc(&p, 4096, -1, NULL), ACCALLOC_OK);
    CHECK(p != NULL);
    EXPECT(accalloc_current_device(&device), ACCALLOC_OK);
    CHECK_EQ(device, 0);
    EXPECT(accalloc_free(p), ACCALLOC_OK);
    EXPECT(accalloc_free(&dummy), ACCALLOC_ERROR_INVALID_POINTER);
    CHECK_CONTAINS(accalloc_last_error_message(), "was not allocated by accalloc");
    EXPECT(accalloc_set_allocator_settings("no_such_key:1"), ACCALLOC_ERROR_CONFIG);
    CHECK_CONTAINS(accalloc_last_error_message(), "unrecognized key 'no_such_key'");
    EXPECT(accalloc_memory_allocated(0, &allocated), ACCALLOC_OK);
    CHECK_EQ(allocated, 0);
    EXPECT(accalloc_empty_cache(), ACCALLOC_OK);
}

static void key_destructor(void *value)
{
    (void)value;
    late_calls("a thread's TLS destructor");
}

static void *worker(void *arg)
{
    void *p = NULL;
    (void)arg;
    /* Use accalloc first, so that this thread's thread-locals exist and are torn down at exit. */
    EXPECT(accalloc_malloc(&p, 1000, 0, NULL), ACCALLOC_OK);
    EXPECT(accalloc_free(p), ACCALLOC_OK);
    EXPECT(accalloc_free(p), ACCALLOC_ERROR_INVALID_POINTER);
    EXPECT(accalloc_set_device(1), ACCALLOC_OK);
    EXPECT(accalloc_set_device(0), ACCALLOC_OK);
    pthread_setspecific(g_key, (void *)1);
    return NULL;
}

static void at_exit(void)
{
    int before = g_failures;
    late_calls("an atexit handler");
    printf("after exit: %d checks, %d failed\n", g_checks, g_failures);
    fflush(stdout);
    if (g_failures != before)
        _exit(1);
}

int main(void)
{
    pthread_t thread;
    void *p = NULL;
    CHECK(pthread_key_create(&g_key, key_destructor) == 0);
    CHECK(atexit(at_exit) == 0);
    EXPECT(accalloc_malloc(&p, 1000, -1, NULL), ACCALLOC_OK);
    EXPECT(accalloc_free(p), ACCALLOC_OK);
    EXPECT(accalloc_free(p), ACCALLOC_ERROR_INVALID_POINTER);
    CHECK(pthread_create(&thread, NULL, worker, NULL) == 0);
    CHECK(pthread_join(thread, NULL) == 0);
    printf("%d checks, %d failed\n", g_checks, g_failures);
    fflush(stdout);
    return g_failures == 0 ? 0 : 1;
}
