/*
 * dspq_ring.h -- the shared memory of a dspqueue, as libcdsprpc and the DSP lay it out.
 *
 * One block per queue, every part 256-byte aligned:
 *
 *   header (48 bytes)                version, error, flags, the two queues' offsets, queue_count
 *   request ring (CPU -> DSP)        req_queue.queue_length bytes
 *   request read state               {position, packet_count, wait_count}   the DSP writes it
 *   request write state                                                      the CPU writes it
 *   response ring (DSP -> CPU)
 *   response read state                                                      the CPU writes it
 *   response write state                                                     the DSP writes it
 *
 * A packet: a u64 header, len | flags << 32 | nbufs << 48 | seq << 56 (len
 * counts the header, the 24-byte buffer entries and the message, unpadded),
 * then the buffer entries, then the message, the whole padded to 8 bytes.
 * A packet never crosses the end of a ring: when it does not fit before the
 * end, the writer leaves its header at the old position and writes the packet,
 * header again, from 0; a reader that finds less than len bytes before the end
 * continues at 8. A writer publishes the data, then its position, then its
 * packet count; a reader its position, then its packet count. Free space is
 * (r == w ? size - 8 : w > r ? size - w + r - 8 : r - w - 8).
 *
 * Wait counts (header flag 1): a side about to sleep bumps its own state's
 * wait_count; the other side signals only when it sees it non-zero.
 *
 * The process state block (1 KiB, one per DSP process) holds per queue id the
 * counters the signal receiver compares: the CPU writes req_packet_count and
 * resp_space_count, the DSP req_space_count and resp_packet_count.
 */
#ifndef NPUD_SHIM_DSPQ_RING_H
#define NPUD_SHIM_DSPQ_RING_H

#include <stddef.h>
#include <stdint.h>

#define DSPQ_ALIGN 256u
#define DSPQ_MAX_QUEUES 64u
#define DSPQ_MAX_QUEUE_SIZE 16777216u
#define DSPQ_MAX_BUFFERS 64u
#define DSPQ_MAX_MESSAGE 65536u
#define DSPQ_DEFAULT_REQ_SIZE 65536u
#define DSPQ_DEFAULT_RESP_SIZE 16384u
#define DSPQ_BUFFER_ENTRY 24u

#define DSPQ_VERSION_PROBE 0xffffffffu /* a DSP that checks versions refuses it */
#define DSPQ_VERSION 2u
#define DSPQ_FLAG_WAIT_COUNTS 1u

struct dspq_ring_header {
    uint32_t queue_offset;
    uint32_t queue_length;
    uint32_t read_state_offset;
    uint32_t write_state_offset;
};

struct dspq_header {
    uint32_t version;
    int32_t error;
    uint32_t flags;
    struct dspq_ring_header req;
    struct dspq_ring_header resp;
    uint32_t queue_count;
};

struct dspq_state {
    uint32_t position;
    uint32_t packet_count;
    uint32_t wait_count;
};

struct dspq_process_state {
    uint32_t req_packet_count[DSPQ_MAX_QUEUES];
    uint32_t req_space_count[DSPQ_MAX_QUEUES];
    uint32_t resp_packet_count[DSPQ_MAX_QUEUES];
    uint32_t resp_space_count[DSPQ_MAX_QUEUES];
};

/* One direction of a queue, as this process sees it. The position and packet
 * count this side publishes are kept here too: the shared copies are written,
 * never read back (the other side could have changed them). */
struct dspq_ring {
    uint8_t *data;
    uint32_t size;
    struct dspq_state *read;
    struct dspq_state *write;
    uint32_t own_position;
    uint32_t own_count;
};

/* Size of the block for rings of req and resp bytes (multiples of 8). */
size_t dspq_block_size(uint32_t req, uint32_t resp);
/* Lay out a zeroed block: offsets and lengths in the header. */
void dspq_layout(struct dspq_header *h, uint32_t req, uint32_t resp);
/* The request (resp 0) or response (resp 1) ring of a laid-out block. */
void dspq_ring_of(struct dspq_header *h, int resp, struct dspq_ring *r);

static inline uint64_t dspq_packet_header(uint32_t len, uint32_t flags, uint32_t nbufs,
                                          uint32_t seq) {
    return (uint64_t)len | (uint64_t)(flags & 0xffff) << 32 | (uint64_t)(nbufs & 0xff) << 48 |
           (uint64_t)(seq & 0xff) << 56;
}

