/*
 * api_test.c -- npud's libcdsprpc against a real npud on the emulator:
 * ./api_test SCENARIO (NPUD_SOCKET names the daemon). Exit 0 when every check
 * holds; the first failing one is printed. Scenarios that need the test to act
 * (kill npud, restart the DSP) print a line and wait for one on stdin.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/wait.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "AEEStdErr.h"
#include "dspqueue.h"
#include "remote.h"
#include "rpcmem.h"

#define CHECK(c)                                                                             \
    do {                                                                                     \
        if (!(c)) {                                                                          \
            fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #c);            \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

#define RC(call, want)                                                                       \
    do {                                                                                     \
        int rc_ = (int)(call);                                                               \
        if (rc_ != (int)(want)) {                                                            \
            fprintf(stderr, "%s:%d: %s = 0x%x, expected 0x%x\n", __FILE__, __LINE__, #call, \
                    (unsigned)rc_, (unsigned)(want));                                        \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

#define ECHO_URI "file:///libecho_skel.so?echo_skel_handle_invoke&_modver=1.0&_dom=cdsp"
#define TEST_MODULE "file:///libnpu_test_skel.so?npu_test_skel_handle_invoke&_modver=1.0"
#define TEST_URI TEST_MODULE "&_dom=cdsp"
#define DSP(n) ((int)(0x80000400u + (n)))

static uint32_t crc32(const uint8_t *p, size_t n) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) {
            c = c & 1 ? (c >> 1) ^ 0xedb88320u : c >> 1;
        }
    }
    return ~c;
}

static void step(const char *line) {
    printf("%s\n", line);
    fflush(stdout);
    char answer[64];
    CHECK(fgets(answer, sizeof(answer), stdin) != NULL);
}

/* echo: in -> out (method 2: primIn {len(in), capacity(out)}, in, out) */
static int echo(remote_handle64 h, void *in, uint32_t in_len, void *out, uint32_t out_len) {
    uint32_t prim[2] = {in_len, out_len};
    remote_arg args[3];
    args[0].buf.pv = prim;
    args[0].buf.nLen = sizeof(prim);
    args[1].buf.pv = in;
    args[1].buf.nLen = in_len;
    args[2].buf.pv = out;
    args[2].buf.nLen = out_len;
    return remote_handle64_invoke(h, REMOTE_SCALARS_MAKE(2, 2, 1), args);
}

/* npu_test.fill: out[i] = (seed + i) & 0xff */
static int fill(remote_handle64 h, uint32_t seed, void *out, uint32_t len) {
    uint32_t prim[2] = {seed, len};
    remote_arg args[2];
    args[0].buf.pv = prim;
    args[0].buf.nLen = sizeof(prim);
    args[1].buf.pv = out;
    args[1].buf.nLen = len;
    return remote_handle64_invoke(h, REMOTE_SCALARS_MAKE(2, 1, 1), args);
}

/* npu_test.checksum: the zlib CRC-32 of in */
static int checksum(remote_handle64 h, const void *in, uint32_t len, uint32_t *crc) {
    uint32_t prim[1] = {len};
    remote_arg args[3];
    args[0].buf.pv = prim;
    args[0].buf.nLen = sizeof(prim);
    args[1].buf.pv = (void *)(uintptr_t)in;
    args[1].buf.nLen = len;
    args[2].buf.pv = crc;
    args[2].buf.nLen = sizeof(*crc);
    return remote_handle64_invoke(h, REMOTE_SCALARS_MAKE(3, 2, 1), args);
}

/* npu_test.busy: on the DSP for us microseconds */
static int busy(remote_handle64 h, uint32_t us) {
    uint32_t prim[1] = {us};
    remote_arg args[1];
    args[0].buf.pv = prim;
    args[0].buf.nLen = sizeof(prim);
    return remote_handle64_invoke(h, REMOTE_SCALARS_MAKE(4, 1, 0), args);
}

static remote_handle64 open_test(void) {
    remote_handle64 h = 0;
    RC(remote_handle64_open(TEST_URI, &h), 0);
    CHECK(h != 0 && h <= UINT32_MAX);
    return h;
}

/* ---- scenarios ------------------------------------------------------------------------------ */

static void scenario_rpcmem(void) {
    rpcmem_init();
    static const size_t sizes[] = {1, 4096, 10000, 1 << 20};
    void *bufs[4];
    for (int i = 0; i < 4; i++) {
        bufs[i] = i % 2 ? rpcmem_alloc(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS, (int)sizes[i])
                        : rpcmem_alloc2(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS, sizes[i]);
        CHECK(bufs[i] != NULL);
        CHECK(((uintptr_t)bufs[i] & 4095) == 0);
        const uint8_t *p = bufs[i];
        for (size_t k = 0; k < sizes[i]; k++) {
            CHECK(p[k] == 0);
        }
        memset(bufs[i], 0xA5, sizes[i]);
        int fd = rpcmem_to_fd(bufs[i]);
        CHECK(fd > 0);
        CHECK(rpcmem_to_fd((char *)bufs[i] + 1) == -1); /* the base alone, as libcdsprpc */
        CHECK(rpcmem_to_fd((char *)bufs[i] + 4095) == -1);
        for (int j = 0; j < i; j++) {
            CHECK(rpcmem_to_fd(bufs[j]) != fd);
        }
    }
    int stack = 0;
    CHECK(rpcmem_to_fd(&stack) == -1);
    CHECK(rpcmem_to_fd(NULL) == -1);
    CHECK(rpcmem_alloc(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS, 0) == NULL);
    CHECK(rpcmem_alloc(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS, -5) == NULL);
    CHECK(rpcmem_alloc2(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS, 0) == NULL);
    CHECK(rpcmem_alloc2(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS, SIZE_MAX) == NULL);
    rpcmem_free(NULL);
    rpcmem_free(&stack); /* not ours: ignored */
    for (int i = 0; i < 4; i++) {
        rpcmem_free(bufs[i]);
    }
    rpcmem_deinit();
}

