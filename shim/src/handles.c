/*
 * handles.c -- remote handles: the table of the program's handles, open and close
 * (invoke.c, controls.c and port.c are the other parts: handles.h).
 *
 * A handle the program gets is a small number of this library's (never npud's
 * id, which is per connection): it stands for {npud handle id, connection
 * generation, session epoch}, and it is dead when either has moved on
 * (AEE_ECONNRESET). It fits in 32 bits, as llama.cpp calls
 * remote_handle64_close through a pointer that takes a 32-bit handle: close
 * uses the low 32 bits alone.

 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "AEEStdErr.h"
#include "conn.h"
#include "handles.h"
#include "mem.h"
#include "remote.h"
#include "shim.h"
#include "wire.h"

#define MAX_URI 1023

static pthread_mutex_t g_handles_lock = PTHREAD_MUTEX_INITIALIZER;
static struct handle *g_handles;
static uint32_t g_next_local = 1;

void handles_fork_lock(void) {
    pthread_mutex_lock(&g_handles_lock);
}

void handles_fork_unlock(void) {
    pthread_mutex_unlock(&g_handles_lock);
}

int handle_lookup(uint32_t local, struct handle *out) {
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

/* The domain id libcdsprpc gives the domain name starts with (cdsp1 before cdsp); -1. */
int shim_domain_by_name(const char *name) {
    static const char *const order[] = {"adsp", "mdsp", "sdsp", "cdsp1", "cdsp", "gdsp0", "gdsp1"};
    static const int ids[] = {0, 1, 2, 4, 3, 5, 6};
    for (unsigned i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        if (strncmp(name, order[i], strlen(order[i])) == 0) {
            return ids[i];
        }
    }
    return -1;
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
    if (shim_domain_by_name(name) < 0) {
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

SHIM_API int remote_handle64_close(remote_handle64 h) {
    /* llama.cpp calls this through an int (*)(remote_handle): the upper half of
     * the argument is not defined. Our handles fit in the lower one. */
    return h_close((uint32_t)(h & 0xffffffffu));
}

SHIM_API int remote_handle_close(remote_handle h) {
    return h_close(h);
}
