/*
 * A fake QNN model library for the portal_qnn host tests, built by the tests
 * against skel/include/qnn_min.h.
 *
 * Default build: two graphs.
 *   graph 0 "add_one":  "in" UINT_8 [4,4] -> "out" UINT_8 [4,4] = in + 1;
 *                       fails with QNN_GRAPH_ERROR_ABORTED when in[0] == 0xFF
 *   graph 1 "add_pair": "a", "b" UINT_8 [8] -> "sum" UINT_8 [8] = a + b,
 *                       "total" UINT_32 scalar (rank 0) = sum of sum's bytes
 * Variants (-D):
 *   FAKE_MODEL_GRAPHS=n           n graphs, graph g = "add g+1" on [4,4]
 *   FAKE_MODEL_COMPOSE_ERROR=e    composeGraphs fails with e
 *   FAKE_MODEL_FINALIZE_ERROR=e   graphFinalize fails with e
 *   FAKE_MODEL_INPUT_TYPE=t       data type of graph 0's input
 *   FAKE_MODEL_INPUT_NAME="s"     name of graph 0's input ("in" by default)
 *   FAKE_MODEL_NO_FREE            no QnnModel_freeGraphsInfo export
 *   FAKE_MODEL_DYNAMIC            graph 0's output is dynamic: an input starting 0xEE
 *                                 produces [2, 4] (8 bytes), 0xED [8, 4] (past its
 *                                 buffer), 0xEC rank 9; others the whole [4, 4]
 *   FAKE_MODEL_GATED              execute waits until fake_model_open_gate();
 *                                 fake_model_waiting() counts callers held there
 *
 * fake_model_live_sets() counts compose results not yet freed, so the tests
 * can see that unload and close give them back.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qnn_min.h"

#define EXPORT __attribute__((visibility("default")))

#ifndef FAKE_MODEL_GRAPHS
#define FAKE_MODEL_GRAPHS 2
#define FAKE_MODEL_WITH_PAIR 1
#else
#define FAKE_MODEL_WITH_PAIR 0
#endif
#ifndef FAKE_MODEL_COMPOSE_ERROR
#define FAKE_MODEL_COMPOSE_ERROR 0
#endif
#ifndef FAKE_MODEL_FINALIZE_ERROR
#define FAKE_MODEL_FINALIZE_ERROR 0
#endif
#ifndef FAKE_MODEL_INPUT_TYPE
#define FAKE_MODEL_INPUT_TYPE QNN_DATATYPE_UINT_8
#endif
#ifndef FAKE_MODEL_INPUT_NAME
#define FAKE_MODEL_INPUT_NAME "in"
#endif
#ifndef FAKE_MODEL_GRAPH_NAME
#define FAKE_MODEL_GRAPH_NAME "add"
#endif

enum { KIND_ADD = 1, KIND_PAIR = 2 };

typedef struct {
    int kind;
    uint8_t addend;
    int finalized;
} fake_graph;

/* One graph's records; info first, so &entries[0] is also &entries[0].info. */
typedef struct {
    GraphInfo_t info;
    fake_graph graph;
    Qnn_Tensor_t inputs[2];
    Qnn_Tensor_t outputs[2];
} fake_entry;

static const uint32_t dims_4x4[2] = {4, 4};
static const uint32_t dims_8[1] = {8};
static int g_live_sets;

EXPORT int fake_model_live_sets(void);
EXPORT Qnn_ErrorHandle_t QnnModel_composeGraphs(const QnnMin_Interface_t **interface,
                                                GraphInfoPtr_t **graphsInfo,
                                                uint32_t *numGraphsInfo);

int fake_model_live_sets(void) {
    return g_live_sets;
}

#ifdef FAKE_MODEL_GATED
static pthread_mutex_t g_gate_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_gate_changed = PTHREAD_COND_INITIALIZER;
static int g_gate_open;
static int g_waiting;

EXPORT int fake_model_waiting(void);
EXPORT void fake_model_open_gate(void);

int fake_model_waiting(void) {
    (void)pthread_mutex_lock(&g_gate_lock);
    int waiting = g_waiting;
    (void)pthread_mutex_unlock(&g_gate_lock);
    return waiting;
}

