/*
 * invoke.c -- remote_handle*_invoke: a call on a remote handle, through npud.
 *
 * An invoke's buffers travel as npud "slices" when they lie in a buffer npud
 * gave us (rpcmem, or remote_register_buf with such a buffer's number), as
 * libcdsprpc passes those by fd, and inline otherwise (outputs are copied
 * back). Inline arguments beyond the Welcome's max_inline_bytes go through a
 * temporary npud buffer instead ("spill"). Handle arguments (dma handles in
 * the handle slots) are AEE_EUNSUPPORTED: npud's wire has no handle argument yet.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdlib.h>
#include <string.h>

#include "AEEStdErr.h"
#include "conn.h"
#include "handles.h"
#include "mem.h"
#include "remote.h"
#include "shim.h"
#include "wire.h"

#define SPILL_ALIGN 128u
#define MAX_DMA_SIZE 268435456u /* the largest spill (npud's inline capacities are smaller) */

struct arg {
    int slice;    /* by reference: buffer, offset */
    int spilled;  /* inline in the caller, by reference through the spill buffer */
    uint32_t buffer;
    uint64_t offset;
    void *ptr;
    size_t len;
};

struct invoke_ctx {
    uint32_t handle;
    uint32_t sc;
    int wait;
    unsigned nin;
    unsigned nout;
    struct arg *args;
};

static void encode_arg(msgpack_packer *pk, const struct arg *a, int output) {
    if (a->slice || a->spilled) {
        msgpack_pack_map(pk, 4);
        mp_kv_str(pk, "type", "slice");
        mp_kv_uint(pk, "buffer", a->buffer);
        mp_kv_uint(pk, "offset", a->offset);
        mp_kv_uint(pk, "length", a->len);
    } else if (output) {
        msgpack_pack_map(pk, 2);
        mp_kv_str(pk, "type", "inline");
        mp_kv_uint(pk, "capacity", a->len);
    } else {
        msgpack_pack_map(pk, 2);
        mp_kv_str(pk, "type", "inline");
        mp_str(pk, "data");
        msgpack_pack_bin(pk, a->len);
        msgpack_pack_bin_body(pk, a->ptr, a->len);
    }
}

static void encode_invoke(void *ctx, msgpack_packer *pk, uint32_t id) {
    const struct invoke_ctx *v = ctx;
    msgpack_pack_map(pk, v->wait ? 7 : 6);
    mp_kv_str(pk, "type", "invoke");
    mp_kv_uint(pk, "id", id);
    mp_kv_uint(pk, "handle", v->handle);
    mp_kv_uint(pk, "sc", v->sc);
    mp_str(pk, "inputs");
    msgpack_pack_array(pk, v->nin);
    for (unsigned i = 0; i < v->nin; i++) {
        encode_arg(pk, &v->args[i], 0);
    }
    mp_str(pk, "outputs");
    msgpack_pack_array(pk, v->nout);
    for (unsigned i = 0; i < v->nout; i++) {
        encode_arg(pk, &v->args[v->nin + i], 1);
    }
    if (v->wait) {
        mp_str(pk, "wait");
        msgpack_pack_true(pk);
    }
}

/* Inline outputs are copied into the caller's buffers here, on the reader
 * thread, while the caller waits. */
static int take_invoke(void *ctx, const msgpack_object *msg, int fd) {
    const struct invoke_ctx *v = ctx;
    (void)fd;
    const msgpack_object *outputs = mp_get(msg, "outputs");
    if (outputs == NULL || outputs->type != MSGPACK_OBJECT_ARRAY ||
        outputs->via.array.size != v->nout) {
        return AEE_ERPC;
    }
    for (unsigned i = 0; i < v->nout; i++) {
        const struct arg *a = &v->args[v->nin + i];
        const msgpack_object *o = &outputs->via.array.ptr[i];
        if (a->slice || a->spilled) {
            if (o->type != MSGPACK_OBJECT_NIL) {
                return AEE_ERPC;
            }
        } else if (o->type != MSGPACK_OBJECT_BIN || o->via.bin.size > a->len) {
            return AEE_ERPC;
        } else if (o->via.bin.size > 0) {
            memcpy(a->ptr, o->via.bin.ptr, o->via.bin.size);
        }
    }
    return 0;
}

static size_t round_up(size_t n, size_t to) {
    return (n + to - 1) / to * to;
}

/* Move the largest inline arguments of a direction over the limit into one
 * temporary npud buffer until the rest fits; inputs are copied in now. */
