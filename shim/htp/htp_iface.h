/*
 * htp_iface.h -- the client side of llama.cpp's htp/htp_iface.idl, as qaic would
 * generate it (the Hexagon SDK's qaic is not available here): written for npud,
 * to build llama.cpp's libggml-hexagon.so against npud's libcdsprpc
 * (scripts/peer-llama.sh).
 *
 *   interface htp_iface : remote_handle64 {                            method index
 *     AEEResult start(in uint32 sess_id, in uint64 dsp_queue_id,
 *                     in uint32 n_hvx, in uint32 n_hmx, in uint64 max_vmem);       2
 *     AEEResult stop();                                                            3
 *     AEEResult mmap(in uint32 fd, in uint64 size);                                4
 *     AEEResult munmap(in uint32 fd);                                              5
 *     AEEResult profiler(in uint32 mode, in htp_iface_pmu_conf pmu);               6
 *     AEEResult etm(in uint32 enable);                                             7
 *     AEEResult hwinfo(rout uint32 n_threads, rout uint32 n_hvx,
 *                      rout uint32 n_hmx, rout uint64 vtcm_size);                  8
 *   };   (open 0 and close 1 run in the DSP's framework)
 */
#ifndef _HTP_IFACE_H
#define _HTP_IFACE_H

#include <AEEStdDef.h>
#include <remote.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct htp_iface_pmu_conf htp_iface_pmu_conf;
struct htp_iface_pmu_conf {
    uint32_t events[8];
};

int htp_iface_open(const char *uri, remote_handle64 *h);
int htp_iface_close(remote_handle64 h);
AEEResult htp_iface_start(remote_handle64 h, uint32_t sess_id, uint64_t dsp_queue_id,
                          uint32_t n_hvx, uint32_t n_hmx, uint64_t max_vmem);
AEEResult htp_iface_stop(remote_handle64 h);
AEEResult htp_iface_mmap(remote_handle64 h, uint32_t fd, uint64_t size);
AEEResult htp_iface_munmap(remote_handle64 h, uint32_t fd);
AEEResult htp_iface_profiler(remote_handle64 h, uint32_t mode, const htp_iface_pmu_conf *pmu);
AEEResult htp_iface_etm(remote_handle64 h, uint32_t enable);
/* unsigned long long, not uint64_t (unsigned long on LP64 Linux): ggml-hexagon.cpp
 * passes an unsigned long long *. The same 8 bytes. */
AEEResult htp_iface_hwinfo(remote_handle64 h, unsigned int *n_threads, unsigned int *n_hvx,
                           unsigned int *n_hmx, unsigned long long *vtcm_size);

#ifndef htp_iface_URI
#define htp_iface_URI "file:///libhtp_iface_skel.so?htp_iface_skel_handle_invoke&_modver=1.0"
#endif

#ifdef __cplusplus
}
#endif

#endif /* _HTP_IFACE_H */
