/*
 * fake_dsp.h -- a DSP in a thread for testing dspqueue.c: it implements port.h
 * (memory as memfds, the dspqueue_rpc methods) and serves the queues from the
 * same shared memory, mapped at addresses of its own, with its own code for
 * the DSP side of the ring protocol.
 */
#ifndef FAKE_DSP_H
#define FAKE_DSP_H

#include <stddef.h>
#include <stdint.h>

enum fake_mode {
    FAKE_ECHO,   /* answer every request */
    FAKE_STALL,  /* read nothing: the request ring fills up */
    FAKE_WAKEUP, /* answer, each answer after an early-wakeup packet */
};

struct fake_stats {
    unsigned signals;        /* signal() calls */
    unsigned wakeups;        /* wait_signal() calls that returned a signal */
    unsigned waits;          /* wait_signal() calls */
    unsigned wait_not_waiting; /* wait_signal() sent without npud's wait flag */
    unsigned creates;        /* create_queue() calls, refused or not */
    unsigned destroys;
    unsigned cancels;
    unsigned opens;
    unsigned closes;
    unsigned init_states;
    unsigned requests;       /* request packets read */
    unsigned responses;      /* response packets written */
    unsigned live_memory;    /* port_alloc'ed blocks not freed */
    unsigned mapped;         /* blocks mapped into the DSP */
    unsigned saw_req_waiting;  /* times the CPU had req write_state.wait_count set */
    unsigned saw_resp_waiting; /* times the CPU had resp read_state.wait_count set */
    unsigned bad;            /* protocol violations the DSP saw */
};

/* Start the DSP thread; fake_stop ends it. */
void fake_reset(void);
void fake_stop(void);
void fake_set_mode(enum fake_mode mode);
void fake_set_old_dsp(int old);          /* accept header version UINT32_MAX */
void fake_set_imported(int imported);    /* is_imported's answer */
void fake_set_open_error(int rc);        /* port_open fails with rc */
void fake_set_cancel_error(int rc);      /* cancel_wait_signal fails with rc */
void fake_set_destroy_error(int rc);     /* destroy_queue fails with rc */
void fake_lose_process(void);            /* the DSP process dies */
/* A hostile DSP: set a position of queue 0's request (resp 0) or response ring
 * (resp 1), the read (write 0) or the write state's (write 1); or 8 bytes of
 * the ring's data at offset at. */
void fake_poke_position(int resp, int write, uint32_t value);
void fake_poke_ring(int resp, uint32_t at, uint64_t value);
void fake_stats(struct fake_stats *out);
/* Wait (up to 5 s) until the DSP is idle: every request answered. */
int fake_idle(void);

/* A buffer as a program has it: rpcmem_alloc + rpcmem_to_fd + fastrpc_mmap. */
void *fake_buffer(size_t size, int *fd);
void fake_buffer_free(void *ptr, int fd, size_t size);

#endif /* FAKE_DSP_H */