/* Every position read from the other side is checked before use: a multiple of
 * 8 below the ring's size; a packet header's length must fit the ring and what
 * the writer published. A bad one is AEE_EBADITEM, never an access. */

/* Room for a packet of alen bytes (padded)? 0, AEE_EWOULDBLOCK, or AEE_EBADITEM
 * when the reader's position is not one. */
int dspq_ring_room(const struct dspq_ring *r, uint32_t alen);
/* Write a packet for which dspq_ring_room said yes, and publish it. */
void dspq_ring_put(struct dspq_ring *r, uint64_t header, const void *buffers,
                   uint32_t buffers_len, const void *message, uint32_t message_len);
/* The header of the next packet: 0, AEE_EWOULDBLOCK when there is none, or
 * AEE_EBADITEM when the writer's position or the header's length is impossible. */
int dspq_ring_peek(const struct dspq_ring *r, uint64_t *header);
/* Consume the next packet (its header from dspq_ring_peek): copy its buffer
 * entries and message where given (NULL: skip them), publish the position. */
void dspq_ring_take(struct dspq_ring *r, uint32_t len, void *buffers, uint32_t buffers_len,
                    void *message, uint32_t message_len);

/*
 * Ordering against the other side, as libcdsprpc's dspqueue_cpu.c orders it:
 * on ARM a full-system barrier (dmb sy) between reading the other side's
 * position and the data it covers, and between consuming data and publishing
 * the read position; a store barrier (dmb st) between writing data and
 * publishing the write position. The CDSP is an IO-coherent master outside
 * the CPUs' inner-shareable domain, so dmb ish would not be enough there.
 * NPUD_SHIM_BARRIERS=inner (read once, at the first queue) uses dmb ish /
 * dmb ishst instead, for measuring on a device whether it makes a difference.
 * Elsewhere (x86_64: the emulator, where the DSP is another process) C11
 * fences, which the compiler makes what the CPU needs.
 */
extern int dspq_inner_shareable;
/* Read NPUD_SHIM_BARRIERS once ("inner" or "system", the default; anything else
 * is the default, logged). 1 when the barriers are inner-shareable. */
int dspq_barriers_init(void);

static inline void dspq_barrier_full(void) {
#if defined(__aarch64__)
    if (dspq_inner_shareable) {
        __asm__ __volatile__("dmb ish" : : : "memory");
    } else {
        __asm__ __volatile__("dmb sy" : : : "memory");
    }
#elif defined(__arm__)
    if (dspq_inner_shareable) {
        __asm__ __volatile__("dmb ish" : : : "memory");
    } else {
        __asm__ __volatile__("dmb sy" : : : "memory");
    }
#else
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

static inline void dspq_barrier_store(void) {
#if defined(__aarch64__) || defined(__arm__)
    if (dspq_inner_shareable) {
        __asm__ __volatile__("dmb ishst" : : : "memory");
    } else {
        __asm__ __volatile__("dmb st" : : : "memory");
    }
#else
    __atomic_thread_fence(__ATOMIC_RELEASE);
#endif
}

/* A word the other side publishes: read it, then order what follows after it. */
static inline uint32_t dspq_load(const uint32_t *p) {
#if defined(__aarch64__) || defined(__arm__)
    uint32_t v = __atomic_load_n(p, __ATOMIC_RELAXED);
    dspq_barrier_full();
    return v;
#else
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
}

/* Publish data written before (ring bytes): a store barrier, then the word. */
static inline void dspq_publish(uint32_t *p, uint32_t v) {
#if defined(__aarch64__) || defined(__arm__)
    dspq_barrier_store();
    __atomic_store_n(p, v, __ATOMIC_RELAXED);
#else
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
#endif
}

/* Publish after reading data (a consumed packet): a full barrier, then the word. */
static inline void dspq_release_read(uint32_t *p, uint32_t v) {
#if defined(__aarch64__) || defined(__arm__)
    dspq_barrier_full();
    __atomic_store_n(p, v, __ATOMIC_RELAXED);
#else
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
#endif
}

/* A counter of the process state block (the receive thread compares them; the
 * signal that follows is a system call, which orders it). */
static inline void dspq_store(uint32_t *p, uint32_t v) {
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}

#endif /* NPUD_SHIM_DSPQ_RING_H */
