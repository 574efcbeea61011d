/*
 * One loaded model: the graphs a model library composed, with a staging
 * buffer per input and output tensor that the skel owns.
 *
 * Ownership: a qnn_model owns its dlopen handle (if any), the GraphInfo_t
 * records until it gives them back through the library's freeGraphsInfo, and
 * every staging buffer; qnn_model_unload releases all of them exactly once.
 * The caller serializes calls on one model (portal_qnn holds the handle lock).
 *
 * Results: AEE codes for what the skel checks itself. Errors that come out of
 * the model library (composeGraphs, graphFinalize, graphExecute) are QNN
 * errors: the function returns AEE_SUCCESS and puts the QNN code (low 16 bits
 * of Qnn_ErrorHandle_t, never 0 for a failure) in *qnn_status.
 */
#ifndef NPUD_SKEL_QNN_MODEL_H
#define NPUD_SKEL_QNN_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "portal_qnn.h"
#include "portal_qnn_api.h"
#include "qnn_min.h"

/* A skel-owned buffer behind one tensor, and the tensor's description taken at load. */
typedef struct {
    uint8_t *data;
    uint32_t bytes;    /* size of data: the tensor's full size */
    uint32_t produced; /* outputs: bytes the last execute produced */
    /* outputs: the record's rank and dimensions as composed (restored before each
     * execute) and as the last successful execute left them (output_dims). */
    uint32_t declared_rank;
    const uint32_t *declared_dims;
    uint32_t produced_rank;
    uint32_t produced_dims[PORTAL_QNN_MAX_RANK];
    portal_qnn_tensor_spec spec; /* what graph_info reports (copied: the library may change its records) */
} qnn_buffer;

typedef struct {
    Qnn_GraphHandle_t handle;
    char name[PORTAL_QNN_MAX_NAME_BYTES]; /* graphName, copied at load; "" when none */
    uint32_t num_inputs;
    uint32_t num_outputs;
    /* Copies of the library's tensor records, their clientBuf pointing at our buffers. */
    Qnn_Tensor_t *input_tensors;
    Qnn_Tensor_t *output_tensors;
    qnn_buffer *inputs;
    qnn_buffer *outputs;
    uint64_t inputs_set; /* bit i: input i has been written since load */
    bool outputs_valid;  /* the last execute succeeded */
} qnn_graph;

typedef struct {
    bool loaded;
    void *library; /* dlopen handle, or NULL for a builtin */
    QnnModel_FreeGraphsInfoFn_t free_graphs;
    const QnnMin_Interface_t *interface;
    GraphInfoPtr_t *graph_infos;
    uint32_t num_graph_infos;
    uint32_t num_graphs;
    qnn_graph graphs[PORTAL_QNN_MAX_GRAPHS_PER_MODEL];
    /* Why the last execute (or run) of any graph failed, NUL-terminated; "" after a success. */
    char last_error[PORTAL_QNN_MAX_ERROR_BYTES];
} qnn_model;

/*
 * dlopen path and look up the two model entry points. On success *library owns
 * the handle. AEE_EUNABLETOLOAD when dlopen fails, AEE_ENOSUCHSYMBOL when an
 * entry point is missing (the library is closed again).
 */
int qnn_model_open_library(const char *path, void **library, QnnModel_ComposeGraphsFn_t *compose,
                           QnnModel_FreeGraphsInfoFn_t *free_graphs);

/*
 * Compose, check and finalize the graphs into the empty model. Takes ownership
 * of library (closed here on any failure). On AEE_SUCCESS with *qnn_status 0
 * the model is loaded; otherwise it is left empty.
 * AEE_EINVALIDFORMAT: the library broke the contract (no function table, no
 * graphs or more than PORTAL_QNN_MAX_GRAPHS_PER_MODEL, a tensor the skel
 * cannot size, a tensor name of PORTAL_QNN_MAX_NAME_BYTES or more); AEE_ENOMEMORY: staging buffers could not be allocated or
 * exceed PORTAL_QNN_MAX_MODEL_BYTES.
 */
int qnn_model_load(qnn_model *model, void *library, QnnModel_ComposeGraphsFn_t compose,
                   QnnModel_FreeGraphsInfoFn_t free_graphs, uint32_t *qnn_status);

/* Give everything back and leave the model empty. */
void qnn_model_unload(qnn_model *model);