void fake_model_open_gate(void) {
    (void)pthread_mutex_lock(&g_gate_lock);
    g_gate_open = 1;
    (void)pthread_cond_broadcast(&g_gate_changed);
    (void)pthread_mutex_unlock(&g_gate_lock);
}

static void wait_at_gate(void) {
    (void)pthread_mutex_lock(&g_gate_lock);
    g_waiting++;
    while (!g_gate_open) {
        (void)pthread_cond_wait(&g_gate_changed, &g_gate_lock);
    }
    g_waiting--;
    (void)pthread_mutex_unlock(&g_gate_lock);
}
#endif

static Qnn_Tensor_t tensor(uint32_t id, const char *name, uint32_t type, uint32_t rank,
                           const uint32_t *dims) {
    Qnn_Tensor_t t;
    memset(&t, 0, sizeof(t));
    t.id = id;
    t.name = name;
    t.dataType = type;
    t.rank = rank;
    t.dimensions = dims;
    return t;
}

static Qnn_ErrorHandle_t finalize(Qnn_GraphHandle_t handle) {
    fake_graph *graph = handle;
    if (graph == NULL) {
        return QNN_GRAPH_ERROR_INVALID_HANDLE;
    }
    if (FAKE_MODEL_FINALIZE_ERROR != 0) {
        return FAKE_MODEL_FINALIZE_ERROR;
    }
    graph->finalized = 1;
    return QNN_SUCCESS;
}

static int buffer_ok(const Qnn_Tensor_t *tensor_record, uint32_t size) {
    return tensor_record->clientBuf.data != NULL && tensor_record->clientBuf.dataSize == size;
}

static Qnn_ErrorHandle_t execute_add(const fake_graph *graph, const Qnn_Tensor_t *inputs,
                                     uint32_t num_inputs, Qnn_Tensor_t *outputs,
                                     uint32_t num_outputs) {
    if (num_inputs != 1 || num_outputs != 1 || !buffer_ok(&inputs[0], 16) ||
        !buffer_ok(&outputs[0], 16)) {
        return QNN_GRAPH_ERROR_INVALID_TENSOR;
    }
    const uint8_t *in = inputs[0].clientBuf.data;
    uint8_t *out = outputs[0].clientBuf.data;
    if (in[0] == 0xFF) {
        return QNN_GRAPH_ERROR_ABORTED;
    }
    for (int i = 0; i < 16; i++) {
        out[i] = (uint8_t)(in[i] + graph->addend);
    }
#ifdef FAKE_MODEL_DYNAMIC
    /* QNN writes a dynamic output's produced dimensions into its record. */
    static const uint32_t dims_2x4[2] = {2, 4};
    static const uint32_t dims_8x4[2] = {8, 4};
    static const uint32_t dims_rank9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    if (in[0] == 0xEE) {
        outputs[0].dimensions = dims_2x4;
        outputs[0].clientBuf.dataSize = 8;
    } else if (in[0] == 0xED) {
        outputs[0].dimensions = dims_8x4;
    } else if (in[0] == 0xEC) {
        outputs[0].rank = 9;
        outputs[0].dimensions = dims_rank9;
    }
#endif
    return QNN_SUCCESS;
}

static Qnn_ErrorHandle_t execute_pair(const Qnn_Tensor_t *inputs, uint32_t num_inputs,
                                      Qnn_Tensor_t *outputs, uint32_t num_outputs) {
    if (num_inputs != 2 || num_outputs != 2 || !buffer_ok(&inputs[0], 8) ||
        !buffer_ok(&inputs[1], 8) || !buffer_ok(&outputs[0], 8) || !buffer_ok(&outputs[1], 4)) {
        return QNN_GRAPH_ERROR_INVALID_TENSOR;
    }
    const uint8_t *a = inputs[0].clientBuf.data;
    const uint8_t *b = inputs[1].clientBuf.data;
    uint8_t *sum = outputs[0].clientBuf.data;
    uint32_t total = 0;
    for (int i = 0; i < 8; i++) {
        sum[i] = (uint8_t)(a[i] + b[i]);
        total += sum[i];
    }
    memcpy(outputs[1].clientBuf.data, &total, sizeof(total));
    return QNN_SUCCESS;
}

