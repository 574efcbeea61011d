/*
 * wire.h -- npud's frames and msgpack maps (protocol/PROTOCOL.md sections 2-4), no I/O.
 */
#ifndef NPUD_SHIM_WIRE_H
#define NPUD_SHIM_WIRE_H

#include <msgpack.h>
#include <stddef.h>
#include <stdint.h>

#define WIRE_PROTOCOL_VERSION 4
#define WIRE_HEADER_SIZE 8
#define WIRE_HANDSHAKE_MAX_FRAME 65536u
#define WIRE_MAX_FRAME_CEILING 16777216u
#define WIRE_MAX_FDS_PER_FRAME 4
#define WIRE_OLD_MAX_BUFFER 268435456u /* the largest buffer before version 6 */
#define WIRE_MAX_BUFFER 4294967296ull  /* MAX_BUFFER_SIZE: the largest the wire names */

/* A frame being built: 8 header bytes, then the msgpack payload. */
struct wbuf {
    char *data;
    size_t len;
    size_t cap;
    int failed; /* an allocation failed: the frame is unusable */
};

/* Start a frame in b (empty) and point pk at it. 0, or -1 without memory. */
int wbuf_start(struct wbuf *b, msgpack_packer *pk);
/* Write the header (fd count 0). 0, or -1 if building failed or the payload
 * exceeds max_payload. */
int wbuf_finish(struct wbuf *b, size_t max_payload);
void wbuf_free(struct wbuf *b);

void mp_str(msgpack_packer *pk, const char *s);
/* key: "type", value: type */
void mp_kv_str(msgpack_packer *pk, const char *key, const char *value);
void mp_kv_uint(msgpack_packer *pk, const char *key, uint64_t value);

/* Checks a header: 0 and the payload length and fd count, or -1 (fatal). */
int wire_header(const uint8_t *h, size_t limit, uint32_t *length, unsigned *fds);

/* The value of key in map, or NULL (also when map is not a map). */
const msgpack_object *mp_get(const msgpack_object *map, const char *key);
/* 0 and the value when o is a non-negative integer, -1 otherwise. */
int mp_uint(const msgpack_object *o, uint64_t *out);
/* 1 when o is the string s. */
int mp_str_is(const msgpack_object *o, const char *s);
/* Copy a string value into out (NUL-terminated, truncated to size). 0 or -1. */
int mp_str_copy(const msgpack_object *o, char *out, size_t size);

#endif /* NPUD_SHIM_WIRE_H */
