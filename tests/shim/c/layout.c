/*
 * layout.c -- sizes, offsets and values of npud's libcdsprpc headers, one
 * "name value" line each (tests/shim/test_library.py has the ABI's values).
 */
#include <stddef.h>
#include <stdio.h>

#include "AEEStdErr.h"
#include "dspqueue.h"
#include "remote.h"
#include "rpcmem.h"

#define SIZE(t) printf("sizeof(" #t ") %zu\n", sizeof(t))
#define OFFSET(t, f) printf("offsetof(" #t ", " #f ") %zu\n", offsetof(t, f))
#define VALUE(v) printf(#v " %lld\n", (long long)(v))

int main(void) {
    SIZE(remote_handle);
    SIZE(remote_handle64);
    SIZE(remote_buf);
    SIZE(remote_arg);
    SIZE(remote_dma_handle);
    SIZE(struct remote_dsp_capability);
    SIZE(struct remote_rpc_control_latency);
    SIZE(struct remote_rpc_control_unsigned_module);
    SIZE(remote_rpc_effective_domain_id_t);
    OFFSET(remote_rpc_effective_domain_id_t, session_id);
    OFFSET(remote_rpc_effective_domain_id_t, effective_domain_id);
    SIZE(remote_rpc_get_uri_t);
    OFFSET(remote_rpc_get_uri_t, session_id);
    OFFSET(remote_rpc_get_uri_t, module_uri);
    OFFSET(remote_rpc_get_uri_t, module_uri_len);
    OFFSET(remote_rpc_get_uri_t, uri);
    OFFSET(remote_rpc_get_uri_t, uri_len);
    SIZE(remote_rpc_reserve_new_session_t);
    OFFSET(remote_rpc_reserve_new_session_t, effective_domain_id);
    SIZE(remote_rpc_get_domain_t);
    SIZE(struct domain);
    SIZE(struct dspqueue_buffer);
    OFFSET(struct dspqueue_buffer, ptr);
    SIZE(fastrpc_domain);
    SIZE(system_req_payload);
    VALUE(REMOTE_SCALARS_MAKEX(0, 2, 2, 1, 0, 0));
    VALUE(REMOTE_SCALARS_MAKEX(7, 31, 255, 255, 15, 15));
    VALUE(REMOTE_SCALARS_LENGTH(REMOTE_SCALARS_MAKEX(0, 1, 2, 3, 4, 5)));
    VALUE(CDSP_DOMAIN_ID);
    VALUE(DSPRPC_CONTROL_LATENCY);
    VALUE(DSPRPC_GET_DSP_INFO);
    VALUE(DSPRPC_GET_DOMAIN);
    VALUE(DSPRPC_CONTROL_UNSIGNED_MODULE);
    VALUE(FASTRPC_RESERVE_NEW_SESSION);
    VALUE(FASTRPC_GET_EFFECTIVE_DOMAIN_ID);
    VALUE(FASTRPC_GET_URI);
    VALUE(ARCH_VER);
    VALUE(MCID_MULTICAST);
    VALUE(RPC_PM_QOS);
    VALUE(FASTRPC_MAP_FD);
    VALUE(FASTRPC_MAP_FD_DELAYED);
    VALUE(FASTRPC_MAP_FD_NOMAP);
    VALUE(FASTRPC_MAP_FD_EXTENDED);
    VALUE(FASTRPC_MAP_FD_DELAYED_EXTENDED);
    VALUE(FASTRPC_GET_DOMAINS);
    VALUE(FASTRPC_NSP);
    VALUE(DOMAINS_LIST_FLAGS_SET_TYPE(0, FASTRPC_NSP));
    VALUE(RPCMEM_HEAP_ID_SYSTEM);
    VALUE(RPCMEM_DEFAULT_FLAGS);
    VALUE(RPCMEM_HEAP_NOREG);
    VALUE(DSPQUEUE_TIMEOUT_NONE);
    VALUE(DSPQUEUE_PACKET_FLAG_USER_READY);
    VALUE(DSPQUEUE_BUFFER_FLAG_FLUSH_SENDER | DSPQUEUE_BUFFER_FLAG_INVALIDATE_RECIPIENT);
    VALUE(DSP_AEE_EOFFSET);
    VALUE(AEE_EUNSUPPORTED);
    VALUE(AEE_EEXPIRED);
    VALUE(AEE_EWOULDBLOCK);
    VALUE(AEE_ECONNRESET);
    VALUE(AEE_EUNSUPPORTEDAPI);
    return 0;
}
