/*
 * dspq_queue.h -- dspqueue's two objects, shared by its parts (not exported).
 *
 * The parts, each one job:
 *   dspqueue.c     the exported API: queues made, closed, written and read, fork
 *   dspq_domain.c  the domain: the DSP's dspqueue_rpc module, the process state
 *                  block, the send and receive threads, losing the DSP process
 *   dspq_packets.c one packet into or out of a queue's rings (buffer references,
 *                  the counters the DSP reads, waking it), and waiting for one
 *   dspq_ring.c    the ring layout in shared memory; dspq_rpc.c the DSP's interface
 *
 * Locks and their order: see dspqueue.c.
 */
#ifndef NPUD_SHIM_DSPQ_QUEUE_H
#define NPUD_SHIM_DSPQ_QUEUE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "dspq_ring.h"
#include "dspqueue.h"
#include "remote.h"

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

/* dspq_domain.c */
void dspq_init_cond(pthread_cond_t *cv);
int dspq_start_thread(pthread_t *thread, void *(*fn)(void *), void *arg);
void dspq_dom_fail(struct dspq_domain *d, int rc);
int dspq_alive(struct dspqueue *q);
void dspq_send_signal(struct dspq_domain *d);
int dspq_dom_create(struct dspq_domain **out);
int dspq_dom_destroy(struct dspq_domain *d);

/* dspq_packets.c */
int dspq_wait_locked(struct dspqueue *q, int packets, const struct timespec *deadline);
void dspq_deadline_after(struct timespec *ts, uint32_t us);
int dspq_write_noblock(struct dspqueue *q, uint32_t flags, uint32_t num_buffers,
                       struct dspqueue_buffer *buffers, uint32_t message_length,
                       const uint8_t *message);
int dspq_read_noblock(struct dspqueue *q, uint32_t *flags, uint32_t max_buffers,
                      uint32_t *num_buffers, struct dspqueue_buffer *buffers,
                      uint32_t max_message_length, uint32_t *message_length, uint8_t *message);

#endif
