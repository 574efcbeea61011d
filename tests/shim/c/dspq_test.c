/*
 * dspq_test.c -- dspqueue.c against the DSP of fake_dsp.c: ./dspq_test SCENARIO.
 * Exit 0 when every check of the scenario holds (the first failing one is printed).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "AEEStdErr.h"
#include "dspqueue.h"
#include "fake_dsp.h"
#include "port.h"

#define CHECK(c)                                                                             \
    do {                                                                                     \
        if (!(c)) {                                                                          \
            fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #c);            \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

#define RC(call, want)                                                                       \
    do {                                                                                     \
        int rc_ = (int)(call);                                                               \
        if (rc_ != (int)(want)) {                                                            \
            fprintf(stderr, "%s:%d: %s = 0x%x, expected 0x%x\n", __FILE__, __LINE__, #call, \
                    (unsigned)rc_, (unsigned)(want));                                        \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

#define BUF_SIZE 65536u
#define SECOND 1000000u

static struct fake_stats stats(void) {
    struct fake_stats s;
    fake_stats(&s);
    return s;
}

static void expect_clean(void) {
    struct fake_stats s = stats();
    CHECK(s.live_memory == 0);
    CHECK(s.mapped == 0);
    CHECK(s.bad == 0);
    CHECK(s.wait_not_waiting == 0);
}

/* One request with one buffer and a message; its answer checked. */
static void roundtrip(dspqueue_t q, int fd, uint8_t *buf, uint32_t offset, uint32_t size,
                      uint32_t ml, uint8_t salt) {
    uint8_t msg[65536];
    uint8_t before[256];
    uint32_t n = size != 0 ? size : BUF_SIZE - offset;
    uint32_t probe = n < sizeof(before) ? n : (uint32_t)sizeof(before);
    for (uint32_t i = 0; i < ml; i++) {
        msg[i] = (uint8_t)(i * 7 + salt);
    }
    memcpy(before, buf + offset, probe);
    struct dspqueue_buffer b = {.fd = (uint32_t)fd, .size = size, .offset = offset, .flags = 0x90};
    b.ptr = buf + offset;
    RC(dspqueue_write(q, 0, 1, &b, ml, msg, SECOND), 0);

    uint32_t flags = 0;
    uint32_t nb = 0;
    uint32_t got = 0;
    struct dspqueue_buffer rb[2];
    uint8_t reply[65536];
    memset(rb, 0, sizeof(rb));
    RC(dspqueue_read(q, &flags, 2, &nb, rb, sizeof(reply), &got, reply, 5 * SECOND), 0);
    CHECK(nb == 1);
    CHECK(got == ml);
    CHECK(flags & DSPQUEUE_PACKET_FLAG_USER_READY);
    CHECK(!!(flags & DSPQUEUE_PACKET_FLAG_MESSAGE) == (ml > 0));
    CHECK(rb[0].fd == (uint32_t)fd);
    CHECK(rb[0].offset == offset);
    CHECK(rb[0].size == n);
    CHECK(rb[0].flags == 0x90);
    CHECK(rb[0].ptr == buf + offset); /* this process's address, not the DSP's */
    for (uint32_t i = 0; i < ml; i++) {
        CHECK(reply[i] == (uint8_t)(msg[i] ^ 0x5A));
    }
    for (uint32_t i = 0; i < probe; i++) {
        CHECK(buf[offset + i] == (uint8_t)(before[i] + 1)); /* the DSP wrote through its mapping */
    }
}

static dspqueue_t create(uint32_t req, uint32_t resp) {
    dspqueue_t q = NULL;
    RC(dspqueue_create(CDSP_DOMAIN_ID, 0, req, resp, NULL, NULL, NULL, &q), 0);
    CHECK(q != NULL);
    return q;
}

