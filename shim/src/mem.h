/*
 * mem.h -- buffers npud allocates and the library maps: what the other parts use.
 */
#ifndef NPUD_SHIM_MEM_H
#define NPUD_SHIM_MEM_H

#include <stddef.h>
#include <stdint.h>

struct conn;

/* An npud buffer mapped here, owned by whoever made it (one fd, one mapping). */
struct raw_buffer {
    void *ptr;
    size_t size;   /* the allocated size (whole pages) */
    int fd;        /* this process's fd of the DMA-BUF */
    int dsp_fd;    /* the number the DSP knows it by */
    uint32_t id;   /* npud's buffer id */
};

/* Allocate size bytes on c and map them here. An AEE code. */
int mem_raw_alloc(struct conn *c, size_t size, struct raw_buffer *out);
/* Unmap, close, and free it on c (c may be NULL: the connection is gone). */
void mem_raw_free(struct conn *c, struct raw_buffer *b);

/* Where an invoke argument [p, p + len) lives (len > 0): 1 and the npud buffer
 * and offset when it lies in a buffer of connection gen that invokes pass by
 * reference (rpcmem, remote_register_buf); 0 when it travels by copy;
 * AEE_EBADPARM when it starts in such a buffer and ends outside it. */
int mem_resolve(uint64_t gen, const void *p, size_t len, uint32_t *buffer, uint64_t *offset);

/* rpcmem and fastrpc_mmap as the API has them (dspqueue uses them too). */
void *mem_alloc(size_t size, uint32_t flags);
void mem_free(void *p);
int mem_to_fd(void *p);
int mem_map(int domain, int fd, void *addr, int offset, size_t length, uint32_t flags);
int mem_unmap(int domain, int fd, void *addr, size_t length);

/* 1 when no rpcmem buffer of connection gen is live (not freed). */
int mem_none_of(uint64_t gen);

/* A buffer dspqueue names by fd: mapped (fastrpc_mmap) in the live session?
 * Then this process's address and the mapped length, and its reference count
 * changed by delta (DSPQUEUE_BUFFER_FLAG_REF/DEREF). AEE_ENOSUCHMAP otherwise. */
int mem_buffer_ref(int fd, int delta, void **va, size_t *size);

#endif /* NPUD_SHIM_MEM_H */