/* The DSP reads and writes rpcmem buffers in place. */
static void scenario_dsp_memory(void) {
    remote_handle64 h = open_test();
    const uint32_t n = 300000; /* more than an inline limit's worth? no: in place */
    uint8_t *buf = rpcmem_alloc2(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS, n);
    CHECK(buf != NULL);
    RC(fill(h, 7, buf + 100, n - 100), 0);
    for (uint32_t i = 0; i < n - 100; i++) {
        CHECK(buf[100 + i] == (uint8_t)(7 + i));
    }
    CHECK(buf[99] == 0);
    uint32_t crc = 0;
    RC(checksum(h, buf, n, &crc), 0);
    CHECK(crc == crc32(buf, n));

    remote_handle64 e = 0;
    RC(remote_handle64_open(ECHO_URI, &e), 0);
    uint8_t in[1000];
    for (int i = 0; i < 1000; i++) {
        in[i] = (uint8_t)(i * 3);
    }
    RC(echo(e, in, 1000, buf + 4096, 1000), 0); /* inline in, rpcmem out */
    CHECK(memcmp(buf + 4096, in, 1000) == 0);
    uint8_t out[1000];
    RC(echo(e, buf + 100, 1000, out, 1000), 0); /* rpcmem in, inline out */
    CHECK(memcmp(out, buf + 100, 1000) == 0);
    RC(echo(e, buf, 0, out, 0), 0);              /* empty buffers */

    /* arguments beyond npud's inline limit go through a buffer of their own */
    const uint32_t big = 3u << 20;
    uint8_t *src = malloc(big);
    uint8_t *dst = malloc(big);
    CHECK(src != NULL && dst != NULL);
    for (uint32_t i = 0; i < big; i++) {
        src[i] = (uint8_t)(i ^ (i >> 8));
    }
    memset(dst, 0, big);
    RC(echo(e, src, big, dst, big), 0);
    CHECK(memcmp(src, dst, big) == 0);
    free(src);
    free(dst);

    /* an argument that starts in an rpcmem buffer must end in it */
    uint8_t *small = rpcmem_alloc2(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS, 4096);
    RC(echo(e, small + 4000, 200, out, 200), AEE_EBADPARM);
    /* RPCMEM_HEAP_NOREG: by copy, and still right */
    uint8_t *noreg = rpcmem_alloc2(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_HEAP_NOREG, 4096);
    memset(noreg, 9, 4096);
    RC(echo(e, noreg, 64, out, 64), 0);
    CHECK(out[0] == 9 && out[63] == 9);
    rpcmem_free(noreg);
    rpcmem_free(small);
    RC(remote_handle64_close(e), 0);
    RC(remote_handle64_close(h), 0);
    rpcmem_free(buf);
}

/* remote_register_buf: by reference with one of our buffers' numbers. */
static void scenario_register(void) {
    remote_handle64 e = 0;
    RC(remote_handle64_open(ECHO_URI, &e), 0);
    uint8_t *buf = rpcmem_alloc2(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_HEAP_NOREG, 8192);
    int fd = rpcmem_to_fd(buf);
    uint8_t in[32] = {1, 2, 3};
    remote_register_buf(buf + 4096, 4096, fd); /* prints S for the second output */
    RC(echo(e, in, 32, buf + 4096, 32), 0);
    CHECK(buf[4096] == 1 && buf[4098] == 3);
    remote_register_buf(buf + 4096, 4096, -1);
    uint8_t other[64];
    remote_register_buf(other, sizeof(other), 12345); /* an fd npud does not know: copied */
    RC(echo(e, in, 32, other, 32), 0);
    CHECK(other[1] == 2);
    remote_register_buf(other, sizeof(other), -1);
    remote_register_buf_attr(buf, 4096, fd, FASTRPC_ATTR_NON_COHERENT);
    remote_register_buf(buf, 4096, -1);
    RC(remote_register_dma_handle(fd, 4096), 0);
    RC(remote_register_dma_handle_attr(fd, 4096, FASTRPC_ATTR_NOMAP), 0);
    RC(remote_register_dma_handle_attr(fd, 4096, 3), AEE_EBADPARM);
    RC(remote_register_dma_handle(-3, 4096), AEE_EBADPARM);
    rpcmem_free(buf);
    RC(remote_handle64_close(e), 0);
}

