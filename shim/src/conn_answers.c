/*
 * conn_answers.c -- what a frame from npud means: during the handshake, the
 * Welcome (its limits and the DSP's attributes) or a refusal; after it, the
 * events (session_restarted, shutting_down), a fatal error without id, or an
 * answer, handed to its waiter with the fd it carried. Runs on the reader thread.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "AEEStdErr.h"
#include "conn_internal.h"
#include "shim.h"
#include "wire.h"

static const char *const CAP_KEYS[SHIM_DSP_ATTRIBUTES] = {
    NULL, /* DOMAIN_SUPPORT: the DSP is there when npud answers */
    "unsigned_pd_support",
    "hvx_support_64b",
    "hvx_support_128b",
    "vtcm_page",
    "vtcm_count",
    "arch_ver",
    "hmx_support_depth",
    "hmx_support_spatial",
    "async_fastrpc_support",
    "status_notification_support",
    "mcid_multicast",
};

static const char *const INTERNAL_KEYS[SHIM_DSP_INTERNAL] = {
    "perf_v2_dsp_support",
    "map_dma_handle_reverserpc",
    "dspsignal_dsp_support",
    "proc_shared_buffer_support",
};

static uint32_t error_field(const msgpack_object *msg) {
    const msgpack_object *fields = mp_get(msg, "fields");
    uint64_t value = 0;
    if (mp_uint(mp_get(fields, "code"), &value) != 0 &&
        mp_uint(mp_get(fields, "rc"), &value) != 0) {
        return 0;
    }
    return (uint32_t)value;
}

static void log_error(const msgpack_object *msg) {
    char text[256] = "";
    uint64_t code = 0;
    (void)mp_uint(mp_get(msg, "code"), &code);
    (void)mp_str_copy(mp_get(msg, "message"), text, sizeof(text));
    shim_log("npud: error %u: %s", (unsigned)code, text);
}

/* A handshake refusal or a fatal error without id: the code it means. */
static int refusal(const msgpack_object *msg) {
    uint64_t code = 0;
    log_error(msg);
    if (mp_uint(mp_get(msg, "code"), &code) != 0) {
        return AEE_ERPC;
    }
    return shim_aee_from_npud((int)code, error_field(msg));
}

static int take_welcome(struct conn *c, const msgpack_object *msg) {
    struct welcome w;
    memset(&w, 0, sizeof(w));
    uint64_t version = 0;
    uint64_t epoch = 0;
    if (mp_uint(mp_get(msg, "protocol_version"), &version) != 0 ||
        mp_uint(mp_get(msg, "epoch"), &epoch) != 0) {
        return AEE_ERPC;
    }
    if (version < WIRE_PROTOCOL_VERSION) {
        shim_log("npud speaks protocol %u; this library needs %d", (unsigned)version,
                 WIRE_PROTOCOL_VERSION);
        return AEE_EVERSIONNOTSUPPORT;
    }
    const msgpack_object *dsp = mp_get(msg, "dsp");
    w.caps[0] = 1;
    for (unsigned i = 1; i < SHIM_DSP_ATTRIBUTES; i++) {
        uint64_t value = 0;
        if (mp_uint(mp_get(dsp, CAP_KEYS[i]), &value) == 0) {
            w.caps[i] = (uint32_t)value;
        }
    }
    for (unsigned i = 0; i < SHIM_DSP_INTERNAL; i++) {
        uint64_t value = 0;
        if (mp_uint(mp_get(dsp, INTERNAL_KEYS[i]), &value) == 0) {
            w.internal[i] = (uint32_t)value;
        }
    }
    const msgpack_object *limits = mp_get(msg, "limits");
    uint64_t value = 0;
    w.max_frame_size = mp_uint(mp_get(limits, "max_frame_size"), &value) == 0
                           ? (uint32_t)value
                           : 1048576;
    w.max_in_flight =
        mp_uint(mp_get(limits, "max_in_flight"), &value) == 0 ? (uint32_t)value : 64;
    w.max_inline_bytes = mp_uint(mp_get(limits, "max_inline_bytes"), &value) == 0
                             ? (uint32_t)value
                             : 983040;
    /* an npud before it answers a larger alloc with a fatal BAD_MESSAGE: never ask it */
    w.max_buffer_size = mp_uint(mp_get(limits, "max_buffer_size"), &value) == 0 ? value
                                                                                 : WIRE_OLD_MAX_BUFFER;
    if (w.max_buffer_size > WIRE_MAX_BUFFER) {
        w.max_buffer_size = WIRE_MAX_BUFFER;
    }
    if (w.max_frame_size < WIRE_HANDSHAKE_MAX_FRAME ||
        w.max_frame_size > WIRE_MAX_FRAME_CEILING || w.max_in_flight == 0) {
        return AEE_ERPC;
    }
    (void)mp_str_copy(mp_get(msg, "domain"), w.domain, sizeof(w.domain));

    pthread_mutex_lock(&c->mu);
    c->welcome = w;
    c->nslots = w.max_in_flight < MAX_SLOTS ? w.max_in_flight : MAX_SLOTS;
    c->epoch = epoch;
    c->state = ST_READY;
    conn_mark_live(c, epoch, 0);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    c->limit = w.max_frame_size;
    shim_log("connected to npud: domain %s, epoch %u", w.domain, (unsigned)epoch);
    return 0;
}

