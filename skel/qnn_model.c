/* One loaded model: composed graphs plus skel-owned staging buffers (see include/qnn_model.h). */
#include "qnn_model.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "AEEStdErr.h"
#include "HAP_farf.h"

/* A failed QNN call always reports a non-zero code, even if its low 16 bits are 0. */
static uint32_t qnn_code(Qnn_ErrorHandle_t error) {
    uint32_t code = QNN_GET_ERROR_CODE(error);
    return code != 0 ? code : QNN_COMMON_ERROR_GENERAL;
}

int qnn_model_open_library(const char *path, void **library, QnnModel_ComposeGraphsFn_t *compose,
                           QnnModel_FreeGraphsInfoFn_t *free_graphs) {
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) {
        const char *why = dlerror();
        FARF(ERROR, "portal_qnn: cannot load %s: %s", path, why != NULL ? why : "?");
        return AEE_EUNABLETOLOAD;
    }
    /* dlsym hands back data pointers; POSIX guarantees they convert to functions. */
    void *compose_symbol = dlsym(handle, QNN_MODEL_COMPOSE_GRAPHS_SYMBOL);
    void *free_symbol = dlsym(handle, QNN_MODEL_FREE_GRAPHS_INFO_SYMBOL);
    if (compose_symbol == NULL || free_symbol == NULL) {
        FARF(ERROR, "portal_qnn: %s lacks %s", path,
             compose_symbol == NULL ? QNN_MODEL_COMPOSE_GRAPHS_SYMBOL
                                    : QNN_MODEL_FREE_GRAPHS_INFO_SYMBOL);
        (void)dlclose(handle);
        return AEE_ENOSUCHSYMBOL;
    }
    *library = handle;
    *compose = (QnnModel_ComposeGraphsFn_t)compose_symbol;
    *free_graphs = (QnnModel_FreeGraphsInfoFn_t)free_symbol;
    return AEE_SUCCESS;
}

/* Bytes of one element of a data type, or 0 for a type the skel does not know. */
static uint32_t element_bytes(uint32_t data_type) {
    switch (data_type) {
    case QNN_DATATYPE_INT_8:
    case QNN_DATATYPE_UINT_8:
    case QNN_DATATYPE_SFIXED_POINT_8:
    case QNN_DATATYPE_UFIXED_POINT_8:
    case QNN_DATATYPE_BOOL_8:
        return 1;
    case QNN_DATATYPE_INT_16:
    case QNN_DATATYPE_UINT_16:
    case QNN_DATATYPE_FLOAT_16:
    case QNN_DATATYPE_SFIXED_POINT_16:
    case QNN_DATATYPE_UFIXED_POINT_16:
        return 2;
    case QNN_DATATYPE_INT_32:
    case QNN_DATATYPE_UINT_32:
    case QNN_DATATYPE_FLOAT_32:
    case QNN_DATATYPE_SFIXED_POINT_32:
    case QNN_DATATYPE_UFIXED_POINT_32:
        return 4;
    case QNN_DATATYPE_INT_64:
    case QNN_DATATYPE_UINT_64:
        return 8;
    default:
        return 0;
    }
}

/*
 * The description graph_info reports, or AEE_EINVALIDFORMAT for a name that
 * does not fit (a truncated name could collide with another tensor's).
 * tensor_bytes has already bounded the rank.
 */
static int describe_tensor(const Qnn_Tensor_t *tensor, uint32_t bytes,
                           portal_qnn_tensor_spec *spec) {
    memset(spec, 0, sizeof(*spec));
    if (tensor->name != NULL) {
        size_t length = strnlen(tensor->name, PORTAL_QNN_MAX_NAME_BYTES);
        if (length == PORTAL_QNN_MAX_NAME_BYTES) {
            FARF(ERROR, "portal_qnn: a tensor name is longer than %u bytes",
                 (unsigned)(PORTAL_QNN_MAX_NAME_BYTES - 1u));
            return AEE_EINVALIDFORMAT;
        }
        memcpy(spec->name, tensor->name, length);
    }
    spec->data_type = tensor->dataType;
    spec->rank = tensor->rank;
    for (uint32_t i = 0; i < tensor->rank; i++) {
        spec->dims[i] = tensor->dimensions[i];
    }
    spec->bytes = bytes;
    return AEE_SUCCESS;
}

