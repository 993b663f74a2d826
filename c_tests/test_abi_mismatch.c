/* A program built against a header of another ABI (ACCALLOC_ABI_VERSION 99, made by CMake from the real
 * header) must be refused at start-up with a clear message. */
#include <stdio.h>
#include <string.h>

#include "accalloc.h"

int main(void)
{
    AccallocStatus status = ACCALLOC_CHECK_ABI();
    const char *message = accalloc_last_error_message();
    if (ACCALLOC_ABI_VERSION != 99) {
        fprintf(stderr, "this test must be built against the ABI 99 header\n");
        return 1;
    }
    /* ACCALLOC_REAL_ABI: the real header's ABI, passed in by CMake. */
    char provides[64];
    snprintf(provides, sizeof provides, "provides ABI %d", ACCALLOC_REAL_ABI);
    if (status != ACCALLOC_ERROR_NOT_SUPPORTED || !strstr(message, "built against accalloc ABI 99") ||
        !strstr(message, provides)) {
        fprintf(stderr, "expected a refusal, got %s: \"%s\"\n", accalloc_status_name(status), message);
        return 1;
    }
    printf("refused as expected: %s\n", message);
    return 0;
}
