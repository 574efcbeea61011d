/*
 * dspqueue.c -- dspqueue, CPU side, with the rings in memory shared with the DSP.
 *
 * The queues of the process share one "domain" object: the DSP's dspqueue_rpc
 * module (opened by the first dspqueue_create), a 1 KiB process state block
 * mapped into the DSP, and two threads, as libcdsprpc has them without
 * driver signalling (mainline kernels):
 *
 *   - the send thread calls signal() (method 8) whenever a write or a read
 *     wants the DSP woken; requests coalesce;
 *   - the receive thread keeps one wait_signal() (method 6) outstanding, sent
 *     as npud's "wait" invoke (no scheduler slot, no watchdog). When it
 *     returns, it compares the state block's counters with each queue's and
 *     wakes the readers and writers whose counters moved; -1 means cancelled.
 *
 * Packets cross in shared memory only (dspq_ring.c): a batch costs the
 * signal() after a write and the wait_signal() that brings the answer, not a
 * call per packet. With wait counts (a DSP that refuses header version
 * UINT32_MAX and accepts version 2) a side signals only when the other side
 * said it waits.
 *
 * Locks, in this order: g_dq_lock (domains: create, close) -> dom.list_mu
 * (the queues of a domain, its error) -> queue.packet_mu / queue.space_mu
 * (readers and writers that wait, the counters they wait on) -> queue.mu (the
 * rings) -> dom.send_mu (the send thread's flags). Only g_dq_lock is held
 * across calls to the DSP. A lost DSP process (restart, npud gone) shows up as
 * a failed signal or wait_signal, or as a new port_session(): the domain
 * fails, everyone waiting wakes with AEE_ECONNRESET, and the next create
 * starts a new domain.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "AEEStdErr.h"
#include "dspq_ring.h"
#include "dspq_rpc.h"
#include "dspqueue.h"
#include "port.h"
#include "shim.h"

#define SIGNAL_BIT 1u
#define CANCEL_BIT 2u
#define STATE_SIZE 1024u

struct dspq_domain {
    remote_handle64 rpc;
    struct dspq_process_state *state;
    int state_fd;
    uint64_t session;
    pthread_t send_thread;
    pthread_t recv_thread;
    int send_started;
    int recv_started;
    pthread_mutex_t list_mu;
    struct dspqueue *queues[DSPQ_MAX_QUEUES]; /* the ones the receive thread serves */
    unsigned char reserved[DSPQ_MAX_QUEUES];   /* ids in use, under g_dq_lock */
    unsigned nqueues;                          /* the same, counted */
    atomic_int error; /* the AEE code the DSP process was lost with, or 0 */
    pthread_mutex_t send_mu;
    pthread_cond_t send_cv;
    unsigned send_mask;
};

struct dspqueue {
    struct dspq_domain *dom;
    unsigned id;
    void *mem;
    size_t mem_size;
    int mem_fd;
    struct dspq_header *header;
    struct dspq_ring req;
    struct dspq_ring resp;
    uint64_t dsp_id;
    uint32_t queue_count;
    int wait_counts;
    pthread_mutex_t mu;
    uint8_t seq;
    uint32_t req_packets;
    uint32_t resp_spaces;
    pthread_mutex_t packet_mu;
    pthread_cond_t packet_cv;
    uint32_t resp_packet_count;
    int packet_cancel;
    pthread_mutex_t space_mu;
    pthread_cond_t space_cv;
    uint32_t req_space_count;
    int space_cancel;
    dspqueue_callback_t packet_callback;
    dspqueue_callback_t error_callback;
    void *context;
    pthread_t callback_thread;
    int callback_started;
    pthread_t error_thread;
    int error_started;
    int closed; /* torn down, its teardown failed: only a close (which frees it) is valid */
    unsigned forks; /* g_forks when it was made: another value, it is a fork's parent's */
};

static pthread_mutex_t g_dq_lock = PTHREAD_MUTEX_INITIALIZER;
static struct dspq_domain *g_dom;
static uint32_t g_queue_count = 1; /* process-wide, starts non-zero */
static unsigned g_forks; /* forks this process is the child of */

void dspqueue_fork_child(void) {
    /* The domain's threads and DSP process are the parent's: its memory goes (its
     * mutexes may be held by threads the child does not have: freed, not
     * destroyed); the parent's queues answer AEE_ECONNRESET here (their_parents). */
    pthread_mutex_init(&g_dq_lock, NULL);
    free(g_dom);
    g_dom = NULL;
    g_forks++;
}

/* A queue made before this process forked (it is the child): it must not be touched
 * beyond its own memory. */
static int their_parents(const struct dspqueue *q) {
    return q->forks != g_forks;
}

static void init_cond(pthread_cond_t *cv) {
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &attr);
    pthread_condattr_destroy(&attr);
}

