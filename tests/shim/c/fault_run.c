/*
 * fault_run.c -- one pass over the library's paths, for the fault hook.
 *
 * Run with the library built with FAULTS=1 and NPUD_SHIM_FAULT_AT=n: the n-th
 * internal call fails. Whatever fails, every call must return (a code, NULL),
 * and at the end nothing may be left: no fd but the connection's, no mapping
 * of a DMA-BUF, no heap (AddressSanitizer's leak check at exit), and npud
 * holds nothing of this process once it exits (the test checks that).
 * Prints one line per call: "name rc".
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "AEEStdErr.h"
#include "dspqueue.h"
#include "remote.h"
#include "rpcmem.h"

#define TEST_URI "file:///libnpu_test_skel.so?npu_test_skel_handle_invoke&_modver=1.0&_dom=cdsp"
#define ECHO_URI "file:///libecho_skel.so?echo_skel_handle_invoke&_modver=1.0&_dom=cdsp"

static int count_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    if (d == NULL) {
        return -1;
    }
    while (readdir(d) != NULL) {
        n++;
    }
    closedir(d);
    return n;
}

static int count_dmabuf_mappings(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[1024];
    int n = 0;
    if (f == NULL) {
        return -1;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        n += strstr(line, "dmabuf") != NULL || strstr(line, "dma_heap") != NULL;
    }
    fclose(f);
    return n;
}

static int report(const char *what, int rc) {
    printf("%s 0x%x\n", what, (unsigned)rc);
    return rc;
}

static void pass(void) {
    struct remote_dsp_capability cap = {CDSP_DOMAIN_ID, ARCH_VER, 0};
    report("get_dsp_info", remote_handle_control(DSPRPC_GET_DSP_INFO, &cap, sizeof(cap)));

    uint8_t *buf = rpcmem_alloc2(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS, 65536);
    int fd = buf != NULL ? rpcmem_to_fd(buf) : -1;
    report("rpcmem_alloc2", buf != NULL ? 0 : -1);
    int mapped = buf != NULL &&
                 report("fastrpc_mmap",
                        fastrpc_mmap(CDSP_DOMAIN_ID, fd, buf, 0, 65536, FASTRPC_MAP_FD)) == 0;

    remote_handle64 h = 0;
    int opened = report("open", remote_handle64_open(TEST_URI, &h)) == 0;
    if (opened) {
        uint32_t prim[2] = {5, 4096};
        uint8_t inline_out[4096];
        remote_arg args[2] = {{.buf = {prim, 8}}, {.buf = {buf != NULL ? buf : inline_out, 4096}}};
        report("invoke_fill", remote_handle64_invoke(h, REMOTE_SCALARS_MAKE(2, 1, 1), args));
        args[1].buf.pv = inline_out;
        report("invoke_inline", remote_handle64_invoke(h, REMOTE_SCALARS_MAKE(2, 1, 1), args));

        size_t big = 2u << 20; /* beyond the inline limit: spilled */
        uint8_t *in = calloc(1, big);
        if (in != NULL) {
            uint32_t len[1] = {(uint32_t)big};
            uint32_t crc = 0;
            remote_arg c[3] = {{.buf = {len, 4}}, {.buf = {in, big}}, {.buf = {&crc, 4}}};
            report("invoke_spill", remote_handle64_invoke(h, REMOTE_SCALARS_MAKE(3, 2, 1), c));
            free(in);
        }
        struct remote_rpc_control_latency lat = {RPC_PM_QOS, 100};
        report("latency", remote_handle64_control(h, DSPRPC_CONTROL_LATENCY, &lat, sizeof(lat)));
    }
    remote_handle64 e = 0;
    if (report("open_echo", remote_handle64_open(ECHO_URI, &e)) == 0) {
        uint8_t *reg = rpcmem_alloc2(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_HEAP_NOREG, 4096);
        if (reg != NULL) {
            uint8_t in[64] = {1};
            uint32_t prim[2] = {64, 64};
            remote_arg args[3] = {{.buf = {prim, 8}}, {.buf = {in, 64}}, {.buf = {reg, 64}}};
            remote_register_buf(reg, 4096, rpcmem_to_fd(reg));
            report("invoke_registered",
                   remote_handle64_invoke(e, REMOTE_SCALARS_MAKE(2, 2, 1), args));
            remote_register_buf(reg, 4096, -1);
            rpcmem_free(reg);
        }
        report("close_echo", remote_handle64_close(e));
    }
    dspqueue_t q = NULL;
    report("dspqueue_create", dspqueue_create(CDSP_DOMAIN_ID, 0, 2560, 6656, NULL, NULL, NULL, &q));
    if (q != NULL) {
        /* A close that fails leaves the queue open, or, when its teardown failed,
         * a husk: either way close it again (the fault hook fails one call only). */
        int closed = dspqueue_close(q);
        report("dspqueue_close", closed);
        if (closed != 0) {
            report("dspqueue_close_again", dspqueue_close(q));
        }
    }
    if (mapped) {
        report("fastrpc_munmap", fastrpc_munmap(CDSP_DOMAIN_ID, fd, buf, 65536));
    }
    if (opened) {
        report("close", remote_handle64_close(h));
    }
    rpcmem_free(buf);
}

int main(void) {
    int fds = count_fds();
    pass();
    pass(); /* again: after whatever the first pass broke (a connection, a thread) */
    int extra = count_fds() - fds;
    int maps = count_dmabuf_mappings();
    printf("extra_fds %d dmabuf_mappings %d\n", extra, maps);
    if (extra > 1 || maps != 0) { /* the connection's socket may stay */
        fprintf(stderr, "leaked: %d fds, %d DMA-BUF mappings\n", extra, maps);
        return 1;
    }
    return 0;
}
