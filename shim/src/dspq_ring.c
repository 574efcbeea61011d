/*
 * dspq_ring.c -- packets in a dspqueue ring (dspq_ring.h has the format).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "AEEStdErr.h"
#include "dspq_ring.h"

static uint32_t align_up(uint32_t n, uint32_t to) {
    return (n + to - 1) / to * to;
}

size_t dspq_block_size(uint32_t req, uint32_t resp) {
    return (size_t)align_up(sizeof(struct dspq_header), DSPQ_ALIGN) + 4 * (size_t)DSPQ_ALIGN +
           align_up(req, DSPQ_ALIGN) + align_up(resp, DSPQ_ALIGN);
}

void dspq_layout(struct dspq_header *h, uint32_t req, uint32_t resp) {
    uint32_t o = align_up(sizeof(struct dspq_header), DSPQ_ALIGN);
    h->req.queue_offset = o;
    h->req.queue_length = req;
    o += align_up(req, DSPQ_ALIGN);
    h->req.read_state_offset = o;
    o += DSPQ_ALIGN;
    h->req.write_state_offset = o;
    o += DSPQ_ALIGN;
    h->resp.queue_offset = o;
    h->resp.queue_length = resp;
    o += align_up(resp, DSPQ_ALIGN);
    h->resp.read_state_offset = o;
    o += DSPQ_ALIGN;
    h->resp.write_state_offset = o;
}

void dspq_ring_of(struct dspq_header *h, int resp, struct dspq_ring *r) {
    const struct dspq_ring_header *q = resp ? &h->resp : &h->req;
    uint8_t *base = (uint8_t *)h;
    r->data = base + q->queue_offset;
    r->size = q->queue_length;
    r->read = (struct dspq_state *)(void *)(base + q->read_state_offset);
    r->write = (struct dspq_state *)(void *)(base + q->write_state_offset);
    r->own_position = 0;
    r->own_count = 0;
}

int dspq_inner_shareable;

static pthread_once_t g_barriers_once = PTHREAD_ONCE_INIT;

static void barriers_from_env(void) {
    const char *v = getenv("NPUD_SHIM_BARRIERS");
    dspq_inner_shareable = v != NULL && strcmp(v, "inner") == 0;
}

int dspq_barriers_init(void) {
    pthread_once(&g_barriers_once, barriers_from_env);
    return dspq_inner_shareable;
}

/* A position the other side published: a multiple of 8 inside the ring. */
static int position_ok(const struct dspq_ring *r, uint32_t pos) {
    return pos < r->size && (pos & 7u) == 0;
}

int dspq_ring_room(const struct dspq_ring *r, uint32_t alen) {
    uint32_t rd = dspq_load(&r->read->position);
    if (!position_ok(r, rd)) {
        return AEE_EBADITEM;
    }
    uint32_t w = r->own_position;
    uint32_t left = rd == w ? r->size - 8 : w > rd ? r->size - w + rd - 8 : rd - w - 8;
    if (left < alen) {
        return AEE_EWOULDBLOCK;
    }
    if (r->size - w < alen && left - (r->size - w) < alen) {
        return AEE_EWOULDBLOCK; /* it must start over at 0, and 0.. is not free yet */
    }
    return 0;
}

static uint32_t put(struct dspq_ring *r, uint32_t pos, const void *data, uint32_t len) {
    memcpy(r->data + pos, data, len);
    pos += align_up(len, 8);
    return pos >= r->size ? 0 : pos;
}

void dspq_ring_put(struct dspq_ring *r, uint64_t header, const void *buffers,
                   uint32_t buffers_len, const void *message, uint32_t message_len) {
    uint32_t len = (uint32_t)(header & 0xffffffffu);
    uint32_t w = r->own_position;
    int wrap = r->size - w < align_up(len, 8);
    w = put(r, w, &header, sizeof(header));
    if (wrap) {
        w = put(r, 0, &header, sizeof(header));
    }
    if (buffers_len > 0) {
        w = put(r, w, buffers, buffers_len);
    }
    if (message_len > 0) {
        w = put(r, w, message, message_len);
    }
    r->own_position = w;
    dspq_publish(&r->write->position, w);
    dspq_publish(&r->write->packet_count, ++r->own_count);
}

int dspq_ring_peek(const struct dspq_ring *r, uint64_t *header) {
    uint32_t w = dspq_load(&r->write->position);
    if (!position_ok(r, w)) {
        return AEE_EBADITEM;
    }
    uint32_t rd = r->own_position;
    uint32_t avail = rd == w ? 0 : w > rd ? w - rd : r->size - rd + w;
    if (avail < 8) {
        return AEE_EWOULDBLOCK;
    }
    memcpy(header, r->data + rd, sizeof(*header));
    /* The packet must fit the ring and lie in what the writer published: from
     * rd, or, when it did not fit before the end, the header at rd and the
     * packet from 0. */
    uint32_t len = (uint32_t)(*header & 0xffffffffu);
    if (len < 8 || len > r->size - 8) {
        return AEE_EBADITEM;
    }
    uint32_t alen = align_up(len, 8);
    uint32_t need = r->size - rd < alen ? r->size - rd + alen : alen;
    if (avail < need) {
        return AEE_EBADITEM;
    }
    return 0;
}

static uint32_t take(const struct dspq_ring *r, uint32_t pos, void *out, uint32_t len) {
    if (out != NULL) {
        memcpy(out, r->data + pos, len);
    }
    pos += align_up(len, 8);
    return pos >= r->size ? 0 : pos;
}

void dspq_ring_take(struct dspq_ring *r, uint32_t len, void *buffers, uint32_t buffers_len,
                    void *message, uint32_t message_len) {
    uint32_t rd = r->own_position;
    rd = r->size - rd < len ? 8 : rd + 8; /* the writer started it over at 0 */
    if (rd >= r->size) {
        rd = 0;
    }
    if (buffers_len > 0) {
        rd = take(r, rd, buffers, buffers_len);
    }
    if (message_len > 0) {
        rd = take(r, rd, message, message_len);
    }
    r->own_position = rd;
    dspq_release_read(&r->read->position, rd);
    dspq_release_read(&r->read->packet_count, ++r->own_count);
}
