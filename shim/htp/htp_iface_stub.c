/*
 * htp_iface_stub.c -- qaic's client stub for llama.cpp's htp/htp_iface.idl, by hand.
 * Written for npud. qaic's rules (shared/reference/fastrpc-abi.md 5.4): every
 * in scalar in one primIn buffer at its natural alignment, the size rounded to
 * the largest alignment; every rout scalar likewise in one primROut buffer
 * after the inputs, copied out only on success; no buffers: pra = NULL.
 *
 *  method    idx  sc          buffers                  layout
 *  start      2   0x02010000  primIn 32 B              sess_id@0 dsp_queue_id@8 n_hvx@16
 *                                                      n_hmx@20 max_vmem@24
 *  stop       3   0x03000000  none (pra NULL)
 *  mmap       4   0x04010000  primIn 16 B              fd@0 size@8
 *  munmap     5   0x05010000  primIn 4 B               fd@0
 *  profiler   6   0x06010000  primIn 36 B              mode@0 pmu.events[0..7]@4
 *  etm        7   0x07010000  primIn 4 B               enable@0
 *  hwinfo     8   0x08000100  primROut 24 B            n_threads@0 n_hvx@4 n_hmx@8
 *                                                      vtcm_size@16
 */
#include <string.h>

#include "htp_iface.h"

int htp_iface_open(const char *uri, remote_handle64 *h) {
    return remote_handle64_open(uri, h);
}

int htp_iface_close(remote_handle64 h) {
    return remote_handle64_close(h);
}

static AEEResult call_in(remote_handle64 h, uint32_t method, void *prim_in, size_t len) {
    remote_arg args[1];
    args[0].buf.pv = prim_in;
    args[0].buf.nLen = len;
    return remote_handle64_invoke(h, REMOTE_SCALARS_MAKEX(0, method, 1, 0, 0, 0), args);
}

AEEResult htp_iface_start(remote_handle64 h, uint32_t sess_id, uint64_t dsp_queue_id,
                          uint32_t n_hvx, uint32_t n_hmx, uint64_t max_vmem) {
    uint8_t in[32] = {0};
    memcpy(in + 0, &sess_id, 4);
    memcpy(in + 8, &dsp_queue_id, 8);
    memcpy(in + 16, &n_hvx, 4);
    memcpy(in + 20, &n_hmx, 4);
    memcpy(in + 24, &max_vmem, 8);
    return call_in(h, 2, in, sizeof(in));
}

AEEResult htp_iface_stop(remote_handle64 h) {
    return remote_handle64_invoke(h, REMOTE_SCALARS_MAKEX(0, 3, 0, 0, 0, 0), NULL);
}

AEEResult htp_iface_mmap(remote_handle64 h, uint32_t fd, uint64_t size) {
    uint8_t in[16] = {0};
    memcpy(in + 0, &fd, 4);
    memcpy(in + 8, &size, 8);
    return call_in(h, 4, in, sizeof(in));
}

AEEResult htp_iface_munmap(remote_handle64 h, uint32_t fd) {
    uint8_t in[4];
    memcpy(in, &fd, 4);
    return call_in(h, 5, in, sizeof(in));
}

AEEResult htp_iface_profiler(remote_handle64 h, uint32_t mode, const htp_iface_pmu_conf *pmu) {
    uint8_t in[36];
    memcpy(in, &mode, 4);
    memcpy(in + 4, pmu->events, sizeof(pmu->events));
    return call_in(h, 6, in, sizeof(in));
}

AEEResult htp_iface_etm(remote_handle64 h, uint32_t enable) {
    uint8_t in[4];
    memcpy(in, &enable, 4);
    return call_in(h, 7, in, sizeof(in));
}

AEEResult htp_iface_hwinfo(remote_handle64 h, unsigned int *n_threads, unsigned int *n_hvx,
                           unsigned int *n_hmx, unsigned long long *vtcm_size) {
    uint64_t out[3] = {0}; /* 24 bytes, 8-aligned */
    remote_arg args[1];
    args[0].buf.pv = out;
    args[0].buf.nLen = sizeof(out);
    int rc = remote_handle64_invoke(h, REMOTE_SCALARS_MAKEX(0, 8, 0, 1, 0, 0), args);
    if (rc == 0) {
        const uint8_t *p = (const uint8_t *)out;
        memcpy(n_threads, p + 0, 4);
        memcpy(n_hvx, p + 4, 4);
        memcpy(n_hmx, p + 8, 4);
        memcpy(vtcm_size, p + 16, 8);
    }
    return rc;
}
