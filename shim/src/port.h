/*
 * port.h -- what dspqueue.c needs from the rest of the library.
 *
 * port.c implements it on top of mem.c and handles.c (npud); the dspqueue
 * tests link dspqueue.c with a fake of their own, a DSP in a thread.
 */
#ifndef NPUD_SHIM_PORT_H
#define NPUD_SHIM_PORT_H

#include <stddef.h>
#include <stdint.h>

#include "remote.h"

/* Shared memory the DSP can map: zeroed, page aligned, passed by copy if ever
 * used in an invoke (RPCMEM_HEAP_NOREG). 0, or an AEE code. */
int port_alloc(size_t size, void **ptr);
void port_free(void *ptr);
/* The number the DSP knows it by (> 0), or -1. */
int port_to_fd(void *ptr);
/* fastrpc_mmap(CDSP, fd, ptr, 0, size, FASTRPC_MAP_FD) and its undoing. */
int port_mmap(int fd, void *ptr, size_t size);
int port_munmap(int fd, void *ptr, size_t size);
/* See mem_buffer_ref: a buffer a packet names by fd. */
int port_buffer_ref(int fd, int delta, void **va, size_t *size);

/* remote_handle64_open/invoke/close; wait: a call that waits for the DSP (a
 * long wait_signal), not one that computes. */
int port_open(const char *uri, remote_handle64 *h);
int port_invoke(remote_handle64 h, uint32_t sc, remote_arg *pra, int wait);
int port_close(remote_handle64 h);

/* An identity of the DSP process the port talks to now; it changes when that
 * process is lost (a restart, npud gone). 0: none. */
uint64_t port_session(void);

#endif /* NPUD_SHIM_PORT_H */
