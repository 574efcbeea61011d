/*
 * dspq_packets.c -- one packet into or out of a queue's rings, and waiting for one.
 *
 * A write checks the packet against the ring, takes the references its buffers
 * ask for (undone if any fails), puts it in the request ring, counts it in the
 * process state block and wakes the DSP when it may sleep; a read takes the
 * response ring's next packet, gives back room, skips early wakeups and turns
 * each buffer's fd + offset into this process's address. Both run under the
 * queue's mu; waiting runs under packet_mu or space_mu (see dspqueue.c).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "AEEStdErr.h"
#include "dspq_queue.h"
#include "port.h"

/* Wait until the DSP moves the counter of which (packets or space), the deadline
 * passes (NULL: never) or the wait ends otherwise. The matching mutex is held. */
int dspq_wait_locked(struct dspqueue *q, int packets, const struct timespec *deadline) {
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

void dspq_deadline_after(struct timespec *ts, uint32_t us) {
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

int dspq_write_noblock(struct dspqueue *q, uint32_t flags, uint32_t num_buffers,
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
        dspq_send_signal(q->dom); /* the DSP may be asleep: wake it */
    }
    pthread_mutex_unlock(&q->mu);
    return 0;
}

int dspq_read_noblock(struct dspqueue *q, uint32_t *flags, uint32_t max_buffers,
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
        dspq_send_signal(q->dom); /* the DSP may wait for room */
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
