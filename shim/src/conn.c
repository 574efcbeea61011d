/*
 * conn.c -- the process's one connection to npud: Hello, pipelined requests,
 * the reader thread, events.
 *
 * Locks: g_lock (which connection is current; held while one is made, so
 * threads that need one wait for it), then conn.mu (state, waiters, epoch),
 * conn.send_mu (one frame at a time on the socket). A thread never holds
 * conn.mu while it sends or waits for the socket.
 *
 * Requests: conn_call takes a slot (at most the Welcome's max_in_flight, up to
 * MAX_SLOTS, are in flight; more wait for a free slot), gives the request an
 * id no request in flight has, sends it and sleeps until its waiter is
 * answered. The reader thread takes each answer off the socket, removes its
 * waiter from the slots, lets the request's reply function take what it needs
 * (on the reader thread, while the caller sleeps) and wakes it. When the
 * connection ends, however it ends, conn_kill answers every waiter at once.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "AEEStdErr.h"
#include "conn.h"
#include "shim.h"
#include "wire.h"

#define DEFAULT_SOCKET "/run/npud/npud.sock"
#define MAX_SLOTS 64
#define RECV_FDS 16 /* room for fds per recvmsg: more is MSG_CTRUNC, fatal */
#define FD_RECORDS 8
#define RECV_CHUNK 65536
#define HANDSHAKE_TIMEOUT_S 30

enum conn_state { ST_HANDSHAKE, ST_READY, ST_DEAD };

struct waiter {
    uint32_t id;
    int done;
    int rc;
    struct conn_request *req;
};

/* The fds one recvmsg brought, and the stream bytes they came with. */
struct fd_record {
    uint64_t start;
    uint64_t end;
    int fds[RECV_FDS];
    unsigned count;
    unsigned taken;
};

