/*
 * conn_stream.c -- the reader thread: bytes and fds off the socket, cut into
 * frames (each bounded before it is kept), each frame given the fds it declares
 * from the recvmsg that brought its first byte, and handed to conn_dispatch.
 * Fds no frame takes are closed. The read buffer and the fd records are this
 * thread's alone.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "AEEStdErr.h"
#include "conn_internal.h"
#include "shim.h"
#include "wire.h"

/* Keep the fds of one recvmsg with the bytes they came with. */
static int keep_fds(struct conn *c, uint64_t start, size_t len, const int *fds, unsigned n) {
    if (c->nrecs == FD_RECORDS) {
        for (unsigned i = 0; i < n; i++) {
            close(fds[i]);
        }
        return -1;
    }
    struct fd_record *r = &c->recs[c->nrecs++];
    r->start = start;
    r->end = start + len;
    memcpy(r->fds, fds, n * sizeof(int));
    r->count = n;
    r->taken = 0;
    return 0;
}

/* The frame starting at stream offset start declares n fds: the first n not
 * taken of the recvmsg that brought its first byte. */
static int take_fds(struct conn *c, uint64_t start, unsigned n, int *fd) {
    *fd = -1;
    if (n == 0) {
        return 0;
    }
    for (unsigned i = 0; i < c->nrecs; i++) {
        struct fd_record *r = &c->recs[i];
        if (r->start <= start && start < r->end) {
            if (r->count - r->taken < n) {
                return -1; /* MISSING_FDS */
            }
            /* npud's frames carry at most one: the frame keeps its first, and
             * the others it declared are closed here (conn_dispatch refuses the
             * frame for its fd count) */
            *fd = r->fds[r->taken];
            for (unsigned j = 1; j < n; j++) {
                close(r->fds[r->taken + j]);
            }
            r->taken += n;
            return 0;
        }
    }
    return -1;
}

/* Records whose bytes were all consumed: their untaken fds are strays. */
static void drop_records(struct conn *c, uint64_t consumed) {
    unsigned kept = 0;
    for (unsigned i = 0; i < c->nrecs; i++) {
        struct fd_record *r = &c->recs[i];
        if (r->end <= consumed) {
            for (unsigned j = r->taken; j < r->count; j++) {
                close(r->fds[j]);
            }
        } else {
            c->recs[kept++] = *r;
        }
    }
    c->nrecs = kept;
}

static int grow_rbuf(struct conn *c, size_t need) {
    if (need <= c->rcap) {
        return 0;
    }
    size_t cap = c->rcap != 0 ? c->rcap : RECV_CHUNK;
    while (cap < need) {
        cap *= 2;
    }
    uint8_t *grown = x_realloc(c->rbuf, cap);
    if (grown == NULL) {
        return -1;
    }
    c->rbuf = grown;
    c->rcap = cap;
    return 0;
}

/* Frames until the stream ends or breaks the protocol: the AEE code it ended with. */
static int read_frames(struct conn *c) {
    for (;;) {
        if (grow_rbuf(c, c->rlen + RECV_CHUNK) != 0) {
            return AEE_ENOMEMORY;
        }
        union {
            char buf[CMSG_SPACE(RECV_FDS * sizeof(int))];
            struct cmsghdr align;
        } control;
        struct iovec iov = {.iov_base = c->rbuf + c->rlen, .iov_len = c->rcap - c->rlen};
        struct msghdr mh = {
            .msg_iov = &iov,
            .msg_iovlen = 1,
            .msg_control = control.buf,
            .msg_controllen = sizeof(control.buf),
        };
        ssize_t n;
        if (FAULT("recvmsg")) {
            n = -1;
            errno = ENOMEM;
        } else {
            n = recvmsg(c->fd, &mh, MSG_CMSG_CLOEXEC);
        }
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            return errno == ENOMEM || errno == ENOBUFS ? AEE_ENOMEMORY : AEE_ECONNRESET;
        }
        int fds[RECV_FDS];
        unsigned nfds = 0;
        int odd = 0;
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm != NULL; cm = CMSG_NXTHDR(&mh, cm)) {
            if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
                size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                for (size_t i = 0; i < count && nfds < RECV_FDS; i++) {
                    memcpy(&fds[nfds++], CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
                }
            } else {
                odd = 1;
            }
        }
        if (odd || (mh.msg_flags & MSG_CTRUNC) || n == 0) {
            for (unsigned i = 0; i < nfds; i++) {
                close(fds[i]);
            }
            return n == 0 ? AEE_ECONNRESET : AEE_ERPC;
        }
        if (nfds > 0 && keep_fds(c, c->roff + c->rlen, (size_t)n, fds, nfds) != 0) {
            return AEE_ERPC;
        }
        c->rlen += (size_t)n;

        size_t pos = 0;
        while (c->rlen - pos >= WIRE_HEADER_SIZE) {
            uint32_t plen;
            unsigned declared;
            if (wire_header(c->rbuf + pos, c->limit, &plen, &declared) != 0) {
                return AEE_ERPC;
            }
            size_t whole = WIRE_HEADER_SIZE + (size_t)plen;
            if (c->rlen - pos < whole) {
                if (grow_rbuf(c, whole + RECV_CHUNK) != 0) {
                    return AEE_ENOMEMORY;
                }
                break;
            }
            int fd;
            if (take_fds(c, c->roff + pos, declared, &fd) != 0) {
                return AEE_ERPC;
            }
            int rc = conn_dispatch(c, (const char *)c->rbuf + pos + WIRE_HEADER_SIZE, plen, fd,
                              declared);
            if (rc != 0) {
                return rc;
            }
            pos += whole;
        }
        drop_records(c, c->roff + pos);
        memmove(c->rbuf, c->rbuf + pos, c->rlen - pos);
        c->rlen -= pos;
        c->roff += pos;
    }
}

void *conn_reader_main(void *arg) {
    struct conn *c = arg;
    int rc = read_frames(c);
    conn_kill(c, rc);
    conn_close_records(c);
    free(c->rbuf);
    c->rbuf = NULL;
    conn_put(c);
    return NULL;
}
