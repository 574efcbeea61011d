/*
 * Checks and copies shared by the hand-written skels (echo_skel.c,
 * portal_qnn_skel.c): the unmarshalling that qaic generates on the Hexagon
 * build, written out by hand so the host build can exercise it.
 *
 * The argument layout follows the qaic rules (shared/reference/fastrpc-abi.md
 * 5.4): primIn first (input scalars and the element count of every sequence
 * or string, u32 each here), then one buffer per `in` sequence or string,
 * then primROut (rout scalars), then one buffer per `rout` sequence.
 *
 * Every helper returns AEE_SUCCESS or AEE_EBADPARM. They are stricter than
 * qaic's generated code, which accepts buffers longer than announced: the
 * stubs always send exact lengths, and so does the emulator (npud/sim/skels.py).
 */
#ifndef NPUD_SKEL_MARSHAL_H
#define NPUD_SKEL_MARSHAL_H

#include <stddef.h>
#include <stdint.h>

#include "remote.h"
#include "skel_export.h"

/* The sc must carry exactly these counts (and pra must exist if any is non-zero). */
int skel_check_counts(uint32_t sc, const remote_arg *pra, uint32_t inbufs, uint32_t outbufs,
                      uint32_t inhandles, uint32_t outhandles);

/* Copy a primIn (or any scalar block) of exactly count u32s out of arg. */
int skel_read_u32s(const remote_arg *arg, uint32_t *values, size_t count);

/* Copy exactly count u32s into a primROut of exactly that size. */
int skel_write_u32s(remote_arg *arg, const uint32_t *values, size_t count);

/* A primROut must have exactly count u32s of room (checked before the call runs). */
int skel_check_u32s_room(const remote_arg *arg, size_t count);

/*
 * A sequence buffer whose length primIn announced: nLen must equal it, must
 * fit the `int` length qaic passes to the implementation, and pv may be NULL
 * only for an empty buffer.
 */
int skel_check_sequence(const remote_arg *arg, uint32_t announced);

/*
 * A `rout sequence<S>` of records of record_size bytes whose count primIn
 * announced: the byte length must equal count * record_size, and the count
 * must fit the `int` length qaic passes to the implementation.
 */
int skel_check_records(const remote_arg *arg, uint32_t count, size_t record_size);

/*
 * An `in string`: announced counts the terminating NUL, so it is at least 1;
 * the buffer holds exactly that many bytes, ends with NUL and has no NUL
 * before the end (a string cut short by an embedded NUL is refused).
 */
int skel_read_string(const remote_arg *arg, uint32_t announced, const char **text);

/*
 * Methods 0 and 1 of every remote_handle64 interface, as remotectl calls them:
 *   open:  sc = MAKEX(0, 0, 2, 0, 0, 1): primIn {u32 uri length with NUL},
 *          the URI, and one output handle slot that receives the new handle.
 *   close: sc = MAKEX(0, 1, 0, 0, 1, 0): one input handle slot.
 */
int skel_invoke_open(int (*open_fn)(const char *uri, remote_handle64 *handle), uint32_t sc,
                     remote_arg *pra);
int skel_invoke_close(int (*close_fn)(remote_handle64 handle), uint32_t sc,
                      const remote_arg *pra);

#endif /* NPUD_SKEL_MARSHAL_H */
