/*
 * The reduced QNN model-library contract that portal_qnn speaks.
 *
 * Written for npud from the public QNN API documentation; it is not a copy of
 * the QAIRT headers and it is NOT binary-compatible with them. It keeps the
 * QNN names, the 64-bit Qnn_ErrorHandle_t, the error numbers and the data-type
 * encoding, and the shape of a model library (QnnModel_composeGraphs returns
 * GraphInfo_t records, QnnModel_freeGraphsInfo releases them), but reduces the
 * rest to what a skel that executes prepared graphs needs:
 *
 * - composeGraphs takes no backend, context or QNN_INTERFACE_VER_TYPE; instead
 *   it hands back the function table (QnnMin_Interface_t) through which the
 *   skel finalizes and executes the graphs it returned.
 * - Qnn_Tensor_t is flattened to the fields the skel reads: the data type, the
 *   rank and dimensions (to size the staging buffer) and the client buffer.
 * - graphExecute has no profile or signal handle.
 *
 * A model library built with qnn-model-lib-generator against the QAIRT SDK
 * exports the full-size signatures and cannot be loaded by this skel as is;
 * it needs an adapter library compiled against the QAIRT headers that exports
 * this contract (see docker/README.md, "QNN models on the device").
 */
#ifndef NPUD_SKEL_QNN_MIN_H
#define NPUD_SKEL_QNN_MIN_H

#include <stdint.h>

/* ---- errors: the low 16 bits carry the code (QNN_GET_ERROR_CODE) ---- */

typedef uint64_t Qnn_ErrorHandle_t;

#define QNN_SUCCESS 0u
#define QNN_GET_ERROR_CODE(error) ((uint32_t)((error) & 0xFFFFu))

#define QNN_MIN_ERROR_COMMON 1000u
#define QNN_COMMON_ERROR_NOT_SUPPORTED (QNN_MIN_ERROR_COMMON + 0u)
#define QNN_COMMON_ERROR_MEM_ALLOC (QNN_MIN_ERROR_COMMON + 2u)
#define QNN_COMMON_ERROR_INVALID_ARGUMENT (QNN_MIN_ERROR_COMMON + 4u)
#define QNN_COMMON_ERROR_GENERAL (QNN_MIN_ERROR_COMMON + 100u)

#define QNN_MIN_ERROR_GRAPH 6000u
#define QNN_GRAPH_ERROR_INVALID_ARGUMENT (QNN_MIN_ERROR_GRAPH + 0u)
#define QNN_GRAPH_ERROR_INVALID_HANDLE (QNN_MIN_ERROR_GRAPH + 1u)
#define QNN_GRAPH_ERROR_INVALID_TENSOR (QNN_MIN_ERROR_GRAPH + 4u)
#define QNN_GRAPH_ERROR_FINALIZE_FAILED (QNN_MIN_ERROR_GRAPH + 22u)
#define QNN_GRAPH_ERROR_GRAPH_NOT_FINALIZED (QNN_MIN_ERROR_GRAPH + 23u)
#define QNN_GRAPH_ERROR_ABORTED (QNN_MIN_ERROR_GRAPH + 31u)

/* ---- data types: QNN's encoding, low byte = bit width written in hex digits ---- */

#define QNN_DATATYPE_INT_8 0x0008u
#define QNN_DATATYPE_INT_16 0x0016u
#define QNN_DATATYPE_INT_32 0x0032u
#define QNN_DATATYPE_INT_64 0x0064u
#define QNN_DATATYPE_UINT_8 0x0108u
#define QNN_DATATYPE_UINT_16 0x0116u
#define QNN_DATATYPE_UINT_32 0x0132u
#define QNN_DATATYPE_UINT_64 0x0164u
#define QNN_DATATYPE_FLOAT_16 0x0216u
#define QNN_DATATYPE_FLOAT_32 0x0232u
#define QNN_DATATYPE_SFIXED_POINT_8 0x0308u
#define QNN_DATATYPE_SFIXED_POINT_16 0x0316u
#define QNN_DATATYPE_SFIXED_POINT_32 0x0332u
#define QNN_DATATYPE_UFIXED_POINT_8 0x0408u
#define QNN_DATATYPE_UFIXED_POINT_16 0x0416u
#define QNN_DATATYPE_UFIXED_POINT_32 0x0432u
#define QNN_DATATYPE_BOOL_8 0x0508u

/* ---- handles, tensors, graphs ---- */

typedef void *Qnn_GraphHandle_t;

/* Memory the caller owns and hands to the graph for one execution. */
typedef struct {
    void *data;
    uint32_t dataSize;
} Qnn_ClientBuffer_t;

typedef struct {
    uint32_t id;
    const char *name;
    uint32_t dataType;           /* QNN_DATATYPE_* */
    uint32_t rank;               /* number of entries in dimensions */
    const uint32_t *dimensions;  /* owned by the model library */
    Qnn_ClientBuffer_t clientBuf;
} Qnn_Tensor_t;

/* One graph as the model library describes it; owned by the model library. */
typedef struct {
    Qnn_GraphHandle_t graph;
    const char *graphName;
    Qnn_Tensor_t *inputTensors;
    uint32_t numInputTensors;
    Qnn_Tensor_t *outputTensors;
    uint32_t numOutputTensors;
} GraphInfo_t;

typedef GraphInfo_t *GraphInfoPtr_t;

/* ---- the function table a model library hands back ---- */

#define QNN_MIN_INTERFACE_VERSION 1u

typedef struct {
    uint32_t version; /* QNN_MIN_INTERFACE_VERSION */
    Qnn_ErrorHandle_t (*graphFinalize)(Qnn_GraphHandle_t graph);
    Qnn_ErrorHandle_t (*graphExecute)(Qnn_GraphHandle_t graph, const Qnn_Tensor_t *inputs,
                                      uint32_t numInputs, Qnn_Tensor_t *outputs,
                                      uint32_t numOutputs);
} QnnMin_Interface_t;

/* ---- what a model library exports ---- */

#define QNN_MODEL_COMPOSE_GRAPHS_SYMBOL "QnnModel_composeGraphs"
#define QNN_MODEL_FREE_GRAPHS_INFO_SYMBOL "QnnModel_freeGraphsInfo"

/*
 * Build the model's graphs. On QNN_SUCCESS *graphsInfo points at
 * *numGraphsInfo graph records and *interface at the table that runs them;
 * both stay valid until QnnModel_freeGraphsInfo is called with the same array.
 */
typedef Qnn_ErrorHandle_t (*QnnModel_ComposeGraphsFn_t)(const QnnMin_Interface_t **interface,
                                                        GraphInfoPtr_t **graphsInfo,
                                                        uint32_t *numGraphsInfo);

/* Release what composeGraphs returned; sets *graphsInfo to NULL. */
typedef Qnn_ErrorHandle_t (*QnnModel_FreeGraphsInfoFn_t)(GraphInfoPtr_t **graphsInfo,
                                                         uint32_t numGraphsInfo);

#endif /* NPUD_SKEL_QNN_MIN_H */
