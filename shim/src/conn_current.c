/*
 * conn_current.c -- the process's current connection to npud: made on first use
 * (the socket, NPUD_SOCKET; the reader thread, which takes no signals; the Hello,
 * with the program's name made to fit the protocol, NPUD_PRIORITY and an isolated
 * domain; the wait for the Welcome, at most HANDSHAKE_TIMEOUT_S), handed out by
 * reference, ended when nothing is held, forgotten in a fork's child.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "AEEStdErr.h"
#include "conn_internal.h"
#include "shim.h"
#include "wire.h"

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct conn *g_conn;
static uint64_t g_next_gen = 1;

static void client_name(char *out, size_t size) {
    const char *name = getenv("NPUD_CLIENT_NAME");
    if (name == NULL || name[0] == '\0') {
        name = program_invocation_short_name;
    }
    /* ^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,63}$ (PROTOCOL.md, hello.client_name) */
    size_t n = 0;
    for (const char *p = name; *p != '\0' && n + 1 < size && n < 64; p++) {
        char ch = *p;
        int ok = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9');
        if (n > 0 && strchr("._:@+-", ch) != NULL) {
            ok = 1;
        }
        char put = ok ? ch : '-';
        if (n == 0 && !ok) {
            put = 'x';
        }
        out[n] = put;
        n++;
    }
    if (n == 0) {
        out[n++] = 'x';
    }
    out[n] = '\0';
}

static const char *priority(void) {
    const char *p = getenv("NPUD_PRIORITY");
    if (p != NULL && (strcmp(p, "realtime") == 0 || strcmp(p, "background") == 0)) {
        return p;
    }
    return "normal";
}

static int send_hello(struct conn *c) {
    char name[65];
    client_name(name, sizeof(name));
    struct wbuf b;
    msgpack_packer pk;
    if (wbuf_start(&b, &pk) != 0) {
        wbuf_free(&b);
        return AEE_ENOMEMORY;
    }
    msgpack_pack_map(&pk, 5);
    mp_kv_str(&pk, "type", "hello");
    mp_kv_uint(&pk, "protocol_version", WIRE_PROTOCOL_VERSION);
    mp_kv_str(&pk, "client_name", name);
    mp_kv_str(&pk, "priority", priority());
    mp_str(&pk, "isolate");
    msgpack_pack_true(&pk);
    if (wbuf_finish(&b, WIRE_HANDSHAKE_MAX_FRAME) != 0) {
        wbuf_free(&b);
        return AEE_ENOMEMORY;
    }
    int rc = conn_send(c, b.data, b.len);
    wbuf_free(&b);
    return rc;
}

static int connect_socket(int *out) {
    const char *path = getenv("NPUD_SOCKET");
    if (path == NULL || path[0] == '\0') {
        path = DEFAULT_SOCKET;
    }
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof(addr));
    addr.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof(addr.sun_path)) {
        shim_log("socket path too long: %s", path);
        return AEE_ECONNREFUSED;
    }
    strcpy(addr.sun_path, path);
    int fd;
    if (FAULT("socket")) {
        fd = -1;
        errno = EMFILE;
    } else {
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    }
    if (fd < 0) {
        return errno == ENOMEM || errno == ENOBUFS ? AEE_ENOMEMORY : AEE_ERPC;
    }
    int r;
    if (FAULT("connect")) {
        r = -1;
        errno = ECONNREFUSED;
    } else {
        do {
            r = connect(fd, (struct sockaddr *)&addr, sizeof(addr));
        } while (r != 0 && errno == EINTR);
    }
    if (r != 0) {
        int err = errno;
        close(fd);
        shim_log("cannot connect to npud at %s: %s", path, strerror(err));
        return shim_aee_from_errno(err);
    }
    *out = fd;
    return 0;
}

static int start_reader(struct conn *c) {
    pthread_t thread;
    pthread_attr_t attr;
    sigset_t all, old;
    if (FAULT("pthread_create")) {
        return AEE_ENOMEMORY;
    }
    if (pthread_attr_init(&attr) != 0) {
        return AEE_ENOMEMORY;
    }
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* the reader takes no signals */
    int err = pthread_create(&thread, &attr, conn_reader_main, c);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    return err == 0 ? 0 : AEE_ENOMEMORY;
}