/*
 * Size of a tensor in bytes, or 0 when the skel cannot size it: unknown type,
 * rank above PORTAL_QNN_MAX_RANK, missing dimensions, a zero dimension, or
 * more than PORTAL_QNN_MAX_TENSOR_BYTES. Rank 0 is a scalar (one element).
 */
static uint32_t tensor_bytes(const Qnn_Tensor_t *tensor) {
    uint64_t bytes = element_bytes(tensor->dataType);
    if (bytes == 0 || tensor->rank > PORTAL_QNN_MAX_RANK ||
        (tensor->rank != 0 && tensor->dimensions == NULL)) {
        return 0;
    }
    for (uint32_t i = 0; i < tensor->rank; i++) {
        /* Both factors stay below 2^32 and the product is checked at once: no overflow. */
        bytes *= tensor->dimensions[i];
        if (bytes == 0 || bytes > PORTAL_QNN_MAX_TENSOR_BYTES) {
            return 0;
        }
    }
    return (uint32_t)bytes;
}

static void free_tensors(Qnn_Tensor_t **tensors, qnn_buffer **buffers, uint32_t count) {
    if (*buffers != NULL) {
        for (uint32_t i = 0; i < count; i++) {
            free((*buffers)[i].data);
        }
    }
    free(*buffers);
    free(*tensors);
    *buffers = NULL;
    *tensors = NULL;
}

static void free_graph(qnn_graph *graph) {
    free_tensors(&graph->input_tensors, &graph->inputs, graph->num_inputs);
    free_tensors(&graph->output_tensors, &graph->outputs, graph->num_outputs);
    memset(graph, 0, sizeof(*graph));
}

/*
 * Copy count tensor records from the library and give each a zeroed staging
 * buffer (zeroed so an output can never expose stale memory). *total_bytes
 * accumulates the model's staging size against PORTAL_QNN_MAX_MODEL_BYTES.
 */
static int stage_tensors(const Qnn_Tensor_t *source, uint32_t count, Qnn_Tensor_t **tensors,
                         qnn_buffer **buffers, uint64_t *total_bytes) {
    if (count == 0) {
        return AEE_SUCCESS;
    }
    if (source == NULL) {
        return AEE_EINVALIDFORMAT;
    }
    *tensors = calloc(count, sizeof(**tensors));
    *buffers = calloc(count, sizeof(**buffers));
    if (*tensors == NULL || *buffers == NULL) {
        return AEE_ENOMEMORY;
    }
    for (uint32_t i = 0; i < count; i++) {
        uint32_t bytes = tensor_bytes(&source[i]);
        if (bytes == 0) {
            FARF(ERROR, "portal_qnn: tensor %u (type 0x%x, rank %u) cannot be sized",
                 (unsigned)i, (unsigned)source[i].dataType, (unsigned)source[i].rank);
            return AEE_EINVALIDFORMAT;
        }
        int rc = describe_tensor(&source[i], bytes, &(*buffers)[i].spec);
        if (rc != AEE_SUCCESS) {
            return rc;
        }
        *total_bytes += bytes;
        if (*total_bytes > PORTAL_QNN_MAX_MODEL_BYTES) {
            return AEE_ENOMEMORY;
        }
        uint8_t *data = calloc(1, bytes);
        if (data == NULL) {
            return AEE_ENOMEMORY;
        }
        (*buffers)[i].data = data;
        (*buffers)[i].bytes = bytes;
        (*buffers)[i].declared_rank = source[i].rank;
        (*buffers)[i].declared_dims = source[i].dimensions;
        (*tensors)[i] = source[i];
        (*tensors)[i].clientBuf.data = data;
        (*tensors)[i].clientBuf.dataSize = bytes;
    }
    return AEE_SUCCESS;
}

