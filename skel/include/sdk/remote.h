/*
 * Host stand-in for the Hexagon SDK's remote.h: only what the skels use.
 *
 * Written for npud from the FastRPC ABI as documented in
 * shared/reference/fastrpc-abi.md (section 4) and the public qualcomm/fastrpc
 * sources; it is not a copy of Qualcomm's header. The Hexagon build
 * (docker/build_skel.sh) uses the SDK's own remote.h instead and never sees
 * this directory.
 */
#ifndef NPUD_SKEL_REMOTE_H
#define NPUD_SKEL_REMOTE_H

#include <stddef.h>
#include <stdint.h>

/* A handle of a plain (non-domain) interface. */
typedef uint32_t remote_handle;

/* A handle of a remote_handle64 ("domain") interface: what <iface>_open returns. */
typedef uint64_t remote_handle64;

/* One buffer argument: the skel reads or writes nLen bytes at pv. */
typedef struct {
    void *pv;
    size_t nLen;
} remote_buf;

/* A dma handle argument (fd plus offset), used in the handle slots. */
typedef struct {
    int32_t fd;
    uint32_t offset;
} remote_dma_handle;

/*
 * One element of the argument array a skel receives. Buffers come first (input
 * buffers, then output buffers), then input handles, then output handles; the
 * counts are in the scalars word.
 */
typedef union {
    remote_buf buf;
    remote_handle h;
    remote_handle64 h64;
    remote_dma_handle dma;
} remote_arg;

/*
 * The scalars word (sc). Real bit layout, shared by the kernel's
 * FASTRPC_BUILD_SCALARS and userspace:
 *   attr 29-31 (3 bits), method 24-28 (5 bits), input buffers 16-23 (8 bits),
 *   output buffers 8-15 (8 bits), input handles 4-7 (4 bits),
 *   output handles 0-3 (4 bits).
 */
#define REMOTE_SCALARS_METHOD_ATTR(sc) (((uint32_t)(sc) >> 29) & 0x7u)
#define REMOTE_SCALARS_METHOD(sc) (((uint32_t)(sc) >> 24) & 0x1fu)
#define REMOTE_SCALARS_INBUFS(sc) (((uint32_t)(sc) >> 16) & 0xffu)
#define REMOTE_SCALARS_OUTBUFS(sc) (((uint32_t)(sc) >> 8) & 0xffu)
#define REMOTE_SCALARS_INHANDLES(sc) (((uint32_t)(sc) >> 4) & 0x0fu)
#define REMOTE_SCALARS_OUTHANDLES(sc) ((uint32_t)(sc) & 0x0fu)

/* Number of remote_arg entries the sc describes. */
#define REMOTE_SCALARS_LENGTH(sc)                                                \
    (REMOTE_SCALARS_INBUFS(sc) + REMOTE_SCALARS_OUTBUFS(sc) +                    \
     REMOTE_SCALARS_INHANDLES(sc) + REMOTE_SCALARS_OUTHANDLES(sc))

#define REMOTE_SCALARS_MAKEX(attr, method, nin, nout, hin, hout)                 \
    ((((uint32_t)(attr) & 0x7u) << 29) | (((uint32_t)(method) & 0x1fu) << 24) |  \
     (((uint32_t)(nin) & 0xffu) << 16) | (((uint32_t)(nout) & 0xffu) << 8) |     \
     (((uint32_t)(hin) & 0x0fu) << 4) | ((uint32_t)(hout) & 0x0fu))

#define REMOTE_SCALARS_MAKE(method, nin, nout) REMOTE_SCALARS_MAKEX(0, method, nin, nout, 0, 0)

#endif /* NPUD_SKEL_REMOTE_H */
