/*
 * portal_qnn: limits, and the C API beyond what qaic generates from the IDL.
 *
 * The RPC methods (portal_qnn_model_load ... portal_qnn_model_unload) are
 * declared by the qaic-generated portal_qnn.h; this header adds what code in
 * the same DSP process calls directly:
 *
 * - portal_qnn_register_builtin: make a model that is already loaded (its
 *   composeGraphs / freeGraphsInfo function pointers) loadable through the
 *   RPC as model_load("builtin:<name>").
 * - portal_qnn_model_load_functions: load such a model into a handle's slot
 *   table directly.
 */
#ifndef NPUD_SKEL_PORTAL_QNN_API_H
#define NPUD_SKEL_PORTAL_QNN_API_H

#include "qnn_min.h"
#include "remote.h"

/* Model slots per open handle; model_index is 0 .. PORTAL_QNN_MAX_MODELS - 1. */
#define PORTAL_QNN_MAX_MODELS 4u
/* Graphs one model may compose; graph_index is 0 .. num_graphs - 1. */
#define PORTAL_QNN_MAX_GRAPHS_PER_MODEL 8u
/* Input tensors and output tensors per graph (each). */
#define PORTAL_QNN_MAX_TENSORS_PER_GRAPH 32u
/* Dimensions per tensor (the size of portal_qnn_tensor_spec.dims). */
#define PORTAL_QNN_MAX_RANK 8u
/* A tensor name with its NUL (the size of portal_qnn_tensor_spec.name). */
#define PORTAL_QNN_MAX_NAME_BYTES 128u
/* Bytes of one tensor, and of all staging buffers of one model. */
#define PORTAL_QNN_MAX_TENSOR_BYTES (64u * 1024u * 1024u)
#define PORTAL_QNN_MAX_MODEL_BYTES (256u * 1024u * 1024u)
/* model_load's model_uri, terminating NUL included. */
#define PORTAL_QNN_MAX_URI_BYTES 512u
/* Registered builtin models per process, and the longest name (NUL excluded). */
#define PORTAL_QNN_MAX_BUILTINS 8u
#define PORTAL_QNN_MAX_BUILTIN_NAME 63u

/* Tensors of a run's arenas start at multiples of this many bytes (idl/portal_qnn.idl). */
#define PORTAL_QNN_ARENA_ALIGN 64u

/* model_uri prefix that names a registered builtin instead of a library path. */
#define PORTAL_QNN_BUILTIN_PREFIX "builtin:"

/* last_error's text with its NUL: a failure's reason is cut to one byte less. */
#define PORTAL_QNN_MAX_ERROR_BYTES 256u

/* model_index reported when model_load did not fill a slot. */
#define PORTAL_QNN_NO_MODEL 0xFFFFFFFFu

/*
 * Register compose/free under name ([A-Za-z0-9_.-], 1..63 characters).
 * AEE_EBADPARM for a bad name or NULL function, AEE_EALREADYLOADED when the
 * name is taken, AEE_EOUTOFHANDLES when PORTAL_QNN_MAX_BUILTINS are registered.
 * Registrations last as long as the library (there is no unregister: a loaded
 * model may still point at the functions).
 */
int portal_qnn_register_builtin(const char *name, QnnModel_ComposeGraphsFn_t compose,
                                QnnModel_FreeGraphsInfoFn_t free_graphs);

/*
 * Load the model that compose/free_graphs describe into the first free slot of
 * handle h. Results as for the RPC portal_qnn_model_load.
 */
int portal_qnn_model_load_functions(remote_handle64 h, QnnModel_ComposeGraphsFn_t compose,
                                    QnnModel_FreeGraphsInfoFn_t free_graphs,
                                    unsigned int *model_index, unsigned int *num_graphs,
                                    unsigned int *qnn_status);

#endif /* NPUD_SKEL_PORTAL_QNN_API_H */