static int start_thread(pthread_t *thread, void *(*fn)(void *), void *arg) {
    if (FAULT("pthread_create")) {
        return AEE_ENOMEMORY;
    }
    return pthread_create(thread, NULL, fn, arg) == 0 ? 0 : AEE_ENOMEMORY;
}

/* ---- losing the DSP process --------------------------------------------------------------- */

static void *error_main(void *arg) {
    struct dspqueue *q = arg;
    q->error_callback(q, atomic_load(&q->dom->error), q->context);
    return NULL;
}

/* The DSP process is gone (rc): wake every waiter, stop the send thread, tell
 * each queue's error callback (on a thread of its own, so it may close the queue). */
static void dom_fail(struct dspq_domain *d, int rc) {
    if (rc == (int)0x8000040d || rc == -1) {
        rc = AEE_ECONNRESET; /* the DSP's "bad state": its process died */
    }
    pthread_mutex_lock(&d->list_mu);
    int expected = 0;
    if (atomic_compare_exchange_strong(&d->error, &expected, rc)) {
        shim_log("dspqueue: the DSP process is lost (0x%x)", (unsigned)rc);
        for (unsigned i = 0; i < DSPQ_MAX_QUEUES; i++) {
            struct dspqueue *q = d->queues[i];
            if (q == NULL) {
                continue;
            }
            pthread_mutex_lock(&q->packet_mu);
            pthread_cond_broadcast(&q->packet_cv);
            pthread_mutex_unlock(&q->packet_mu);
            pthread_mutex_lock(&q->space_mu);
            pthread_cond_broadcast(&q->space_cv);
            pthread_mutex_unlock(&q->space_mu);
            if (q->error_callback != NULL && !q->error_started) {
                q->error_started = start_thread(&q->error_thread, error_main, q) == 0;
            }
        }
    }
    pthread_mutex_unlock(&d->list_mu);
    pthread_mutex_lock(&d->send_mu);
    d->send_mask |= CANCEL_BIT;
    pthread_cond_signal(&d->send_cv);
    pthread_mutex_unlock(&d->send_mu);
}

/* 0 while the queue's DSP process lives, its loss's code once it does not. */
static int alive(struct dspqueue *q) {
    struct dspq_domain *d = q->dom;
    int rc = atomic_load(&d->error);
    if (rc == 0 && port_session() != d->session) {
        dom_fail(d, AEE_ECONNRESET);
        rc = atomic_load(&d->error);
    }
    return rc;
}

/* ---- the signal threads -------------------------------------------------------------------- */

static void send_signal(struct dspq_domain *d) {
    pthread_mutex_lock(&d->send_mu);
    d->send_mask |= SIGNAL_BIT;
    pthread_cond_signal(&d->send_cv);
    pthread_mutex_unlock(&d->send_mu);
}

static void *send_main(void *arg) {
    struct dspq_domain *d = arg;
    pthread_mutex_lock(&d->send_mu);
    for (;;) {
        while (d->send_mask == 0) {
            pthread_cond_wait(&d->send_cv, &d->send_mu);
        }
        if (d->send_mask & CANCEL_BIT) {
            break;
        }
        d->send_mask &= ~SIGNAL_BIT;
        pthread_mutex_unlock(&d->send_mu);
        int rc = dspq_rpc_signal(d->rpc);
        if (rc != 0) {
            dom_fail(d, rc);
        }
        pthread_mutex_lock(&d->send_mu);
    }
    pthread_mutex_unlock(&d->send_mu);
    return NULL;
}

static void *recv_main(void *arg) {
    struct dspq_domain *d = arg;
    for (;;) {
        int32_t signal = 0;
        int rc = dspq_rpc_wait_signal(d->rpc, &signal);
        if (rc != 0) {
            dom_fail(d, rc);
            return NULL;
        }
        if (signal == -1) {
            return NULL; /* cancel_wait_signal */
        }
        pthread_mutex_lock(&d->list_mu);
        for (unsigned i = 0; i < DSPQ_MAX_QUEUES; i++) {
            struct dspqueue *q = d->queues[i];
            if (q == NULL) {
                continue;
            }
            uint32_t packets = dspq_load(&d->state->resp_packet_count[i]);
            uint32_t spaces = dspq_load(&d->state->req_space_count[i]);
            pthread_mutex_lock(&q->packet_mu);
            if (q->resp_packet_count != packets) {
                q->resp_packet_count = packets;
                pthread_cond_broadcast(&q->packet_cv);
            }
            pthread_mutex_unlock(&q->packet_mu);
            pthread_mutex_lock(&q->space_mu);
            if (q->req_space_count != spaces) {
                q->req_space_count = spaces;
                pthread_cond_broadcast(&q->space_cv);
            }
            pthread_mutex_unlock(&q->space_mu);
        }
        pthread_mutex_unlock(&d->list_mu);
    }
}

