/* fork() while another thread is inside the allocator: the child must never hang. accalloc's rule
 * (as PyTorch's for CUDA): a child of a process that used accalloc cannot use it; every call there
 * returns ACCALLOC_ERROR_NOT_SUPPORTED at once with a message saying why, and the parent carries on.
 * Each child arms an alarm first, so a child that hangs dies of SIGALRM and the test fails instead of
 * hanging. Before the fix, most children deadlocked on their first malloc. */
#include "accalloc.h"
#include "accalloc_test_util.h"

#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#define EXPECT(call, want) CHECK_STATUS_WITH(call, want, accalloc_status_name, accalloc_last_error_message)
#define CHILDREN 20

static volatile int g_stop = 0;

/* Keeps the allocator busy: malloc, free, statistics and empty_cache on both devices. */
static void *busy(void *arg)
{
    long rounds = 0;
    (void)arg;
    while (!g_stop) {
        void *p = NULL;
        int64_t value = 0;
        int32_t device = (int32_t)(rounds & 1);
        if (accalloc_malloc(&p, (size_t)(1 + rounds % 7) << 20, device, NULL) == ACCALLOC_OK)
            accalloc_free(p);
        accalloc_memory_allocated(device, &value);
        if (rounds % 64 == 0)
            accalloc_empty_cache();
        ++rounds;
    }
    return NULL;
}

/* In the child: every call answers at once. Exit status 0 when each answer is the expected one. */
static int child(void)
{
    void *p = NULL;
    int64_t value = 0;
    alarm(5);
    if (accalloc_malloc(&p, 4096, 0, NULL) != ACCALLOC_ERROR_NOT_SUPPORTED || p != NULL)
        return 2;
    if (strstr(accalloc_last_error_message(), "fork() child") == NULL)
        return 3;
    if (accalloc_memory_allocated(0, &value) != ACCALLOC_ERROR_NOT_SUPPORTED)
        return 4;
    if (accalloc_empty_cache() != ACCALLOC_ERROR_NOT_SUPPORTED)
        return 5;
    return 0;
}

int main(void)
{
    pthread_t thread;
    int i, hung = 0, wrong = 0;
    void *p = NULL;
    EXPECT(accalloc_malloc(&p, 1000, 0, NULL), ACCALLOC_OK);
    CHECK(pthread_create(&thread, NULL, busy, NULL) == 0);
    for (i = 0; i < CHILDREN; ++i) {
        int status = 0;
        pid_t pid;
        usleep(2000); /* let the busy thread get well inside the allocator */
        pid = fork();
        if (pid == 0)
            _exit(child());
        CHECK(pid > 0);
        CHECK(waitpid(pid, &status, 0) == pid);
        if (WIFSIGNALED(status)) {
            ++hung;
            fprintf(stderr, "child %d died of signal %d (SIGALRM: it hung)\n", i, WTERMSIG(status));
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            ++wrong;
            fprintf(stderr, "child %d exited with %d\n", i, WEXITSTATUS(status));
        }
    }
    g_stop = 1;
    CHECK(pthread_join(thread, NULL) == 0);
    CHECK_EQ(hung, 0);
    CHECK_EQ(wrong, 0);
    /* The parent is unaffected. */
    EXPECT(accalloc_free(p), ACCALLOC_OK);
    EXPECT(accalloc_empty_cache(), ACCALLOC_OK);
    printf("%d children, %d checks, %d failed\n", CHILDREN, g_checks, g_failures);
    return g_failures == 0 ? 0 : 1;
}