static void scenario_mmap(void) {
    const size_t n = 10000;
    uint8_t *buf = rpcmem_alloc2(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS, n);
    uint8_t *other = rpcmem_alloc2(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS, 4096);
    int fd = rpcmem_to_fd(buf);
    int fd2 = rpcmem_to_fd(other);
    RC(fastrpc_mmap(CDSP_DOMAIN_ID, fd, buf, 0, n, FASTRPC_MAP_FD), 0);
    RC(fastrpc_mmap(CDSP_DOMAIN_ID, fd, buf, 0, n, FASTRPC_MAP_FD), AEE_EALREADY);
    RC(fastrpc_munmap(CDSP_DOMAIN_ID, fd, buf, n), 0);
    RC(fastrpc_munmap(CDSP_DOMAIN_ID, fd, buf, n), AEE_ENOSUCHMAP);
    RC(fastrpc_mmap(-1, fd, buf, 0, 12288, FASTRPC_MAP_FD_DELAYED), 0); /* the rounded size */
    RC(fastrpc_munmap(-1, fd, NULL, 0), 0);
    /* every flag libcdsprpc passes on: STATIC, FD_NOMAP, the extended ones (llama.cpp
     * maps with FD_DELAYED_EXTENDED on DSPs newer than v79) */
    const enum fastrpc_map_flags passed[] = {FASTRPC_MAP_STATIC, FASTRPC_MAP_FD_NOMAP,
                                             FASTRPC_MAP_FD_EXTENDED,
                                             FASTRPC_MAP_FD_DELAYED_EXTENDED};
    for (size_t i = 0; i < sizeof(passed) / sizeof(passed[0]); i++) {
        RC(fastrpc_mmap(CDSP_DOMAIN_ID, fd, buf, 0, n, passed[i]), 0);
        RC(fastrpc_munmap(CDSP_DOMAIN_ID, fd, buf, n), 0);
    }
    /* what libcdsprpc refuses: RESERVED, beyond the enum, attribute bits, an offset */
    RC(fastrpc_mmap(CDSP_DOMAIN_ID, fd, buf, 0, n, FASTRPC_MAP_RESERVED), AEE_EBADPARM);
    RC(fastrpc_mmap(CDSP_DOMAIN_ID, fd, buf, 0, n, (enum fastrpc_map_flags)19), AEE_EBADPARM);
    RC(fastrpc_mmap(CDSP_DOMAIN_ID, fd, buf, 0, n, (enum fastrpc_map_flags)0x10002),
       AEE_EBADPARM);
    RC(fastrpc_mmap(CDSP_DOMAIN_ID, fd, buf, 4096, n - 4096, FASTRPC_MAP_FD), AEE_EBADPARM);
    /* what the kernel's MEM_MAP refuses (AEE_EFAILED from libcdsprpc): an fd that is no
     * buffer, a length beyond the buffer */
    RC(fastrpc_mmap(CDSP_DOMAIN_ID, 999999, buf, 0, n, FASTRPC_MAP_FD), AEE_EFAILED);
    RC(fastrpc_mmap(CDSP_DOMAIN_ID, fd, buf, 0, n + 4096, FASTRPC_MAP_FD), AEE_EFAILED);
    RC(fastrpc_mmap(CDSP_DOMAIN_ID, fd2, other, 0, n, FASTRPC_MAP_FD), AEE_EFAILED);
    /* what npud cannot map: a part of a buffer, another address */
    RC(fastrpc_mmap(CDSP_DOMAIN_ID, fd, buf, 0, 4096, FASTRPC_MAP_FD), AEE_EBADPARM);
    RC(fastrpc_mmap(CDSP_DOMAIN_ID, fd, other, 0, n, FASTRPC_MAP_FD), AEE_EBADPARM);
    RC(fastrpc_mmap(CDSP_DOMAIN_ID, -1, buf, 0, n, FASTRPC_MAP_FD), AEE_EBADPARM);
    RC(fastrpc_mmap(ADSP_DOMAIN_ID, fd, buf, 0, n, FASTRPC_MAP_FD), AEE_EUNSUPPORTED);
    RC(fastrpc_mmap(CDSP_DOMAIN_ID + 8, fd, buf, 0, n, FASTRPC_MAP_FD), AEE_EUNSUPPORTED);
    RC(fastrpc_mmap(99, fd, buf, 0, n, FASTRPC_MAP_FD), AEE_EBADPARM);
    RC(fastrpc_munmap(99, fd, buf, n), AEE_EBADPARM);
    RC(fastrpc_munmap(CDSP_DOMAIN_ID, fd2, other, 4096), AEE_ENOSUCHMAP);
    /* freed while mapped: npud unmaps it first */
    RC(fastrpc_mmap(CDSP_DOMAIN_ID, fd2, other, 0, 4096, FASTRPC_MAP_FD), 0);
    rpcmem_free(other);
    rpcmem_free(buf);
}

