/*
 * rpcmem.h -- npud's libcdsprpc: memory shared with the DSP.
 *
 * Written for npud from the FastRPC ABI (the same names and values as
 * Qualcomm's rpcmem.h). npud allocates the memory (a DMA-BUF from the system
 * heap) and the library maps it into the caller; the heap id and most flags
 * are accepted and ignored, as libcdsprpc does on Linux.
 */
#ifndef RPCMEM_H
#define RPCMEM_H

#include <stddef.h>
#include <stdint.h>

/* Heap ids (ignored). */
enum rpc_heap_ids {
    RPCMEM_HEAP_ID_SECURE = 9,
    RPCMEM_HEAP_ID_CONTIG = 22,
    RPCMEM_HEAP_ID_SYSTEM = 25,
};
#define RPCMEM_DEFAULT_HEAP (-1)

/* Flags. RPCMEM_HEAP_NOREG: invokes pass the buffer by copy, not by reference. */
#define RPCMEM_DEFAULT_FLAGS 1
#define RPCMEM_FLAG_UNCACHED 0
#define RPCMEM_FLAG_CACHED RPCMEM_DEFAULT_FLAGS
#define RPCMEM_HEAP_DEFAULT 0x80000000
#define RPCMEM_HEAP_NOREG 0x40000000
#define RPCMEM_HEAP_UNCACHED 0x20000000
#define RPCMEM_HEAP_NOVA 0x10000000
#define RPCMEM_HEAP_NONCOHERENT 0x08000000
#define RPCMEM_TRY_MAP_STATIC 0x04000000
#define RPCMEM_FORCE_NOINVALIDATE 0x02000000
#define RPCMEM_FORCE_NOFLUSH 0x01000000

#ifdef __cplusplus
extern "C" {
#endif

/* Kept for old programs; nothing to do. */
void rpcmem_init(void);
void rpcmem_deinit(void);

/* A page-aligned, zeroed buffer the DSP can read and write, or NULL. */
void *rpcmem_alloc(int heapid, uint32_t flags, int size);
void *rpcmem_alloc2(int heapid, uint32_t flags, size_t size);
void rpcmem_free(void *po);

/* The number the DSP knows the buffer holding po by (> 0), or -1. Pass it to
 * fastrpc_mmap, in dspqueue buffers and to skels that map buffers by fd. */
int rpcmem_to_fd(void *po);

#if defined(__GNUC__)
__attribute__((unused))
#endif
static inline void *rpcmem_alloc_def(int size) {
    return rpcmem_alloc(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS, size);
}

#ifdef __cplusplus
}
#endif

#endif /* RPCMEM_H */
