/*
 * conn.c -- a connection to npud: its references, its end, and the requests it
 * carries (its other parts: conn_internal.h).
 *
 * Locks: g_lock (conn_current.c: which connection is current; held while one is
 * made, so threads that need one wait for it), then conn.mu (state, waiters, epoch),
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
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "AEEStdErr.h"
#include "conn.h"
#include "conn_internal.h"
#include "shim.h"
#include "wire.h"

/* generation << 32 | epoch of the live connection, 0 when there is none. */
static _Atomic uint64_t g_live;

/* Bit 31 of the epoch half: a restart was seen (an answer said DSP_RESTARTED) and
 * its session_restarted has not come yet. npud sends that event before any answer
 * from the new session, so nothing can be made in between. */
#define RESTART_SEEN 0x80000000u

static uint64_t live_token(uint64_t gen, uint64_t epoch) {
    return gen << 32 | (epoch & 0x7fffffffu);
}

void conn_clear_live(void) {
    atomic_store(&g_live, 0);
}

void conn_mark_live(const struct conn *c, uint64_t epoch, int restart_seen) {
    atomic_store(&g_live, live_token(c->gen, epoch) | (restart_seen ? RESTART_SEEN : 0u));
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

void conn_close_records(struct conn *c) {
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
    conn_close_records(c);
    free(c->rbuf);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->send_mu);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* The connection is over: every waiter fails with rc, the reader wakes up. */
void conn_kill(struct conn *c, int rc) {
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
int conn_send(struct conn *c, const char *data, size_t len) {
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