static void scenario_handles(void) {
    remote_handle64 h = open_test();
    remote_handle h32 = 0;
    RC(remote_handle_open(ECHO_URI, &h32), 0);
    CHECK(h32 != 0 && h32 != h);
    uint8_t in[16] = {5};
    uint8_t out[16] = {0};
    uint32_t prim[2] = {16, 16};
    remote_arg args[3] = {{.buf = {prim, 8}}, {.buf = {in, 16}}, {.buf = {out, 16}}};
    RC(remote_handle_invoke(h32, REMOTE_SCALARS_MAKE(2, 2, 1), args), 0);
    CHECK(out[0] == 5);
    /* the skel's own answer comes back unchanged */
    prim[0] = 99; /* primIn that does not match the buffers: AEE_EBADPARM from the DSP */
    RC(remote_handle_invoke(h32, REMOTE_SCALARS_MAKE(2, 2, 1), args), DSP(0x0E));
    RC(remote_handle64_invoke(h, REMOTE_SCALARS_MAKE(12, 0, 0), NULL), DSP(0x14));
    /* arguments */
    RC(remote_handle64_invoke(h, REMOTE_SCALARS_MAKE(2, 1, 1), NULL), AEE_EBADPARM);
    RC(remote_handle64_invoke(h, REMOTE_SCALARS_MAKEX(0, 2, 0, 0, 1, 0), args),
       AEE_EUNSUPPORTED); /* dma handles: npud's wire has none yet */
    remote_arg nul[1] = {{.buf = {NULL, 8}}};
    RC(remote_handle64_invoke(h, REMOTE_SCALARS_MAKE(4, 1, 0), nul), AEE_EBADPARM);
    RC(remote_handle64_invoke(0x7777, REMOTE_SCALARS_MAKE(2, 0, 0), NULL), AEE_EINVHANDLE);
    RC(remote_handle64_invoke(h | (1ull << 40), REMOTE_SCALARS_MAKE(2, 0, 0), NULL),
       AEE_EINVHANDLE);
    RC(remote_handle64_control(0x7777, DSPRPC_GET_DOMAIN, NULL, 0), AEE_EINVHANDLE);
    /* opening */
    remote_handle64 x = 0;
    RC(remote_handle64_open(NULL, &x), AEE_EBADPARM);
    RC(remote_handle64_open(TEST_URI, NULL), AEE_EBADPARM);
    RC(remote_handle64_open("", &x), AEE_EBADPARM);
    RC(remote_handle64_open("file:///lib nospace.so?x", &x), AEE_EBADPARM);
    RC(remote_handle64_open(TEST_MODULE "&_dom=adsp", &x), AEE_EUNSUPPORTED);
    RC(remote_handle64_open(TEST_MODULE "&_dom=cdsp1", &x), AEE_EUNSUPPORTED);
    RC(remote_handle64_open(TEST_MODULE "&_dom=cdsp&_session=1", &x), AEE_EUNSUPPORTED);
    /* as libcdsprpc: a 64-bit open names its domain, and a session below 4 */
    RC(remote_handle64_open(TEST_MODULE, &x), AEE_EBADPARM);
    RC(remote_handle64_open(TEST_MODULE "&_session=0", &x), AEE_EBADPARM);
    RC(remote_handle64_open(TEST_MODULE "&_dom=dsp", &x), AEE_EBADPARM);
    RC(remote_handle64_open(TEST_MODULE "&_dom=cdsp&_session=4", &x), AEE_EBADPARM);
    RC(remote_handle64_open(
           "file:///libnothere_skel.so?nothere_skel_handle_invoke&_modver=1.0&_dom=cdsp", &x),
       DSP(0x3E)); /* AEE_ENOSUCHMOD, the DSP's dlopen */
    RC(remote_handle64_open(TEST_MODULE "&_dom=cdsp&_session=0", &x), 0);
    RC(remote_handle64_close(x), 0);
    /* the 32-bit open runs in the current domain: no &_dom needed */
    remote_handle y = 0;
    RC(remote_handle_open(TEST_MODULE, &y), 0);
    RC(remote_handle_close(y), 0);
    /* closing: the upper half of a 64-bit handle is ignored (llama.cpp's 32-bit call) */
    RC(remote_handle64_close(h | 0xdead00000000ull), 0);
    RC(remote_handle64_close(h), AEE_EINVHANDLE);
    RC(remote_handle64_invoke(h, REMOTE_SCALARS_MAKE(2, 0, 0), NULL), AEE_EINVHANDLE);
    RC(remote_handle_close(h32), 0);
    RC(remote_handle_close(h32), AEE_EINVHANDLE);
}