/* Check what composeGraphs returned and build the skel's side of every graph. */
static int adopt_graphs(qnn_model *model) {
    const QnnMin_Interface_t *interface = model->interface;
    if (interface == NULL || interface->version != QNN_MIN_INTERFACE_VERSION ||
        interface->graphFinalize == NULL || interface->graphExecute == NULL) {
        FARF(ERROR, "portal_qnn: model library returned no usable function table");
        return AEE_EINVALIDFORMAT;
    }
    if (model->graph_infos == NULL || model->num_graph_infos == 0 ||
        model->num_graph_infos > PORTAL_QNN_MAX_GRAPHS_PER_MODEL) {
        FARF(ERROR, "portal_qnn: model library composed %u graphs (1..%u allowed)",
             (unsigned)model->num_graph_infos, (unsigned)PORTAL_QNN_MAX_GRAPHS_PER_MODEL);
        return AEE_EINVALIDFORMAT;
    }
    uint64_t total_bytes = 0;
    for (uint32_t g = 0; g < model->num_graph_infos; g++) {
        const GraphInfo_t *info = model->graph_infos[g];
        if (info == NULL || info->graph == NULL ||
            info->numInputTensors > PORTAL_QNN_MAX_TENSORS_PER_GRAPH ||
            info->numOutputTensors == 0 ||
            info->numOutputTensors > PORTAL_QNN_MAX_TENSORS_PER_GRAPH) {
            FARF(ERROR, "portal_qnn: graph %u is malformed", (unsigned)g);
            return AEE_EINVALIDFORMAT;
        }
        qnn_graph *graph = &model->graphs[g];
        if (info->graphName != NULL) {
            /* A truncated name could collide with another graph's, as for tensors. */
            size_t length = strnlen(info->graphName, PORTAL_QNN_MAX_NAME_BYTES);
            if (length == PORTAL_QNN_MAX_NAME_BYTES) {
                FARF(ERROR, "portal_qnn: graph %u's name is longer than %u bytes", (unsigned)g,
                     (unsigned)(PORTAL_QNN_MAX_NAME_BYTES - 1u));
                return AEE_EINVALIDFORMAT;
            }
            memcpy(graph->name, info->graphName, length);
        }
        /* Counts first: free_graph needs them even when staging stops half way. */
        graph->handle = info->graph;
        graph->num_inputs = info->numInputTensors;
        graph->num_outputs = info->numOutputTensors;
        model->num_graphs = g + 1;
        int rc = stage_tensors(info->inputTensors, graph->num_inputs, &graph->input_tensors,
                               &graph->inputs, &total_bytes);
        if (rc == AEE_SUCCESS) {
            rc = stage_tensors(info->outputTensors, graph->num_outputs, &graph->output_tensors,
                               &graph->outputs, &total_bytes);
        }
        if (rc != AEE_SUCCESS) {
            return rc;
        }
    }
    return AEE_SUCCESS;
}

void qnn_model_unload(qnn_model *model) {
    for (uint32_t g = 0; g < model->num_graphs; g++) {
        free_graph(&model->graphs[g]);
    }
    if (model->graph_infos != NULL && model->free_graphs != NULL) {
        Qnn_ErrorHandle_t error = model->free_graphs(&model->graph_infos, model->num_graph_infos);
        if (error != QNN_SUCCESS) {
            FARF(ERROR, "portal_qnn: freeGraphsInfo failed with %u", (unsigned)qnn_code(error));
        }
    }
    if (model->library != NULL) {
        (void)dlclose(model->library);
    }
    memset(model, 0, sizeof(*model));
}

int qnn_model_load(qnn_model *model, void *library, QnnModel_ComposeGraphsFn_t compose,
                   QnnModel_FreeGraphsInfoFn_t free_graphs, uint32_t *qnn_status) {
    memset(model, 0, sizeof(*model));
    model->library = library;
    *qnn_status = QNN_SUCCESS;

    const QnnMin_Interface_t *interface = NULL;
    GraphInfoPtr_t *graph_infos = NULL;
    uint32_t num_graph_infos = 0;
    Qnn_ErrorHandle_t error = compose(&interface, &graph_infos, &num_graph_infos);
    if (error != QNN_SUCCESS) {
        /* A failed compose hands nothing back, so there is nothing to free but the library. */
        *qnn_status = qnn_code(error);
        FARF(ERROR, "portal_qnn: composeGraphs failed with %u", (unsigned)*qnn_status);
        qnn_model_unload(model);
        return AEE_SUCCESS;
    }
    model->interface = interface;
    model->graph_infos = graph_infos;
    model->num_graph_infos = num_graph_infos;
    model->free_graphs = free_graphs;

    int rc = adopt_graphs(model);
    if (rc != AEE_SUCCESS) {
        qnn_model_unload(model);
        return rc;
    }
    for (uint32_t g = 0; g < model->num_graphs; g++) {
        error = interface->graphFinalize(model->graphs[g].handle);
        if (error != QNN_SUCCESS) {
            *qnn_status = qnn_code(error);
            FARF(ERROR, "portal_qnn: graphFinalize(%u) failed with %u", (unsigned)g,
                 (unsigned)*qnn_status);
            qnn_model_unload(model);
            return AEE_SUCCESS;
        }
    }
    model->loaded = true;
    return AEE_SUCCESS;
}

