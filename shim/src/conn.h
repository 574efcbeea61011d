/*
 * conn.h -- the process's one connection to npud.
 *
 * Made on first use (conn_get), it carries every request of every thread:
 * each gets an id and a waiter; requests are pipelined, the answers come in
 * any order and one reader thread hands each to its waiter. When the
 * connection ends, every waiter fails at once with AEE_ECONNRESET; the next
 * conn_get connects again (a new generation: objects of the old one are gone).
 */
#ifndef NPUD_SHIM_CONN_H
#define NPUD_SHIM_CONN_H

#include <msgpack.h>
#include <stdint.h>

struct conn;

/* Capability attribute ids 0..11 (remote.h enum remote_dsp_attributes). */
#define SHIM_DSP_ATTRIBUTES 12
/* libcdsprpc's internal attributes 128..131 (PERF_V2_DSP_SUPPORT,
 * MAP_DMA_HANDLE_REVERSERPC, DSPSIGNAL_DSP_SUPPORT, PROC_SHARED_BUFFER_SUPPORT),
 * which the kernel answers from the DSP's table as it answers 1..11. */
#define SHIM_DSP_INTERNAL_FIRST 128
#define SHIM_DSP_INTERNAL 4

/* What the Welcome said (fixed once the connection is up). */
struct welcome {
    uint32_t caps[SHIM_DSP_ATTRIBUTES];
    uint32_t internal[SHIM_DSP_INTERNAL];
    uint32_t max_frame_size;
    uint32_t max_in_flight;
    uint32_t max_inline_bytes;
    uint64_t max_buffer_size; /* the largest alloc npud gives (256 MiB before version 6) */
    char domain[65];
};

/* Builds a request's map (with its id). */
typedef void (*conn_encode_fn)(void *ctx, msgpack_packer *pk, uint32_t id);
/* Takes a reply, on the reader thread: msg is the reply's map and fd the fd it
 * carried (-1 for none), which the function owns from then on. An AEE code. */
typedef int (*conn_reply_fn)(void *ctx, const msgpack_object *msg, int fd);

struct conn_request {
    const char *reply_type;   /* e.g. "alloc_reply" */
    conn_encode_fn encode;
    void *encode_ctx;
    conn_reply_fn on_reply;   /* NULL: nothing to take from the reply */
    void *reply_ctx;
    int acquires;             /* takes DSP resources: refused once npud shuts down */
    int expected_rc;          /* an AEE code the caller expects (a probe): not logged */
    /* out */
    int npud_code;            /* npud's error code; 0 when the reply came */
    uint32_t dsp_rc;          /* the error's DSP result field (code or rc), or 0 */
    uint64_t epoch;           /* the session epoch when the answer was read */
};

/* A live connection, referenced (conn_put gives it back). An AEE code. */
int conn_get(struct conn **out);
/* The live connection if it is generation gen (never a new one): objects of an
 * ended connection are released with it. AEE_ECONNRESET otherwise. */
int conn_get_gen(uint64_t gen, struct conn **out);
void conn_put(struct conn *c);

uint64_t conn_gen(const struct conn *c);

/* End c, the live connection, when nobody else holds it, nothing is in flight and
 * idle(gen) says nothing of it is held: npud then ends the DSP process (the
 * isolated domain), as libcdsprpc ends it when the last handle closes. 1 if ended.
 * The caller still holds its reference. */
int conn_end_if_idle(struct conn *c, int (*idle)(uint64_t gen));
const struct welcome *conn_welcome(const struct conn *c);

/* Send a request and wait for its answer: 0, or the AEE code of the error. */
int conn_call(struct conn *c, struct conn_request *req);

/* 1 when an object made in connection generation gen (and, for DSP objects, in
 * session epoch epoch) still exists: the connection is live and no restart
 * happened since. */
int conn_alive(uint64_t gen);
/* generation << 32 | epoch of the live connection, 0 when there is none. */
uint64_t conn_live(void);
int conn_alive_epoch(uint64_t gen, uint64_t epoch);

#endif /* NPUD_SHIM_CONN_H */