static void scenario_controls(void) {
    struct remote_dsp_capability cap = {CDSP_DOMAIN_ID, ARCH_VER, 0};
    RC(remote_handle_control(DSPRPC_GET_DSP_INFO, &cap, sizeof(cap)), 0);
    CHECK(cap.capability == 0x73);
    cap.attribute_ID = DOMAIN_SUPPORT;
    RC(remote_handle_control(DSPRPC_GET_DSP_INFO, &cap, sizeof(cap)), 0);
    CHECK(cap.capability == 1);
    cap.attribute_ID = 130; /* DSPSIGNAL_DSP_SUPPORT: none, so dspqueue signals by RPC */
    cap.capability = 7;
    RC(remote_handle_control(DSPRPC_GET_DSP_INFO, &cap, sizeof(cap)), 0);
    CHECK(cap.capability == 0);
    cap.attribute_ID = 260;
    RC(remote_handle_control(DSPRPC_GET_DSP_INFO, &cap, sizeof(cap)), AEE_EBADPARM);
    struct remote_dsp_capability adsp = {ADSP_DOMAIN_ID, DOMAIN_SUPPORT, 9};
    RC(remote_handle_control(DSPRPC_GET_DSP_INFO, &adsp, sizeof(adsp)), 0);
    CHECK(adsp.capability == 0);
    adsp.attribute_ID = ARCH_VER;
    RC(remote_handle_control(DSPRPC_GET_DSP_INFO, &adsp, sizeof(adsp)), AEE_EUNSUPPORTED);
    struct remote_dsp_capability far = {40, ARCH_VER, 0};
    RC(remote_handle_control(DSPRPC_GET_DSP_INFO, &far, sizeof(far)), AEE_EBADPARM);
    RC(remote_handle_control(DSPRPC_GET_DSP_INFO, NULL, 12), AEE_EBADPARM);
    RC(remote_handle_control(DSPRPC_CONTROL_WAKELOCK, &cap, 4), AEE_EUNSUPPORTED);
    RC(remote_handle_control(99, NULL, 0), AEE_EUNSUPPORTED);
    remote_rpc_get_domain_t dom = {-1};
    RC(remote_handle_control(DSPRPC_GET_DOMAIN, &dom, sizeof(dom)), 0);
    CHECK(dom.domain == CDSP_DOMAIN_ID);

    char cdsp[] = "cdsp";
    char cdsp1[] = "cdsp1";
    char bogus[] = "xdsp";
    remote_rpc_effective_domain_id_t eff = {cdsp, 4, 0, 99};
    RC(remote_session_control(FASTRPC_GET_EFFECTIVE_DOMAIN_ID, &eff, sizeof(eff)), 0);
    CHECK(eff.effective_domain_id == 3);
    eff.session_id = 1;
    RC(remote_session_control(FASTRPC_GET_EFFECTIVE_DOMAIN_ID, &eff, sizeof(eff)), 0);
    CHECK(eff.effective_domain_id == 11);
    eff.domain_name = cdsp1;
    eff.domain_name_len = 5;
    RC(remote_session_control(FASTRPC_GET_EFFECTIVE_DOMAIN_ID, &eff, sizeof(eff)), 0);
    CHECK(eff.effective_domain_id == 12);
    eff.session_id = 4;
    RC(remote_session_control(FASTRPC_GET_EFFECTIVE_DOMAIN_ID, &eff, sizeof(eff)), AEE_EBADPARM);
    eff.session_id = 0;
    eff.domain_name = bogus;
    RC(remote_session_control(FASTRPC_GET_EFFECTIVE_DOMAIN_ID, &eff, sizeof(eff)), AEE_EBADPARM);
    RC(remote_session_control(FASTRPC_GET_EFFECTIVE_DOMAIN_ID, &eff, 8), AEE_EBADPARM);

    struct remote_rpc_control_unsigned_module um = {CDSP_DOMAIN_ID, 1};
    RC(remote_session_control(DSPRPC_CONTROL_UNSIGNED_MODULE, &um, sizeof(um)), 0);
    um.domain = -1;
    RC(remote_session_control(DSPRPC_CONTROL_UNSIGNED_MODULE, &um, sizeof(um)), 0);
    um.domain = 77;
    RC(remote_session_control(DSPRPC_CONTROL_UNSIGNED_MODULE, &um, sizeof(um)), AEE_EBADPARM);
    RC(remote_session_control(DSPRPC_CONTROL_UNSIGNED_MODULE, &um, 4), AEE_EBADPARM);

    char module[] = "file:///libggml-htp-v73.so?htp_iface_skel_handle_invoke&_modver=1.0";
    char uri[256];
    remote_rpc_get_uri_t u = {cdsp, 4, 0, module, (uint32_t)strlen(module), uri, sizeof(uri)};
    RC(remote_session_control(FASTRPC_GET_URI, &u, sizeof(u)), 0);
    CHECK(strcmp(uri, "file:///libggml-htp-v73.so?htp_iface_skel_handle_invoke&_modver=1.0"
                      "&_dom=cdsp&_session=0") == 0);
    u.uri_len = (uint32_t)strlen(module) + 10;
    RC(remote_session_control(FASTRPC_GET_URI, &u, sizeof(u)), AEE_EBADSIZE);
    u.uri_len = (uint32_t)strlen(module);
    RC(remote_session_control(FASTRPC_GET_URI, &u, sizeof(u)), AEE_EBADPARM);
    u.uri_len = sizeof(uri);
    u.session_id = 1;
    RC(remote_session_control(FASTRPC_GET_URI, &u, sizeof(u)), 0);
    CHECK(strstr(uri, "&_dom=cdsp&_session=1") != NULL);
    RC(remote_session_control(FASTRPC_GET_URI, &u, 8), AEE_EBADPARM);

    remote_rpc_reserve_new_session_t rs = {cdsp, 4, cdsp, 4, 0, 0};
    RC(remote_session_control(FASTRPC_RESERVE_NEW_SESSION, &rs, sizeof(rs)), AEE_EUNSUPPORTED);
    RC(remote_session_control(FASTRPC_THREAD_PARAMS, NULL, 0), AEE_EUNSUPPORTED);
    RC(remote_session_control(1000, NULL, 0), AEE_EUNSUPPORTED);

    remote_handle64 h = open_test();
    struct remote_rpc_control_latency lat = {RPC_PM_QOS, 0xdeadbeef};
    RC(remote_handle64_control(h, DSPRPC_CONTROL_LATENCY, &lat, sizeof(lat)), 0);
    RC(remote_handle_control(DSPRPC_CONTROL_LATENCY, &lat, sizeof(lat)), 0);
    lat.enable = 9;
    RC(remote_handle64_control(h, DSPRPC_CONTROL_LATENCY, &lat, sizeof(lat)), AEE_EBADPARM);
    RC(remote_handle64_control(h, DSPRPC_CONTROL_LATENCY, &lat, 4), AEE_EBADPARM);
    cap.attribute_ID = ARCH_VER;
    RC(remote_handle64_control(h, DSPRPC_GET_DSP_INFO, &cap, sizeof(cap)), 0);
    CHECK(cap.capability == 0x73);
    RC(remote_handle64_control(h, 99, NULL, 0), AEE_EUNSUPPORTED);
    RC(remote_handle64_close(h), 0);
}

static void scenario_dspqueue(void) {
    dspqueue_t q = NULL;
    /* the emulated DSP's dspqueue_rpc skel takes the queue (after the version handshake) */
    RC(dspqueue_create(CDSP_DOMAIN_ID, 0, 2560, 6656, NULL, NULL, NULL, &q), 0);
    CHECK(q != NULL);
    uint64_t id = 0;
    RC(dspqueue_export(q, &id), 0);
    CHECK(id != 0);
    RC(dspqueue_close(q), 0);
    q = NULL;
    RC(dspqueue_create(CDSP_DOMAIN_ID, 0, 0, 0, NULL, NULL, NULL, NULL), AEE_EBADPARM);
    RC(dspqueue_create(ADSP_DOMAIN_ID, 0, 0, 0, NULL, NULL, NULL, &q), AEE_EUNSUPPORTED);
    RC(dspqueue_create(CDSP_DOMAIN_ID, 3, 0, 0, NULL, NULL, NULL, &q), AEE_EBADPARM);
}

struct worker {
    int index;
    int failed;
};