/* ---- the domain ------------------------------------------------------------------------------ */

#define CANCEL_TRIES 3

/* The DSP process or npud is gone: the wait returned (or will) on its own. */
static int dom_lost(struct dspq_domain *d) {
    return atomic_load(&d->error) == AEE_ECONNRESET;
}

static void dom_free(struct dspq_domain *d) {
    pthread_cond_destroy(&d->send_cv);
    pthread_mutex_destroy(&d->send_mu);
    pthread_mutex_destroy(&d->list_mu);
    free(d);
}

/* Stop the threads and let go of the DSP side. Called under g_dq_lock when the
 * last queue of the domain closes, or when making the domain failed. */
static int dom_destroy(struct dspq_domain *d) {
    int rc = 0;
    int lost = atomic_load(&d->error) != 0;
    if (d->recv_started) {
        /* A cancel that could not be sent (a failed allocation, a send cut short) is
         * tried again: without it the wait, its thread and d stay until the process
         * ends. */
        int cancelled = dspq_rpc_cancel_wait_signal(d->rpc);
        for (int again = 0; cancelled != 0 && again < CANCEL_TRIES && !dom_lost(d); again++) {
            cancelled = dspq_rpc_cancel_wait_signal(d->rpc);
        }
        if (cancelled != 0 && port_session() == d->session) {
            /* The wait is still on the DSP, which did not let it go: it returns
             * only when the DSP or npud goes, and the thread with it. Leave the
             * thread, the handle and d to that (closing the handle would wait
             * for the wait). */
            shim_log("dspqueue: cancel_wait_signal failed (0x%x)", (unsigned)cancelled);
            dom_fail(d, cancelled);
            pthread_detach(d->recv_thread);
            return lost ? 0 : cancelled;
        }
        pthread_join(d->recv_thread, NULL);
    }
    if (d->send_started) {
        pthread_mutex_lock(&d->send_mu);
        d->send_mask |= CANCEL_BIT;
        pthread_cond_signal(&d->send_cv);
        pthread_mutex_unlock(&d->send_mu);
        pthread_join(d->send_thread, NULL);
    }
    if (d->state != NULL) {
        if (d->state_fd > 0) {
            int unmapped = port_munmap(d->state_fd, d->state, STATE_SIZE);
            if (rc == 0 && !lost) {
                rc = unmapped;
            }
        }
        port_free(d->state);
    }
    if (d->rpc != 0) {
        int closed = port_close(d->rpc);
        if (rc == 0 && !lost) {
            rc = closed;
        }
    }
    dom_free(d);
    return rc;
}

static int dom_create(struct dspq_domain **out) {
    struct dspq_domain *d = x_calloc(1, sizeof(*d));
    if (d == NULL) {
        return AEE_ENOMEMORY;
    }
    pthread_mutex_init(&d->list_mu, NULL);
    pthread_mutex_init(&d->send_mu, NULL);
    init_cond(&d->send_cv);
    d->state_fd = -1;

    int rc = port_open(DSPQ_RPC_URI "&_dom=cdsp&_session=0", &d->rpc);
    if (rc != 0) {
        shim_log("dspqueue: the DSP has no dspqueue_rpc module (0x%x)", (unsigned)rc);
        d->rpc = 0;
        dom_free(d);
        return rc == AEE_ECONNRESET ? rc : AEE_EUNSUPPORTED; /* as libcdsprpc */
    }
    /* the process the module was opened in (npud announces a new one before any
     * answer from it, so this is the open's) */
    d->session = port_session();
    void *state = NULL;
    rc = port_alloc(STATE_SIZE, &state);
    if (rc != 0) {
        goto fail;
    }
    d->state = state;
    d->state_fd = port_to_fd(state);
    if (d->state_fd <= 0) {
        rc = AEE_ERPC;
        goto fail;
    }
    rc = port_mmap(d->state_fd, state, STATE_SIZE);
    if (rc != 0) {
        d->state_fd = -1;
        goto fail;
    }
    rc = dspq_rpc_init_process_state(d->rpc, d->state_fd);
    if (rc != 0) {
        goto fail;
    }
    rc = start_thread(&d->send_thread, send_main, d);
    if (rc != 0) {
        goto fail;
    }
    d->send_started = 1;
    rc = start_thread(&d->recv_thread, recv_main, d);
    if (rc != 0) {
        goto fail;
    }
    d->recv_started = 1;
    *out = d;
    return 0;
fail:
    atomic_store(&d->error, rc); /* nothing to signal: undo quietly */
    dom_destroy(d);
    return rc;
}

/* ---- queues --------------------------------------------------------------------------------- */