struct conn {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* a waiter answered, a slot freed, the state changed */
    pthread_mutex_t send_mu;
    int refs;
    int fd;
    uint64_t gen;
    enum conn_state state;
    int dead_rc;
    int shutting_down;
    uint64_t epoch;
    struct welcome welcome;
    struct waiter *slots[MAX_SLOTS];
    unsigned nslots;
    unsigned used;
    uint32_t next_id;
    /* The reader thread's alone. */
    uint8_t *rbuf;
    size_t rlen;
    size_t rcap;
    uint64_t roff; /* stream offset of rbuf[0] */
    size_t limit;  /* the current frame limit */
    struct fd_record recs[FD_RECORDS];
    unsigned nrecs;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct conn *g_conn;
static uint64_t g_next_gen = 1;
/* generation << 32 | epoch of the live connection, 0 when there is none. */
static _Atomic uint64_t g_live;

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

/* Bit 31 of the epoch half: a restart was seen (an answer said DSP_RESTARTED) and
 * its session_restarted has not come yet. npud sends that event before any answer
 * from the new session, so nothing can be made in between. */
#define RESTART_SEEN 0x80000000u

static uint64_t live_token(uint64_t gen, uint64_t epoch) {
    return gen << 32 | (epoch & 0x7fffffffu);
}

int conn_alive(uint64_t gen) {
    uint64_t live = atomic_load(&g_live);
    return live != 0 && live >> 32 == gen;
}

uint64_t conn_live(void) {
    return atomic_load(&g_live);
}

int conn_alive_epoch(uint64_t gen, uint64_t epoch) {
    uint64_t live = atomic_load(&g_live);
    return live != 0 && live == live_token(gen, epoch);
}

uint64_t conn_gen(const struct conn *c) {
    return c->gen;
}

const struct welcome *conn_welcome(const struct conn *c) {
    return &c->welcome;
}

static void close_records(struct conn *c) {
    for (unsigned i = 0; i < c->nrecs; i++) {
        for (unsigned j = c->recs[i].taken; j < c->recs[i].count; j++) {
            close(c->recs[i].fds[j]);
        }
    }
    c->nrecs = 0;
}

void conn_put(struct conn *c) {
    pthread_mutex_lock(&c->mu);
    int last = --c->refs == 0;
    pthread_mutex_unlock(&c->mu);
    if (!last) {
        return;
    }
    if (c->fd >= 0) {
        close(c->fd);
    }
    close_records(c);
    free(c->rbuf);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->send_mu);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* The connection is over: every waiter fails with rc, the reader wakes up. */
static void conn_kill(struct conn *c, int rc) {
    pthread_mutex_lock(&c->mu);
    if (c->state == ST_DEAD) {
        pthread_mutex_unlock(&c->mu);
        return;
    }
    shim_log("connection to npud ends (0x%x)", (unsigned)rc);
    c->state = ST_DEAD;
    c->dead_rc = rc;
    for (unsigned i = 0; i < MAX_SLOTS; i++) {
        if (c->slots[i] != NULL) {
            c->slots[i]->rc = rc;
            c->slots[i]->done = 1;
            c->slots[i] = NULL;
        }
    }
    c->used = 0;
    uint64_t expected = atomic_load(&g_live);
    if (expected >> 32 == c->gen) {
        atomic_compare_exchange_strong(&g_live, &expected, 0);
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    shutdown(c->fd, SHUT_RDWR);
}

/* One whole frame on the socket, or the connection dies. */
static int conn_send(struct conn *c, const char *data, size_t len) {
    int err = 0;
    pthread_mutex_lock(&c->send_mu);
    size_t sent = 0;
    while (sent < len) {
        struct iovec iov = {.iov_base = (void *)(data + sent), .iov_len = len - sent};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
        ssize_t n;
        if (FAULT("sendmsg")) {
            n = -1;
            errno = EPIPE;
        } else {
            n = sendmsg(c->fd, &msg, MSG_NOSIGNAL);
        }
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            err = errno;
            break;
        }
        sent += (size_t)n;
    }
    pthread_mutex_unlock(&c->send_mu);
    if (err != 0) {
        int rc = err == ENOMEM || err == ENOBUFS ? AEE_ENOMEMORY : AEE_ECONNRESET;
        conn_kill(c, rc);
        return rc;
    }
    return 0;
}

/* ---- the reader ----------------------------------------------------------------------- */

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
    atomic_store(&g_live, live_token(c->gen, epoch));
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
                atomic_store(&g_live, live_token(c->gen, c->epoch) | RESTART_SEEN);
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
static int dispatch(struct conn *c, const char *payload, size_t len, int fd, unsigned nfds) {
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
            atomic_store(&g_live, live_token(c->gen, epoch));
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

/* Keep the fds of one recvmsg with the bytes they came with. */
static int keep_fds(struct conn *c, uint64_t start, size_t len, const int *fds, unsigned n) {
    if (c->nrecs == FD_RECORDS) {
        for (unsigned i = 0; i < n; i++) {
            close(fds[i]);
        }
        return -1;
    }
    struct fd_record *r = &c->recs[c->nrecs++];
    r->start = start;
    r->end = start + len;
    memcpy(r->fds, fds, n * sizeof(int));
    r->count = n;
    r->taken = 0;
    return 0;
}

/* The frame starting at stream offset start declares n fds: the first n not
 * taken of the recvmsg that brought its first byte. */
static int take_fds(struct conn *c, uint64_t start, unsigned n, int *fd) {
    *fd = -1;
    if (n == 0) {
        return 0;
    }
    for (unsigned i = 0; i < c->nrecs; i++) {
        struct fd_record *r = &c->recs[i];
        if (r->start <= start && start < r->end) {
            if (r->count - r->taken < n) {
                return -1; /* MISSING_FDS */
            }
            /* npud's frames carry at most one: the frame keeps its first, and
             * the others it declared are closed here (dispatch refuses the
             * frame for its fd count) */
            *fd = r->fds[r->taken];
            for (unsigned j = 1; j < n; j++) {
                close(r->fds[r->taken + j]);
            }
            r->taken += n;
            return 0;
        }
    }
    return -1;
}

/* Records whose bytes were all consumed: their untaken fds are strays. */
static void drop_records(struct conn *c, uint64_t consumed) {
    unsigned kept = 0;
    for (unsigned i = 0; i < c->nrecs; i++) {
        struct fd_record *r = &c->recs[i];
        if (r->end <= consumed) {
            for (unsigned j = r->taken; j < r->count; j++) {
                close(r->fds[j]);
            }
        } else {
            c->recs[kept++] = *r;
        }
    }
    c->nrecs = kept;
}

static int grow_rbuf(struct conn *c, size_t need) {
    if (need <= c->rcap) {
        return 0;
    }
    size_t cap = c->rcap != 0 ? c->rcap : RECV_CHUNK;
    while (cap < need) {
        cap *= 2;
    }
    uint8_t *grown = x_realloc(c->rbuf, cap);
    if (grown == NULL) {
        return -1;
    }
    c->rbuf = grown;
    c->rcap = cap;
    return 0;
}

/* Frames until the stream ends or breaks the protocol: the AEE code it ended with. */
static int read_frames(struct conn *c) {
    for (;;) {
        if (grow_rbuf(c, c->rlen + RECV_CHUNK) != 0) {
            return AEE_ENOMEMORY;
        }
        union {
            char buf[CMSG_SPACE(RECV_FDS * sizeof(int))];
            struct cmsghdr align;
        } control;
        struct iovec iov = {.iov_base = c->rbuf + c->rlen, .iov_len = c->rcap - c->rlen};
        struct msghdr mh = {
            .msg_iov = &iov,
            .msg_iovlen = 1,
            .msg_control = control.buf,
            .msg_controllen = sizeof(control.buf),
        };
        ssize_t n;
        if (FAULT("recvmsg")) {
            n = -1;
            errno = ENOMEM;
        } else {
            n = recvmsg(c->fd, &mh, MSG_CMSG_CLOEXEC);
        }
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            return errno == ENOMEM || errno == ENOBUFS ? AEE_ENOMEMORY : AEE_ECONNRESET;
        }
        int fds[RECV_FDS];
        unsigned nfds = 0;
        int odd = 0;
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm != NULL; cm = CMSG_NXTHDR(&mh, cm)) {
            if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
                size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                for (size_t i = 0; i < count && nfds < RECV_FDS; i++) {
                    memcpy(&fds[nfds++], CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
                }
            } else {
                odd = 1;
            }
        }
        if (odd || (mh.msg_flags & MSG_CTRUNC) || n == 0) {
            for (unsigned i = 0; i < nfds; i++) {
                close(fds[i]);
            }
            return n == 0 ? AEE_ECONNRESET : AEE_ERPC;
        }
        if (nfds > 0 && keep_fds(c, c->roff + c->rlen, (size_t)n, fds, nfds) != 0) {
            return AEE_ERPC;
        }
        c->rlen += (size_t)n;

        size_t pos = 0;
        while (c->rlen - pos >= WIRE_HEADER_SIZE) {
            uint32_t plen;
            unsigned declared;
            if (wire_header(c->rbuf + pos, c->limit, &plen, &declared) != 0) {
                return AEE_ERPC;
            }
            size_t whole = WIRE_HEADER_SIZE + (size_t)plen;
            if (c->rlen - pos < whole) {
                if (grow_rbuf(c, whole + RECV_CHUNK) != 0) {
                    return AEE_ENOMEMORY;
                }
                break;
            }
            int fd;
            if (take_fds(c, c->roff + pos, declared, &fd) != 0) {
                return AEE_ERPC;
            }
            int rc = dispatch(c, (const char *)c->rbuf + pos + WIRE_HEADER_SIZE, plen, fd,
                              declared);
            if (rc != 0) {
                return rc;
            }
            pos += whole;
        }
        drop_records(c, c->roff + pos);
        memmove(c->rbuf, c->rbuf + pos, c->rlen - pos);
        c->rlen -= pos;
        c->roff += pos;
    }
}