static void *worker_main(void *arg) {
    struct worker *w = arg;
    remote_handle64 h = 0;
    if (remote_handle64_open(TEST_URI, &h) != 0) {
        w->failed = 1;
        return NULL;
    }
    for (int i = 0; i < 40 && !w->failed; i++) {
        uint32_t n = 5000 + (uint32_t)(w->index * 1000 + i);
        uint8_t *buf = rpcmem_alloc2(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS, n);
        if (buf == NULL || fill(h, (uint32_t)i, buf, n) != 0) {
            w->failed = 2;
        } else {
            for (uint32_t k = 0; k < n; k++) {
                if (buf[k] != (uint8_t)(i + (int)k)) {
                    w->failed = 3;
                    break;
                }
            }
        }
        uint32_t crc = 0;
        if (buf != NULL && (checksum(h, buf, n, &crc) != 0 || crc != crc32(buf, n))) {
            w->failed = 4;
        }
        rpcmem_free(buf);
    }
    if (remote_handle64_close(h) != 0) {
        w->failed = 5;
    }
    return NULL;
}

/* Threads share the one connection: requests pipelined, answers in any order. */
static void scenario_threads(void) {
    pthread_t t[6];
    struct worker w[6];
    for (int i = 0; i < 6; i++) {
        w[i] = (struct worker){.index = i};
        CHECK(pthread_create(&t[i], NULL, worker_main, &w[i]) == 0);
    }
    remote_handle64 h = open_test();
    RC(busy(h, 200000), 0); /* a slow call does not hold the others up */
    RC(remote_handle64_close(h), 0);
    for (int i = 0; i < 6; i++) {
        pthread_join(t[i], NULL);
        CHECK(w[i].failed == 0);
    }
}

static void scenario_refused(void) {
    /* NPUD_SOCKET names nothing: every call fails at once with ECONNREFUSED */
    remote_handle64 h = 0;
    RC(remote_handle64_open(TEST_URI, &h), AEE_ECONNREFUSED);
    CHECK(rpcmem_alloc2(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS, 4096) == NULL);
    struct remote_dsp_capability cap = {CDSP_DOMAIN_ID, DOMAIN_SUPPORT, 9};
    RC(remote_handle_control(DSPRPC_GET_DSP_INFO, &cap, sizeof(cap)), 0);
    CHECK(cap.capability == 0); /* no npud: no CDSP */
    cap.attribute_ID = ARCH_VER;
    RC(remote_handle_control(DSPRPC_GET_DSP_INFO, &cap, sizeof(cap)), AEE_ECONNREFUSED);
    dspqueue_t q = NULL;
    RC(dspqueue_create(CDSP_DOMAIN_ID, 0, 0, 0, NULL, NULL, NULL, &q), AEE_EUNSUPPORTED);
}

struct call {
    remote_handle64 h;
    int rc;
};

/* A call of 10 s: cut short, it fails with AEE_ECONNRESET; run to its end, it is 0. */
static void *busy_main(void *arg) {
    struct call *c = arg;
    c->rc = busy(c->h, 10000000);
    return NULL;
}

static void *busy_short_main(void *arg) {
    struct call *c = arg;
    c->rc = busy(c->h, 2000000);
    return NULL;
}

/* npud dies while calls wait: they fail at once, later calls fail cleanly. */
static void scenario_gone(void) {
    remote_handle64 h = open_test();
    uint8_t *buf = rpcmem_alloc2(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS, 8192);
    int fd = rpcmem_to_fd(buf);
    RC(fastrpc_mmap(CDSP_DOMAIN_ID, fd, buf, 0, 8192, FASTRPC_MAP_FD), 0);
    struct call calls[2] = {{.h = h}, {.h = h}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) {
        CHECK(pthread_create(&t[i], NULL, busy_main, &calls[i]) == 0);
    }
    usleep(300000);
    step("CALLING"); /* the test kills npud, then answers */
    for (int i = 0; i < 2; i++) {
        pthread_join(t[i], NULL);
        RC(calls[i].rc, AEE_ECONNRESET); /* cut short, not run to its end */
    }
    RC(busy(h, 1), AEE_ECONNRESET);
    RC(fastrpc_munmap(CDSP_DOMAIN_ID, fd, buf, 8192), AEE_ECONNRESET); /* went with npud */
    CHECK(rpcmem_to_fd(buf) == -1);
    buf[0] = 1; /* still mapped here until freed */
    rpcmem_free(buf);
    RC(remote_handle64_close(h), AEE_ECONNRESET);
    remote_handle64 x = 0;
    RC(remote_handle64_open(TEST_URI, &x), AEE_ECONNREFUSED);
    printf("DONE\n");
}

/* The DSP process restarts: handles, mappings and queues die, buffers live on. */
static void scenario_restart(void) {
    remote_handle64 h = open_test();
    uint8_t *buf = rpcmem_alloc2(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS, 8192);
    int fd = rpcmem_to_fd(buf);
    RC(fastrpc_mmap(CDSP_DOMAIN_ID, fd, buf, 0, 8192, FASTRPC_MAP_FD), 0);
    struct call c = {.h = h};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, busy_main, &c) == 0);
    usleep(300000);
    step("RESTART"); /* the test restarts this client's DSP process, then answers */
    pthread_join(t, NULL);
    RC(c.rc, AEE_ECONNRESET); /* cut short by the restart, not run to its end */
    RC(busy(h, 1), AEE_ECONNRESET);
    RC(fastrpc_munmap(CDSP_DOMAIN_ID, fd, buf, 8192), AEE_ECONNRESET);
    RC(remote_handle64_close(h), AEE_ECONNRESET);
    /* the buffer is still npud's and ours: map it again, use it */
    CHECK(rpcmem_to_fd(buf) == fd);
    remote_handle64 again = 0;
    int rc = AEE_ECONNRESET;
    for (int i = 0; i < 100 && rc != 0; i++) { /* the process comes back */
        rc = remote_handle64_open(TEST_URI, &again);
        if (rc != 0) {
            usleep(100000);
        }
    }
    RC(rc, 0);
    RC(fastrpc_mmap(CDSP_DOMAIN_ID, fd, buf, 0, 8192, FASTRPC_MAP_FD), 0);
    RC(fill(again, 3, buf, 8192), 0);
    CHECK(buf[10] == 13);
    RC(fastrpc_munmap(CDSP_DOMAIN_ID, fd, buf, 8192), 0);
    RC(remote_handle64_close(again), 0);
    rpcmem_free(buf);
    printf("DONE\n");
}