static void queue_free(struct dspqueue *q) {
    pthread_cond_destroy(&q->space_cv);
    pthread_mutex_destroy(&q->space_mu);
    pthread_cond_destroy(&q->packet_cv);
    pthread_mutex_destroy(&q->packet_mu);
    pthread_mutex_destroy(&q->mu);
    free(q);
}

/* Wait until the DSP moves the counter of which (packets or space), the deadline
 * passes (NULL: never) or the wait ends otherwise. The matching mutex is held. */
static int wait_locked(struct dspqueue *q, int packets, const struct timespec *deadline) {
    pthread_cond_t *cv = packets ? &q->packet_cv : &q->space_cv;
    pthread_mutex_t *mu = packets ? &q->packet_mu : &q->space_mu;
    uint32_t *count = packets ? &q->resp_packet_count : &q->req_space_count;
    int *cancel = packets ? &q->packet_cancel : &q->space_cancel;
    uint32_t seen = *count;
    while (seen == *count) {
        int lost = atomic_load(&q->dom->error);
        if (lost != 0) {
            return lost;
        }
        if (*cancel) {
            return AEE_EINTERRUPTED;
        }
        if (deadline == NULL) {
            pthread_cond_wait(cv, mu);
        } else if (pthread_cond_timedwait(cv, mu, deadline) == ETIMEDOUT) {
            return AEE_EEXPIRED;
        }
    }
    return 0;
}

static void deadline_after(struct timespec *ts, uint32_t us) {
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += us / 1000000;
    ts->tv_nsec += (long)(us % 1000000) * 1000;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

static int buffer_delta(uint32_t flags, int *delta) {
    int ref = (flags & DSPQUEUE_BUFFER_FLAG_REF) != 0;
    int deref = (flags & DSPQUEUE_BUFFER_FLAG_DEREF) != 0;
    if (ref && deref) {
        return AEE_EBADPARM;
    }
    *delta = ref ? 1 : deref ? -1 : 0;
    return 0;
}

static void undo_refs(const struct dspqueue_buffer *buffers, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        int delta = 0;
        if (buffer_delta(buffers[i].flags, &delta) == 0 && delta != 0) {
            (void)port_buffer_ref((int)buffers[i].fd, -delta, NULL, NULL);
        }
    }
}

static int write_noblock(struct dspqueue *q, uint32_t flags, uint32_t num_buffers,
                         struct dspqueue_buffer *buffers, uint32_t message_length,
                         const uint8_t *message) {
    if (num_buffers > DSPQ_MAX_BUFFERS || message_length > DSPQ_MAX_MESSAGE ||
        (num_buffers > 0 && buffers == NULL) || (message_length > 0 && message == NULL)) {
        return AEE_EBADPARM;
    }
    flags &= ~(uint32_t)(DSPQUEUE_PACKET_FLAG_BUFFERS | DSPQUEUE_PACKET_FLAG_MESSAGE);
    if (num_buffers > 0) {
        flags |= DSPQUEUE_PACKET_FLAG_BUFFERS;
    }
    if (message_length > 0) {
        flags |= DSPQUEUE_PACKET_FLAG_MESSAGE;
    }
    uint32_t len = 8 + num_buffers * DSPQ_BUFFER_ENTRY + message_length;
    uint32_t alen = (len + 7) & ~7u;
    if (alen > q->req.size - 8) {
        return AEE_EBADPARM;
    }
    pthread_mutex_lock(&q->mu);
    int rc = atomic_load(&q->dom->error);
    if (rc == 0 && q->header->queue_count != q->queue_count) {
        rc = AEE_ERPC;
    }
    if (rc == 0) {
        rc = dspq_ring_room(&q->req, alen);
    }
    uint32_t refs = 0;
    for (uint32_t i = 0; rc == 0 && i < num_buffers; i++) {
        struct dspqueue_buffer *b = &buffers[i];
        int delta = 0;
        void *va = NULL;
        size_t size = 0;
        rc = buffer_delta(b->flags, &delta);
        if (rc == 0) {
            rc = port_buffer_ref((int)b->fd, delta, &va, &size);
        }
        if (rc != 0) {
            break;
        }
        refs = i + 1;
        if (b->size != 0 ? (uint64_t)b->offset + b->size > size : b->offset != 0) {
            rc = AEE_EBADPARM;
        }
    }
    if (rc != 0) {
        undo_refs(buffers, refs);
        pthread_mutex_unlock(&q->mu);
        return rc;
    }
    uint64_t header =
        dspq_packet_header(len, flags | DSPQUEUE_PACKET_FLAG_USER_READY, num_buffers, q->seq);
    dspq_ring_put(&q->req, header, buffers, num_buffers * DSPQ_BUFFER_ENTRY, message,
                  message_length);
    q->seq++;
    dspq_store(&q->dom->state->req_packet_count[q->id], ++q->req_packets);
    dspq_barrier_full();
    if (!q->wait_counts || dspq_load(&q->req.read->wait_count) != 0) {
        send_signal(q->dom); /* the DSP may be asleep: wake it */
    }
    pthread_mutex_unlock(&q->mu);
    return 0;
}

