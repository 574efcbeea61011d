/*
 * echo: the implementation of idl/echo.idl, built into libecho_skel.so.
 *
 * echo(in_buf, out_buf) copies min(len(in_buf), capacity(out_buf)) bytes and
 * zero-fills the rest of out_buf, so the whole output buffer (which the kernel
 * copies back to the client in full) never carries stale bytes. The emulator's
 * EchoSkel (npud/sim/skels.py) behaves the same way.
 *
 * The marshalling in front of these functions is qaic's echo_skel.c on the
 * Hexagon build and the hand-written echo_skel.c on the host build.
 */
#include <stdlib.h>
#include <string.h>

#include "AEEStdErr.h"
#include "HAP_farf.h"
#include "echo.h"
#include "skel_export.h"
#include "skel_handles.h"

/* Per-handle state: nothing but the handle itself, which echo() validates. */
typedef struct {
    skel_object base; /* first: the registry stores &base */
} echo_context;

static skel_registry g_echo_handles = SKEL_REGISTRY_INIT;

SKEL_EXPORT int echo_open(const char *uri, remote_handle64 *h) {
    if (uri == NULL || h == NULL) {
        return AEE_EBADPARM;
    }
    int rc = skel_registry_open(&g_echo_handles, sizeof(echo_context), NULL, h);
    if (rc != AEE_SUCCESS) {
        return rc;
    }
    FARF(MEDIUM, "echo: opened %s", uri);
    return AEE_SUCCESS;
}

SKEL_EXPORT int echo_close(remote_handle64 h) {
    skel_object *object = skel_registry_remove(&g_echo_handles, h);
    if (object == NULL) {
        return AEE_EINVHANDLE;
    }
    skel_object_destroy(object);
    free(object);
    return AEE_SUCCESS;
}

SKEL_EXPORT int echo_echo(remote_handle64 _h, const unsigned char *in_buf, int in_bufLen,
                          unsigned char *out_buf, int out_bufLen) {
    if (in_bufLen < 0 || out_bufLen < 0 || (in_bufLen > 0 && in_buf == NULL) ||
        (out_bufLen > 0 && out_buf == NULL)) {
        return AEE_EBADPARM;
    }
    skel_object *object = skel_registry_acquire(&g_echo_handles, _h);
    if (object == NULL) {
        return AEE_EINVHANDLE;
    }
    size_t in_length = (size_t)in_bufLen;
    size_t capacity = (size_t)out_bufLen;
    size_t count = in_length < capacity ? in_length : capacity;
    if (count != 0) {
        memcpy(out_buf, in_buf, count);
    }
    if (capacity > count) {
        memset(out_buf + count, 0, capacity - count);
    }
    skel_registry_release(&g_echo_handles, object);
    return AEE_SUCCESS;
}
