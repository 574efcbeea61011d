/*
 * htp_stub_test.c -- shim/htp/htp_iface_stub.c marshals as qaic does: each
 * method's scalars word and primIn/primROut bytes, seen by a libcdsprpc stand-in.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "htp_iface.h"

#define CHECK(c)                                                                             \
    do {                                                                                     \
        if (!(c)) {                                                                          \
            fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #c);            \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

static uint32_t g_sc;
static int g_null;
static size_t g_len;
static uint8_t g_in[64];

int remote_handle64_open(const char *name, remote_handle64 *ph) {
    CHECK(strcmp(name, "uri") == 0);
    *ph = 0x42;
    return 0;
}

int remote_handle64_close(remote_handle64 h) {
    return h == 0x42 ? 0 : 1;
}

int remote_handle64_invoke(remote_handle64 h, uint32_t sc, remote_arg *pra) {
    CHECK(h == 0x42);
    g_sc = sc;
    g_null = pra == NULL;
    g_len = 0;
    if (pra != NULL && REMOTE_SCALARS_INBUFS(sc) == 1) {
        g_len = pra[0].buf.nLen;
        memcpy(g_in, pra[0].buf.pv, g_len);
    }
    if (pra != NULL && REMOTE_SCALARS_OUTBUFS(sc) == 1) { /* hwinfo */
        uint8_t *out = pra[0].buf.pv;
        uint32_t threads = 4, hvx = 4, hmx = 1;
        uint64_t vtcm = 8u << 20;
        CHECK(pra[0].buf.nLen == 24);
        memcpy(out, &threads, 4);
        memcpy(out + 4, &hvx, 4);
        memcpy(out + 8, &hmx, 4);
        memcpy(out + 16, &vtcm, 8);
    }
    return 0;
}

static uint64_t u64_at(size_t off) {
    uint64_t v;
    memcpy(&v, g_in + off, 8);
    return v;
}

static uint32_t u32_at(size_t off) {
    uint32_t v;
    memcpy(&v, g_in + off, 4);
    return v;
}

int main(void) {
    remote_handle64 h = 0;
    CHECK(htp_iface_open("uri", &h) == 0 && h == 0x42);
    CHECK(htp_iface_start(h, 0, 0x51, 4, 1, 0xb8e6c000ull) == 0);
    CHECK(g_sc == 0x02010000 && g_len == 32);
    CHECK(u32_at(0) == 0 && u64_at(8) == 0x51 && u32_at(16) == 4 && u32_at(20) == 1);
    CHECK(u64_at(24) == 0xb8e6c000ull);
    CHECK(htp_iface_stop(h) == 0);
    CHECK(g_sc == 0x03000000 && g_null);
    CHECK(htp_iface_mmap(h, 21, 1ull << 33) == 0);
    CHECK(g_sc == 0x04010000 && g_len == 16 && u32_at(0) == 21 && u64_at(8) == 1ull << 33);
    CHECK(htp_iface_munmap(h, 21) == 0);
    CHECK(g_sc == 0x05010000 && g_len == 4 && u32_at(0) == 21);
    htp_iface_pmu_conf pmu = {{1, 2, 3, 4, 5, 6, 7, 8}};
    CHECK(htp_iface_profiler(h, 2, &pmu) == 0);
    CHECK(g_sc == 0x06010000 && g_len == 36 && u32_at(0) == 2 && u32_at(4) == 1);
    CHECK(u32_at(32) == 8);
    CHECK(htp_iface_etm(h, 1) == 0);
    CHECK(g_sc == 0x07010000 && g_len == 4 && u32_at(0) == 1);
    unsigned threads = 0, hvx = 0, hmx = 0;
    unsigned long long vtcm = 0;
    CHECK(htp_iface_hwinfo(h, &threads, &hvx, &hmx, &vtcm) == 0);
    CHECK(g_sc == 0x08000100 && threads == 4 && hvx == 4 && hmx == 1 && vtcm == 8u << 20);
    CHECK(htp_iface_close(h) == 0);
    printf("ok htp\n");
    return 0;
}
