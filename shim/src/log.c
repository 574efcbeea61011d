/*
 * log.c -- diagnostics on stderr when NPUD_SHIM_LOG is set (to anything but 0; 2 also
 * traces every invoke's arguments).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

static atomic_int g_level = -1;

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
