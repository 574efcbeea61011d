/*
 * handles.c -- remote handles (open, invoke, close) and the controls.
 *
 * A handle the program gets is a small number of this library's (never npud's
 * id, which is per connection): it stands for {npud handle id, connection
 * generation, session epoch}, and it is dead when either has moved on
 * (AEE_ECONNRESET). It fits in 32 bits, as llama.cpp calls
 * remote_handle64_close through a pointer that takes a 32-bit handle: close
 * uses the low 32 bits alone.
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
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "AEEStdErr.h"
#include "conn.h"
#include "mem.h"
#include "port.h"
#include "remote.h"
#include "rpcmem.h"
#include "shim.h"
#include "wire.h"

#define NUM_SESSIONS 4       /* libcdsprpc's: sessions 0..3 per domain */
#define NUM_DOMAINS 8        /* effective domain id = domain + 8 * session */
#define MAX_URI 1023
#define SPILL_ALIGN 128u
#define MAX_DMA_SIZE 268435456u /* the largest spill (npud's inline capacities are smaller) */

static const char *const DOMAIN_NAMES[] = {"adsp", "mdsp", "sdsp", "cdsp", "cdsp1", "gdsp0",
                                           "gdsp1"};

struct handle {
    struct handle *next;
    uint32_t local;
    uint32_t remote;
    uint64_t gen;
    uint64_t epoch;
};

static int domain_by_name(const char *name);

static pthread_mutex_t g_handles_lock = PTHREAD_MUTEX_INITIALIZER;
static struct handle *g_handles;
static uint32_t g_next_local = 1;

void handles_fork_lock(void) {
    pthread_mutex_lock(&g_handles_lock);
}

void handles_fork_unlock(void) {
    pthread_mutex_unlock(&g_handles_lock);
}

/* The handle's npud id, generation and epoch: 0, AEE_EINVHANDLE or AEE_ECONNRESET. */
static int lookup(uint32_t local, struct handle *out) {
    int rc = AEE_EINVHANDLE;
    pthread_mutex_lock(&g_handles_lock);
    for (struct handle *h = g_handles; h != NULL; h = h->next) {
        if (h->local == local) {
            *out = *h;
            rc = conn_alive_epoch(h->gen, h->epoch) ? 0 : AEE_ECONNRESET;
            break;
        }
    }
    pthread_mutex_unlock(&g_handles_lock);
    return rc;
}

/* ---- open and close ------------------------------------------------------------------------ */

struct open_ctx {
    const char *uri;
    uint32_t handle;
};

static void encode_open(void *ctx, msgpack_packer *pk, uint32_t id) {
    const struct open_ctx *o = ctx;
    msgpack_pack_map(pk, 3);
    mp_kv_str(pk, "type", "open");
    mp_kv_uint(pk, "id", id);
    mp_kv_str(pk, "uri", o->uri);
}

static int take_open(void *ctx, const msgpack_object *msg, int fd) {
    struct open_ctx *o = ctx;
    uint64_t handle = 0;
    (void)fd;
    if (mp_uint(mp_get(msg, "handle"), &handle) != 0 || handle == 0 || handle > UINT32_MAX) {
        return AEE_ERPC;
    }
    o->handle = (uint32_t)handle;
    return 0;
}

struct close_ctx {
    uint32_t handle;
};

static void encode_close(void *ctx, msgpack_packer *pk, uint32_t id) {
    const struct close_ctx *cl = ctx;
    msgpack_pack_map(pk, 3);
    mp_kv_str(pk, "type", "close");
    mp_kv_uint(pk, "id", id);
    mp_kv_uint(pk, "handle", cl->handle);
}

/* The domain and session a module URI names: npud serves the CDSP, session 0.
 * A 64-bit open must name its domain (libcdsprpc's get_domain_from_name finds
 * none in a URI without "&_dom=" and answers AEE_EBADPARM); a 32-bit open runs
 * in the current domain, the CDSP, whatever the URI says of it. */