static void scenario_basic(void) {
    dspqueue_t q = create(2560, 6656); /* llama.cpp's sizes */
    uint64_t id = 0;
    RC(dspqueue_export(q, &id), 0);
    CHECK(id >> 8 == 0x38500000000ull >> 8);
    struct fake_stats s = stats();
    CHECK(s.opens == 1 && s.init_states == 1);
    CHECK(s.creates == 2); /* version UINT32_MAX refused, then version 2 with wait counts */
    int fd = -1;
    uint8_t *buf = fake_buffer(BUF_SIZE, &fd);
    CHECK(buf != NULL && fd > 0);
    unsigned before = stats().signals + stats().wakeups;
    for (int i = 0; i < 20; i++) {
        roundtrip(q, fd, buf, (uint32_t)(i * 128), 24, 24, (uint8_t)i);
    }
    roundtrip(q, fd, buf, 0, 0, 0, 1); /* size 0: the whole buffer */
    s = stats();
    /* a round trip costs one signal() and one wait_signal() answer at most */
    CHECK(s.signals + s.wakeups - before <= 2 * 21 + 2);
    CHECK(s.requests == 21 && s.responses == 21);
    RC(dspqueue_close(q), 0);
    fake_buffer_free(buf, fd, BUF_SIZE);
    s = stats();
    CHECK(s.destroys == 1 && s.cancels == 1 && s.closes == 1);
    expect_clean();
}

static void scenario_old_dsp(void) {
    fake_set_old_dsp(1);
    dspqueue_t q = create(1024, 1024);
    CHECK(stats().creates == 1); /* the first create_queue was taken: no wait counts */
    int fd = -1;
    uint8_t *buf = fake_buffer(BUF_SIZE, &fd);
    for (int i = 0; i < 50; i++) {
        roundtrip(q, fd, buf, 0, 16, (uint32_t)(i % 40), (uint8_t)i);
    }
    RC(dspqueue_close(q), 0);
    fake_buffer_free(buf, fd, BUF_SIZE);
    expect_clean();
}

/* Small rings, every packet size up to half a ring (a larger one may never find
 * room: a packet never crosses the end), and the rings wrap hundreds of times. */
static void scenario_wrap(void) {
    dspqueue_t q = create(256, 256);
    int fd = -1;
    uint8_t *buf = fake_buffer(BUF_SIZE, &fd);
    for (uint32_t i = 0; i < 3000; i++) {
        roundtrip(q, fd, buf, (i * 8) % 4096, 8, i % 97, (uint8_t)i);
    }
    CHECK(stats().responses == 3000);
    RC(dspqueue_close(q), 0);
    fake_buffer_free(buf, fd, BUF_SIZE);
    expect_clean();
}

struct stream {
    dspqueue_t q;
    unsigned count;
    unsigned step;
    int rc;
};

static void *writer_main(void *arg) {
    struct stream *s = arg;
    for (unsigned i = 0; i < s->count; i++) {
        uint8_t msg[200];
        uint32_t ml = 4 + (i * s->step) % 150;
        memcpy(msg, &i, 4);
        for (uint32_t k = 4; k < ml; k++) {
            msg[k] = (uint8_t)(i + k);
        }
        int rc = dspqueue_write(s->q, 0, 0, NULL, ml, msg, DSPQUEUE_TIMEOUT_NONE);
        if (rc != 0) {
            s->rc = rc;
            return NULL;
        }
    }
    return NULL;
}

static void *reader_main(void *arg) {
    struct stream *s = arg;
    for (unsigned i = 0; i < s->count; i++) {
        uint8_t msg[200];
        uint32_t ml = 0;
        uint32_t nb = 9;
        uint32_t flags = 0;
        int rc = dspqueue_read(s->q, &flags, 0, &nb, NULL, sizeof(msg), &ml, msg,
                               DSPQUEUE_TIMEOUT_NONE);
        if (rc != 0) {
            s->rc = rc;
            return NULL;
        }
        uint32_t seq;
        uint8_t head[4];
        for (int k = 0; k < 4; k++) {
            head[k] = msg[k] ^ 0x5A;
        }
        memcpy(&seq, head, 4);
        if (seq != i || nb != 0 || ml != 4 + (i * s->step) % 150) {
            s->rc = -1;
            return NULL;
        }
        for (uint32_t k = 4; k < ml; k++) {
            if ((msg[k] ^ 0x5A) != (uint8_t)(i + k)) {
                s->rc = -2;
                return NULL;
            }
        }
    }
    return NULL;
}

