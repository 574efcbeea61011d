/*
 * log.c -- diagnostics on stderr when NPUD_SHIM_LOG is set (to anything but 0; 2 also
 * traces every invoke's arguments). An answer a probe expects is no error and is not
 * logged as one (shim_log_expect).
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

static atomic_int g_level = -1;
/* The calling thread's expected answer (pthread keys: no TLS model to pick in a
 * library that is dlopen'ed, nothing linked beyond libc). */
static pthread_once_t g_expect_once = PTHREAD_ONCE_INIT;
static pthread_key_t g_expect_key;
static int g_expect_ok;

static void expect_key_init(void) {
    g_expect_ok = pthread_key_create(&g_expect_key, NULL) == 0;
}

void shim_log_expect(int rc) {
    (void)pthread_once(&g_expect_once, expect_key_init);
    if (g_expect_ok) {
        (void)pthread_setspecific(g_expect_key, (void *)(intptr_t)rc);
    }
}

int shim_log_expected(void) {
    (void)pthread_once(&g_expect_once, expect_key_init);
    return g_expect_ok ? (int)(intptr_t)pthread_getspecific(g_expect_key) : 0;
}

int shim_log_level(void) {
    int level = atomic_load(&g_level);
    if (level < 0) {
        const char *value = getenv("NPUD_SHIM_LOG");
        level = value == NULL || value[0] == '\0' ? 0 : atoi(value);
        if (level == 0 && value != NULL && value[0] != '\0' && strcmp(value, "0") != 0) {
            level = 1;
        }
        atomic_store(&g_level, level);
    }
    return level;
}

void shim_log(const char *fmt, ...) {
    int saved = errno;
    if (shim_log_level() > 0) {
        char line[512];
        va_list args;
        va_start(args, fmt);
        vsnprintf(line, sizeof(line), fmt, args);
        va_end(args);
        fprintf(stderr, "libcdsprpc(npud): %s\n", line);
    }
    errno = saved;
}