static int read_noblock(struct dspqueue *q, uint32_t *flags, uint32_t max_buffers,
                        uint32_t *num_buffers, struct dspqueue_buffer *buffers,
                        uint32_t max_message_length, uint32_t *message_length,
                        uint8_t *message) {
    pthread_mutex_lock(&q->mu);
again:;
    int rc = atomic_load(&q->dom->error);
    if (rc == 0 && q->header->queue_count != q->queue_count) {
        rc = AEE_ERPC;
    }
    uint64_t header = 0;
    if (rc == 0) {
        rc = dspq_ring_peek(&q->resp, &header);
    }
    uint32_t len = (uint32_t)(header & 0xffffffffu);
    uint32_t f = (uint32_t)(header >> 32) & 0xffff;
    uint32_t nb = f & DSPQUEUE_PACKET_FLAG_BUFFERS ? (uint32_t)(header >> 48) & 0xff : 0;
    if (rc == 0 && (len < 8 + nb * DSPQ_BUFFER_ENTRY || len > q->resp.size - 8 ||
                    nb > DSPQ_MAX_BUFFERS || !(f & DSPQUEUE_PACKET_FLAG_USER_READY))) {
        rc = AEE_EBADITEM;
    }
    uint32_t ml = f & DSPQUEUE_PACKET_FLAG_MESSAGE ? len - 8 - nb * DSPQ_BUFFER_ENTRY : 0;
    if (rc == 0 && ((buffers != NULL && max_buffers < nb) ||
                    (message != NULL && max_message_length < ml))) {
        rc = AEE_EBADPARM; /* the caller's room is too small: the packet stays */
    }
    if (rc != 0) {
        pthread_mutex_unlock(&q->mu);
        return rc;
    }
    dspq_ring_take(&q->resp, len, buffers, nb * DSPQ_BUFFER_ENTRY, message, ml);
    dspq_store(&q->dom->state->resp_space_count[q->id], ++q->resp_spaces);
    dspq_barrier_full();
    if (!q->wait_counts || dspq_load(&q->resp.write->wait_count) != 0) {
        send_signal(q->dom); /* the DSP may wait for room */
    }
    if (f & DSPQUEUE_PACKET_FLAG_WAKEUP) {
        goto again; /* an early wakeup: the answer follows, maybe already there */
    }
    uint32_t refs = 0;
    for (uint32_t i = 0; buffers != NULL && i < nb; i++) {
        struct dspqueue_buffer *b = &buffers[i];
        int delta = 0;
        void *va = NULL;
        size_t size = 0;
        rc = buffer_delta(b->flags, &delta);
        if (rc == 0) {
            rc = port_buffer_ref((int)b->fd, delta, &va, &size);
        }
        if (rc != 0) {
            break;
        }
        refs = i + 1;
        if (b->size != 0) {
            if ((uint64_t)b->offset + b->size > size) {
                rc = AEE_EBADITEM;
                break;
            }
        } else if (b->offset != 0) {
            rc = AEE_EBADITEM;
            break;
        } else {
            b->size = (uint32_t)size;
        }
        b->ptr = (char *)va + b->offset; /* this process's address of fd + offset */
    }
    if (rc != 0) {
        undo_refs(buffers, refs);
        pthread_mutex_unlock(&q->mu);
        return rc;
    }
    if (flags != NULL) {
        *flags = f;
    }
    if (num_buffers != NULL) {
        *num_buffers = nb;
    }
    if (message_length != NULL) {
        *message_length = ml;
    }
    pthread_mutex_unlock(&q->mu);
    return 0;
}

static void *callback_main(void *arg) {
    struct dspqueue *q = arg;
    uint32_t seen = 0;
    pthread_mutex_lock(&q->packet_mu);
    for (;;) {
        if (q->packet_cancel || atomic_load(&q->dom->error) != 0) {
            break;
        }
        uint32_t written = dspq_load(&q->resp.write->packet_count);
        if (written != seen) {
            seen = written;
            pthread_mutex_unlock(&q->packet_mu);
            q->packet_callback(q, 0, q->context);
            pthread_mutex_lock(&q->packet_mu);
            continue;
        }
        if (q->wait_counts) {
            __atomic_fetch_add(&q->resp.read->wait_count, 1, __ATOMIC_SEQ_CST);
        }
        if (dspq_load(&q->resp.write->packet_count) == seen) {
            (void)wait_locked(q, 1, NULL);
        }
        if (q->wait_counts) {
            __atomic_fetch_sub(&q->resp.read->wait_count, 1, __ATOMIC_SEQ_CST);
        }
    }
    pthread_mutex_unlock(&q->packet_mu);
    return NULL;
}

