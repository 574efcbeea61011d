/*
 * dspq_domain.c -- the domain that the queues of a process share (see dspqueue.c):
 * the DSP's dspqueue_rpc module, the 1 KiB process state block mapped into the
 * DSP, the send thread (signal(), method 8) and the receive thread (one
 * wait_signal(), method 6, outstanding), and what happens when the DSP process
 * is lost: every waiter wakes, each queue's error callback is told.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "AEEStdErr.h"
#include "dspq_queue.h"
#include "dspq_rpc.h"
#include "port.h"
#include "shim.h"

void dspq_init_cond(pthread_cond_t *cv) {
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &attr);
    pthread_condattr_destroy(&attr);
}

int dspq_start_thread(pthread_t *thread, void *(*fn)(void *), void *arg) {
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
void dspq_dom_fail(struct dspq_domain *d, int rc) {
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
                q->error_started = dspq_start_thread(&q->error_thread, error_main, q) == 0;
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
int dspq_alive(struct dspqueue *q) {
    struct dspq_domain *d = q->dom;
    int rc = atomic_load(&d->error);
    if (rc == 0 && port_session() != d->session) {
        dspq_dom_fail(d, AEE_ECONNRESET);
        rc = atomic_load(&d->error);
    }
    return rc;
}

/* ---- the signal threads -------------------------------------------------------------------- */

void dspq_send_signal(struct dspq_domain *d) {
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
            dspq_dom_fail(d, rc);
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
            dspq_dom_fail(d, rc);
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
int dspq_dom_destroy(struct dspq_domain *d) {
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
            dspq_dom_fail(d, cancelled);
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

int dspq_dom_create(struct dspq_domain **out) {
    struct dspq_domain *d = x_calloc(1, sizeof(*d));
    if (d == NULL) {
        return AEE_ENOMEMORY;
    }
    pthread_mutex_init(&d->list_mu, NULL);
    pthread_mutex_init(&d->send_mu, NULL);
    dspq_init_cond(&d->send_cv);
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
    rc = dspq_start_thread(&d->send_thread, send_main, d);
    if (rc != 0) {
        goto fail;
    }
    d->send_started = 1;
    rc = dspq_start_thread(&d->recv_thread, recv_main, d);
    if (rc != 0) {
        goto fail;
    }
    d->recv_started = 1;
    *out = d;
    return 0;
fail:
    atomic_store(&d->error, rc); /* nothing to signal: undo quietly */
    dspq_dom_destroy(d);
    return rc;
}
