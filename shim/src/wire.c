/*
 * wire.c -- npud's frames and msgpack maps, no I/O.
 */
#include <stdlib.h>
#include <string.h>

#include "shim.h"
#include "wire.h"

static int wbuf_write(void *data, const char *buf, size_t len) {
    struct wbuf *b = data;
    if (b->failed) {
        return -1;
    }
    if (len > b->cap - b->len) {
        size_t cap = b->cap != 0 ? b->cap : 256;
        while (len > cap - b->len) {
            if (cap > SIZE_MAX / 2) {
                b->failed = 1;
                return -1;
            }
            cap *= 2;
        }
        char *grown = x_realloc(b->data, cap);
        if (grown == NULL) {
            b->failed = 1;
            return -1;
        }
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, buf, len);
    b->len += len;
    return 0;
}

int wbuf_start(struct wbuf *b, msgpack_packer *pk) {
    static const char header[WIRE_HEADER_SIZE] = {0};
    memset(b, 0, sizeof(*b));
    msgpack_packer_init(pk, b, wbuf_write);
    return wbuf_write(b, header, sizeof(header));
}

int wbuf_finish(struct wbuf *b, size_t max_payload) {
    if (b->failed || b->len <= WIRE_HEADER_SIZE) {
        return -1;
    }
    size_t payload = b->len - WIRE_HEADER_SIZE;
    if (payload > max_payload || payload > UINT32_MAX) {
        return -1;
    }
    uint8_t *h = (uint8_t *)b->data;
    h[0] = 0x4E; /* 'N' */
    h[1] = 0x50; /* 'P' */
    h[2] = 0;    /* clients send no fds */
    h[3] = 0;
    h[4] = (uint8_t)(payload & 0xff);
    h[5] = (uint8_t)((payload >> 8) & 0xff);
    h[6] = (uint8_t)((payload >> 16) & 0xff);
    h[7] = (uint8_t)((payload >> 24) & 0xff);
    return 0;
}

void wbuf_free(struct wbuf *b) {
    free(b->data);
    memset(b, 0, sizeof(*b));
}

void mp_str(msgpack_packer *pk, const char *s) {
    size_t len = strlen(s);
    msgpack_pack_str(pk, len);
    msgpack_pack_str_body(pk, s, len);
}

void mp_kv_str(msgpack_packer *pk, const char *key, const char *value) {
    mp_str(pk, key);
    mp_str(pk, value);
}

void mp_kv_uint(msgpack_packer *pk, const char *key, uint64_t value) {
    mp_str(pk, key);
    msgpack_pack_uint64(pk, value);
}

int wire_header(const uint8_t *h, size_t limit, uint32_t *length, unsigned *fds) {
    if (h[0] != 0x4E || h[1] != 0x50 || h[3] != 0 || h[2] > WIRE_MAX_FDS_PER_FRAME) {
        return -1;
    }
    uint32_t len = (uint32_t)h[4] | (uint32_t)h[5] << 8 | (uint32_t)h[6] << 16 |
                   (uint32_t)h[7] << 24;
    if (len == 0 || len > limit) {
        return -1;
    }
    *length = len;
    *fds = h[2];
    return 0;
}

const msgpack_object *mp_get(const msgpack_object *map, const char *key) {
    if (map == NULL || map->type != MSGPACK_OBJECT_MAP) {
        return NULL;
    }
    size_t len = strlen(key);
    for (uint32_t i = 0; i < map->via.map.size; i++) {
        const msgpack_object *k = &map->via.map.ptr[i].key;
        if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == len &&
            memcmp(k->via.str.ptr, key, len) == 0) {
            return &map->via.map.ptr[i].val;
        }
    }
    return NULL;
}

int mp_uint(const msgpack_object *o, uint64_t *out) {
    if (o == NULL || o->type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
        return -1;
    }
    *out = o->via.u64;
    return 0;
}

int mp_str_is(const msgpack_object *o, const char *s) {
    size_t len = strlen(s);
    return o != NULL && o->type == MSGPACK_OBJECT_STR && o->via.str.size == len &&
           memcmp(o->via.str.ptr, s, len) == 0;
}

int mp_str_copy(const msgpack_object *o, char *out, size_t size) {
    if (o == NULL || o->type != MSGPACK_OBJECT_STR || size == 0) {
        return -1;
    }
    size_t len = o->via.str.size < size - 1 ? o->via.str.size : size - 1;
    memcpy(out, o->via.str.ptr, len);
    out[len] = '\0';
    return 0;
}
