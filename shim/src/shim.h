/*
 * shim.h -- what the parts of npud's libcdsprpc share.
 *
 * Layout of the library (shim/README.md has the whole story):
 *   fault.c    the n-th-call fault hook (built in with -DSHIM_FAULTS) and the
 *              allocation wrappers every part uses
 *   log.c      NPUD_SHIM_LOG diagnostics
 *   errors.c   npud error codes -> AEE codes, in one table
 *   wire.c     frames and msgpack helpers (no I/O)
 *   conn.c     a connection to npud and its requests; conn_current.c (the one
 *              current, made through Hello), conn_stream.c (the reader: frames, fds),
 *              conn_answers.c (the Welcome, events, answers to their waiters)
 *   mem.c      rpcmem, fastrpc_mmap/munmap, remote_register_buf*
 *   handles.c  remote_handle*_open/close; invoke.c remote_handle*_invoke;
 *              controls.c remote_handle*_control, remote_session_control
 *   port.c     what dspqueue.c needs, on top of mem.c and handles.c
 *   fork.c     the child of a fork starts clean
 *   dspqueue.c, dspq_domain.c, dspq_packets.c, dspq_ring.c, dspq_rpc.c
 *              dspqueue, CPU side (dspq_queue.h)
 */
#ifndef NPUD_SHIM_H
#define NPUD_SHIM_H

#include <stddef.h>
#include <stdint.h>

/* The exported ABI (the version script lists the same names). */
#define SHIM_API __attribute__((visibility("default")))

/* ---- fault.c --------------------------------------------------------------------- */
#ifdef SHIM_FAULTS
/* 1 when this call (the n-th fault point passed, NPUD_SHIM_FAULT_AT=n) must fail. */
int shim_fault(const char *what);
#define FAULT(what) shim_fault(what)
#else
#define FAULT(what) 0
#endif

/* malloc/calloc/realloc with a fault point each; NULL and errno ENOMEM on failure. */
void *x_malloc(size_t size);
void *x_calloc(size_t count, size_t size);
void *x_realloc(void *ptr, size_t size);

/* ---- log.c ------------------------------------------------------------------------ */
void shim_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* One more request of this kind sent to npud (stats.c: NPUD_SHIM_STATS). */
void stats_count(const char *reply_type);
/* NPUD_SHIM_LOG: 0 off, 1 errors and events, 2 also each invoke's arguments. */
int shim_log_level(void);
/* The calling thread's next invokes probe the DSP and expect the AEE code rc as one
 * answer (0: none): that answer is not logged as an error. */
void shim_log_expect(int rc);
int shim_log_expected(void);

/* ---- errors.c --------------------------------------------------------------------- */
/* The AEE code for an npud error (code) with its DSP result field (dsp_rc, 0 if none). */
int shim_aee_from_npud(int code, uint32_t dsp_rc);
/* The AEE code libcdsprpc gives for a failed syscall's errno. */
int shim_aee_from_errno(int err);


/* ---- fork.c: the pieces' fork handlers (see fork.c) ------------------------------- */
void handles_fork_lock(void);
void handles_fork_unlock(void);
void mem_fork_lock(void);
void mem_fork_unlock(void);
void stats_fork_lock(void);
void stats_fork_unlock(void);
/* In the child: stats.c counts anew and writes nothing at exit (the parent's file). */
void stats_fork_child(void);
/* In the child: forget the parent's connection (conn.c) and dspqueue domain. */
void conn_fork_child(void);
void dspqueue_fork_child(void);

/* A domain argument: 0 for the CDSP's default session (3, or -1 for "the
 * current domain"), AEE_EUNSUPPORTED for another valid effective domain id
 * (npud brokers that one process only), AEE_EBADPARM for anything else. */
int shim_check_domain(int domain);

/* npud's error codes (protocol/PROTOCOL.md section 11) that the library acts on. */
enum npud_code {
    NPUD_FASTRPC = 100,
    NPUD_OPEN_FAILED = 101,
    NPUD_INVOKE_FAILED = 102,
    NPUD_MMAP_FAILED = 103,
    NPUD_DSP_RESTARTED = 104,
    NPUD_UNSUPPORTED = 106,
    NPUD_UNKNOWN_HANDLE = 109,
    NPUD_UNKNOWN_BUFFER = 205,
    NPUD_INVALID_ARGUMENT = 206,
    NPUD_QUOTA_EXCEEDED = 601,
};

#endif /* NPUD_SHIM_H */