static qnn_graph *graph_at(qnn_model *model, uint32_t graph) {
    return graph < model->num_graphs ? &model->graphs[graph] : NULL;
}

static uint64_t all_inputs(const qnn_graph *graph) {
    return (UINT64_C(1) << graph->num_inputs) - 1u;
}

int qnn_model_set_input(qnn_model *model, uint32_t graph_index, uint32_t tensor,
                        const uint8_t *data, size_t length) {
    qnn_graph *graph = graph_at(model, graph_index);
    if (graph == NULL || tensor >= graph->num_inputs || (length != 0 && data == NULL)) {
        return AEE_EBADPARM;
    }
    qnn_buffer *buffer = &graph->inputs[tensor];
    if (length != buffer->bytes) {
        FARF(HIGH, "portal_qnn: input %u takes %u bytes, got %u", (unsigned)tensor,
             (unsigned)buffer->bytes, (unsigned)length);
        return AEE_EBADSIZE;
    }
    memcpy(buffer->data, data, length);
    graph->inputs_set |= UINT64_C(1) << tensor;
    return AEE_SUCCESS;
}

/*
 * Keep the shape graphExecute left in an output's record (QNN writes a dynamic
 * output's produced dimensions there; a fixed one's stay as composed), or
 * AEE_EINVALIDFORMAT when it is no shape of that buffer: a rank over the
 * maximum, no dimensions, or more elements than the buffer holds.
 */
static int keep_produced_dims(const Qnn_Tensor_t *record, qnn_buffer *buffer) {
    uint32_t rank = record->rank;
    if (rank > PORTAL_QNN_MAX_RANK || (rank != 0 && record->dimensions == NULL)) {
        return AEE_EINVALIDFORMAT;
    }
    uint64_t bytes = element_bytes(buffer->spec.data_type);
    for (uint32_t d = 0; d < rank && bytes <= buffer->bytes; d++) {
        bytes *= record->dimensions[d];
    }
    if (bytes > buffer->bytes) {
        return AEE_EINVALIDFORMAT;
    }
    buffer->produced_rank = rank;
    memset(buffer->produced_dims, 0, sizeof(buffer->produced_dims));
    if (rank != 0) {
        memcpy(buffer->produced_dims, record->dimensions, rank * sizeof(*record->dimensions));
    }
    return AEE_SUCCESS;
}

int qnn_model_execute(qnn_model *model, uint32_t graph_index, uint32_t *qnn_status) {
    qnn_graph *graph = graph_at(model, graph_index);
    if (graph == NULL) {
        return AEE_EBADPARM;
    }
    if (graph->inputs_set != all_inputs(graph)) {
        return AEE_ENOTINITIALIZED;
    }
    /* The graph may have written the records last time: point them at our buffers again. */
    for (uint32_t i = 0; i < graph->num_inputs; i++) {
        graph->input_tensors[i].clientBuf.data = graph->inputs[i].data;
        graph->input_tensors[i].clientBuf.dataSize = graph->inputs[i].bytes;
    }
    for (uint32_t i = 0; i < graph->num_outputs; i++) {
        graph->output_tensors[i].clientBuf.data = graph->outputs[i].data;
        graph->output_tensors[i].clientBuf.dataSize = graph->outputs[i].bytes;
        graph->output_tensors[i].rank = graph->outputs[i].declared_rank;
        graph->output_tensors[i].dimensions = graph->outputs[i].declared_dims;
        graph->outputs[i].produced = 0;
    }
    graph->outputs_valid = false;
    *qnn_status = QNN_SUCCESS;
    model->last_error[0] = '\0';

    Qnn_ErrorHandle_t error =
        model->interface->graphExecute(graph->handle, graph->input_tensors, graph->num_inputs,
                                       graph->output_tensors, graph->num_outputs);
    if (error != QNN_SUCCESS) {
        *qnn_status = qnn_code(error);
        /* The model library's own words went to its log; its caller gets QNN's. */
        (void)snprintf(model->last_error, sizeof(model->last_error),
                       "graphExecute of graph %u failed: QNN error %u", (unsigned)graph_index,
                       (unsigned)*qnn_status);
        return AEE_SUCCESS;
    }
    for (uint32_t i = 0; i < graph->num_outputs; i++) {
        const Qnn_ClientBuffer_t *written = &graph->output_tensors[i].clientBuf;
        /* An output may shrink (dynamic shapes), never move or grow past its buffer. */
        if (written->data != graph->outputs[i].data || written->dataSize > graph->outputs[i].bytes) {
            FARF(ERROR, "portal_qnn: graph %u moved or overgrew output %u", (unsigned)graph_index,
                 (unsigned)i);
            return AEE_EINVALIDFORMAT;
        }
        int rc = keep_produced_dims(&graph->output_tensors[i], &graph->outputs[i]);
        if (rc != AEE_SUCCESS) {
            FARF(ERROR, "portal_qnn: graph %u left output %u with dimensions past its buffer",
                 (unsigned)graph_index, (unsigned)i);
            return rc;
        }
        graph->outputs[i].produced = written->dataSize;
    }
    graph->outputs_valid = true;
    return AEE_SUCCESS;
}

