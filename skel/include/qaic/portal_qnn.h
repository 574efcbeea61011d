/*
 * Host stand-in for the header qaic generates from idl/portal_qnn.idl
 * (`qaic -mdll idl/portal_qnn.idl` writes portal_qnn.h, portal_qnn_skel.c and
 * portal_qnn_stub.c).
 *
 * IDL `unsigned long` is C `unsigned int`, `in string` is `const char *`,
 * `in sequence<octet> x` is `const unsigned char *x, int xLen`, and
 * `rout sequence<octet> x` is `unsigned char *x, int xLen` (xLen = capacity),
 * `rout sequence<S> x` of a struct S is `S *x, int xLen` (xLen = records).
 * skel/portal_qnn_imp.c compiles unchanged against either header.
 */
#ifndef NPUD_SKEL_QAIC_PORTAL_QNN_H
#define NPUD_SKEL_QAIC_PORTAL_QNN_H

#include "AEEStdDef.h"
#include "remote.h"

#ifdef __cplusplus
extern "C" {
#endif

/* struct portal_qnn_tensor_spec of the IDL: only `unsigned long` and `char` members, no padding. */
typedef struct portal_qnn_tensor_spec portal_qnn_tensor_spec;
struct portal_qnn_tensor_spec {
    unsigned int data_type;
    unsigned int rank;
    unsigned int dims[8];
    unsigned int bytes;
    char name[128];
};

int portal_qnn_open(const char *uri, remote_handle64 *h);
int portal_qnn_close(remote_handle64 h);
/* method 2 */
int portal_qnn_model_load(remote_handle64 _h, const char *model_uri, unsigned int *model_index,
                          unsigned int *num_graphs, unsigned int *qnn_status);
/* method 3 */
int portal_qnn_set_input(remote_handle64 _h, unsigned int model_index, unsigned int graph_index,
                         unsigned int tensor_index, const unsigned char *data, int dataLen);
/* method 4 */
int portal_qnn_execute(remote_handle64 _h, unsigned int model_index, unsigned int graph_index,
                       unsigned int *qnn_status);
/* method 5 */
int portal_qnn_get_output(remote_handle64 _h, unsigned int model_index, unsigned int graph_index,
                          unsigned int tensor_index, unsigned char *data, int dataLen,
                          unsigned int *data_len);
/* method 6 */
int portal_qnn_model_unload(remote_handle64 _h, unsigned int model_index);
/* method 7; inputsLen / outputsLen count records */
int portal_qnn_graph_info(remote_handle64 _h, unsigned int model_index, unsigned int graph_index,
                          portal_qnn_tensor_spec *inputs, int inputsLen,
                          portal_qnn_tensor_spec *outputs, int outputsLen,
                          unsigned int *num_inputs, unsigned int *num_outputs);
/* method 8 */
int portal_qnn_run(remote_handle64 _h, unsigned int model_index, unsigned int graph_index,
                   const unsigned char *inputs, int inputsLen, unsigned char *outputs,
                   int outputsLen, unsigned int *qnn_status);
/* method 9 */
int portal_qnn_last_error(remote_handle64 _h, unsigned int model_index, unsigned char *text,
                          int textLen, unsigned int *text_len);
/* method 10 */
int portal_qnn_graph_name(remote_handle64 _h, unsigned int model_index, unsigned int graph_index,
                          unsigned char *name, int nameLen, unsigned int *name_len);
/* method 11; dimsLen counts u32s */
int portal_qnn_output_dims(remote_handle64 _h, unsigned int model_index, unsigned int graph_index,
                           unsigned int *dims, int dimsLen, unsigned int *num_outputs);
/* method 12; dimsLen counts u32s */
int portal_qnn_run_dims(remote_handle64 _h, unsigned int model_index, unsigned int graph_index,
                        const unsigned char *inputs, int inputsLen, unsigned char *outputs,
                        int outputsLen, unsigned int *dims, int dimsLen, unsigned int *qnn_status,
                        unsigned int *num_outputs);

#ifndef portal_qnn_URI
#define portal_qnn_URI "file:///libportal_qnn_skel.so?portal_qnn_skel_handle_invoke&_modver=1.0"
#endif

#ifdef __cplusplus
}
#endif

#endif /* NPUD_SKEL_QAIC_PORTAL_QNN_H */