/* A send thread and a receive thread, like llama.cpp's: many packets in flight. */
static void scenario_many(void) {
    dspqueue_t q = create(2048, 1024);
    struct stream w = {.q = q, .count = 20000, .step = 13};
    struct stream r = w;
    pthread_t tw;
    pthread_t tr;
    unsigned before = stats().signals;
    CHECK(pthread_create(&tr, NULL, reader_main, &r) == 0);
    CHECK(pthread_create(&tw, NULL, writer_main, &w) == 0);
    pthread_join(tw, NULL);
    pthread_join(tr, NULL);
    RC(w.rc, 0);
    RC(r.rc, 0);
    struct fake_stats s = stats();
    CHECK(s.requests == 20000 && s.responses == 20000);
    /* signals coalesce: never more than one per packet */
    CHECK(s.signals - before <= 20000 + 2);
    printf("many: 20000 packets, %u signal() calls, %u wait_signal() answers\n",
           s.signals - before, s.wakeups);
    RC(dspqueue_close(q), 0);
    expect_clean();
}

static void *blocked_write(void *arg) {
    struct stream *s = arg;
    uint8_t msg[56] = {1};
    s->rc = dspqueue_write(s->q, 0, 0, NULL, sizeof(msg), msg, DSPQUEUE_TIMEOUT_NONE);
    return NULL;
}

/* The DSP reads nothing: the request ring fills, writes time out or wait. */
static void scenario_full(void) {
    fake_set_mode(FAKE_STALL);
    dspqueue_t q = create(512, 4096);
    uint8_t msg[56] = {0};
    unsigned written = 0;
    int rc;
    while ((rc = dspqueue_write(q, 0, 0, NULL, sizeof(msg), msg, 0)) == 0) {
        written++;
        CHECK(written < 100);
    }
    RC(rc, AEE_EEXPIRED);
    CHECK(written == (512 - 8) / 64);
    RC(dspqueue_write(q, 0, 0, NULL, sizeof(msg), msg, 2000), AEE_EEXPIRED);
    struct stream s = {.q = q};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, blocked_write, &s) == 0);
    usleep(50000);
    fake_set_mode(FAKE_ECHO); /* the DSP drains the ring and sees the writer waiting */
    pthread_join(t, NULL);
    RC(s.rc, 0);
    CHECK(fake_idle());
    CHECK(stats().saw_req_waiting >= 1);
    for (unsigned i = 0; i < written + 1; i++) {
        uint32_t ml = 0;
        uint8_t reply[64];
        RC(dspqueue_read(q, NULL, 0, NULL, NULL, sizeof(reply), &ml, reply, SECOND), 0);
        CHECK(ml == sizeof(msg));
    }
    RC(dspqueue_read_noblock(q, NULL, 0, NULL, NULL, 0, NULL, NULL), AEE_EWOULDBLOCK);
    RC(dspqueue_close(q), 0);
    expect_clean();
}

/* The CPU reads nothing: the DSP waits for room, and the reader's reads wake it. */
static void scenario_resp_full(void) {
    dspqueue_t q = create(4096, 256);
    uint8_t msg[100] = {0};
    for (int i = 0; i < 20; i++) {
        RC(dspqueue_write(q, 0, 0, NULL, sizeof(msg), msg, SECOND), 0);
    }
    usleep(50000);
    CHECK(stats().responses < 20); /* the response ring holds two */
    for (int i = 0; i < 20; i++) {
        uint32_t ml = 0;
        uint8_t reply[128];
        RC(dspqueue_read(q, NULL, 0, NULL, NULL, sizeof(reply), &ml, reply, 5 * SECOND), 0);
        CHECK(ml == sizeof(msg));
    }
    CHECK(stats().responses == 20);
    RC(dspqueue_close(q), 0);
    expect_clean();
}

static void scenario_timeout(void) {
    dspqueue_t q = create(1024, 1024);
    uint8_t m[8];
    uint32_t ml = 0;
    RC(dspqueue_read_noblock(q, NULL, 0, NULL, NULL, sizeof(m), &ml, m), AEE_EWOULDBLOCK);
    RC(dspqueue_read(q, NULL, 0, NULL, NULL, sizeof(m), &ml, m, 0), AEE_EEXPIRED);
    struct timespec a;
    struct timespec b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    RC(dspqueue_read(q, NULL, 0, NULL, NULL, sizeof(m), &ml, m, 30000), AEE_EEXPIRED);
    clock_gettime(CLOCK_MONOTONIC, &b);
    long waited_us = (b.tv_sec - a.tv_sec) * 1000000L + (b.tv_nsec - a.tv_nsec) / 1000;
    CHECK(waited_us >= 30000); /* it did wait the time it was given */
    CHECK(stats().saw_resp_waiting == 0);
    RC(dspqueue_close(q), 0);
    expect_clean();
}