static int check_uri(const char *uri, int need_domain) {
    size_t len = strnlen(uri, MAX_URI + 1);
    if (len == 0 || len > MAX_URI) {
        return AEE_EBADPARM;
    }
    for (size_t i = 0; i < len; i++) {
        if (uri[i] < 0x21 || uri[i] > 0x7e) {
            return AEE_EBADPARM; /* npud's open.uri is printable ASCII without spaces */
        }
    }
    const char *dom = strstr(uri, "&_dom=");
    if (dom == NULL) {
        return need_domain ? AEE_EBADPARM : 0;
    }
    if (!need_domain) {
        return 0;
    }
    const char *name = dom + strlen("&_dom=");
    if (domain_by_name(name) < 0) {
        return AEE_EBADPARM; /* no domain libcdsprpc knows */
    }
    if (strncmp(name, CDSP_DOMAIN_NAME, 4) != 0 || (name[4] != '\0' && name[4] != '&')) {
        return AEE_EUNSUPPORTED;
    }
    const char *session = strstr(uri, "&_session=");
    if (session != NULL) {
        long n = strtol(session + strlen("&_session="), NULL, 10);
        if (n < 0 || n >= NUM_SESSIONS) {
            return AEE_EBADPARM;
        }
        if (n != 0) {
            return AEE_EUNSUPPORTED; /* one DSP process per client: session 0 */
        }
    }
    return 0;
}

static int h_open(const char *uri, int need_domain, uint32_t *out) {
    if (uri == NULL || out == NULL) {
        return AEE_EBADPARM;
    }
    int rc = check_uri(uri, need_domain);
    if (rc != 0) {
        return rc;
    }
    struct handle *h = x_calloc(1, sizeof(*h));
    if (h == NULL) {
        return AEE_ENOMEMORY;
    }
    struct open_ctx o = {.uri = uri};
    struct conn_request req = {
        .reply_type = "open_reply",
        .encode = encode_open,
        .encode_ctx = &o,
        .on_reply = take_open,
        .reply_ctx = &o,
        .acquires = 1,
    };
    struct conn *c;
    rc = conn_get(&c);
    if (rc == 0) {
        rc = conn_call(c, &req);
        h->gen = conn_gen(c);
        conn_put(c);
    }
    if (rc != 0) {
        shim_log("open %s failed: 0x%x", uri, (unsigned)rc);
        free(h);
        return rc;
    }
    h->remote = o.handle;
    h->epoch = req.epoch;
    pthread_mutex_lock(&g_handles_lock);
    h->local = g_next_local++;
    if (g_next_local == 0 || g_next_local == UINT32_MAX) {
        g_next_local = 1;
    }
    h->next = g_handles;
    g_handles = h;
    *out = h->local;
    pthread_mutex_unlock(&g_handles_lock);
    return 0;
}

/* No handle and no rpcmem buffer of connection gen (dspqueue's module is a handle). */
static int nothing_held(uint64_t gen) {
    int none = 1;
    pthread_mutex_lock(&g_handles_lock);
    for (const struct handle *h = g_handles; h != NULL; h = h->next) {
        if (h->gen == gen) {
            none = 0;
            break;
        }
    }
    pthread_mutex_unlock(&g_handles_lock);
    return none && mem_none_of(gen);
}

static int h_close(uint32_t local) {
    pthread_mutex_lock(&g_handles_lock);
    struct handle **link = &g_handles;
    while (*link != NULL && (*link)->local != local) {
        link = &(*link)->next;
    }
    struct handle *h = *link;
    if (h != NULL) {
        *link = h->next;
    }
    pthread_mutex_unlock(&g_handles_lock);
    if (h == NULL) {
        return AEE_EINVHANDLE;
    }
    int rc = AEE_ECONNRESET; /* a restart or a lost connection closed it already */
    struct conn *c;
    if (conn_alive_epoch(h->gen, h->epoch) && conn_get_gen(h->gen, &c) == 0) {
        struct close_ctx cl = {.handle = h->remote};
        struct conn_request req = {
            .reply_type = "close_reply", .encode = encode_close, .encode_ctx = &cl};
        rc = conn_call(c, &req);
        if (rc == 0) {
            /* libcdsprpc ends the DSP process when the last handle closes. npud's
             * process lives as long as the connection, which also holds the buffers:
             * it is ended when nothing else is held (see conn_end_if_idle). */
            (void)conn_end_if_idle(c, nothing_held);
        }
        conn_put(c);
    }
    free(h);
    return rc;
}

/* ---- invoke --------------------------------------------------------------------------------- */

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