/* Make queue q of the domain d in slot id. */
static int queue_create(struct dspq_domain *d, unsigned id, uint32_t count, uint32_t req,
                        uint32_t resp, struct dspqueue *q) {
    q->dom = d;
    q->id = id;
    q->queue_count = count;
    q->mem_size = dspq_block_size(req, resp);
    if (dspq_barriers_init()) {
        shim_log("dspqueue: inner-shareable barriers (NPUD_SHIM_BARRIERS=inner)");
    }
    int rc = port_alloc(q->mem_size, &q->mem);
    if (rc != 0) {
        return rc;
    }
    q->mem_fd = port_to_fd(q->mem);
    if (q->mem_fd <= 0) {
        rc = AEE_ERPC;
        goto free_mem;
    }
    rc = port_mmap(q->mem_fd, q->mem, q->mem_size);
    if (rc != 0) {
        goto free_mem;
    }
    q->header = q->mem;
    memset(q->mem, 0, q->mem_size);
    q->header->version = 1;
    q->header->queue_count = count;
    dspq_layout(q->header, req, resp);
    dspq_ring_of(q->header, 0, &q->req);
    dspq_ring_of(q->header, 1, &q->resp);
    dspq_store(&d->state->req_packet_count[id], 0);
    dspq_store(&d->state->resp_space_count[id], 0);

    /* A DSP that checks versions refuses this one, and then takes version 2
     * with wait counts; one that accepts it is an old DSP without them. */
    q->header->version = DSPQ_VERSION_PROBE;
    shim_log_expect(AEE_EUNSUPPORTED); /* the answer of a DSP that checks: no error */
    rc = dspq_rpc_create_queue(d->rpc, id, q->mem_fd, count, &q->dsp_id);
    shim_log_expect(0);
    if (rc == AEE_EUNSUPPORTED || rc == (int)(DSP_AEE_EOFFSET + AEE_EUNSUPPORTED)) {
        q->header->version = DSPQ_VERSION;
        q->header->flags = DSPQ_FLAG_WAIT_COUNTS;
        rc = dspq_rpc_create_queue(d->rpc, id, q->mem_fd, count, &q->dsp_id);
        q->wait_counts = 1;
    }
    if (rc != 0) {
        goto unmap;
    }
    if (q->packet_callback != NULL) {
        rc = start_thread(&q->callback_thread, callback_main, q);
        if (rc != 0) {
            (void)dspq_rpc_destroy_queue(d->rpc, q->dsp_id);
            goto unmap;
        }
        q->callback_started = 1;
    }
    return 0;
unmap:
    (void)port_munmap(q->mem_fd, q->mem, q->mem_size);
free_mem:
    port_free(q->mem);
    q->mem = NULL;
    return rc;
}

/* ---- the exported functions ------------------------------------------------------------------ */

SHIM_API AEEResult dspqueue_create(int domain, uint32_t flags, uint32_t req_queue_size,
                                   uint32_t resp_queue_size, dspqueue_callback_t packet_callback,
                                   dspqueue_callback_t error_callback, void *callback_context,
                                   dspqueue_t *queue) {
    if (queue == NULL) {
        return AEE_EBADPARM;
    }
    *queue = NULL;
    int rc = shim_check_domain(domain);
    if (rc != 0) {
        return rc;
    }
    if (flags != 0 || req_queue_size > DSPQ_MAX_QUEUE_SIZE ||
        resp_queue_size > DSPQ_MAX_QUEUE_SIZE) {
        return AEE_EBADPARM;
    }
    uint32_t req = req_queue_size != 0 ? req_queue_size : DSPQ_DEFAULT_REQ_SIZE;
    uint32_t resp = resp_queue_size != 0 ? resp_queue_size : DSPQ_DEFAULT_RESP_SIZE;
    req = (req + 7) & ~7u; /* positions are multiples of 8 */
    resp = (resp + 7) & ~7u;

    struct dspqueue *q = x_calloc(1, sizeof(*q));
    if (q == NULL) {
        return AEE_ENOMEMORY;
    }
    pthread_mutex_init(&q->mu, NULL);
    pthread_mutex_init(&q->packet_mu, NULL);
    pthread_mutex_init(&q->space_mu, NULL);
    init_cond(&q->packet_cv);
    init_cond(&q->space_cv);
    q->packet_callback = packet_callback;
    q->error_callback = error_callback;
    q->context = callback_context;
    q->forks = g_forks;

    pthread_mutex_lock(&g_dq_lock);
    struct dspq_domain *d = g_dom;
    if (d != NULL && (atomic_load(&d->error) != 0 || d->session != port_session())) {
        /* the process it served is gone: its queues keep it until they close */
        if (atomic_load(&d->error) == 0) {
            dom_fail(d, AEE_ECONNRESET);
        }
        g_dom = NULL;
        if (d->nqueues == 0) {
            dom_destroy(d);
        }
        d = NULL;
    }
    if (d == NULL) {
        rc = dom_create(&d);
        if (rc != 0) {
            pthread_mutex_unlock(&g_dq_lock);
            queue_free(q);
            return rc;
        }
        g_dom = d;
    }
    unsigned id = 0;
    while (id < DSPQ_MAX_QUEUES && d->reserved[id]) {
        id++;
    }
    if (id >= DSPQ_MAX_QUEUES) {
        rc = AEE_EBADPARM; /* 64 queues per process */
    } else {
        rc = queue_create(d, id, g_queue_count++, req, resp, q);
    }
    if (rc == 0) {
        d->reserved[id] = 1;
        d->nqueues++;
        pthread_mutex_lock(&d->list_mu);
        d->queues[id] = q;
        pthread_mutex_unlock(&d->list_mu);
        *queue = q;
    } else if (d->nqueues == 0) {
        g_dom = NULL;
        dom_destroy(d);
    }
    pthread_mutex_unlock(&g_dq_lock);
    if (rc != 0) {
        queue_free(q);
    }
    return rc;
}