/* Hand an answer to its waiter. A nonzero return is fatal for the connection. */
static int deliver(struct conn *c, uint64_t id, const msgpack_object *msg, int is_error,
                   int fd) {
    struct waiter *w = NULL;
    pthread_mutex_lock(&c->mu);
    for (unsigned i = 0; i < MAX_SLOTS; i++) {
        if (c->slots[i] != NULL && c->slots[i]->id == id) {
            w = c->slots[i];
            c->slots[i] = NULL;
            c->used--;
            break;
        }
    }
    uint64_t epoch = c->epoch;
    pthread_mutex_unlock(&c->mu);
    if (w == NULL) {
        if (fd >= 0) {
            close(fd);
        }
        return AEE_ERPC; /* UNKNOWN_REQUEST_ID */
    }
    struct conn_request *req = w->req;
    int rc;
    int fatal = 0;
    if (is_error) {
        uint64_t code = 0;
        (void)mp_uint(mp_get(msg, "code"), &code);
        if (code == NPUD_DSP_RESTARTED) {
            pthread_mutex_lock(&c->mu);
            if (c->state == ST_READY) {
                conn_mark_live(c, c->epoch, 1);
            }
            pthread_mutex_unlock(&c->mu);
        }
        req->npud_code = (int)code;
        req->dsp_rc = error_field(msg);
        rc = shim_aee_from_npud((int)code, req->dsp_rc);
        int expected = req->expected_rc != 0 &&
                       (rc == req->expected_rc ||
                        rc == (int)(DSP_AEE_EOFFSET + (unsigned)req->expected_rc));
        if (!expected) {
            log_error(msg);
        }
        if (fd >= 0) {
            close(fd);
        }
    } else if (!mp_str_is(mp_get(msg, "type"), req->reply_type)) {
        rc = AEE_ERPC; /* UNEXPECTED_MESSAGE */
        fatal = 1;
        if (fd >= 0) {
            close(fd);
        }
    } else if (req->on_reply != NULL) {
        rc = req->on_reply(req->reply_ctx, msg, fd);
    } else {
        rc = 0;
        if (fd >= 0) {
            close(fd);
        }
    }
    pthread_mutex_lock(&c->mu);
    req->epoch = epoch;
    w->rc = rc;
    w->done = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return fatal ? rc : 0;
}

/* One frame's payload. A nonzero return ends the connection with that code. */
int conn_dispatch(struct conn *c, const char *payload, size_t len, int fd, unsigned nfds) {
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    msgpack_unpack_return ret =
        FAULT("msgpack") ? MSGPACK_UNPACK_NOMEM_ERROR : msgpack_unpack_next(&u, payload, len, &off);
    int rc = 0;
    if (ret != MSGPACK_UNPACK_SUCCESS || off != len || u.data.type != MSGPACK_OBJECT_MAP) {
        rc = ret == MSGPACK_UNPACK_NOMEM_ERROR ? AEE_ENOMEMORY : AEE_ERPC;
        goto out;
    }
    const msgpack_object *msg = &u.data;
    const msgpack_object *type = mp_get(msg, "type");
    unsigned expected_fds = mp_str_is(type, "alloc_reply") ? 1 : 0;
    if (nfds != expected_fds) {
        rc = AEE_ERPC; /* FD_COUNT_MISMATCH */
        goto out;
    }
    pthread_mutex_lock(&c->mu);
    enum conn_state state = c->state;
    pthread_mutex_unlock(&c->mu);
    if (state == ST_HANDSHAKE) {
        if (mp_str_is(type, "welcome")) {
            rc = take_welcome(c, msg);
        } else if (mp_str_is(type, "error")) {
            rc = refusal(msg);
        } else {
            rc = AEE_ERPC;
        }
        goto out;
    }
    if (mp_str_is(type, "session_restarted")) {
        uint64_t epoch = 0;
        if (mp_uint(mp_get(msg, "epoch"), &epoch) != 0) {
            rc = AEE_ERPC;
            goto out;
        }
        pthread_mutex_lock(&c->mu);
        c->epoch = epoch;
        if (c->state == ST_READY) {
            conn_mark_live(c, epoch, 0);
        }
        pthread_mutex_unlock(&c->mu);
        shim_log("the DSP process restarted (epoch %u): handles, mappings and queues are gone",
                 (unsigned)epoch);
        goto out;
    }
    if (mp_str_is(type, "shutting_down")) {
        pthread_mutex_lock(&c->mu);
        c->shutting_down = 1;
        pthread_mutex_unlock(&c->mu);
        shim_log("npud is shutting down");
        goto out;
    }
    const msgpack_object *id_obj = mp_get(msg, "id");
    uint64_t id = 0;
    if (mp_str_is(type, "error") && (id_obj == NULL || id_obj->type == MSGPACK_OBJECT_NIL)) {
        rc = refusal(msg);
        goto out;
    }
    if (mp_uint(id_obj, &id) != 0 || mp_str_is(type, "welcome")) {
        rc = AEE_ERPC;
        goto out;
    }
    rc = deliver(c, id, msg, mp_str_is(type, "error"), fd);
    fd = -1; /* deliver owns it */
out:
    if (fd >= 0) {
        close(fd);
    }
    msgpack_unpacked_destroy(&u);
    return rc;
}
