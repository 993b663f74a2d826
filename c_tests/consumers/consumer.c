/* A program built against an installed accalloc (through pkg-config or its CMake package). */
#include <stdio.h>
#include <stdlib.h>

#include <accalloc.h>

int main(void)
{
    void *p = NULL;
    int64_t allocated = -1;
    if (ACC_CHECK_ABI() != ACC_OK) {
        fprintf(stderr, "%s\n", acc_last_error_message());
        return 1;
    }
    if (acc_malloc(&p, 4096, -1, NULL) != ACC_OK || acc_memory_allocated(-1, &allocated) != ACC_OK ||
        allocated != 4096 || acc_free(p) != ACC_OK) {
        fprintf(stderr, "accalloc did not work: %s\n", acc_last_error_message());
        return 1;
    }
    printf("consumer of accalloc %s (header %s, ABI %u) on %s: ok\n", acc_version(), ACC_VERSION_STRING,
           acc_abi_version(), acc_device_type_name(acc_current_accelerator()));
    return 0;
}