static void scenario_errors(void) {
    dspqueue_t q = NULL;
    RC(dspqueue_create(CDSP_DOMAIN_ID, 0, 0, 0, NULL, NULL, NULL, NULL), AEE_EBADPARM);
    RC(dspqueue_create(CDSP_DOMAIN_ID, 1, 0, 0, NULL, NULL, NULL, &q), AEE_EBADPARM);
    RC(dspqueue_create(CDSP_DOMAIN_ID, 0, 16777217, 0, NULL, NULL, NULL, &q), AEE_EBADPARM);
    RC(dspqueue_create(ADSP_DOMAIN_ID, 0, 0, 0, NULL, NULL, NULL, &q), AEE_EUNSUPPORTED);
    RC(dspqueue_create(99, 0, 0, 0, NULL, NULL, NULL, &q), AEE_EBADPARM);
    RC(dspqueue_close(NULL), AEE_EBADPARM);
    RC(dspqueue_export(NULL, NULL), AEE_EBADPARM);
    CHECK(stats().opens == 0);

    q = create(0, 0); /* the defaults: 64 KiB and 16 KiB */
    int fd = -1;
    uint8_t *buf = fake_buffer(BUF_SIZE, &fd);
    uint8_t big[65537] = {0};
    struct dspqueue_buffer b = {.fd = (uint32_t)fd, .size = 16};
    struct dspqueue_buffer bufs[65];
    for (int i = 0; i < 65; i++) {
        bufs[i] = b;
    }
    struct dspqueue_buffer unmapped = {.fd = 9999};
    RC(dspqueue_write(q, 0, 1, &unmapped, 0, NULL, SECOND), AEE_ENOSUCHMAP);
    struct dspqueue_buffer beyond = {.fd = (uint32_t)fd, .offset = BUF_SIZE - 8, .size = 16};
    RC(dspqueue_write(q, 0, 1, &beyond, 0, NULL, SECOND), AEE_EBADPARM);
    struct dspqueue_buffer offset_whole = {.fd = (uint32_t)fd, .offset = 8, .size = 0};
    RC(dspqueue_write(q, 0, 1, &offset_whole, 0, NULL, SECOND), AEE_EBADPARM);
    struct dspqueue_buffer both = {.fd = (uint32_t)fd,
                                   .flags = DSPQUEUE_BUFFER_FLAG_REF | DSPQUEUE_BUFFER_FLAG_DEREF};
    RC(dspqueue_write(q, 0, 1, &both, 0, NULL, SECOND), AEE_EBADPARM);
    /* a bad second buffer undoes the first one's reference */
    struct dspqueue_buffer pair[2] = {{.fd = (uint32_t)fd, .flags = DSPQUEUE_BUFFER_FLAG_REF},
                                      {.fd = 9999}};
    RC(dspqueue_write(q, 0, 2, pair, 0, NULL, SECOND), AEE_ENOSUCHMAP);
    RC(dspqueue_write(q, 0, 65, bufs, 0, NULL, SECOND), AEE_EBADPARM);
    RC(dspqueue_write(q, 0, 0, NULL, sizeof(big), big, SECOND), AEE_EBADPARM);
    RC(dspqueue_write(q, 0, 1, NULL, 0, NULL, SECOND), AEE_EBADPARM);
    RC(dspqueue_write(q, 0, 0, NULL, 4, NULL, SECOND), AEE_EBADPARM);
    RC(dspqueue_write(NULL, 0, 0, NULL, 0, NULL, SECOND), AEE_EBADPARM);
    RC(dspqueue_read(NULL, NULL, 0, NULL, NULL, 0, NULL, NULL, 0), AEE_EBADPARM);
    RC(dspqueue_read_noblock(NULL, NULL, 0, NULL, NULL, 0, NULL, NULL), AEE_EBADPARM);
    CHECK(stats().requests == 0);

    /* the reader's room too small: an error, and the packet is still there */
    struct dspqueue_buffer two[2] = {{.fd = (uint32_t)fd, .size = 8},
                                     {.fd = (uint32_t)fd, .offset = 64, .size = 8}};
    uint8_t msg[32] = {1, 2, 3};
    RC(dspqueue_write(q, 0, 2, two, sizeof(msg), msg, SECOND), 0);
    CHECK(fake_idle());
    struct dspqueue_buffer rb[2];
    uint8_t reply[32];
    uint32_t nb = 0;
    uint32_t ml = 0;
    RC(dspqueue_read(q, NULL, 1, &nb, rb, sizeof(reply), &ml, reply, SECOND), AEE_EBADPARM);
    RC(dspqueue_read(q, NULL, 2, &nb, rb, 16, &ml, reply, SECOND), AEE_EBADPARM);
    RC(dspqueue_read(q, NULL, 2, &nb, rb, sizeof(reply), &ml, reply, SECOND), 0);
    CHECK(nb == 2 && ml == sizeof(msg) && rb[1].ptr == buf + 64);

    /* references: a referenced buffer cannot be unmapped until it is let go */
    struct dspqueue_buffer ref = {.fd = (uint32_t)fd, .size = 8, .flags = DSPQUEUE_BUFFER_FLAG_REF};
    RC(dspqueue_write(q, 0, 1, &ref, 0, NULL, SECOND), 0);
    RC(port_munmap(fd, buf, BUF_SIZE), AEE_EBADPARM);
    uint32_t flags = 0;
    RC(dspqueue_read(q, &flags, 1, &nb, rb, 0, &ml, NULL, SECOND), 0); /* REF again: 2 */
    struct dspqueue_buffer deref = {.fd = (uint32_t)fd, .size = 8,
                                    .flags = DSPQUEUE_BUFFER_FLAG_DEREF};
    RC(dspqueue_write(q, 0, 1, &deref, 0, NULL, SECOND), 0);
    RC(dspqueue_read(q, &flags, 1, &nb, rb, 0, &ml, NULL, SECOND), 0); /* DEREF again: 0 */
    RC(port_munmap(fd, buf, BUF_SIZE), 0);
    port_free(buf);
    RC(dspqueue_close(q), 0);
    expect_clean();
}