/* npud shuts down: calls that take resources fail at once; the one running may
 * finish within the grace period; then npud is gone. */
static void scenario_shutdown(void) {
    remote_handle64 h = open_test();
    struct call c = {.h = h};
    pthread_t t;
    c.rc = -1;
    CHECK(pthread_create(&t, NULL, busy_short_main, &c) == 0);
    usleep(200000);
    step("RUNNING"); /* the test stops npud (SIGTERM), then answers */
    remote_handle64 x = 0;
    RC(remote_handle64_open(TEST_URI, &x), AEE_ECONNRESET); /* refused, not sent */
    pthread_join(t, NULL);
    CHECK(c.rc == 0 || c.rc == AEE_ECONNRESET);
    RC(busy(h, 1), AEE_ECONNRESET);
    printf("DONE\n");
}

/* Hold everything and wait to be killed (the test checks npud let go of it all). */
static void scenario_hold(void) {
    remote_handle64 h = open_test();
    uint8_t *buf = rpcmem_alloc2(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS, 65536);
    RC(fastrpc_mmap(CDSP_DOMAIN_ID, rpcmem_to_fd(buf), buf, 0, 65536, FASTRPC_MAP_FD), 0);
    uint8_t *buf2 = rpcmem_alloc2(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS, 4096);
    RC(fill(h, 1, buf2, 4096), 0);
    struct call c = {.h = h};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, busy_short_main, &c) == 0); /* on the DSP when we go */
    usleep(200000);
    step("HOLDING");
    exit(0); /* no teardown, as llama.cpp */
}

static void *busy_fork_main(void *arg) {
    struct call *c = arg;
    c->rc = busy(c->h, 300000); /* on the DSP while the process forks */
    return NULL;
}

static void check_fill(const uint8_t *p, uint32_t seed, uint32_t len) {
    for (uint32_t i = 0; i < len; i++) {
        CHECK(p[i] == (uint8_t)((seed + i) & 0xff));
    }
}

/* fork() while a call is on the DSP and a queue is open: the child's calls on what
 * the parent made fail (AEE_ECONNRESET) without touching the parent's connection,
 * its own calls open a connection of their own; the parent goes on as before. */
static void scenario_fork(void) {
    remote_handle64 h = open_test();
    uint8_t *buf = rpcmem_alloc2(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS, 8192);
    CHECK(buf != NULL);
    RC(fill(h, 5, buf, 4096), 0);
    int fd = rpcmem_to_fd(buf);
    RC(fastrpc_mmap(CDSP_DOMAIN_ID, fd, buf, 0, 8192, FASTRPC_MAP_FD), 0);
    dspqueue_t q = NULL;
    RC(dspqueue_create(CDSP_DOMAIN_ID, 0, 0, 0, NULL, NULL, NULL, &q), 0);
    struct call c = {.h = h};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, busy_fork_main, &c) == 0);
    usleep(100000);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        check_fill(buf, 5, 4096); /* the memory is still there */
        RC(fill(h, 6, buf, 4096), AEE_ECONNRESET);
        CHECK(rpcmem_to_fd(buf) == -1);
        RC(fastrpc_munmap(CDSP_DOMAIN_ID, fd, buf, 8192), AEE_ECONNRESET);
        uint64_t id = 0;
        RC(dspqueue_export(q, &id), AEE_ECONNRESET);
        RC(dspqueue_write(q, 0, 0, NULL, 4, buf, 1000), AEE_ECONNRESET);
        RC(dspqueue_close(q), 0); /* the child's copy goes */
        /* the child's own: a new connection, a new DSP process */
        remote_handle64 mine = open_test();
        CHECK(mine != h);
        uint8_t *own = rpcmem_alloc2(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS, 4096);
        CHECK(own != NULL);
        RC(fill(mine, 9, own, 4096), 0);
        check_fill(own, 9, 4096);
        dspqueue_t mq = NULL;
        RC(dspqueue_create(CDSP_DOMAIN_ID, 0, 0, 0, NULL, NULL, NULL, &mq), 0);
        RC(dspqueue_close(mq), 0);
        rpcmem_free(own);
        RC(remote_handle64_close(mine), 0);
        RC(remote_handle64_close(h), AEE_ECONNRESET);
        rpcmem_free(buf);
        exit(0); /* the leak check runs in the child too */
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(pthread_join(t, NULL) == 0);
    RC(c.rc, 0); /* the call that was on the DSP during the fork */
    RC(fill(h, 7, buf, 4096), 0);
    check_fill(buf, 7, 4096);
    CHECK(rpcmem_to_fd(buf) == fd);
    uint64_t id = 0;
    RC(dspqueue_export(q, &id), 0);
    RC(dspqueue_close(q), 0);
    RC(fastrpc_munmap(CDSP_DOMAIN_ID, fd, buf, 8192), 0);
    rpcmem_free(buf);
    RC(remote_handle64_close(h), 0);
}

/* llama.cpp's buffers: its chunk round4k(size) + a 4 KiB guard page (with
 * GGML_HEXAGON_MBUF=256, up to 256 MiB + 4 KiB) and a tensor over 256 MiB in a
 * buffer of its own; beyond npud's largest (2 GiB by default): NULL, unasked. */
