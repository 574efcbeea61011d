/*
 * dspq_rpc.h -- the DSP's dspqueue_rpc interface (libdspqueue_rpc_skel.so), client side.
 *
 * interface dspqueue_rpc : remote_handle64 (methods from 2), marshalled by
 * qaic's rules: primIn {in scalars at natural alignment}, primROut {rout scalars}.
 *
 *   method               idx  sc          primIn                        primROut
 *   init_process_state    2   0x02010000  i32 fd                        -
 *   create_queue          3   0x03010100  u32 id, i32 fd, u32 count     u64 queue_id
 *   destroy_queue         4   0x04010000  u64 queue_id                  -
 *   is_imported           5   0x05010100  u64 queue_id                  i32 imported
 *   wait_signal           6   0x06000100  -                             i32 signal (-1: cancelled)
 *   cancel_wait_signal    7   0x07000000  -                             -
 *   signal                8   0x08000000  -                             -
 */
#ifndef NPUD_SHIM_DSPQ_RPC_H
#define NPUD_SHIM_DSPQ_RPC_H

#include <stdint.h>

#include "remote.h"

#define DSPQ_RPC_URI                                                                          \
    "file:///libdspqueue_rpc_skel.so?dspqueue_rpc_skel_handle_invoke&_modver=1.0"

int dspq_rpc_init_process_state(remote_handle64 h, int32_t fd);
int dspq_rpc_create_queue(remote_handle64 h, uint32_t id, int32_t fd, uint32_t count,
                          uint64_t *queue_id);
int dspq_rpc_destroy_queue(remote_handle64 h, uint64_t queue_id);
int dspq_rpc_is_imported(remote_handle64 h, uint64_t queue_id, int32_t *imported);
/* Waits on the DSP (npud's "wait" invoke) until it signals or the wait is cancelled. */
int dspq_rpc_wait_signal(remote_handle64 h, int32_t *signal);
int dspq_rpc_cancel_wait_signal(remote_handle64 h);
int dspq_rpc_signal(remote_handle64 h);

#endif /* NPUD_SHIM_DSPQ_RPC_H */