static int g_errors;
static int g_error_code;

static void on_error(dspqueue_t q, AEEResult error, void *context) {
    (void)q;
    (void)context;
    __atomic_fetch_add(&g_errors, 1, __ATOMIC_SEQ_CST);
    __atomic_store_n(&g_error_code, error, __ATOMIC_SEQ_CST);
}

static void *blocked_read(void *arg) {
    struct stream *s = arg;
    uint8_t m[64];
    uint32_t ml = 0;
    s->rc = dspqueue_read(s->q, NULL, 0, NULL, NULL, sizeof(m), &ml, m, DSPQUEUE_TIMEOUT_NONE);
    return NULL;
}

/* The DSP process dies (a restart): waiters wake, every call fails with
 * AEE_ECONNRESET, close still works, and a new queue starts a new process. */
static void scenario_restart(void) {
    dspqueue_t q = NULL;
    RC(dspqueue_create(CDSP_DOMAIN_ID, 0, 1024, 1024, NULL, on_error, NULL, &q), 0);
    int fd = -1;
    uint8_t *buf = fake_buffer(BUF_SIZE, &fd);
    roundtrip(q, fd, buf, 0, 8, 8, 1);
    struct stream s = {.q = q};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, blocked_read, &s) == 0);
    usleep(30000);
    fake_lose_process();
    pthread_join(t, NULL);
    RC(s.rc, AEE_ECONNRESET);
    uint8_t m[8] = {0};
    RC(dspqueue_write(q, 0, 0, NULL, sizeof(m), m, SECOND), AEE_ECONNRESET);
    RC(dspqueue_read_noblock(q, NULL, 0, NULL, NULL, sizeof(m), NULL, m), AEE_ECONNRESET);
    for (int i = 0; i < 500 && __atomic_load_n(&g_errors, __ATOMIC_SEQ_CST) == 0; i++) {
        usleep(1000);
    }
    CHECK(__atomic_load_n(&g_errors, __ATOMIC_SEQ_CST) == 1);
    CHECK(__atomic_load_n(&g_error_code, __ATOMIC_SEQ_CST) == AEE_ECONNRESET);
    RC(dspqueue_close(q), 0);

    q = create(1024, 1024); /* a new process */
    CHECK(stats().opens == 2);
    roundtrip(q, fd, buf, 0, 8, 8, 2);
    RC(dspqueue_close(q), 0);
    fake_buffer_free(buf, fd, BUF_SIZE);
    expect_clean();
}