/*
 * Copy one input. AEE_EBADPARM: graph or tensor index out of range;
 * AEE_EBADSIZE: length differs from the tensor's size.
 */
int qnn_model_set_input(qnn_model *model, uint32_t graph, uint32_t tensor, const uint8_t *data,
                        size_t length);

/*
 * Run one graph on the inputs written so far. AEE_EBADPARM: graph index out
 * of range; AEE_ENOTINITIALIZED: some input was never written.
 */
int qnn_model_execute(qnn_model *model, uint32_t graph, uint32_t *qnn_status);

/*
 * Copy one output of the last execute into out (capacity bytes, the tail
 * zero-filled) and report its size in *produced. AEE_EBADPARM: index out of
 * range; AEE_ENOTINITIALIZED: no successful execute yet; AEE_EBUFFERTOOSMALL:
 * capacity is smaller than the output.
 */
int qnn_model_get_output(qnn_model *model, uint32_t graph, uint32_t tensor, uint8_t *out,
                         size_t capacity, uint32_t *produced);

/*
 * One run on arenas (idl/portal_qnn.idl, "Tensor arenas"): copy every input
 * from inputs (exactly the inputs arena's size), execute, and copy every
 * output into outputs at its offset, zero-filling the rest of the capacity.
 * AEE_EBADPARM: graph index out of range or NULL data; AEE_EBADSIZE: input
 * length differs from the inputs arena; AEE_EBUFFERTOOSMALL: capacity below
 * the outputs arena; otherwise as qnn_model_execute (a QNN failure writes
 * nothing into outputs).
 */
int qnn_model_run(qnn_model *model, uint32_t graph, const uint8_t *inputs, size_t input_length,
                  uint8_t *outputs, size_t output_capacity, uint32_t *qnn_status);

/* Entries of output_dims per output: the rank, then PORTAL_QNN_MAX_RANK dimensions. */
#define QNN_MODEL_DIMS_STRIDE (1u + PORTAL_QNN_MAX_RANK)

/*
 * Every output's shape as the graph's last successful execute produced it
 * (the dimensions graphExecute left in its output records: a graph with
 * dynamic output dimensions writes the produced ones there), into dims
 * (capacity u32s, the rest zero-filled), QNN_MODEL_DIMS_STRIDE entries per
 * output, and the output count in *num_outputs. AEE_EBADPARM: graph index
 * out of range or NULL dims; AEE_ENOTINITIALIZED: no successful execute since
 * the load or the last failure; AEE_EBUFFERTOOSMALL: capacity below
 * QNN_MODEL_DIMS_STRIDE entries per output.
 */
int qnn_model_output_dims(const qnn_model *model, uint32_t graph, uint32_t *dims,
                          size_t capacity, uint32_t *num_outputs);

/* The number of outputs of graph, or 0 when there is no such graph. */
uint32_t qnn_model_num_outputs(const qnn_model *model, uint32_t graph);

/*
 * Describe graph's tensors: inputs[0..num_inputs-1] and outputs[0..num_outputs-1]
 * are filled, the rest of each array zeroed. AEE_EBADPARM: graph index out of
 * range; AEE_EBUFFERTOOSMALL: a capacity (in records) below the tensor count.
 */
/*
 * Copy the model's last_error into text (capacity bytes, the rest zero-filled, no NUL
 * written) and report how many bytes were copied in *length.
 */
void qnn_model_last_error(const qnn_model *model, uint8_t *text, size_t capacity,
                          uint32_t *length);

/*
 * Copy graph graph_index's name into name as qnn_model_last_error copies its text.
 * AEE_EBADPARM: no such graph.
 */
int qnn_model_graph_name(const qnn_model *model, uint32_t graph_index, uint8_t *name,
                         size_t capacity, uint32_t *length);

/* The same for any kept text of kept_size bytes (NUL-terminated within them). */
void qnn_copy_text(const char *kept, size_t kept_size, uint8_t *text, size_t capacity,
                   uint32_t *length);

int qnn_model_describe(const qnn_model *model, uint32_t graph, portal_qnn_tensor_spec *inputs,
                       size_t input_capacity, portal_qnn_tensor_spec *outputs,
                       size_t output_capacity, uint32_t *num_inputs, uint32_t *num_outputs);

#endif /* NPUD_SKEL_QNN_MODEL_H */
