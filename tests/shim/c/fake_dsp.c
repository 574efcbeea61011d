/*
 * fake_dsp.c -- the DSP side of dspqueue, in a thread, for tests (fake_dsp.h).
 *
 * Written from the protocol's description (shim/src/dspq_ring.h comment, NOTES
 * of the research), not from the library's ring code: the DSP here reads and
 * writes the rings with code of its own, through its own mappings of the
 * memfds, so a mistake on either side shows.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "AEEStdErr.h"
#include "fake_dsp.h"
#include "port.h"

#define BLOCKS 256
#define QUEUES 64
#define RPC_URI                                                                               \
    "file:///libdspqueue_rpc_skel.so?dspqueue_rpc_skel_handle_invoke&_modver=1.0&_dom=cdsp&_" \
    "session=0"
#define DSP_EUNSUPPORTED 0x80000414u
#define DSP_EBADPARM 0x8000040Eu

struct block {
    int used;
    int memfd;
    uint8_t *cpu;
    uint8_t *dsp;
    size_t size;
    int dsp_fd;
    int refs;
};

/* The DSP's idea of a queue's memory: offsets read from the header. */
struct side {
    uint8_t *data;
    uint32_t size;
    volatile uint32_t *read;  /* position, packet_count, wait_count */
    volatile uint32_t *write;
};