int qnn_model_output_dims(const qnn_model *model, uint32_t graph_index, uint32_t *dims,
                          size_t capacity, uint32_t *num_outputs) {
    if (graph_index >= model->num_graphs || (capacity != 0 && dims == NULL)) {
        return AEE_EBADPARM;
    }
    const qnn_graph *graph = &model->graphs[graph_index];
    if (!graph->outputs_valid) {
        return AEE_ENOTINITIALIZED;
    }
    if (capacity < (size_t)graph->num_outputs * QNN_MODEL_DIMS_STRIDE) {
        return AEE_EBUFFERTOOSMALL;
    }
    memset(dims, 0, capacity * sizeof(*dims));
    for (uint32_t i = 0; i < graph->num_outputs; i++) {
        const qnn_buffer *buffer = &graph->outputs[i];
        uint32_t *entry = dims + (size_t)i * QNN_MODEL_DIMS_STRIDE;
        entry[0] = buffer->produced_rank;
        memcpy(entry + 1, buffer->produced_dims, buffer->produced_rank * sizeof(*entry));
    }
    *num_outputs = graph->num_outputs;
    return AEE_SUCCESS;
}

uint32_t qnn_model_num_outputs(const qnn_model *model, uint32_t graph_index) {
    return graph_index < model->num_graphs ? model->graphs[graph_index].num_outputs : 0;
}

int qnn_model_get_output(qnn_model *model, uint32_t graph_index, uint32_t tensor, uint8_t *out,
                         size_t capacity, uint32_t *produced) {
    qnn_graph *graph = graph_at(model, graph_index);
    if (graph == NULL || tensor >= graph->num_outputs || (capacity != 0 && out == NULL)) {
        return AEE_EBADPARM;
    }
    if (!graph->outputs_valid) {
        return AEE_ENOTINITIALIZED;
    }
    const qnn_buffer *buffer = &graph->outputs[tensor];
    if (capacity < buffer->produced) {
        return AEE_EBUFFERTOOSMALL;
    }
    if (buffer->produced != 0) {
        memcpy(out, buffer->data, buffer->produced);
    }
    /* The whole output buffer travels back to the client: no stale bytes in the tail. */
    if (capacity > buffer->produced) {
        memset(out + buffer->produced, 0, capacity - buffer->produced);
    }
    *produced = buffer->produced;
    return AEE_SUCCESS;
}

/* Bytes a tensor takes in an arena: its size rounded up to PORTAL_QNN_ARENA_ALIGN. */
static uint64_t arena_slot(uint32_t bytes) {
    return ((uint64_t)bytes + PORTAL_QNN_ARENA_ALIGN - 1u) / PORTAL_QNN_ARENA_ALIGN *
           PORTAL_QNN_ARENA_ALIGN;
}

/* The arena size of count tensors (at most 32 of 64 MiB each: no overflow in 64 bits). */
static uint64_t arena_size(const qnn_buffer *buffers, uint32_t count) {
    uint64_t size = 0;
    for (uint32_t i = 0; i < count; i++) {
        size += arena_slot(buffers[i].bytes);
    }
    return size;
}

