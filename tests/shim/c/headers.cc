// headers.cc -- what llama.cpp's ggml-hexagon.cpp and htp-drv.cpp take from the
// libcdsprpc headers, as C++ (the files themselves come with the sdist; the peer
// build, scripts/peer-llama.sh, compiles them).
#include <AEEStdErr.h>
#include <dspqueue.h>
#include <remote.h>
#include <rpcmem.h>

#include <cstdint>

// htp-drv.h declares this one itself (npud's library does not export it).
extern "C" int remote_system_request(system_req_payload *req);

static domain supported[] = {{CDSP_DOMAIN_ID, CDSP_DOMAIN}, {CDSP1_DOMAIN_ID, CDSP1_DOMAIN}};

int use_them(void) {
    fastrpc_map_flags flags = FASTRPC_MAP_FD_DELAYED_EXTENDED;
    struct remote_rpc_reserve_new_session n {};
    struct remote_rpc_effective_domain_id eff {};
    struct remote_rpc_control_unsigned_module u;
    struct remote_rpc_get_uri g = {};
    struct remote_rpc_control_latency l;
    struct remote_dsp_capability cap;
    system_req_payload info = {};
    info.id = FASTRPC_GET_DOMAINS;
    info.sys.domains = nullptr;
    info.sys.max_domains = 0;
    info.sys.flags = DOMAINS_LIST_FLAGS_SET_TYPE(0, FASTRPC_NSP);
    fastrpc_domain d {};
    u.domain = CDSP_DOMAIN_ID;
    u.enable = 1;
    l.enable = RPC_PM_QOS;
    l.latency = 100;
    cap.domain = CDSP_DOMAIN_ID;
    cap.attribute_ID = ARCH_VER;
    cap.capability = 0;
    dspqueue_buffer b {};
    b.flags = DSPQUEUE_BUFFER_FLAG_FLUSH_SENDER | DSPQUEUE_BUFFER_FLAG_INVALIDATE_RECIPIENT;
    b.ptr = nullptr;
    (void)n.effective_domain_id;
    (void)eff.effective_domain_id;
    (void)g.uri_len;
    (void)d.instance_id;
    (void)supported;
    int err = remote_handle_control(DSPRPC_GET_DSP_INFO, &cap, sizeof(cap));
    if ((err & 0xff) == (AEE_EUNSUPPORTEDAPI & 0xff) || err == AEE_EEXPIRED ||
        err == AEE_EWOULDBLOCK) {
        return 1;
    }
    void *p = rpcmem_alloc2(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS, 4096);
    return remote_system_request(&info) + fastrpc_mmap(CDSP_DOMAIN_ID, rpcmem_to_fd(p), p, 0, 4096, flags) +
           remote_session_control(DSPRPC_CONTROL_UNSIGNED_MODULE, &u, sizeof(u)) +
           remote_handle64_control(0, DSPRPC_CONTROL_LATENCY, &l, sizeof(l)) +
           dspqueue_write(nullptr, 0, 1, &b, 0, nullptr, 1000000);
}