static int h_invoke(uint32_t local, uint32_t sc, remote_arg *pra, int wait) {
    unsigned nin = REMOTE_SCALARS_INBUFS(sc);
    unsigned nout = REMOTE_SCALARS_OUTBUFS(sc);
    unsigned handles = REMOTE_SCALARS_INHANDLES(sc) + REMOTE_SCALARS_OUTHANDLES(sc);
    if (pra == NULL && nin + nout + handles > 0) {
        return AEE_EBADPARM;
    }
    struct handle h;
    int rc = lookup(local, &h);
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

/* ---- controls --------------------------------------------------------------------------------- */

static int domain_by_name(const char *name) {
    static const char *const order[] = {"adsp", "mdsp", "sdsp", "cdsp1", "cdsp", "gdsp0", "gdsp1"};
    static const int ids[] = {0, 1, 2, 4, 3, 5, 6};
    for (unsigned i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        if (strncmp(name, order[i], strlen(order[i])) == 0) {
            return ids[i];
        }
    }
    return -1;
}

static int dsp_info(struct remote_dsp_capability *cap, uint32_t len) {
    if (cap == NULL || len < sizeof(*cap)) {
        return AEE_EBADPARM;
    }
    if (cap->domain >= NUM_DOMAINS * NUM_SESSIONS) {
        return AEE_EBADPARM;
    }
    if (cap->attribute_ID >= 260) { /* libcdsprpc's FASTRPC_MAX_ATTRIBUTES */
        return AEE_EBADPARM;
    }
    cap->capability = 0;
    if (cap->domain % NUM_DOMAINS != CDSP_DOMAIN_ID) {
        /* npud brokers the CDSP alone: any other DSP is absent here */
        return cap->attribute_ID == DOMAIN_SUPPORT ? 0 : AEE_EUNSUPPORTED;
    }
    struct conn *c;
    int rc = conn_get(&c);
    if (rc != 0) {
        return cap->attribute_ID == DOMAIN_SUPPORT ? 0 : rc;
    }
    uint32_t id = cap->attribute_ID;
    if (id < SHIM_DSP_ATTRIBUTES) {
        cap->capability = conn_welcome(c)->caps[id];
    } else if (id >= SHIM_DSP_INTERNAL_FIRST && id < SHIM_DSP_INTERNAL_FIRST + SHIM_DSP_INTERNAL) {
        cap->capability = conn_welcome(c)->internal[id - SHIM_DSP_INTERNAL_FIRST];
    }
    /* 256..259, the driver's (PERF_V2_DRIVER_SUPPORT .. DSPSIGNAL_DRIVER_SUPPORT):
     * 0, which libcdsprpc answers itself on mainline kernels; the DSP's others
     * (12..127, 132..255, unassigned): 0, npud does not ask for them. */
    conn_put(c);
    return 0;
}

/* The controls remote_handle_control and remote_handle64_control share. */
static int handle_control(uint32_t req, void *data, uint32_t len) {
    switch (req) {
    case DSPRPC_CONTROL_LATENCY: {
        const struct remote_rpc_control_latency *l = data;
        if (l == NULL || len != sizeof(*l) || l->enable > RPC_POLL_QOS) {
            return AEE_EBADPARM;
        }
        return 0; /* npud schedules; QoS requests change nothing */
    }
    case DSPRPC_GET_DSP_INFO:
        return dsp_info(data, len);
    case DSPRPC_GET_DOMAIN: {
        remote_rpc_get_domain_t *d = data;
        if (d == NULL || len != sizeof(*d)) {
            return AEE_EBADPARM;
        }
        d->domain = CDSP_DOMAIN_ID;
        return 0;
    }
    default:
        return AEE_EUNSUPPORTED;
    }
}

static int get_uri(remote_rpc_get_uri_t *u, uint32_t len) {
    if (u == NULL || len != sizeof(*u) || u->domain_name == NULL || u->domain_name_len == 0 ||
        u->session_id >= NUM_SESSIONS) {
        return AEE_EBADPARM;
    }
    int domain = domain_by_name(u->domain_name);
    if (domain < 0 || u->module_uri == NULL || u->module_uri_len == 0 || u->uri == NULL ||
        u->uri_len <= u->module_uri_len) {
        return AEE_EBADPARM;
    }
    int need = snprintf(NULL, 0, "%s&_dom=%s&_session=%u", u->module_uri, DOMAIN_NAMES[domain],
                        u->session_id);
    int rc = need < 0 || u->uri_len <= (uint32_t)need ? AEE_EBADSIZE : 0;
    snprintf(u->uri, u->uri_len, "%s&_dom=%s&_session=%u", u->module_uri, DOMAIN_NAMES[domain],
             u->session_id);
    return rc;
}

static int session_control(uint32_t req, void *data, uint32_t len) {
    switch (req) {
    case DSPRPC_CONTROL_UNSIGNED_MODULE: {
        const struct remote_rpc_control_unsigned_module *u = data;
        if (u == NULL || len != sizeof(*u) ||
            (u->domain != -1 && (u->domain < 0 || u->domain >= NUM_DOMAINS * NUM_SESSIONS))) {
            return AEE_EBADPARM;
        }
        return 0; /* npud's DSP processes are unsigned PDs */
    }
    case FASTRPC_GET_EFFECTIVE_DOMAIN_ID: {
        remote_rpc_effective_domain_id_t *e = data;
        if (e == NULL || len != sizeof(*e) || e->domain_name == NULL || e->domain_name_len == 0 ||
            e->session_id >= NUM_SESSIONS) {
            return AEE_EBADPARM;
        }
        int domain = domain_by_name(e->domain_name);
        if (domain < 0) {
            return AEE_EBADPARM;
        }
        e->effective_domain_id = (uint32_t)domain + NUM_DOMAINS * e->session_id;
        return 0;
    }
    case FASTRPC_GET_URI:
        return get_uri(data, len);
    default:
        /* FASTRPC_RESERVE_NEW_SESSION among them: a client has one DSP process */
        return AEE_EUNSUPPORTED;
    }
}

/* ---- the exported functions --------------------------------------------------------------------- */

SHIM_API int remote_handle64_open(const char *name, remote_handle64 *ph) {
    uint32_t h = 0;
    if (ph == NULL) {
        return AEE_EBADPARM;
    }
    int rc = h_open(name, 1, &h);
    if (rc == 0) {
        *ph = h;
    }
    return rc;
}

SHIM_API int remote_handle_open(const char *name, remote_handle *ph) {
    return h_open(name, 0, ph);
}

SHIM_API int remote_handle64_invoke(remote_handle64 h, uint32_t sc, remote_arg *pra) {
    if (h > UINT32_MAX) {
        return AEE_EINVHANDLE;
    }
    return h_invoke((uint32_t)h, sc, pra, 0);
}

SHIM_API int remote_handle_invoke(remote_handle h, uint32_t sc, remote_arg *pra) {
    return h_invoke(h, sc, pra, 0);
}

SHIM_API int remote_handle64_close(remote_handle64 h) {
    /* llama.cpp calls this through an int (*)(remote_handle): the upper half of
     * the argument is not defined. Our handles fit in the lower one. */
    return h_close((uint32_t)(h & 0xffffffffu));
}

SHIM_API int remote_handle_close(remote_handle h) {
    return h_close(h);
}

SHIM_API int remote_handle_control(uint32_t req, void *data, uint32_t datalen) {
    return handle_control(req, data, datalen);
}

SHIM_API int remote_handle64_control(remote_handle64 h, uint32_t req, void *data,
                                     uint32_t datalen) {
    struct handle found;
    int rc = h > UINT32_MAX ? AEE_EINVHANDLE : lookup((uint32_t)h, &found);
    if (rc != 0) {
        return rc;
    }
    return handle_control(req, data, datalen);
}

SHIM_API int remote_session_control(uint32_t req, void *data, uint32_t datalen) {
    return session_control(req, data, datalen);
}

/* ---- port.h, for dspqueue ---------------------------------------------------------------------- */

int port_alloc(size_t size, void **ptr) {
    *ptr = mem_alloc(size, RPCMEM_DEFAULT_FLAGS | RPCMEM_HEAP_NOREG);
    return *ptr != NULL ? 0 : AEE_ENORPCMEMORY;
}

void port_free(void *ptr) {
    mem_free(ptr);
}

int port_to_fd(void *ptr) {
    return mem_to_fd(ptr);
}

int port_mmap(int fd, void *ptr, size_t size) {
    return mem_map(CDSP_DOMAIN_ID, fd, ptr, 0, size, FASTRPC_MAP_FD);
}

int port_munmap(int fd, void *ptr, size_t size) {
    return mem_unmap(CDSP_DOMAIN_ID, fd, ptr, size);
}

int port_buffer_ref(int fd, int delta, void **va, size_t *size) {
    return mem_buffer_ref(fd, delta, va, size);
}

int port_open(const char *uri, remote_handle64 *h) {
    return remote_handle64_open(uri, h);
}

int port_invoke(remote_handle64 h, uint32_t sc, remote_arg *pra, int wait) {
    if (h > UINT32_MAX) {
        return AEE_EINVHANDLE;
    }
    return h_invoke((uint32_t)h, sc, pra, wait);
}

int port_close(remote_handle64 h) {
    return remote_handle64_close(h);
}

uint64_t port_session(void) {
    return conn_live();
}