/* The process is lost while no call is made: the next call notices. */
static void scenario_lost_idle(void) {
    dspqueue_t q = create(1024, 1024);
    fake_lose_process();
    uint8_t m[8] = {0};
    RC(dspqueue_write(q, 0, 0, NULL, sizeof(m), m, SECOND), AEE_ECONNRESET);
    RC(dspqueue_close(q), 0);
    expect_clean();
}

static unsigned g_callbacks;
static unsigned g_packets;

static void on_packet(dspqueue_t q, AEEResult error, void *context) {
    (void)error;
    (void)context;
    __atomic_fetch_add(&g_callbacks, 1, __ATOMIC_SEQ_CST);
    uint8_t m[64];
    uint32_t ml = 0;
    while (dspqueue_read_noblock(q, NULL, 0, NULL, NULL, sizeof(m), &ml, m) == 0) {
        __atomic_fetch_add(&g_packets, 1, __ATOMIC_SEQ_CST);
    }
}

static void scenario_callbacks(void) {
    dspqueue_t q = NULL;
    RC(dspqueue_create(CDSP_DOMAIN_ID, 0, 4096, 4096, on_packet, NULL, NULL, &q), 0);
    uint8_t m[16] = {0};
    for (int i = 0; i < 300; i++) {
        RC(dspqueue_write(q, 0, 0, NULL, sizeof(m), m, SECOND), 0);
    }
    for (int i = 0; i < 5000 && __atomic_load_n(&g_packets, __ATOMIC_SEQ_CST) < 300; i++) {
        usleep(1000);
    }
    CHECK(__atomic_load_n(&g_packets, __ATOMIC_SEQ_CST) == 300);
    CHECK(__atomic_load_n(&g_callbacks, __ATOMIC_SEQ_CST) >= 1);
    RC(dspqueue_close(q), 0);
    expect_clean();
}

static void scenario_imported(void) {
    dspqueue_t q = create(1024, 1024);
    fake_set_imported(1);
    RC(dspqueue_close(q), AEE_EBADPARM); /* the DSP still has it open */
    fake_set_imported(0);
    RC(dspqueue_close(q), 0);
    expect_clean();
}

struct worker {
    dspqueue_t q;
    int fd;
    uint8_t *buf;
    uint32_t offset;
};

static void *worker_main(void *arg) {
    struct worker *w = arg;
    for (int i = 0; i < 300; i++) {
        roundtrip(w->q, w->fd, w->buf, w->offset, 32, (uint32_t)(i % 100), (uint8_t)i);
    }
    return NULL;
}

/* Several queues of one process share the state block and the two threads. */
static void scenario_multi(void) {
    struct worker w[3];
    pthread_t t[3];
    int fd = -1;
    uint8_t *buf = fake_buffer(BUF_SIZE, &fd);
    for (int i = 0; i < 3; i++) {
        w[i] = (struct worker){.q = create(1024, 1024), .fd = fd, .buf = buf,
                               .offset = (uint32_t)(i * 4096)};
    }
    for (int i = 0; i < 3; i++) {
        CHECK(pthread_create(&t[i], NULL, worker_main, &w[i]) == 0);
    }
    for (int i = 0; i < 3; i++) {
        pthread_join(t[i], NULL);
    }
    struct fake_stats s = stats();
    CHECK(s.opens == 1 && s.init_states == 1 && s.creates == 6);
    for (int i = 0; i < 3; i++) {
        RC(dspqueue_close(w[i].q), 0);
        CHECK(stats().closes == (i == 2 ? 1u : 0u)); /* the last queue takes the process */
    }
    fake_buffer_free(buf, fd, BUF_SIZE);
    expect_clean();

    /* 64 queues per process */
    dspqueue_t qs[64];
    for (int i = 0; i < 64; i++) {
        qs[i] = create(256, 256);
    }
    dspqueue_t extra = NULL;
    RC(dspqueue_create(CDSP_DOMAIN_ID, 0, 256, 256, NULL, NULL, NULL, &extra), AEE_EBADPARM);
    for (int i = 0; i < 64; i++) {
        RC(dspqueue_close(qs[i]), 0);
    }
    expect_clean();
}