static int spill(struct conn *c, struct invoke_ctx *v, size_t inline_in, size_t inline_out,
                 size_t limit, struct raw_buffer *raw) {
    size_t total = 0;
    for (int output = 0; output < 2; output++) {
        size_t sum = output ? inline_out : inline_in;
        unsigned first = output ? v->nin : 0;
        unsigned end = output ? v->nin + v->nout : v->nin;
        while (sum > limit) {
            struct arg *largest = NULL;
            for (unsigned i = first; i < end; i++) {
                struct arg *a = &v->args[i];
                if (!a->slice && !a->spilled && (largest == NULL || a->len > largest->len)) {
                    largest = a;
                }
            }
            size_t room = round_up(largest->len, SPILL_ALIGN);
            if (largest->len > MAX_DMA_SIZE || total > MAX_DMA_SIZE - room) {
                return AEE_ENOMEMORY;
            }
            largest->spilled = 1;
            largest->offset = total;
            total += room;
            sum -= largest->len;
        }
    }
    int rc = mem_raw_alloc(c, total, raw);
    if (rc != 0) {
        return rc;
    }
    for (unsigned i = 0; i < v->nin + v->nout; i++) {
        struct arg *a = &v->args[i];
        if (a->spilled) {
            a->buffer = raw->id;
            if (i < v->nin) {
                memcpy((char *)raw->ptr + a->offset, a->ptr, a->len);
            }
        }
    }
    return 0;
}

int handle_invoke(uint32_t local, uint32_t sc, remote_arg *pra, int wait) {
    unsigned nin = REMOTE_SCALARS_INBUFS(sc);
    unsigned nout = REMOTE_SCALARS_OUTBUFS(sc);
    unsigned handles = REMOTE_SCALARS_INHANDLES(sc) + REMOTE_SCALARS_OUTHANDLES(sc);
    if (pra == NULL && nin + nout + handles > 0) {
        return AEE_EBADPARM;
    }
    struct handle h;
    int rc = handle_lookup(local, &h);
    if (rc != 0) {
        return rc;
    }
    if (handles > 0) {
        /* npud's invoke carries buffers only: no dma handle arguments yet. */
        return AEE_EUNSUPPORTED;
    }
    struct conn *c;
    rc = conn_get_gen(h.gen, &c);
    if (rc != 0) {
        return rc;
    }
    struct invoke_ctx v = {.handle = h.remote, .sc = sc, .wait = wait, .nin = nin, .nout = nout};
    struct raw_buffer raw = {0};
    int spilled = 0;
    v.args = x_calloc(nin + nout + 1, sizeof(struct arg));
    if (v.args == NULL) {
        rc = AEE_ENOMEMORY;
        goto out;
    }
    size_t inline_in = 0;
    size_t inline_out = 0;
    for (unsigned i = 0; i < nin + nout; i++) {
        struct arg *a = &v.args[i];
        a->ptr = pra[i].buf.pv;
        a->len = pra[i].buf.nLen;
        if (a->len == 0) {
            continue;
        }
        if (a->ptr == NULL) {
            rc = AEE_EBADPARM;
            goto out;
        }
        int where = mem_resolve(h.gen, a->ptr, a->len, &a->buffer, &a->offset);
        if (where < 0 || where > 1) {
            rc = where; /* AEE_EBADPARM: it straddles the end of a shared buffer */
            goto out;
        }
        a->slice = where;
        if (!a->slice) {
            if (i < nin) {
                inline_in += a->len;
            } else {
                inline_out += a->len;
            }
        }
    }
    size_t limit = conn_welcome(c)->max_inline_bytes;
    if (inline_in > limit || inline_out > limit) {
        rc = spill(c, &v, inline_in, inline_out, limit, &raw);
        if (rc != 0) {
            goto out;
        }
        spilled = 1;
    }
    if (shim_log_level() >= 2) {
        char kinds[2 * 255 + 2] = "";
        size_t k = 0;
        for (unsigned i = 0; i < nin + nout; i++) {
            if (i == nin) {
                kinds[k++] = '|';
            }
            kinds[k++] = v.args[i].slice ? 'S' : v.args[i].spilled ? 'P' : 'I';
        }
        kinds[k] = '\0';
        shim_log("invoke handle %u sc 0x%08x args %s%s", local, sc, kinds, wait ? " wait" : "");
    }
    struct conn_request req = {
        .reply_type = "invoke_reply",
        .encode = encode_invoke,
        .encode_ctx = &v,
        .on_reply = take_invoke,
        .reply_ctx = &v,
        .acquires = 1,
        .expected_rc = shim_log_expected(),
    };
    rc = conn_call(c, &req);
    if (rc == 0 && spilled) {
        for (unsigned i = nin; i < nin + nout; i++) {
            if (v.args[i].spilled) {
                memcpy(v.args[i].ptr, (char *)raw.ptr + v.args[i].offset, v.args[i].len);
            }
        }
    }
out:
    if (spilled) {
        mem_raw_free(c, &raw);
    }
    free(v.args);
    conn_put(c);
    return rc;
}

SHIM_API int remote_handle64_invoke(remote_handle64 h, uint32_t sc, remote_arg *pra) {
    if (h > UINT32_MAX) {
        return AEE_EINVHANDLE;
    }
    return handle_invoke((uint32_t)h, sc, pra, 0);
}

SHIM_API int remote_handle_invoke(remote_handle h, uint32_t sc, remote_arg *pra) {
    return handle_invoke(h, sc, pra, 0);
}
