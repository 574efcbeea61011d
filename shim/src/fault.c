/*
 * fault.c -- allocation wrappers and the n-th-call fault hook.
 *
 * Built with -DSHIM_FAULTS (the test build only), every fault point (each
 * malloc, socket, connect, sendmsg, recvmsg, mmap, pthread_create and msgpack
 * decode the library makes) counts; with NPUD_SHIM_FAULT_AT=n in the
 * environment the n-th one fails as the real call would (NULL/-1 and an
 * errno). NPUD_SHIM_FAULT_COUNT=path writes, at exit, how many fault points
 * the process passed: a test runs once without a fault to learn N, then with
 * n = 1..N, and checks that each run returns codes and leaks nothing.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "shim.h"

#ifdef SHIM_FAULTS
static atomic_ulong g_points;
static unsigned long g_fail_at;

__attribute__((constructor)) static void fault_init(void) {
    const char *at = getenv("NPUD_SHIM_FAULT_AT");
    g_fail_at = at != NULL ? strtoul(at, NULL, 10) : 0;
}

__attribute__((destructor)) static void fault_fini(void) {
    const char *path = getenv("NPUD_SHIM_FAULT_COUNT");
    if (path == NULL) {
        return;
    }
    FILE *out = fopen(path, "w");
    if (out != NULL) {
        fprintf(out, "%lu\n", atomic_load(&g_points));
        fclose(out);
    }
}

int shim_fault(const char *what) {
    unsigned long n = atomic_fetch_add(&g_points, 1) + 1;
    if (g_fail_at == 0 || n != g_fail_at) {
        return 0;
    }
    shim_log("fault injected: call %lu (%s) fails", n, what);
    return 1;
}
#endif

void *x_malloc(size_t size) {
    if (FAULT("malloc")) {
        errno = ENOMEM;
        return NULL;
    }
    return malloc(size);
}

void *x_calloc(size_t count, size_t size) {
    if (FAULT("calloc")) {
        errno = ENOMEM;
        return NULL;
    }
    return calloc(count, size);
}

void *x_realloc(void *ptr, size_t size) {
    if (FAULT("realloc")) {
        errno = ENOMEM;
        return NULL;
    }
    return realloc(ptr, size);
}