static void scenario_unsupported(void) {
    dspqueue_t q = NULL;
    fake_set_open_error((int)0x8000043E); /* AEE_ENOSUCHMOD: no dspqueue_rpc skel */
    RC(dspqueue_create(CDSP_DOMAIN_ID, 0, 0, 0, NULL, NULL, NULL, &q), AEE_EUNSUPPORTED);
    CHECK(q == NULL);
    fake_set_open_error(AEE_ECONNRESET);
    RC(dspqueue_create(CDSP_DOMAIN_ID, 0, 0, 0, NULL, NULL, NULL, &q), AEE_ECONNRESET);
    fake_set_open_error(0);
    q = create(0, 0);
    RC(dspqueue_close(q), 0);
    expect_clean();
}

static void scenario_wakeup(void) {
    fake_set_mode(FAKE_WAKEUP);
    dspqueue_t q = create(1024, 1024);
    int fd = -1;
    uint8_t *buf = fake_buffer(BUF_SIZE, &fd);
    for (int i = 0; i < 50; i++) {
        roundtrip(q, fd, buf, 0, 8, 8, (uint8_t)i); /* early wakeups are skipped */
    }
    RC(dspqueue_close(q), 0);
    fake_buffer_free(buf, fd, BUF_SIZE);
    expect_clean();
}

/* destroy_queue fails: close returns the failure (as libcdsprpc), lets go of the
 * queue's memory all the same, and leaves a husk that only a second close takes. */
static void scenario_teardown_error(void) {
    const int failure = (int)0x80000401u; /* the DSP's AEE_EFAILED */
    dspqueue_t keep = create(1024, 1024);
    dspqueue_t q = create(1024, 1024);
    fake_set_destroy_error(failure);
    RC(dspqueue_close(q), failure);
    fake_set_destroy_error(0);
    uint64_t id = 0;
    uint8_t m[8] = {0};
    uint32_t ml = 0;
    RC(dspqueue_export(q, &id), AEE_EBADPARM);
    RC(dspqueue_write(q, 0, 0, NULL, sizeof(m), m, SECOND), AEE_EBADPARM);
    RC(dspqueue_read(q, NULL, 0, NULL, NULL, sizeof(m), &ml, m, SECOND), AEE_EBADPARM);
    RC(dspqueue_read_noblock(q, NULL, 0, NULL, NULL, sizeof(m), &ml, m), AEE_EBADPARM);
    RC(dspqueue_close(q), 0); /* the husk */
    int fd = -1;
    uint8_t *buf = fake_buffer(BUF_SIZE, &fd);
    roundtrip(keep, fd, buf, 0, 16, 16, 1); /* the other queue works on */
    fake_buffer_free(buf, fd, BUF_SIZE);
    /* the last queue: its domain goes too */
    fake_set_destroy_error(failure);
    RC(dspqueue_close(keep), failure);
    fake_set_destroy_error(0);
    RC(dspqueue_close(keep), 0);
    CHECK(stats().closes == 1 && stats().cancels == 1);
    expect_clean();
}

/* A DSP that writes impossible ring positions and packet lengths: each is
 * AEE_EBADITEM to the caller, never an access outside the ring; the positions
 * the CPU publishes are its own, whatever the shared copies say. */