static void *reader_main(void *arg) {
    struct conn *c = arg;
    int rc = read_frames(c);
    conn_kill(c, rc);
    close_records(c);
    free(c->rbuf);
    c->rbuf = NULL;
    conn_put(c);
    return NULL;
}

/* ---- connecting -------------------------------------------------------------------------- */

static void client_name(char *out, size_t size) {
    const char *name = getenv("NPUD_CLIENT_NAME");
    if (name == NULL || name[0] == '\0') {
        name = program_invocation_short_name;
    }
    /* ^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,63}$ (PROTOCOL.md, hello.client_name) */
    size_t n = 0;
    for (const char *p = name; *p != '\0' && n + 1 < size && n < 64; p++) {
        char ch = *p;
        int ok = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9');
        if (n > 0 && strchr("._:@+-", ch) != NULL) {
            ok = 1;
        }
        char put = ok ? ch : '-';
        if (n == 0 && !ok) {
            put = 'x';
        }
        out[n] = put;
        n++;
    }
    if (n == 0) {
        out[n++] = 'x';
    }
    out[n] = '\0';
}

static const char *priority(void) {
    const char *p = getenv("NPUD_PRIORITY");
    if (p != NULL && (strcmp(p, "realtime") == 0 || strcmp(p, "background") == 0)) {
        return p;
    }
    return "normal";
}

