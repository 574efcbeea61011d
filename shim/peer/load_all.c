/*
 * load_all.c -- libnpud-load-all.so, an LD_PRELOAD helper for llama.cpp's own
 * tests: it calls llama.cpp's public ggml_backend_load_all() before main(), so
 * a program that lists devices before anything loads the backends (in a
 * GGML_BACKEND_DL build, tests/test-llama-archs.cpp does) sees the Hexagon one.
 * llama.cpp is not modified. NPUD_LOAD_ALL_QUIET=1: no report on stderr.
 * Written for npud (scripts/peer-llama.sh builds it).
 */
#include <stdio.h>
#include <stdlib.h>

#include "ggml-backend.h"

__attribute__((constructor)) static void npud_load_all_backends(void) {
    ggml_backend_load_all();
    if (getenv("NPUD_LOAD_ALL_QUIET") != NULL) {
        return;
    }
    size_t devices = ggml_backend_dev_count();
    fprintf(stderr, "npud-load-all: %zu backend(s), %zu device(s):", ggml_backend_reg_count(),
            devices);
    for (size_t i = 0; i < devices; i++) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        fprintf(stderr, " %s(%s)", ggml_backend_dev_name(dev), ggml_backend_dev_description(dev));
    }
    fprintf(stderr, "\n");
}