int qnn_model_run(qnn_model *model, uint32_t graph_index, const uint8_t *inputs,
                  size_t input_length, uint8_t *outputs, size_t output_capacity,
                  uint32_t *qnn_status) {
    qnn_graph *graph = graph_at(model, graph_index);
    if (graph == NULL || (input_length != 0 && inputs == NULL) ||
        (output_capacity != 0 && outputs == NULL)) {
        return AEE_EBADPARM;
    }
    uint64_t in_size = arena_size(graph->inputs, graph->num_inputs);
    uint64_t out_size = arena_size(graph->outputs, graph->num_outputs);
    if ((uint64_t)input_length != in_size) {
        FARF(HIGH, "portal_qnn: run inputs arena is %u bytes, got %u", (unsigned)in_size,
             (unsigned)input_length);
        return AEE_EBADSIZE;
    }
    if ((uint64_t)output_capacity < out_size) {
        return AEE_EBUFFERTOOSMALL;
    }
    uint64_t offset = 0;
    for (uint32_t i = 0; i < graph->num_inputs; i++) {
        memcpy(graph->inputs[i].data, inputs + offset, graph->inputs[i].bytes);
        offset += arena_slot(graph->inputs[i].bytes);
    }
    graph->inputs_set = all_inputs(graph);
    int rc = qnn_model_execute(model, graph_index, qnn_status);
    if (rc != AEE_SUCCESS || *qnn_status != QNN_SUCCESS) {
        return rc;
    }
    offset = 0;
    for (uint32_t i = 0; i < graph->num_outputs; i++) {
        const qnn_buffer *buffer = &graph->outputs[i];
        uint64_t next = offset + arena_slot(buffer->bytes);
        if (buffer->produced != 0) {
            memcpy(outputs + offset, buffer->data, buffer->produced);
        }
        /* The tail of a shrunken output and the padding: no stale bytes reach the client. */
        memset(outputs + offset + buffer->produced, 0, (size_t)(next - offset - buffer->produced));
        offset = next;
    }
    if (output_capacity > offset) {
        memset(outputs + offset, 0, output_capacity - (size_t)offset);
    }
    return AEE_SUCCESS;
}

void qnn_copy_text(const char *kept, size_t kept_size, uint8_t *text, size_t capacity,
                   uint32_t *length) {
    size_t bytes = strnlen(kept, kept_size);
    size_t copied = bytes < capacity ? bytes : capacity;
    if (copied != 0) {
        memcpy(text, kept, copied);
    }
    if (capacity > copied) {
        memset(text + copied, 0, capacity - copied);
    }
    *length = (uint32_t)copied;
}

void qnn_model_last_error(const qnn_model *model, uint8_t *text, size_t capacity,
                          uint32_t *length) {
    qnn_copy_text(model->last_error, sizeof(model->last_error), text, capacity, length);
}

int qnn_model_graph_name(const qnn_model *model, uint32_t graph_index, uint8_t *name,
                         size_t capacity, uint32_t *length) {
    if (graph_index >= model->num_graphs) {
        return AEE_EBADPARM;
    }
    const qnn_graph *graph = &model->graphs[graph_index];
    qnn_copy_text(graph->name, sizeof(graph->name), name, capacity, length);
    return AEE_SUCCESS;
}

static void copy_specs(const qnn_buffer *buffers, uint32_t count, portal_qnn_tensor_spec *specs,
                       size_t capacity) {
    if (capacity != 0) {
        memset(specs, 0, capacity * sizeof(*specs));
    }
    for (uint32_t i = 0; i < count; i++) {
        specs[i] = buffers[i].spec;
    }
}

int qnn_model_describe(const qnn_model *model, uint32_t graph_index, portal_qnn_tensor_spec *inputs,
                       size_t input_capacity, portal_qnn_tensor_spec *outputs,
                       size_t output_capacity, uint32_t *num_inputs, uint32_t *num_outputs) {
    if (graph_index >= model->num_graphs || (input_capacity != 0 && inputs == NULL) ||
        (output_capacity != 0 && outputs == NULL)) {
        return AEE_EBADPARM;
    }
    const qnn_graph *graph = &model->graphs[graph_index];
    if (input_capacity < graph->num_inputs || output_capacity < graph->num_outputs) {
        return AEE_EBUFFERTOOSMALL;
    }
    copy_specs(graph->inputs, graph->num_inputs, inputs, input_capacity);
    copy_specs(graph->outputs, graph->num_outputs, outputs, output_capacity);
    *num_inputs = graph->num_inputs;
    *num_outputs = graph->num_outputs;
    return AEE_SUCCESS;
}