static int send_hello(struct conn *c) {
    char name[65];
    client_name(name, sizeof(name));
    struct wbuf b;
    msgpack_packer pk;
    if (wbuf_start(&b, &pk) != 0) {
        wbuf_free(&b);
        return AEE_ENOMEMORY;
    }
    msgpack_pack_map(&pk, 5);
    mp_kv_str(&pk, "type", "hello");
    mp_kv_uint(&pk, "protocol_version", WIRE_PROTOCOL_VERSION);
    mp_kv_str(&pk, "client_name", name);
    mp_kv_str(&pk, "priority", priority());
    mp_str(&pk, "isolate");
    msgpack_pack_true(&pk);
    if (wbuf_finish(&b, WIRE_HANDSHAKE_MAX_FRAME) != 0) {
        wbuf_free(&b);
        return AEE_ENOMEMORY;
    }
    int rc = conn_send(c, b.data, b.len);
    wbuf_free(&b);
    return rc;
}

static int connect_socket(int *out) {
    const char *path = getenv("NPUD_SOCKET");
    if (path == NULL || path[0] == '\0') {
        path = DEFAULT_SOCKET;
    }
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof(addr));
    addr.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof(addr.sun_path)) {
        shim_log("socket path too long: %s", path);
        return AEE_ECONNREFUSED;
    }
    strcpy(addr.sun_path, path);
    int fd;
    if (FAULT("socket")) {
        fd = -1;
        errno = EMFILE;
    } else {
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    }
    if (fd < 0) {
        return errno == ENOMEM || errno == ENOBUFS ? AEE_ENOMEMORY : AEE_ERPC;
    }
    int r;
    if (FAULT("connect")) {
        r = -1;
        errno = ECONNREFUSED;
    } else {
        do {
            r = connect(fd, (struct sockaddr *)&addr, sizeof(addr));
        } while (r != 0 && errno == EINTR);
    }
    if (r != 0) {
        int err = errno;
        close(fd);
        shim_log("cannot connect to npud at %s: %s", path, strerror(err));
        return shim_aee_from_errno(err);
    }
    *out = fd;
    return 0;
}

static int start_reader(struct conn *c) {
    pthread_t thread;
    pthread_attr_t attr;
    sigset_t all, old;
    if (FAULT("pthread_create")) {
        return AEE_ENOMEMORY;
    }
    if (pthread_attr_init(&attr) != 0) {
        return AEE_ENOMEMORY;
    }
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* the reader takes no signals */
    int err = pthread_create(&thread, &attr, reader_main, c);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    return err == 0 ? 0 : AEE_ENOMEMORY;
}

/* A new connection through its Welcome, with one reference for the caller. */
static int conn_open(uint64_t gen, struct conn **out) {
    struct conn *c = x_calloc(1, sizeof(*c));
    if (c == NULL) {
        return AEE_ENOMEMORY;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->send_mu, NULL);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    c->refs = 1;
    c->fd = -1;
    c->gen = gen;
    c->state = ST_HANDSHAKE;
    c->limit = WIRE_HANDSHAKE_MAX_FRAME;
    c->next_id = 1;

    int rc = connect_socket(&c->fd);
    if (rc != 0) {
        conn_put(c);
        return rc;
    }
    c->refs = 2; /* the reader's */
    rc = start_reader(c);
    if (rc != 0) {
        c->refs = 1;
        conn_put(c);
        return rc;
    }
    rc = send_hello(c);
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += HANDSHAKE_TIMEOUT_S;
    pthread_mutex_lock(&c->mu);
    while (rc == 0 && c->state == ST_HANDSHAKE) {
        if (pthread_cond_timedwait(&c->cv, &c->mu, &deadline) == ETIMEDOUT) {
            pthread_mutex_unlock(&c->mu);
            shim_log("npud did not answer the Hello within %d s", HANDSHAKE_TIMEOUT_S);
            conn_kill(c, AEE_EEXPIRED);
            pthread_mutex_lock(&c->mu);
        }
    }
    if (rc == 0 && c->state != ST_READY) {
        rc = c->dead_rc;
    }
    pthread_mutex_unlock(&c->mu);
    if (rc != 0) {
        conn_kill(c, rc);
        conn_put(c);
        return rc;
    }
    *out = c;
    return 0;
}

