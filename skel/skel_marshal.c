/* Checks and copies shared by the hand-written skels (see include/skel_marshal.h). */
#include "skel_marshal.h"

#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "AEEStdErr.h"
#include "HAP_farf.h"

int skel_check_counts(uint32_t sc, const remote_arg *pra, uint32_t inbufs, uint32_t outbufs,
                      uint32_t inhandles, uint32_t outhandles) {
    if (REMOTE_SCALARS_INBUFS(sc) != inbufs || REMOTE_SCALARS_OUTBUFS(sc) != outbufs ||
        REMOTE_SCALARS_INHANDLES(sc) != inhandles || REMOTE_SCALARS_OUTHANDLES(sc) != outhandles) {
        FARF(HIGH, "sc 0x%08x: expected %u/%u buffers and %u/%u handles", (unsigned)sc,
             (unsigned)inbufs, (unsigned)outbufs, (unsigned)inhandles, (unsigned)outhandles);
        return AEE_EBADPARM;
    }
    if (REMOTE_SCALARS_LENGTH(sc) != 0 && pra == NULL) {
        return AEE_EBADPARM;
    }
    return AEE_SUCCESS;
}

int skel_read_u32s(const remote_arg *arg, uint32_t *values, size_t count) {
    size_t size = count * sizeof(uint32_t);
    if (arg->buf.nLen != size || (size != 0 && arg->buf.pv == NULL)) {
        FARF(HIGH, "scalar block has %zu bytes, expected %zu", arg->buf.nLen, size);
        return AEE_EBADPARM;
    }
    /* memcpy: the buffer carries no alignment promise. */
    if (size != 0) {
        memcpy(values, arg->buf.pv, size);
    }
    return AEE_SUCCESS;
}

int skel_check_u32s_room(const remote_arg *arg, size_t count) {
    size_t size = count * sizeof(uint32_t);
    if (arg->buf.nLen != size || (size != 0 && arg->buf.pv == NULL)) {
        FARF(HIGH, "primROut has %zu bytes, expected %zu", arg->buf.nLen, size);
        return AEE_EBADPARM;
    }
    return AEE_SUCCESS;
}

int skel_write_u32s(remote_arg *arg, const uint32_t *values, size_t count) {
    int rc = skel_check_u32s_room(arg, count);
    if (rc == AEE_SUCCESS && count != 0) {
        memcpy(arg->buf.pv, values, count * sizeof(uint32_t));
    }
    return rc;
}

int skel_check_sequence(const remote_arg *arg, uint32_t announced) {
    if (arg->buf.nLen != (size_t)announced) {
        FARF(HIGH, "sequence: primIn announces %u bytes, buffer has %zu", (unsigned)announced,
             arg->buf.nLen);
        return AEE_EBADPARM;
    }
    if (announced > (uint32_t)INT_MAX || (announced != 0 && arg->buf.pv == NULL)) {
        return AEE_EBADPARM;
    }
    return AEE_SUCCESS;
}

int skel_check_records(const remote_arg *arg, uint32_t count, size_t record_size) {
    if (record_size == 0 || count > (uint32_t)INT_MAX || (size_t)count > SIZE_MAX / record_size) {
        return AEE_EBADPARM;
    }
    size_t bytes = (size_t)count * record_size;
    if (arg->buf.nLen != bytes || (bytes != 0 && arg->buf.pv == NULL)) {
        FARF(HIGH, "records: primIn announces %zu bytes, buffer has %zu", bytes, arg->buf.nLen);
        return AEE_EBADPARM;
    }
    return AEE_SUCCESS;
}

int skel_read_string(const remote_arg *arg, uint32_t announced, const char **text) {
    if (announced == 0) {
        return AEE_EBADPARM;
    }
    int rc = skel_check_sequence(arg, announced);
    if (rc != AEE_SUCCESS) {
        return rc;
    }
    const char *bytes = (const char *)arg->buf.pv;
    if (memchr(bytes, '\0', announced) != bytes + announced - 1) {
        FARF(HIGH, "string of %u bytes is not NUL-terminated exactly at its end",
             (unsigned)announced);
        return AEE_EBADPARM;
    }
    *text = bytes;
    return AEE_SUCCESS;
}

int skel_invoke_open(int (*open_fn)(const char *uri, remote_handle64 *handle), uint32_t sc,
                     remote_arg *pra) {
    int rc = skel_check_counts(sc, pra, 2, 0, 0, 1);
    uint32_t uri_length = 0;
    const char *uri = NULL;
    if (rc == AEE_SUCCESS) {
        rc = skel_read_u32s(&pra[0], &uri_length, 1);
    }
    if (rc == AEE_SUCCESS) {
        rc = skel_read_string(&pra[1], uri_length, &uri);
    }
    if (rc != AEE_SUCCESS) {
        return rc;
    }
    remote_handle64 handle = 0;
    rc = open_fn(uri, &handle);
    if (rc == AEE_SUCCESS) {
        pra[2].h64 = handle;
    }
    return rc;
}

int skel_invoke_close(int (*close_fn)(remote_handle64 handle), uint32_t sc,
                      const remote_arg *pra) {
    int rc = skel_check_counts(sc, pra, 0, 0, 1, 0);
    if (rc != AEE_SUCCESS) {
        return rc;
    }
    return close_fn(pra[0].h64);
}