struct queue {
    int active;
    uint8_t *base;
    struct side req;
    struct side resp;
    uint64_t dsp_id;
    uint8_t seq;
    int wait_counts;
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_work_cv = PTHREAD_COND_INITIALIZER; /* the DSP thread sleeps here */
static pthread_cond_t g_wait_cv = PTHREAD_COND_INITIALIZER; /* wait_signal sleeps here */
static struct block g_blocks[BLOCKS];
static struct queue g_queues[QUEUES];
static volatile uint32_t *g_state; /* req_packet[64], req_space[64], resp_packet[64], resp_space[64] */
static enum fake_mode g_mode;
static int g_old_dsp;
static int g_imported;
static int g_open_error;
static int g_cancel_error;
static int g_destroy_error;
static int g_lost;
static uint64_t g_session = 1;
static remote_handle64 g_handle;
static remote_handle64 g_next_handle = 0x77;
static int g_work;
static int g_cpu_signal;
static int g_cancel;
static int g_stop;
static int g_busy;
static pthread_t g_thread;
static struct fake_stats g_stats;

static uint32_t ld(volatile uint32_t *p) {
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

static void st(volatile uint32_t *p, uint32_t v) {
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}

static uint32_t pad8(uint32_t n) {
    return (n + 7u) & ~7u;
}

static struct block *by_fd(int fd) {
    for (int i = 0; i < BLOCKS; i++) {
        if (g_blocks[i].used && g_blocks[i].dsp_fd == fd) {
            return &g_blocks[i];
        }
    }
    return NULL;
}

/* ---- the DSP thread ------------------------------------------------------------------------ */

static void signal_cpu(void) {
    g_cpu_signal = 1;
    pthread_cond_broadcast(&g_wait_cv);
}

static void view(struct side *s, uint8_t *base, const uint32_t *qh) {
    /* qh: queue_offset, queue_length, read_state_offset, write_state_offset */
    s->data = base + qh[0];
    s->size = qh[1];
    s->read = (volatile uint32_t *)(void *)(base + qh[2]);
    s->write = (volatile uint32_t *)(void *)(base + qh[3]);
}

/* Room in the response ring for alen bytes at the DSP's write position? */
static int resp_room(const struct side *s, uint32_t alen) {
    uint32_t r = ld(&s->read[0]);
    uint32_t w = s->write[0];
    uint32_t left;
    if (r == w) {
        left = s->size - 8;
    } else if (w > r) {
        left = s->size - w + r - 8;
    } else {
        left = r - w - 8;
    }
    if (left < alen) {
        return 0;
    }
    if (s->size - w < alen && left - (s->size - w) < alen) {
        return 0;
    }
    return 1;
}

static uint32_t emit(struct side *s, uint32_t w, const void *p, uint32_t n) {
    memcpy(s->data + w, p, n);
    w += pad8(n);
    return w >= s->size ? 0 : w;
}

static void respond(struct queue *q, uint32_t flags, const uint8_t *bufs, uint32_t nb,
                    const uint8_t *msg, uint32_t ml) {
    uint32_t len = 8 + 24 * nb + ml;
    if (nb > 0) {
        flags |= 2;
    }
    if (ml > 0) {
        flags |= 1;
    }
    uint64_t hdr = (uint64_t)len | (uint64_t)((flags | 0x10) & 0xffff) << 32 |
                   (uint64_t)nb << 48 | (uint64_t)q->seq++ << 56;
    while (!resp_room(&q->resp, pad8(len)) && !g_stop && !g_lost) {
        /* no room: say so and wait for the CPU to read and signal */
        __atomic_fetch_add(&q->resp.write[2], 1, __ATOMIC_SEQ_CST);
        if (!resp_room(&q->resp, pad8(len))) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 20000000;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            g_work = 0;
            pthread_cond_timedwait(&g_work_cv, &g_mu, &ts);
        }
        __atomic_fetch_sub(&q->resp.write[2], 1, __ATOMIC_SEQ_CST);
    }
    if (g_stop || g_lost) {
        return;
    }
    uint32_t w = q->resp.write[0];
    int wrap = q->resp.size - w < pad8(len);
    w = emit(&q->resp, w, &hdr, 8);
    if (wrap) {
        w = emit(&q->resp, 0, &hdr, 8);
    }
    if (nb > 0) {
        w = emit(&q->resp, w, bufs, 24 * nb);
    }
    if (ml > 0) {
        w = emit(&q->resp, w, msg, ml);
    }
    st(&q->resp.write[0], w);
    st(&q->resp.write[1], q->resp.write[1] + 1);
    unsigned id = (unsigned)(q - g_queues);
    st(&g_state[128 + id], g_state[128 + id] + 1); /* resp_packet_count */
    g_stats.responses++;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (ld(&q->resp.read[2]) != 0) {
        g_stats.saw_resp_waiting++;
    }
    if (!q->wait_counts || ld(&q->resp.read[2]) != 0) {
        signal_cpu();
    }
}

/* Read one request; 1 if there was one. */
static int serve_one(struct queue *q) {
    struct side *s = &q->req;
    uint32_t w = ld(&s->write[0]);
    uint32_t r = s->read[0];
    if (r == w) {
        return 0;
    }
    uint64_t hdr;
    memcpy(&hdr, s->data + r, 8);
    uint32_t len = (uint32_t)hdr;
    uint32_t flags = (uint32_t)(hdr >> 32) & 0xffff;
    uint32_t nb = flags & 2 ? (uint32_t)(hdr >> 48) & 0xff : 0;
    uint32_t ml = flags & 1 ? len - 8 - 24 * nb : 0;
    if (!(flags & 0x10) || len < 8 + 24 * nb || nb > 64 || ml > 65536) {
        g_stats.bad++;
    }
    r = s->size - r < len ? 8 : r + 8;
    if (r >= s->size) {
        r = 0;
    }
    uint8_t bufs[64 * 24];
    uint8_t msg[65536];
    if (nb > 0) {
        memcpy(bufs, s->data + r, 24 * nb);
        r += pad8(24 * nb);
        if (r >= s->size) {
            r = 0;
        }
    }
    if (ml > 0) {
        memcpy(msg, s->data + r, ml);
        r += pad8(ml);
        if (r >= s->size) {
            r = 0;
        }
    }
    st(&s->read[0], r);
    st(&s->read[1], s->read[1] + 1);
    unsigned id = (unsigned)(q - g_queues);
    st(&g_state[64 + id], g_state[64 + id] + 1); /* req_space_count */
    g_stats.requests++;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (ld(&s->write[2]) != 0) {
        g_stats.saw_req_waiting++;
    }
    if (!q->wait_counts || ld(&s->write[2]) != 0) {
        signal_cpu(); /* the writer waits for room */
    }

    /* The work: each buffer's bytes + 1 through the DSP's own mapping; the
     * answer: the same buffer entries with the DSP's addresses, the message ^ 0x5A. */
    for (uint32_t i = 0; i < nb; i++) {
        uint32_t fd;
        uint32_t size;
        uint32_t offset;
        memcpy(&fd, bufs + 24 * i, 4);
        memcpy(&size, bufs + 24 * i + 4, 4);
        memcpy(&offset, bufs + 24 * i + 8, 4);
        struct block *b = by_fd((int)fd);
        if (b == NULL || b->dsp == NULL || (uint64_t)offset + size > b->size) {
            g_stats.bad++;
            continue;
        }
        uint32_t n = size != 0 ? size : (uint32_t)b->size - offset;
        for (uint32_t k = 0; k < n; k++) {
            b->dsp[offset + k]++;
        }
        uint64_t dsp_address = (uint64_t)(uintptr_t)(b->dsp + offset);
        memcpy(bufs + 24 * i + 16, &dsp_address, 8);
    }
    for (uint32_t i = 0; i < ml; i++) {
        msg[i] ^= 0x5A;
    }
    if (g_mode == FAKE_WAKEUP) {
        respond(q, 4, NULL, 0, NULL, 0);
    }
    respond(q, flags & ~3u, bufs, nb, msg, ml);
    return 1;
}

static void *dsp_main(void *arg) {
    (void)arg;
    pthread_mutex_lock(&g_mu);
    while (!g_stop) {
        int did = 0;
        g_busy = 1;
        for (int i = 0; i < QUEUES && g_mode != FAKE_STALL && !g_lost; i++) {
            while (g_queues[i].active && serve_one(&g_queues[i])) {
                did = 1;
            }
        }
        g_busy = 0;
        if (did) {
            continue;
        }
        /* idle: ask the CPU to signal after its next write, look once more, sleep */
        for (int i = 0; i < QUEUES; i++) {
            if (g_queues[i].active) {
                st(&g_queues[i].req.read[2], 1);
            }
        }
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        int pending = 0;
        for (int i = 0; i < QUEUES; i++) {
            struct queue *q = &g_queues[i];
            pending |= q->active && ld(&q->req.write[0]) != q->req.read[0];
        }
        if (!pending || g_mode == FAKE_STALL || g_lost) {
            while (!g_work && !g_stop) {
                pthread_cond_wait(&g_work_cv, &g_mu);
            }
        }
        g_work = 0;
        for (int i = 0; i < QUEUES; i++) {
            if (g_queues[i].active) {
                st(&g_queues[i].req.read[2], 0);
            }
        }
    }
    pthread_mutex_unlock(&g_mu);
    return NULL;
}

/* ---- control ----------------------------------------------------------------------------------- */

void fake_reset(void) {
    pthread_mutex_lock(&g_mu);
    g_stop = 0;
    pthread_mutex_unlock(&g_mu);
    if (pthread_create(&g_thread, NULL, dsp_main, NULL) != 0) {
        abort();
    }
}

void fake_stop(void) {
    pthread_mutex_lock(&g_mu);
    g_stop = 1;
    pthread_cond_broadcast(&g_work_cv);
    pthread_mutex_unlock(&g_mu);
    pthread_join(g_thread, NULL);
}

void fake_set_mode(enum fake_mode mode) {
    pthread_mutex_lock(&g_mu);
    g_mode = mode;
    g_work = 1;
    pthread_cond_broadcast(&g_work_cv);
    pthread_mutex_unlock(&g_mu);
}

void fake_set_old_dsp(int old) {
    g_old_dsp = old;
}

void fake_set_imported(int imported) {
    g_imported = imported;
}

void fake_set_open_error(int rc) {
    g_open_error = rc;
}

void fake_set_cancel_error(int rc) {
    g_cancel_error = rc;
}

void fake_set_destroy_error(int rc) {
    g_destroy_error = rc;
}

void fake_lose_process(void) {
    pthread_mutex_lock(&g_mu);
    g_lost = 1;
    g_session++;
    for (int i = 0; i < QUEUES; i++) {
        g_queues[i].active = 0;
    }
    g_state = NULL;
    pthread_cond_broadcast(&g_wait_cv);
    pthread_cond_broadcast(&g_work_cv);
    pthread_mutex_unlock(&g_mu);
}

void fake_poke_position(int resp, int write, uint32_t value) {
    pthread_mutex_lock(&g_mu);
    struct side *s = resp ? &g_queues[0].resp : &g_queues[0].req;
    st(write ? &s->write[0] : &s->read[0], value);
    pthread_mutex_unlock(&g_mu);
}

void fake_poke_ring(int resp, uint32_t at, uint64_t value) {
    pthread_mutex_lock(&g_mu);
    struct side *s = resp ? &g_queues[0].resp : &g_queues[0].req;
    memcpy(s->data + at, &value, sizeof(value));
    pthread_mutex_unlock(&g_mu);
}

void fake_stats(struct fake_stats *out) {
    pthread_mutex_lock(&g_mu);
    *out = g_stats;
    pthread_mutex_unlock(&g_mu);
}

int fake_idle(void) {
    for (int n = 0; n < 5000; n++) {
        pthread_mutex_lock(&g_mu);
        int pending = g_busy;
        for (int i = 0; i < QUEUES; i++) {
            struct queue *q = &g_queues[i];
            pending |= q->active && ld(&q->req.write[0]) != q->req.read[0];
        }
        pthread_mutex_unlock(&g_mu);
        if (!pending) {
            return 1;
        }
        usleep(1000);
    }
    return 0;
}

void *fake_buffer(size_t size, int *fd) {
    void *p = NULL;
    if (port_alloc(size, &p) != 0) {
        return NULL;
    }
    *fd = port_to_fd(p);
    if (port_mmap(*fd, p, size) != 0) {
        port_free(p);
        return NULL;
    }
    return p;
}

void fake_buffer_free(void *ptr, int fd, size_t size) {
    (void)port_munmap(fd, ptr, size);
    port_free(ptr);
}

/* ---- port.h ------------------------------------------------------------------------------------ */

int port_alloc(size_t size, void **ptr) {
    size_t rounded = (size + 4095) / 4096 * 4096;
    pthread_mutex_lock(&g_mu);
    int rc = AEE_ENORPCMEMORY;
    for (int i = 0; i < BLOCKS; i++) {
        struct block *b = &g_blocks[i];
        if (b->used) {
            continue;
        }
        int memfd = memfd_create("fake-rpcmem", MFD_CLOEXEC);
        if (memfd < 0 || ftruncate(memfd, (off_t)rounded) != 0) {
            if (memfd >= 0) {
                close(memfd);
            }
            break;
        }
        void *cpu = mmap(NULL, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
        if (cpu == MAP_FAILED) {
            close(memfd);
            break;
        }
        memset(b, 0, sizeof(*b));
        b->used = 1;
        b->memfd = memfd;
        b->cpu = cpu;
        b->size = rounded;
        b->dsp_fd = 100 + i; /* the DSP's numbers: not this process's fds */
        *ptr = cpu;
        g_stats.live_memory++;
        rc = 0;
        break;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

void port_free(void *ptr) {
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < BLOCKS; i++) {
        struct block *b = &g_blocks[i];
        if (b->used && b->cpu == ptr) {
            if (b->dsp != NULL) {
                munmap(b->dsp, b->size);
                g_stats.mapped--;
            }
            munmap(b->cpu, b->size);
            close(b->memfd);
            memset(b, 0, sizeof(*b));
            g_stats.live_memory--;
            break;
        }
    }
    pthread_mutex_unlock(&g_mu);
}

int port_to_fd(void *ptr) {
    pthread_mutex_lock(&g_mu);
    int fd = -1;
    for (int i = 0; i < BLOCKS; i++) {
        struct block *b = &g_blocks[i];
        if (b->used && (uint8_t *)ptr >= b->cpu && (uint8_t *)ptr < b->cpu + b->size) {
            fd = b->dsp_fd;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return fd;
}

int port_mmap(int fd, void *ptr, size_t size) {
    pthread_mutex_lock(&g_mu);
    struct block *b = by_fd(fd);
    int rc = 0;
    if (b == NULL || b->cpu != ptr || size > b->size) {
        rc = AEE_EBADPARM;
    } else if (b->dsp != NULL) {
        rc = AEE_EALREADY;
    } else {
        void *dsp = mmap(NULL, b->size, PROT_READ | PROT_WRITE, MAP_SHARED, b->memfd, 0);
        if (dsp == MAP_FAILED) {
            rc = AEE_EFAILED;
        } else {
            b->dsp = dsp;
            g_stats.mapped++;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

int port_munmap(int fd, void *ptr, size_t size) {
    (void)ptr;
    (void)size;
    pthread_mutex_lock(&g_mu);
    struct block *b = by_fd(fd);
    int rc = 0;
    if (b == NULL || b->dsp == NULL) {
        rc = AEE_ENOSUCHMAP;
    } else if (b->refs > 0) {
        rc = AEE_EBADPARM;
    } else {
        munmap(b->dsp, b->size);
        b->dsp = NULL;
        g_stats.mapped--;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

int port_buffer_ref(int fd, int delta, void **va, size_t *size) {
    pthread_mutex_lock(&g_mu);
    struct block *b = by_fd(fd);
    int rc = 0;
    if (b == NULL || b->dsp == NULL) {
        rc = AEE_ENOSUCHMAP;
    } else if (b->refs + delta < 0) {
        rc = AEE_EBADPARM;
    } else {
        b->refs += delta;
        if (va != NULL) {
            *va = b->cpu;
        }
        if (size != NULL) {
            *size = b->size;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

int port_open(const char *uri, remote_handle64 *h) {
    pthread_mutex_lock(&g_mu);
    g_stats.opens++;
    int rc = 0;
    if (strcmp(uri, RPC_URI) != 0) {
        g_stats.bad++;
        rc = (int)DSP_EBADPARM;
    } else if (g_open_error != 0) {
        rc = g_open_error;
    } else {
        g_lost = 0; /* a new DSP process */
        g_handle = g_next_handle++;
        *h = g_handle;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

int port_close(remote_handle64 h) {
    pthread_mutex_lock(&g_mu);
    g_stats.closes++;
    int rc = h == g_handle && !g_lost ? 0 : AEE_ECONNRESET;
    if (h == g_handle) {
        g_handle = 0;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

uint64_t port_session(void) {
    pthread_mutex_lock(&g_mu);
    uint64_t s = g_session;
    pthread_mutex_unlock(&g_mu);
    return s;
}

static int arg_is(remote_arg *pra, unsigned i, size_t len) {
    return pra != NULL && pra[i].buf.pv != NULL && pra[i].buf.nLen == len;
}

static int create_queue(uint32_t id, int fd, uint32_t count, uint64_t *qid) {
    g_stats.creates++;
    struct block *b = by_fd(fd);
    if (b == NULL || b->dsp == NULL || id >= QUEUES || g_state == NULL) {
        g_stats.bad++;
        return (int)DSP_EBADPARM;
    }
    const uint32_t *h = (const uint32_t *)(void *)b->dsp;
    /* version, error, flags, req[4], resp[4], queue_count */
    if (!g_old_dsp) {
        if (h[0] == 0xffffffffu) {
            return (int)DSP_EUNSUPPORTED;
        }
        if (h[0] != 2 || h[2] != 1) {
            g_stats.bad++;
            return (int)DSP_EUNSUPPORTED;
        }
    }
    if (h[11] != count) {
        g_stats.bad++;
        return (int)DSP_EBADPARM;
    }
    struct queue *q = &g_queues[id];
    memset(q, 0, sizeof(*q));
    q->base = b->dsp;
    view(&q->req, b->dsp, h + 3);
    view(&q->resp, b->dsp, h + 7);
    q->wait_counts = !g_old_dsp;
    q->dsp_id = 0x38500000000ull | id;
    q->active = 1;
    *qid = q->dsp_id;
    /* a new queue to watch: the DSP thread looks again (and, idle, asks to be signalled) */
    g_work = 1;
    pthread_cond_broadcast(&g_work_cv);
    return 0;
}

int port_invoke(remote_handle64 h, uint32_t sc, remote_arg *pra, int wait) {
    uint32_t method = (sc >> 24) & 0x1f;
    static const uint32_t expected[9] = {0, 0, 0x02010000, 0x03010100, 0x04010000, 0x05010100,
                                         0x06000100, 0x07000000, 0x08000000};
    pthread_mutex_lock(&g_mu);
    int rc = 0;
    if (method < 2 || method > 8 || sc != expected[method]) {
        g_stats.bad++;
        rc = (int)DSP_EBADPARM;
        goto out;
    }
    if (h != g_handle || g_lost) {
        rc = AEE_ECONNRESET; /* npud: DSP_RESTARTED, the process is gone */
        goto out;
    }
    if ((method == 6) != (wait != 0)) {
        g_stats.wait_not_waiting++;
    }
    switch (method) {
    case 2: { /* init_process_state(i32 fd) */
        int32_t fd;
        if (!arg_is(pra, 0, 4)) {
            g_stats.bad++;
            rc = (int)DSP_EBADPARM;
            break;
        }
        memcpy(&fd, pra[0].buf.pv, 4);
        struct block *b = by_fd(fd);
        if (b == NULL || b->dsp == NULL) {
            g_stats.bad++;
            rc = (int)DSP_EBADPARM;
            break;
        }
        g_state = (volatile uint32_t *)(void *)b->dsp;
        g_stats.init_states++;
        break;
    }
    case 3: { /* create_queue(u32 id, i32 fd, u32 count, rout u64 id) */
        uint32_t in[3];
        uint64_t qid = 0;
        if (!arg_is(pra, 0, 12) || !arg_is(pra, 1, 8)) {
            g_stats.bad++;
            rc = (int)DSP_EBADPARM;
            break;
        }
        memcpy(in, pra[0].buf.pv, 12);
        rc = create_queue(in[0], (int)in[1], in[2], &qid);
        if (rc == 0) {
            memcpy(pra[1].buf.pv, &qid, 8);
        }
        break;
    }
    case 4: /* destroy_queue(u64 id) */
    case 5: { /* is_imported(u64 id, rout i32) */
        uint64_t qid;
        if (!arg_is(pra, 0, 8) || (method == 5 && !arg_is(pra, 1, 4))) {
            g_stats.bad++;
            rc = (int)DSP_EBADPARM;
            break;
        }
        memcpy(&qid, pra[0].buf.pv, 8);
        struct queue *q = &g_queues[qid & 63];
        if (!q->active || q->dsp_id != qid) {
            g_stats.bad++;
            rc = (int)DSP_EBADPARM;
            break;
        }
        if (method == 4 && g_destroy_error != 0) {
            q->active = 0;
            rc = g_destroy_error; /* it went, but the answer is a failure */
        } else if (method == 4) {
            q->active = 0;
            g_stats.destroys++;
        } else {
            int32_t imported = g_imported;
            memcpy(pra[1].buf.pv, &imported, 4);
        }
        break;
    }
    case 6: { /* wait_signal(rout i32) */
        if (!arg_is(pra, 0, 4)) {
            g_stats.bad++;
            rc = (int)DSP_EBADPARM;
            break;
        }
        g_stats.waits++;
        while (!g_cpu_signal && !g_cancel && !g_lost && h == g_handle) {
            pthread_cond_wait(&g_wait_cv, &g_mu);
        }
        int32_t signal = 0;
        if (g_lost || h != g_handle) {
            rc = AEE_ECONNRESET;
            break;
        }
        if (g_cancel) {
            g_cancel = 0;
            signal = -1;
        } else {
            g_cpu_signal = 0;
            g_stats.wakeups++;
        }
        memcpy(pra[0].buf.pv, &signal, 4);
        break;
    }
    case 7: /* cancel_wait_signal() */
        if (g_cancel_error != 0) {
            rc = g_cancel_error;
            break;
        }
        g_cancel = 1;
        g_stats.cancels++;
        pthread_cond_broadcast(&g_wait_cv);
        break;
    case 8: /* signal() */
        g_stats.signals++;
        g_work = 1;
        pthread_cond_broadcast(&g_work_cv);
        break;
    default:
        break;
    }
out:
    pthread_mutex_unlock(&g_mu);
    return rc;
}