SHIM_API AEEResult dspqueue_close(dspqueue_t queue) {
    struct dspqueue *q = queue;
    if (q == NULL) {
        return AEE_EBADPARM;
    }
    if (q->closed) {
        queue_free(q); /* the husk of a failed teardown */
        return 0;
    }
    if (their_parents(q)) {
        /* the parent's queue, in a fork's child: the child's copy of its memory goes,
         * the parent's queue stays the parent's */
        port_free(q->mem);
        free(q);
        return 0;
    }
    struct dspq_domain *d = q->dom;
    int rc = 0;
    if (alive(q) == 0) {
        int32_t imported = 0;
        rc = dspq_rpc_is_imported(d->rpc, q->dsp_id, &imported);
        if (rc == AEE_ECONNRESET) {
            dom_fail(d, rc);
            rc = 0;
        } else if (rc != 0) {
            return rc;
        } else if (imported) {
            return AEE_EBADPARM; /* the DSP still uses it */
        }
    }
    if (q->header->queue_count != q->queue_count) {
        return AEE_ERPC;
    }
    pthread_mutex_lock(&d->list_mu);
    d->queues[q->id] = NULL;
    int error_started = q->error_started;
    pthread_mutex_unlock(&d->list_mu);
    if (error_started) {
        if (pthread_equal(pthread_self(), q->error_thread)) {
            pthread_detach(q->error_thread); /* closed from its own error callback */
        } else {
            pthread_join(q->error_thread, NULL);
        }
    }
    pthread_mutex_lock(&q->packet_mu);
    q->packet_cancel = 1;
    pthread_cond_broadcast(&q->packet_cv);
    pthread_mutex_unlock(&q->packet_mu);
    pthread_mutex_lock(&q->space_mu);
    q->space_cancel = 1;
    pthread_cond_broadcast(&q->space_cv);
    pthread_mutex_unlock(&q->space_mu);
    if (q->callback_started) {
        pthread_join(q->callback_thread, NULL);
    }
    /* From here on the queue goes whatever fails. What failed is returned, as
     * libcdsprpc returns it; the queue is torn down all the same (its memory, fds
     * and id let go) and stays as a closed husk: every call on it but close is
     * AEE_EBADPARM, and a close frees it (0). A program that never closes it
     * again leaves the husk, a few hundred bytes. */
    int lost = atomic_load(&d->error) != 0;
    int destroyed = lost ? 0 : dspq_rpc_destroy_queue(d->rpc, q->dsp_id);
    int unmapped = port_munmap(q->mem_fd, q->mem, q->mem_size);
    if (!lost && (destroyed != 0 || unmapped != 0)) {
        shim_log("dspqueue: closing queue %u: destroy 0x%x, munmap 0x%x", q->id,
                 (unsigned)destroyed, (unsigned)unmapped);
        rc = destroyed != 0 ? destroyed : unmapped;
    }
    port_free(q->mem);
    q->mem = NULL;
    unsigned id = q->id;

    pthread_mutex_lock(&g_dq_lock);
    d->reserved[id] = 0;
    if (--d->nqueues == 0) {
        if (g_dom == d) {
            g_dom = NULL;
        }
        int down = dom_destroy(d);
        if (down != 0) {
            shim_log("dspqueue: the last queue's teardown failed (0x%x)", (unsigned)down);
            if (rc == 0) {
                rc = down;
            }
        }
    }
    pthread_mutex_unlock(&g_dq_lock);
    q->dom = NULL;
    if (rc != 0) {
        q->closed = 1;
        return rc;
    }
    queue_free(q);
    return 0;
}