/* A new connection through its Welcome, with one reference for the caller. */
static int conn_open(uint64_t gen, struct conn **out) {
    struct conn *c = x_calloc(1, sizeof(*c));
    if (c == NULL) {
        return AEE_ENOMEMORY;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->send_mu, NULL);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    c->refs = 1;
    c->fd = -1;
    c->gen = gen;
    c->state = ST_HANDSHAKE;
    c->limit = WIRE_HANDSHAKE_MAX_FRAME;
    c->next_id = 1;

    int rc = connect_socket(&c->fd);
    if (rc != 0) {
        conn_put(c);
        return rc;
    }
    c->refs = 2; /* the reader's */
    rc = start_reader(c);
    if (rc != 0) {
        c->refs = 1;
        conn_put(c);
        return rc;
    }
    rc = send_hello(c);
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += HANDSHAKE_TIMEOUT_S;
    pthread_mutex_lock(&c->mu);
    while (rc == 0 && c->state == ST_HANDSHAKE) {
        if (pthread_cond_timedwait(&c->cv, &c->mu, &deadline) == ETIMEDOUT) {
            pthread_mutex_unlock(&c->mu);
            shim_log("npud did not answer the Hello within %d s", HANDSHAKE_TIMEOUT_S);
            conn_kill(c, AEE_EEXPIRED);
            pthread_mutex_lock(&c->mu);
        }
    }
    if (rc == 0 && c->state != ST_READY) {
        rc = c->dead_rc;
    }
    pthread_mutex_unlock(&c->mu);
    if (rc != 0) {
        conn_kill(c, rc);
        conn_put(c);
        return rc;
    }
    *out = c;
    return 0;
}

int conn_get(struct conn **out) {
    pthread_mutex_lock(&g_lock);
    struct conn *c = g_conn;
    if (c != NULL) {
        pthread_mutex_lock(&c->mu);
        int live = c->state == ST_READY;
        if (live) {
            c->refs++;
        }
        pthread_mutex_unlock(&c->mu);
        if (live) {
            pthread_mutex_unlock(&g_lock);
            *out = c;
            return 0;
        }
        g_conn = NULL;
        conn_put(c);
    }
    int rc = conn_open(g_next_gen, &c);
    if (rc == 0) {
        g_next_gen++;
        pthread_mutex_lock(&c->mu);
        c->refs++; /* g_conn's */
        pthread_mutex_unlock(&c->mu);
        g_conn = c;
        *out = c;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

int conn_end_if_idle(struct conn *c, int (*idle)(uint64_t gen)) {
    int ended = 0;
    pthread_mutex_lock(&g_lock); /* no other thread gets the connection meanwhile */
    pthread_mutex_lock(&c->mu);
    /* the caller's reference, g_conn's and the reader's: nobody else holds it, and
     * nothing is in flight */
    int alone = g_conn == c && c->state == ST_READY && c->refs == 3 && c->used == 0;
    pthread_mutex_unlock(&c->mu);
    if (alone && idle(c->gen)) {
        shim_log("the last handle is closed and nothing is held: the DSP process ends");
        g_conn = NULL;
        conn_kill(c, AEE_ECONNRESET); /* the reader ends, and npud lets the process go */
        conn_put(c);                  /* g_conn's reference */
        ended = 1;
    }
    pthread_mutex_unlock(&g_lock);
    return ended;
}

void conn_fork_child(void) {
    pthread_mutex_init(&g_lock, NULL);
    struct conn *c = g_conn;
    g_conn = NULL;
    conn_clear_live();
    if (c == NULL) {
        return;
    }
    /* The child's copies only: its socket fd (no shutdown: the parent's connection
     * is the same socket), the fds the reader had kept, its memory. Its mutexes
     * may have been held by a thread the child does not have: freed, not
     * destroyed. Objects of its generation are of an ended connection now. */
    if (c->fd >= 0) {
        close(c->fd);
    }
    conn_close_records(c);
    free(c->rbuf);
    free(c);
}

int conn_get_gen(uint64_t gen, struct conn **out) {
    int rc = AEE_ECONNRESET;
    pthread_mutex_lock(&g_lock);
    struct conn *c = g_conn;
    if (c != NULL && c->gen == gen) {
        pthread_mutex_lock(&c->mu);
        if (c->state == ST_READY) {
            c->refs++;
            *out = c;
            rc = 0;
        }
        pthread_mutex_unlock(&c->mu);
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}
