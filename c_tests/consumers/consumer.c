/* A program built against an installed accalloc (through pkg-config or its CMake package). */
#include <stdio.h>
#include <stdlib.h>

#include <accalloc.h>

int main(void)
{
    void *p = NULL;
    int64_t allocated = -1;
    if (ACCALLOC_CHECK_ABI() != ACCALLOC_OK) {
        fprintf(stderr, "%s\n", accalloc_last_error_message());
        return 1;
    }
    if (accalloc_malloc(&p, 4096, -1, NULL) != ACCALLOC_OK || accalloc_memory_allocated(-1, &allocated) != ACCALLOC_OK ||
        allocated != 4096 || accalloc_free(p) != ACCALLOC_OK) {
        fprintf(stderr, "accalloc did not work: %s\n", accalloc_last_error_message());
        return 1;
    }
    printf("consumer of accalloc %s (header %s, ABI %u) on %s: ok\n", accalloc_version(), ACCALLOC_VERSION_STRING,
           accalloc_abi_version(), accalloc_device_type_name(accalloc_current_accelerator()));
    return 0;
}
