/*
 * handles.h -- the remote handles, shared by their parts (not exported).
 *
 *   handles.c   the handle table, remote_handle*_open and _close, the domain names
 *   invoke.c    remote_handle*_invoke: arguments as slices, inline or spilled
 *   controls.c  remote_handle*_control, remote_session_control
 *   port.c      what dspqueue.c needs (port.h), on top of mem.c and the above
 */
#ifndef NPUD_SHIM_HANDLES_H
#define NPUD_SHIM_HANDLES_H

#include <stdint.h>

#include "remote.h"

#define NUM_SESSIONS 4 /* libcdsprpc's: sessions 0..3 per domain */
#define NUM_DOMAINS 8  /* effective domain id = domain + 8 * session */

/* A handle the program holds: this library's small number for npud's handle id in
 * connection generation gen and session epoch epoch. */
struct handle {
    struct handle *next;
    uint32_t local;
    uint32_t remote;
    uint64_t gen;
    uint64_t epoch;
};

/* handles.c */
/* The domain id libcdsprpc gives the name name starts with (cdsp1 before cdsp); -1. */
int shim_domain_by_name(const char *name);
/* The handle's npud id, generation and epoch: 0, AEE_EINVHANDLE or AEE_ECONNRESET. */
int handle_lookup(uint32_t local, struct handle *out);

/* invoke.c */
/* npud "invoke" on handle local (wait: npud's wait invoke, no slot, no watchdog). */
int handle_invoke(uint32_t local, uint32_t sc, remote_arg *pra, int wait);

#endif /* NPUD_SHIM_HANDLES_H */
