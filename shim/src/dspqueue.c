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
 * Packets cross in shared memory only (dspq_ring.c, dspq_packets.c): a batch costs the
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
 *
 * This file holds the exported API and a queue's making and closing; the domain
 * and its threads are dspq_domain.c, a packet's way in and out dspq_packets.c
 * (dspq_queue.h lists the parts).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "AEEStdErr.h"
#include "dspq_queue.h"
#include "dspq_ring.h"
#include "dspq_rpc.h"
#include "dspqueue.h"
#include "port.h"
#include "shim.h"

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

/* ---- queues --------------------------------------------------------------------------------- */

static void queue_free(struct dspqueue *q) {
    pthread_cond_destroy(&q->space_cv);
    pthread_mutex_destroy(&q->space_mu);
    pthread_cond_destroy(&q->packet_cv);
    pthread_mutex_destroy(&q->packet_mu);
    pthread_mutex_destroy(&q->mu);
    free(q);
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
            (void)dspq_wait_locked(q, 1, NULL);
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
        rc = dspq_start_thread(&q->callback_thread, callback_main, q);
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
    dspq_init_cond(&q->packet_cv);
    dspq_init_cond(&q->space_cv);
    q->packet_callback = packet_callback;
    q->error_callback = error_callback;
    q->context = callback_context;
    q->forks = g_forks;

    pthread_mutex_lock(&g_dq_lock);
    struct dspq_domain *d = g_dom;
    if (d != NULL && (atomic_load(&d->error) != 0 || d->session != port_session())) {
        /* the process it served is gone: its queues keep it until they close */
        if (atomic_load(&d->error) == 0) {
            dspq_dom_fail(d, AEE_ECONNRESET);
        }
        g_dom = NULL;
        if (d->nqueues == 0) {
            dspq_dom_destroy(d);
        }
        d = NULL;
    }
    if (d == NULL) {
        rc = dspq_dom_create(&d);
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
        dspq_dom_destroy(d);
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
    if (dspq_alive(q) == 0) {
        int32_t imported = 0;
        rc = dspq_rpc_is_imported(d->rpc, q->dsp_id, &imported);
        if (rc == AEE_ECONNRESET) {
            dspq_dom_fail(d, rc);
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
        int down = dspq_dom_destroy(d);
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
    int rc = dspq_alive(q);
    if (rc != 0) {
        return rc;
    }
    struct timespec deadline;
    if (timeout_us != DSPQUEUE_TIMEOUT_NONE) {
        dspq_deadline_after(&deadline, timeout_us);
    }
    int waiting = 0;
    pthread_mutex_lock(&q->space_mu);
    rc = dspq_write_noblock(q, flags, num_buffers, buffers, message_length, message);
    if (rc == AEE_EWOULDBLOCK && q->wait_counts) {
        __atomic_fetch_add(&q->req.write->wait_count, 1, __ATOMIC_SEQ_CST);
        waiting = 1;
        rc = dspq_write_noblock(q, flags, num_buffers, buffers, message_length, message);
    }
    while (rc == AEE_EWOULDBLOCK) {
        rc = dspq_wait_locked(q, 0, timeout_us != DSPQUEUE_TIMEOUT_NONE ? &deadline : NULL);
        if (rc == 0) {
            rc = dspq_write_noblock(q, flags, num_buffers, buffers, message_length, message);
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
    int rc = dspq_alive(q);
    if (rc != 0) {
        return rc;
    }
    return dspq_read_noblock(q, flags, max_buffers, num_buffers, buffers, max_message_length,
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
    int rc = dspq_alive(q);
    if (rc != 0) {
        return rc;
    }
    struct timespec deadline;
    if (timeout_us != DSPQUEUE_TIMEOUT_NONE) {
        dspq_deadline_after(&deadline, timeout_us);
    }
    int waiting = 0;
    pthread_mutex_lock(&q->packet_mu);
    rc = dspq_read_noblock(q, flags, max_buffers, num_buffers, buffers, max_message_length,
                      message_length, message);
    if (rc == AEE_EWOULDBLOCK && q->wait_counts) {
        __atomic_fetch_add(&q->resp.read->wait_count, 1, __ATOMIC_SEQ_CST);
        waiting = 1;
        rc = dspq_read_noblock(q, flags, max_buffers, num_buffers, buffers, max_message_length,
                          message_length, message);
    }
    while (rc == AEE_EWOULDBLOCK) {
        rc = dspq_wait_locked(q, 1, timeout_us != DSPQUEUE_TIMEOUT_NONE ? &deadline : NULL);
        if (rc == 0) {
            rc = dspq_read_noblock(q, flags, max_buffers, num_buffers, buffers, max_message_length,
                              message_length, message);
        }
    }
    if (waiting) {
        __atomic_fetch_sub(&q->resp.read->wait_count, 1, __ATOMIC_SEQ_CST);
    }
    pthread_mutex_unlock(&q->packet_mu);
    return rc;
}
