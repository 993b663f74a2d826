// accalloc from C++ destructors that run after the thread's thread-locals are torn down: a global
// object's destructor (run by exit(), after the main thread's thread-local destructors) and a
// thread_local object constructed before the thread first used accalloc (destroyed after accalloc's
// own thread-locals). Each call must answer as usual; before the fix the process died with SIGABRT.
#include "accalloc.h"

#include <cstdio>
#include <cstring>
#include <thread>
#include <unistd.h>

namespace {

int g_failures = 0;

void check(bool ok, const char *where, const char *what)
{
    if (!ok) {
        ++g_failures;
        std::fprintf(stderr, "FAIL in %s: %s (last error: \"%s\")\n", where, what, accalloc_last_error_message());
    }
}

void late_calls(const char *where)
{
    void *p = nullptr;
    int dummy = 0;
    check(accalloc_malloc(&p, 4096, -1, nullptr) == ACCALLOC_OK && p != nullptr, where, "malloc");
    check(accalloc_free(p) == ACCALLOC_OK, where, "free");
    check(accalloc_free(&dummy) == ACCALLOC_ERROR_INVALID_POINTER, where, "a foreign pointer is refused");
    check(std::strstr(accalloc_last_error_message(), "was not allocated by accalloc") != nullptr, where,
          "the refusal's message");
}

struct LateUser {
    const char *where;
    ~LateUser()
    {
        late_calls(where);
        std::printf("late calls from %s: %d failed\n", where, g_failures);
        std::fflush(stdout);
        if (g_failures != 0)
            _exit(1);
    }
};

LateUser g_global{"a C++ global destructor"};

} // namespace

int main()
{
    std::thread worker([] {
        thread_local LateUser late{"a C++ thread_local destructor"};
        void *p = nullptr;
        (void)late.where;
        // First use of accalloc on this thread, after `late` was constructed.
        check(accalloc_malloc(&p, 1000, 0, nullptr) == ACCALLOC_OK, "the worker", "malloc");
        check(accalloc_free(p) == ACCALLOC_OK, "the worker", "free");
        check(accalloc_free(p) == ACCALLOC_ERROR_INVALID_POINTER, "the worker", "double free");
    });
    worker.join();
    void *p = nullptr;
    check(accalloc_malloc(&p, 1000, 0, nullptr) == ACCALLOC_OK, "main", "malloc");
    check(accalloc_free(p) == ACCALLOC_OK, "main", "free");
    check(accalloc_free(p) == ACCALLOC_ERROR_INVALID_POINTER, "main", "double free");
    std::printf("main: %d failed\n", g_failures);
    return g_failures == 0 ? 0 : 1;
}