static void scenario_hostile(void) {
    fake_set_mode(FAKE_STALL);
    dspqueue_t q = create(1024, 1024);
    uint8_t m[16] = {1, 2, 3};
    uint8_t got[64];
    uint32_t ml = 0;
    const uint32_t far = 0x7ffffff8u; /* far outside the mapping */

    /* the CPU's own positions, overwritten in shared memory: not read back */
    fake_poke_position(0, 1, far); /* request write position */
    RC(dspqueue_write(q, 0, 0, NULL, sizeof(m), m, SECOND), 0);
    fake_poke_position(1, 0, far); /* response read position */
    RC(dspqueue_read_noblock(q, NULL, 0, NULL, NULL, sizeof(got), &ml, got), AEE_EWOULDBLOCK);

    /* the DSP's positions: outside the ring, at its end, not a multiple of 8 */
    const uint32_t bad[] = {far, 1024, 1028, 12, 0xffffffffu};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        fake_poke_position(0, 0, bad[i]); /* request read position */
        RC(dspqueue_write(q, 0, 0, NULL, sizeof(m), m, SECOND), AEE_EBADITEM);
        fake_poke_position(1, 1, bad[i]); /* response write position */
        RC(dspqueue_read_noblock(q, NULL, 0, NULL, NULL, sizeof(got), &ml, got), AEE_EBADITEM);
        RC(dspqueue_read(q, NULL, 0, NULL, NULL, sizeof(got), &ml, got, SECOND), AEE_EBADITEM);
    }
    fake_poke_position(0, 0, 24); /* the DSP "read" the one request: room again */
    RC(dspqueue_write(q, 0, 0, NULL, sizeof(m), m, SECOND), 0);

    /* packet headers: a length beyond the ring, beyond what was published, below 8 */
    const uint64_t user_ready_message = (uint64_t)(0x10 | 1) << 32;
    const uint64_t headers[] = {user_ready_message | 0xfffffff0u, user_ready_message | 1024,
                                user_ready_message | 64, user_ready_message | 4};
    for (size_t i = 0; i < sizeof(headers) / sizeof(headers[0]); i++) {
        fake_poke_ring(1, 0, headers[i]);
        fake_poke_position(1, 1, 16); /* 16 bytes published */
        RC(dspqueue_read_noblock(q, NULL, 0, NULL, NULL, sizeof(got), &ml, got), AEE_EBADITEM);
    }
    /* with nothing published, nothing to read; a sound packet still reads */
    fake_poke_position(1, 1, 0);
    RC(dspqueue_read_noblock(q, NULL, 0, NULL, NULL, sizeof(got), &ml, got), AEE_EWOULDBLOCK);
    fake_poke_ring(1, 0, user_ready_message | 16);
    fake_poke_position(1, 1, 16);
    RC(dspqueue_read_noblock(q, NULL, 0, NULL, NULL, sizeof(got), &ml, got), 0);
    CHECK(ml == 8);
    RC(dspqueue_close(q), 0);
    expect_clean();
}

/* Under NPUD_SHIM_FAULT_AT=n: whatever fails, a code comes back and nothing leaks. */
static void scenario_faults(void) {
    dspqueue_t q = NULL;
    int rc = dspqueue_create(CDSP_DOMAIN_ID, 0, 1024, 1024, on_packet, on_error, NULL, &q);
    printf("create: 0x%x\n", (unsigned)rc);
    if (rc == 0) {
        uint8_t m[16] = {0};
        rc = dspqueue_write(q, 0, 0, NULL, sizeof(m), m, SECOND);
        printf("write: 0x%x\n", (unsigned)rc);
        rc = dspqueue_close(q);
        printf("close: 0x%x\n", (unsigned)rc);
        CHECK(rc == 0);
    } else {
        CHECK(q == NULL);
    }
    expect_clean();
}

int main(int argc, char **argv) {
    static const struct {
        const char *name;
        void (*run)(void);
    } scenarios[] = {
        {"basic", scenario_basic},           {"old_dsp", scenario_old_dsp},
        {"wrap", scenario_wrap},             {"many", scenario_many},
        {"full", scenario_full},             {"resp_full", scenario_resp_full},
        {"timeout", scenario_timeout},       {"errors", scenario_errors},
        {"restart", scenario_restart},       {"lost_idle", scenario_lost_idle},
        {"callbacks", scenario_callbacks},   {"imported", scenario_imported},
        {"multi", scenario_multi},           {"unsupported", scenario_unsupported},
        {"wakeup", scenario_wakeup},         {"faults", scenario_faults},
        {"hostile", scenario_hostile},       {"teardown_error", scenario_teardown_error},
    };
    if (argc != 2) {
        fprintf(stderr, "usage: %s SCENARIO\n", argv[0]);
        return 2;
    }
    for (size_t i = 0; i < sizeof(scenarios) / sizeof(scenarios[0]); i++) {
        if (strcmp(argv[1], scenarios[i].name) == 0) {
            fake_reset();
            scenarios[i].run();
            fake_stop();
            printf("ok %s\n", argv[1]);
            return 0;
        }
    }
    fprintf(stderr, "no scenario %s\n", argv[1]);
    return 2;
}