static void scenario_big(void) {
    const size_t sizes[] = {(256u << 20) + 4096u, 300u << 20};
    remote_handle64 h = open_test();
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        uint8_t *b = rpcmem_alloc2(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS, sizes[i]);
        CHECK(b != NULL);
        int fd = rpcmem_to_fd(b);
        CHECK(fd > 0);
        RC(fastrpc_mmap(CDSP_DOMAIN_ID, fd, b, 0, sizes[i], FASTRPC_MAP_FD_DELAYED), 0);
        /* the DSP writes its last page: the whole buffer is its */
        RC(fill(h, 3, b + sizes[i] - 4096, 4096), 0);
        check_fill(b + sizes[i] - 4096, 3, 4096);
        CHECK(b[0] == 0);
        RC(fastrpc_munmap(CDSP_DOMAIN_ID, fd, b, sizes[i]), 0);
        rpcmem_free(b);
    }
    CHECK(rpcmem_alloc2(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS, (2ull << 30) + 1) == NULL);
    RC(remote_handle64_close(h), 0);
}

/* An npud before version 6 announces no largest buffer: 256 MiB, and a larger
 * rpcmem_alloc is refused here, never sent (it would be a fatal BAD_MESSAGE). */
static void scenario_big_old(void) {
    CHECK(rpcmem_alloc2(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS, (256u << 20) + 1) == NULL);
}

/* The last handle's close ends the DSP process, as libcdsprpc's does, once nothing
 * else is held (npud keeps buffers on the connection that the process lives on). */
static void scenario_teardown(void) {
    remote_handle64 h = open_test();
    uint8_t *buf = rpcmem_alloc2(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS, 4096);
    CHECK(buf != NULL);
    RC(fill(h, 1, buf, 4096), 0);
    remote_handle64 second = open_test();
    RC(remote_handle64_close(h), 0); /* not the last */
    RC(remote_handle64_close(second), 0); /* the last, but a buffer is held */
    step("HELD");
    rpcmem_free(buf);
    h = open_test();
    RC(remote_handle64_close(h), 0); /* the last, nothing held: the process ends */
    step("CLOSED");
    h = open_test(); /* a new one */
    uint8_t out[64];
    RC(fill(h, 2, out, sizeof(out)), 0);
    check_fill(out, 2, sizeof(out));
    RC(remote_handle64_close(h), 0);
}

/* fds of this process whose link names contain what */
static int count_fds(const char *what) {
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    CHECK(d != NULL);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char link[256];
        ssize_t len = readlinkat(dirfd(d), e->d_name, link, sizeof(link) - 1);
        if (len > 0) {
            link[len] = '\0';
            n += strstr(link, what) != NULL;
        }
    }
    closedir(d);
    return n;
}

/* A fake npud answers the alloc with a frame that declares 2 fds: the library
 * refuses it (the connection ends) and keeps neither fd. */
static void scenario_two_fds(void) {
    CHECK(count_fds("npud-fake") == 0);
    CHECK(rpcmem_alloc2(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS, 4096) == NULL);
    CHECK(count_fds("npud-fake") == 0);
}

static uint32_t attribute(uint32_t id) {
    struct remote_dsp_capability cap = {CDSP_DOMAIN_ID, id, 0xdeadu};
    RC(remote_handle_control(DSPRPC_GET_DSP_INFO, &cap, sizeof(cap)), 0);
    return cap.capability;
}

/* A fake npud whose DSP answers 128..131 (tests/shim/test_wire.py): the library
 * answers them as the device would; the driver's 256..259 are 0, as libcdsprpc's. */
static void scenario_caps(void) {
    CHECK(attribute(ARCH_VER) == 0x79);
    CHECK(attribute(128) == 0x11);
    CHECK(attribute(129) == 0x12);
    CHECK(attribute(130) == 1);
    CHECK(attribute(131) == 0x14);
    const uint32_t zero[] = {12, 127, 132, 255, 256, 257, 258, 259};
    for (size_t i = 0; i < sizeof(zero) / sizeof(zero[0]); i++) {
        CHECK(attribute(zero[i]) == 0);
    }
    struct remote_dsp_capability cap = {CDSP_DOMAIN_ID, 260, 0};
    RC(remote_handle_control(DSPRPC_GET_DSP_INFO, &cap, sizeof(cap)), AEE_EBADPARM);
}

int main(int argc, char **argv) {
    static const struct {
        const char *name;
        void (*run)(void);
    } scenarios[] = {
        {"rpcmem", scenario_rpcmem},     {"dsp_memory", scenario_dsp_memory},
        {"register", scenario_register}, {"mmap", scenario_mmap},
        {"handles", scenario_handles},   {"controls", scenario_controls},
        {"dspqueue", scenario_dspqueue}, {"threads", scenario_threads},
        {"refused", scenario_refused},   {"gone", scenario_gone},
        {"restart", scenario_restart},   {"shutdown", scenario_shutdown},
        {"hold", scenario_hold},         {"two_fds", scenario_two_fds},
        {"caps", scenario_caps},         {"fork", scenario_fork},
        {"big", scenario_big},           {"big_old", scenario_big_old},
        {"teardown", scenario_teardown},
    };
    if (argc != 2) {
        fprintf(stderr, "usage: %s SCENARIO\n", argv[0]);
        return 2;
    }
    for (size_t i = 0; i < sizeof(scenarios) / sizeof(scenarios[0]); i++) {
        if (strcmp(argv[1], scenarios[i].name) == 0) {
            scenarios[i].run();
            printf("ok %s\n", argv[1]);
            return 0;
        }
    }
    fprintf(stderr, "no scenario %s\n", argv[1]);
    return 2;
}
