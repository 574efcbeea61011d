/*
 * dspqueue.h -- npud's libcdsprpc: packet queues between the CPU and the DSP.
 *
 * Written for npud from the FastRPC ABI (the same names, values and layouts
 * as Qualcomm's dspqueue.h). A queue lives in memory shared with the DSP
 * process; packets cross it without a call into npud, which carries only the
 * signals (see shim/README.md).
 */
#ifndef DSPQUEUE_H
#define DSPQUEUE_H

#include <stdint.h>
#include <stdlib.h>

#include "AEEStdDef.h"

/* timeout_us meaning "wait for ever". */
#define DSPQUEUE_TIMEOUT_NONE 0xffffffff

enum dspqueue_packet_flags {
    DSPQUEUE_PACKET_FLAG_MESSAGE = 0x0001,      /* the packet carries a message */
    DSPQUEUE_PACKET_FLAG_BUFFERS = 0x0002,      /* the packet carries buffer references */
    DSPQUEUE_PACKET_FLAG_WAKEUP = 0x0004,       /* an early wakeup packet */
    DSPQUEUE_PACKET_FLAG_DRIVER_READY = 0x0008, /* unused */
    DSPQUEUE_PACKET_FLAG_USER_READY = 0x0010,   /* set by every writer */
    DSPQUEUE_PACKET_FLAG_RESERVED_ZERO = 0xffe0
};

enum dspqueue_buffer_flags {
    DSPQUEUE_BUFFER_FLAG_REF = 0x00000004,   /* take a reference on a mapped buffer */
    DSPQUEUE_BUFFER_FLAG_DEREF = 0x00000008, /* drop one */
    DSPQUEUE_BUFFER_FLAG_FLUSH_SENDER = 0x00000010,
    DSPQUEUE_BUFFER_FLAG_INVALIDATE_SENDER = 0x00000020,
    DSPQUEUE_BUFFER_FLAG_FLUSH_RECIPIENT = 0x00000040,
    DSPQUEUE_BUFFER_FLAG_INVALIDATE_RECIPIENT = 0x00000080
};
/* The bits a buffer's flags must leave clear (a macro: ISO C enumerators are ints). */
#define DSPQUEUE_BUFFER_FLAG_RESERVED_ZERO 0xffffff00u

enum dspqueue_stat {
    DSPQUEUE_STAT_READ_QUEUE_PACKETS = 1,
    DSPQUEUE_STAT_READ_QUEUE_BYTES,
    DSPQUEUE_STAT_WRITE_QUEUE_PACKETS,
    DSPQUEUE_STAT_WRITE_QUEUE_BYTES,
    DSPQUEUE_STAT_EARLY_WAKEUP_WAIT_TIME,
    DSPQUEUE_STAT_EARLY_WAKEUP_MISSES,
    DSPQUEUE_STAT_SIGNALING_PERF
};

#define DSPQUEUE_SIGNALING_PERF_REDUCED_SIGNALING 100
#define DSPQUEUE_SIGNALING_PERF_OPTIMIZED_SIGNALING 1000

struct dspqueue;
typedef struct dspqueue *dspqueue_t;

/* A buffer a packet refers to: 24 bytes, as it is stored in the queue. */
struct dspqueue_buffer {
    uint32_t fd;     /* rpcmem_to_fd of a buffer mapped with fastrpc_mmap */
    uint32_t size;   /* bytes; 0 on write: the whole mapped buffer */
    uint32_t offset; /* into the buffer */
    uint32_t flags;  /* enum dspqueue_buffer_flags */
    union {
        void *ptr; /* on read: this process's address of fd + offset */
        uint64_t address;
    };
};

typedef void (*dspqueue_callback_t)(dspqueue_t queue, AEEResult error, void *context);

#ifdef __cplusplus
extern "C" {
#endif

/* domain CDSP_DOMAIN_ID (or -1); flags 0; sizes in bytes (0: the defaults, 64 KiB
 * requests and 16 KiB responses). packet_callback runs on a thread of the queue
 * when packets arrive; error_callback when the DSP process is lost. */
AEEResult dspqueue_create(int domain, uint32_t flags, uint32_t req_queue_size,
                          uint32_t resp_queue_size, dspqueue_callback_t packet_callback,
                          dspqueue_callback_t error_callback, void *callback_context,
                          dspqueue_t *queue);
AEEResult dspqueue_close(dspqueue_t queue);

/* The id the DSP side imports the queue by. */
AEEResult dspqueue_export(dspqueue_t queue, uint64_t *queue_id);

/* AEE_EEXPIRED when timeout_us passes first. */
AEEResult dspqueue_write(dspqueue_t queue, uint32_t flags, uint32_t num_buffers,
                         struct dspqueue_buffer *buffers, uint32_t message_length,
                         const uint8_t *message, uint32_t timeout_us);
AEEResult dspqueue_read(dspqueue_t queue, uint32_t *flags, uint32_t max_buffers,
                        uint32_t *num_buffers, struct dspqueue_buffer *buffers,
                        uint32_t max_message_length, uint32_t *message_length,
                        uint8_t *message, uint32_t timeout_us);
/* AEE_EWOULDBLOCK when no packet is there. */
AEEResult dspqueue_read_noblock(dspqueue_t queue, uint32_t *flags, uint32_t max_buffers,
                                uint32_t *num_buffers, struct dspqueue_buffer *buffers,
                                uint32_t max_message_length, uint32_t *message_length,
                                uint8_t *message);

#ifdef __cplusplus
}
#endif

#endif /* DSPQUEUE_H */
