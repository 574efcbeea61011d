/*
 * errors_table.c -- print the library's AEE code for each npud error code given
 * (with DSP result 0x8000040E where the error carries one), then for each errno.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "shim.h"

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        int code = atoi(argv[i]);
        printf("npud %d 0x%x\n", code, (unsigned)shim_aee_from_npud(code, 0x8000040Eu));
    }
    static const int errnos[] = {EPIPE, ECONNRESET, ECONNREFUSED, ENOENT, ENOMEM, EINVAL,
                                 ETIMEDOUT, EACCES, ENODEV, EIO, EBUSY};
    for (size_t i = 0; i < sizeof(errnos) / sizeof(errnos[0]); i++) {
        printf("errno %d 0x%x\n", errnos[i], (unsigned)shim_aee_from_errno(errnos[i]));
    }
    printf("domain -1 0x%x\n", (unsigned)shim_check_domain(-1));
    printf("domain 3 0x%x\n", (unsigned)shim_check_domain(3));
    printf("domain 0 0x%x\n", (unsigned)shim_check_domain(0));
    printf("domain 11 0x%x\n", (unsigned)shim_check_domain(11));
    printf("domain 32 0x%x\n", (unsigned)shim_check_domain(32));
    return 0;
}