SHIM_API AEEResult dspqueue_export(dspqueue_t queue, uint64_t *queue_id) {
    if (queue == NULL || queue_id == NULL || queue->closed) {
        return AEE_EBADPARM;
    }
    if (their_parents(queue)) {
        return AEE_ECONNRESET;
    }
    *queue_id = queue->dsp_id;
    return 0;
}

SHIM_API AEEResult dspqueue_write(dspqueue_t queue, uint32_t flags, uint32_t num_buffers,
                                  struct dspqueue_buffer *buffers, uint32_t message_length,
                                  const uint8_t *message, uint32_t timeout_us) {
    struct dspqueue *q = queue;
    if (q == NULL || q->closed) {
        return AEE_EBADPARM;
    }
    if (their_parents(q)) {
        return AEE_ECONNRESET;
    }
    int rc = alive(q);
    if (rc != 0) {
        return rc;
    }
    struct timespec deadline;
    if (timeout_us != DSPQUEUE_TIMEOUT_NONE) {
        deadline_after(&deadline, timeout_us);
    }
    int waiting = 0;
    pthread_mutex_lock(&q->space_mu);
    rc = write_noblock(q, flags, num_buffers, buffers, message_length, message);
    if (rc == AEE_EWOULDBLOCK && q->wait_counts) {
        __atomic_fetch_add(&q->req.write->wait_count, 1, __ATOMIC_SEQ_CST);
        waiting = 1;
        rc = write_noblock(q, flags, num_buffers, buffers, message_length, message);
    }
    while (rc == AEE_EWOULDBLOCK) {
        rc = wait_locked(q, 0, timeout_us != DSPQUEUE_TIMEOUT_NONE ? &deadline : NULL);
        if (rc == 0) {
            rc = write_noblock(q, flags, num_buffers, buffers, message_length, message);
        }
    }
    if (waiting) {
        __atomic_fetch_sub(&q->req.write->wait_count, 1, __ATOMIC_SEQ_CST);
    }
    pthread_mutex_unlock(&q->space_mu);
    return rc;
}

SHIM_API AEEResult dspqueue_read_noblock(dspqueue_t queue, uint32_t *flags, uint32_t max_buffers,
                                         uint32_t *num_buffers, struct dspqueue_buffer *buffers,
                                         uint32_t max_message_length, uint32_t *message_length,
                                         uint8_t *message) {
    struct dspqueue *q = queue;
    if (q == NULL || q->closed) {
        return AEE_EBADPARM;
    }
    if (their_parents(q)) {
        return AEE_ECONNRESET;
    }
    int rc = alive(q);
    if (rc != 0) {
        return rc;
    }
    return read_noblock(q, flags, max_buffers, num_buffers, buffers, max_message_length,
                        message_length, message);
}

SHIM_API AEEResult dspqueue_read(dspqueue_t queue, uint32_t *flags, uint32_t max_buffers,
                                 uint32_t *num_buffers, struct dspqueue_buffer *buffers,
                                 uint32_t max_message_length, uint32_t *message_length,
                                 uint8_t *message, uint32_t timeout_us) {
    struct dspqueue *q = queue;
    if (q == NULL || q->closed) {
        return AEE_EBADPARM;
    }
    if (their_parents(q)) {
        return AEE_ECONNRESET;
    }
    int rc = alive(q);
    if (rc != 0) {
        return rc;
    }
    struct timespec deadline;
    if (timeout_us != DSPQUEUE_TIMEOUT_NONE) {
        deadline_after(&deadline, timeout_us);
    }
    int waiting = 0;
    pthread_mutex_lock(&q->packet_mu);
    rc = read_noblock(q, flags, max_buffers, num_buffers, buffers, max_message_length,
                      message_length, message);
    if (rc == AEE_EWOULDBLOCK && q->wait_counts) {
        __atomic_fetch_add(&q->resp.read->wait_count, 1, __ATOMIC_SEQ_CST);
        waiting = 1;
        rc = read_noblock(q, flags, max_buffers, num_buffers, buffers, max_message_length,
                          message_length, message);
    }
    while (rc == AEE_EWOULDBLOCK) {
        rc = wait_locked(q, 1, timeout_us != DSPQUEUE_TIMEOUT_NONE ? &deadline : NULL);
        if (rc == 0) {
            rc = read_noblock(q, flags, max_buffers, num_buffers, buffers, max_message_length,
                              message_length, message);
        }
    }
    if (waiting) {
        __atomic_fetch_sub(&q->resp.read->wait_count, 1, __ATOMIC_SEQ_CST);
    }
    pthread_mutex_unlock(&q->packet_mu);
    return rc;
}