static Qnn_ErrorHandle_t execute(Qnn_GraphHandle_t handle, const Qnn_Tensor_t *inputs,
                                 uint32_t num_inputs, Qnn_Tensor_t *outputs,
                                 uint32_t num_outputs) {
    const fake_graph *graph = handle;
    if (graph == NULL) {
        return QNN_GRAPH_ERROR_INVALID_HANDLE;
    }
    if (!graph->finalized) {
        return QNN_GRAPH_ERROR_GRAPH_NOT_FINALIZED;
    }
#ifdef FAKE_MODEL_GATED
    wait_at_gate();
#endif
    if (graph->kind == KIND_PAIR) {
        return execute_pair(inputs, num_inputs, outputs, num_outputs);
    }
    return execute_add(graph, inputs, num_inputs, outputs, num_outputs);
}

static const QnnMin_Interface_t g_interface = {QNN_MIN_INTERFACE_VERSION, finalize, execute};

static void build_add(fake_entry *entry, uint8_t addend) {
    entry->graph.kind = KIND_ADD;
    entry->graph.addend = addend;
    entry->inputs[0] = tensor(1, FAKE_MODEL_INPUT_NAME, FAKE_MODEL_INPUT_TYPE, 2, dims_4x4);
    entry->outputs[0] = tensor(2, "out", QNN_DATATYPE_UINT_8, 2, dims_4x4);
    entry->info.graphName = FAKE_MODEL_GRAPH_NAME;
    entry->info.numInputTensors = 1;
    entry->info.numOutputTensors = 1;
}

static void build_pair(fake_entry *entry) {
    entry->graph.kind = KIND_PAIR;
    entry->inputs[0] = tensor(1, "a", QNN_DATATYPE_UINT_8, 1, dims_8);
    entry->inputs[1] = tensor(2, "b", QNN_DATATYPE_UINT_8, 1, dims_8);
    entry->outputs[0] = tensor(3, "sum", QNN_DATATYPE_UINT_8, 1, dims_8);
    entry->outputs[1] = tensor(4, "total", QNN_DATATYPE_UINT_32, 0, NULL);
    entry->info.graphName = "add_pair";
    entry->info.numInputTensors = 2;
    entry->info.numOutputTensors = 2;
}

Qnn_ErrorHandle_t QnnModel_composeGraphs(const QnnMin_Interface_t **interface,
                                         GraphInfoPtr_t **graphsInfo, uint32_t *numGraphsInfo) {
    if (FAKE_MODEL_COMPOSE_ERROR != 0) {
        return FAKE_MODEL_COMPOSE_ERROR;
    }
    fake_entry *entries = calloc(FAKE_MODEL_GRAPHS, sizeof(*entries));
    GraphInfoPtr_t *pointers = calloc(FAKE_MODEL_GRAPHS, sizeof(*pointers));
    if (entries == NULL || pointers == NULL) {
        free(entries);
        free(pointers);
        return QNN_COMMON_ERROR_MEM_ALLOC;
    }
    for (uint32_t g = 0; g < FAKE_MODEL_GRAPHS; g++) {
        fake_entry *entry = &entries[g];
        if (FAKE_MODEL_WITH_PAIR && g == 1) {
            build_pair(entry);
        } else {
            build_add(entry, (uint8_t)(g + 1));
        }
        entry->info.graph = &entry->graph;
        entry->info.inputTensors = entry->inputs;
        entry->info.outputTensors = entry->outputs;
        pointers[g] = &entry->info;
    }
    *interface = &g_interface;
    *graphsInfo = pointers;
    *numGraphsInfo = FAKE_MODEL_GRAPHS;
    g_live_sets++;
    return QNN_SUCCESS;
}

#ifndef FAKE_MODEL_NO_FREE
EXPORT Qnn_ErrorHandle_t QnnModel_freeGraphsInfo(GraphInfoPtr_t **graphsInfo,
                                                 uint32_t numGraphsInfo);

Qnn_ErrorHandle_t QnnModel_freeGraphsInfo(GraphInfoPtr_t **graphsInfo, uint32_t numGraphsInfo) {
    if (graphsInfo == NULL || *graphsInfo == NULL || numGraphsInfo != FAKE_MODEL_GRAPHS) {
        return QNN_COMMON_ERROR_INVALID_ARGUMENT;
    }
    free((*graphsInfo)[0]); /* the entries array: info is its first member */
    free(*graphsInfo);
    *graphsInfo = NULL;
    g_live_sets--;
    return QNN_SUCCESS;
}
#endif
