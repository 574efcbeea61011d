/*
 * dspq_rpc.c -- the dspqueue_rpc methods marshalled as qaic would (dspq_rpc.h).
 */
#include <string.h>

#include "dspq_rpc.h"
#include "port.h"

static int call(remote_handle64 h, uint32_t method, void *in, size_t in_len, void *out,
                size_t out_len, int wait) {
    remote_arg args[2];
    unsigned n = 0;
    if (in != NULL) {
        args[n].buf.pv = in;
        args[n].buf.nLen = in_len;
        n++;
    }
    if (out != NULL) {
        args[n].buf.pv = out;
        args[n].buf.nLen = out_len;
        n++;
    }
    uint32_t sc = REMOTE_SCALARS_MAKEX(0, method, in != NULL, out != NULL, 0, 0);
    return port_invoke(h, sc, n > 0 ? args : NULL, wait);
}

int dspq_rpc_init_process_state(remote_handle64 h, int32_t fd) {
    int32_t in[1] = {fd};
    return call(h, 2, in, sizeof(in), NULL, 0, 0);
}

int dspq_rpc_create_queue(remote_handle64 h, uint32_t id, int32_t fd, uint32_t count,
                          uint64_t *queue_id) {
    uint32_t in[3] = {id, (uint32_t)fd, count};
    uint64_t out[1] = {0};
    int rc = call(h, 3, in, sizeof(in), out, sizeof(out), 0);
    if (rc == 0) {
        *queue_id = out[0];
    }
    return rc;
}

int dspq_rpc_destroy_queue(remote_handle64 h, uint64_t queue_id) {
    uint64_t in[1] = {queue_id};
    return call(h, 4, in, sizeof(in), NULL, 0, 0);
}

int dspq_rpc_is_imported(remote_handle64 h, uint64_t queue_id, int32_t *imported) {
    uint64_t in[1] = {queue_id};
    int32_t out[1] = {0};
    int rc = call(h, 5, in, sizeof(in), out, sizeof(out), 0);
    if (rc == 0) {
        *imported = out[0];
    }
    return rc;
}

int dspq_rpc_wait_signal(remote_handle64 h, int32_t *signal) {
    int32_t out[1] = {0};
    int rc = call(h, 6, NULL, 0, out, sizeof(out), 1);
    if (rc == 0) {
        *signal = out[0];
    }
    return rc;
}

int dspq_rpc_cancel_wait_signal(remote_handle64 h) {
    return call(h, 7, NULL, 0, NULL, 0, 0);
}

int dspq_rpc_signal(remote_handle64 h) {
    return call(h, 8, NULL, 0, NULL, 0, 0);
}