int conn_get(struct conn **out) {
    pthread_mutex_lock(&g_lock);
    struct conn *c = g_conn;
    if (c != NULL) {
        pthread_mutex_lock(&c->mu);
        int live = c->state == ST_READY;
        if (live) {
            c->refs++;
        }
        pthread_mutex_unlock(&c->mu);
        if (live) {
            pthread_mutex_unlock(&g_lock);
            *out = c;
            return 0;
        }
        g_conn = NULL;
        conn_put(c);
    }
    int rc = conn_open(g_next_gen, &c);
    if (rc == 0) {
        g_next_gen++;
        pthread_mutex_lock(&c->mu);
        c->refs++; /* g_conn's */
        pthread_mutex_unlock(&c->mu);
        g_conn = c;
        *out = c;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

int conn_end_if_idle(struct conn *c, int (*idle)(uint64_t gen)) {
    int ended = 0;
    pthread_mutex_lock(&g_lock); /* no other thread gets the connection meanwhile */
    pthread_mutex_lock(&c->mu);
    /* the caller's reference, g_conn's and the reader's: nobody else holds it, and
     * nothing is in flight */
    int alone = g_conn == c && c->state == ST_READY && c->refs == 3 && c->used == 0;
    pthread_mutex_unlock(&c->mu);
    if (alone && idle(c->gen)) {
        shim_log("the last handle is closed and nothing is held: the DSP process ends");
        g_conn = NULL;
        conn_kill(c, AEE_ECONNRESET); /* the reader ends, and npud lets the process go */
        conn_put(c);                  /* g_conn's reference */
        ended = 1;
    }
    pthread_mutex_unlock(&g_lock);
    return ended;
}

void conn_fork_child(void) {
    pthread_mutex_init(&g_lock, NULL);
    struct conn *c = g_conn;
    g_conn = NULL;
    atomic_store(&g_live, 0);
    if (c == NULL) {
        return;
    }
    /* The child's copies only: its socket fd (no shutdown: the parent's connection
     * is the same socket), the fds the reader had kept, its memory. Its mutexes
     * may have been held by a thread the child does not have: freed, not
     * destroyed. Objects of its generation are of an ended connection now. */
    if (c->fd >= 0) {
        close(c->fd);
    }
    close_records(c);
    free(c->rbuf);
    free(c);
}

int conn_get_gen(uint64_t gen, struct conn **out) {
    int rc = AEE_ECONNRESET;
    pthread_mutex_lock(&g_lock);
    struct conn *c = g_conn;
    if (c != NULL && c->gen == gen) {
        pthread_mutex_lock(&c->mu);
        if (c->state == ST_READY) {
            c->refs++;
            *out = c;
            rc = 0;
        }
        pthread_mutex_unlock(&c->mu);
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

/* ---- requests ------------------------------------------------------------------------------ */

static int id_in_flight(const struct conn *c, uint32_t id) {
    for (unsigned i = 0; i < MAX_SLOTS; i++) {
        if (c->slots[i] != NULL && c->slots[i]->id == id) {
            return 1;
        }
    }
    return 0;
}

int conn_call(struct conn *c, struct conn_request *req) {
    struct waiter w = {.req = req};
    req->npud_code = 0;
    req->dsp_rc = 0;
    unsigned slot = 0;

    pthread_mutex_lock(&c->mu);
    for (;;) {
        if (c->state != ST_READY) {
            int rc = c->dead_rc;
            pthread_mutex_unlock(&c->mu);
            return rc;
        }
        if (req->acquires && c->shutting_down) {
            pthread_mutex_unlock(&c->mu);
            return AEE_ECONNRESET;
        }
        if (c->used < c->nslots) {
            break;
        }
        pthread_cond_wait(&c->cv, &c->mu);
    }
    while (c->slots[slot] != NULL) {
        slot++;
    }
    do {
        w.id = c->next_id++;
    } while (w.id == 0 || id_in_flight(c, w.id));
    c->slots[slot] = &w;
    c->used++;
    size_t max_payload = c->welcome.max_frame_size;
    pthread_mutex_unlock(&c->mu);
    stats_count(req->reply_type);

    struct wbuf b;
    msgpack_packer pk;
    int built = wbuf_start(&b, &pk) == 0;
    if (built) {
        req->encode(req->encode_ctx, &pk, w.id);
        built = wbuf_finish(&b, max_payload) == 0;
    }
    if (!built) {
        int rc = b.failed ? AEE_ENOMEMORY : AEE_EBADPARM; /* too big for a frame */
        wbuf_free(&b);
        pthread_mutex_lock(&c->mu);
        if (c->slots[slot] == &w) {
            c->slots[slot] = NULL;
            c->used--;
            pthread_cond_broadcast(&c->cv);
        } else if (w.done) {
            rc = w.rc; /* the connection ended meanwhile */
        }
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    (void)conn_send(c, b.data, b.len); /* a failure answers every waiter, this one too */
    wbuf_free(&b);

    pthread_mutex_lock(&c->mu);
    while (!w.done) {
        pthread_cond_wait(&c->cv, &c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    return w.rc;
}
