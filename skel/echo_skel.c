/*
 * echo_skel_handle_invoke: the hand-written unmarshalling of idl/echo.idl.
 *
 * On the Hexagon build qaic generates this entry (and the file of the same
 * name) from the IDL; this version exists so the host build can drive the
 * implementation with real remote_arg arrays. Layouts (qaic rules,
 * shared/reference/fastrpc-abi.md 5.4):
 *
 *   method 0 open   sc 0x00020001  see skel_invoke_open
 *   method 1 close  sc 0x01000010  see skel_invoke_close
 *   method 2 echo   sc 0x02020100  pra[0] primIn {u32 len(in_buf), u32 capacity(out_buf)}
 *                                  pra[1] in_buf, pra[2] out_buf
 *
 * Wrong counts or lengths: AEE_EBADPARM. Any other method: AEE_EUNSUPPORTED.
 */
#include <stdint.h>

#include "AEEStdErr.h"
#include "echo.h"
#include "remote.h"
#include "skel_marshal.h"

SKEL_EXPORT int echo_skel_handle_invoke(remote_handle64 h, uint32_t sc, remote_arg *pra);

static int invoke_echo(remote_handle64 h, uint32_t sc, remote_arg *pra) {
    uint32_t prim_in[2] = {0, 0};
    int rc = skel_check_counts(sc, pra, 2, 1, 0, 0);
    if (rc == AEE_SUCCESS) {
        rc = skel_read_u32s(&pra[0], prim_in, 2);
    }
    if (rc == AEE_SUCCESS) {
        rc = skel_check_sequence(&pra[1], prim_in[0]);
    }
    if (rc == AEE_SUCCESS) {
        rc = skel_check_sequence(&pra[2], prim_in[1]);
    }
    if (rc != AEE_SUCCESS) {
        return rc;
    }
    return echo_echo(h, (const unsigned char *)pra[1].buf.pv, (int)prim_in[0],
                     (unsigned char *)pra[2].buf.pv, (int)prim_in[1]);
}

int echo_skel_handle_invoke(remote_handle64 h, uint32_t sc, remote_arg *pra) {
    switch (REMOTE_SCALARS_METHOD(sc)) {
    case 0:
        return skel_invoke_open(echo_open, sc, pra);
    case 1:
        return skel_invoke_close(echo_close, sc, pra);
    case 2:
        return invoke_echo(h, sc, pra);
    default:
        return AEE_EUNSUPPORTED;
    }
}
