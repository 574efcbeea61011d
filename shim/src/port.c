/*
 * port.c -- port.h for dspqueue.c: its shared memory is rpcmem (mem.c), its calls
 * to the DSP's dspqueue_rpc module are remote handles (handles.c, invoke.c), its
 * DSP process is the live connection's session.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stddef.h>
#include <stdint.h>

#include "AEEStdErr.h"
#include "conn.h"
#include "handles.h"
#include "mem.h"
#include "port.h"
#include "remote.h"
#include "rpcmem.h"
#include "shim.h"

int port_alloc(size_t size, void **ptr) {
    *ptr = mem_alloc(size, RPCMEM_DEFAULT_FLAGS | RPCMEM_HEAP_NOREG);
    return *ptr != NULL ? 0 : AEE_ENORPCMEMORY;
}

void port_free(void *ptr) {
    mem_free(ptr);
}

int port_to_fd(void *ptr) {
    return mem_to_fd(ptr);
}

int port_mmap(int fd, void *ptr, size_t size) {
    return mem_map(CDSP_DOMAIN_ID, fd, ptr, 0, size, FASTRPC_MAP_FD);
}

int port_munmap(int fd, void *ptr, size_t size) {
    return mem_unmap(CDSP_DOMAIN_ID, fd, ptr, size);
}

int port_buffer_ref(int fd, int delta, void **va, size_t *size) {
    return mem_buffer_ref(fd, delta, va, size);
}

int port_open(const char *uri, remote_handle64 *h) {
    return remote_handle64_open(uri, h);
}

int port_invoke(remote_handle64 h, uint32_t sc, remote_arg *pra, int wait) {
    if (h > UINT32_MAX) {
        return AEE_EINVHANDLE;
    }
    return handle_invoke((uint32_t)h, sc, pra, wait);
}

int port_close(remote_handle64 h) {
    return remote_handle64_close(h);
}

uint64_t port_session(void) {
    return conn_live();
}
