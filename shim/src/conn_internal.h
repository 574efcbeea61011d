/*
 * conn_internal.h -- the connection's state, shared by its parts (not exported).
 *
 * The parts, each one job:
 *   conn.c          a connection's life (references, its end) and its requests: a
 *                   slot, an id, the frame sent, the wait for the answer
 *   conn_current.c  the current connection: made on first use (the socket, the reader
 *                   thread, Hello -> Welcome), ended when idle, forgotten in a fork
 *   conn_stream.c   the reader thread: frames and the fds that came with them
 *   conn_answers.c  what a frame means: the Welcome, events, an answer to its waiter
 *
 * Locks and their order: see conn.c.
 */
#ifndef NPUD_SHIM_CONN_INTERNAL_H
#define NPUD_SHIM_CONN_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "conn.h"

#define DEFAULT_SOCKET "/run/npud/npud.sock"
#define MAX_SLOTS 64
#define RECV_FDS 16 /* room for fds per recvmsg: more is MSG_CTRUNC, fatal */
#define FD_RECORDS 8
#define RECV_CHUNK 65536
#define HANDSHAKE_TIMEOUT_S 30

enum conn_state { ST_HANDSHAKE, ST_READY, ST_DEAD };

struct waiter {
    uint32_t id;
    int done;
    int rc;
    struct conn_request *req;
};

/* The fds one recvmsg brought, and the stream bytes they came with. */
struct fd_record {
    uint64_t start;
    uint64_t end;
    int fds[RECV_FDS];
    unsigned count;
    unsigned taken;
};

struct conn {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* a waiter answered, a slot freed, the state changed */
    pthread_mutex_t send_mu;
    int refs;
    int fd;
    uint64_t gen;
    enum conn_state state;
    int dead_rc;
    int shutting_down;
    uint64_t epoch;
    struct welcome welcome;
    struct waiter *slots[MAX_SLOTS];
    unsigned nslots;
    unsigned used;
    uint32_t next_id;
    /* The reader thread's alone. */
    uint8_t *rbuf;
    size_t rlen;
    size_t rcap;
    uint64_t roff; /* stream offset of rbuf[0] */
    size_t limit;  /* the current frame limit */
    struct fd_record recs[FD_RECORDS];
    unsigned nrecs;
};

/* conn.c */
/* The connection is over: every waiter fails with rc, the reader wakes up. */
void conn_kill(struct conn *c, int rc);
/* One whole frame on the socket, or the connection dies. */
int conn_send(struct conn *c, const char *data, size_t len);
/* Close the fds the reader kept and nobody took. */
void conn_close_records(struct conn *c);
/* c's generation and epoch are the live ones (restart_seen: a restart was seen and its
 * session_restarted has not come yet). Called under c->mu. */
void conn_mark_live(const struct conn *c, uint64_t epoch, int restart_seen);
/* No connection is live (a fork's child forgets its parent's). */
void conn_clear_live(void);

/* conn_stream.c */
/* The reader thread: frames until the stream ends, then the connection's end. */
void *conn_reader_main(void *arg);

/* conn_answers.c */
/* One frame's payload. A nonzero return ends the connection with that code. */
int conn_dispatch(struct conn *c, const char *payload, size_t len, int fd, unsigned nfds);

#endif /* NPUD_SHIM_CONN_INTERNAL_H */
