/*
 * portal_qnn: the implementation of idl/portal_qnn.idl, built into
 * libportal_qnn_skel.so.
 *
 * Each open handle owns a slot table of PORTAL_QNN_MAX_MODELS models; a model
 * is composed either from a library (dlopen, QnnModel_composeGraphs and
 * QnnModel_freeGraphsInfo) or from functions registered in this process as a
 * builtin. The graphs run through the function table the model hands back
 * (include/qnn_min.h). Closing the handle unloads whatever is still loaded.
 *
 * Result codes (the IDL documents them per method):
 *   AEE_EBADPARM         NULL or out-of-range argument (model_index >= 4,
 *                        graph_index >= the model's graph count, tensor index
 *                        >= the graph's tensor count, bad model_uri)
 *   AEE_EINVHANDLE       the handle is not open
 *   AEE_EBADSTATE        the model slot is empty (never loaded, or unloaded)
 *   AEE_EOUTOFHANDLES    all model slots are in use
 *   AEE_EBADSIZE         set_input data is not exactly the tensor's size
 *   AEE_ENOTINITIALIZED  execute before every input was set; get_output
 *                        before a successful execute
 *   AEE_EBUFFERTOOSMALL  get_output capacity below the output's size; graph_info
 *                        capacity below the graph's tensor count
 *   AEE_EUNABLETOLOAD / AEE_ENOSUCHSYMBOL / AEE_ERESOURCENOTFOUND
 *                        library not loadable / entry point missing /
 *                        no such builtin
 *   AEE_EINVALIDFORMAT / AEE_ENOMEMORY   see qnn_model_load
 *   AEE_SUCCESS with qnn_status != 0     the model library (QNN) failed
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "AEEStdErr.h"
#include "HAP_farf.h"
#include "portal_qnn.h"
#include "portal_qnn_api.h"
#include "qnn_model.h"
#include "skel_export.h"
#include "skel_handles.h"

_Static_assert(sizeof(unsigned int) == sizeof(uint32_t), "IDL unsigned long is a 32-bit C int");

typedef struct {
    skel_object base; /* first: the registry stores &base */
    qnn_model models[PORTAL_QNN_MAX_MODELS];
    /* Why the handle's last model_load failed, NUL-terminated; "" after a success. */
    char load_error[PORTAL_QNN_MAX_ERROR_BYTES];
} portal_context;

static skel_registry g_portal_handles = SKEL_REGISTRY_INIT;

/* ---- builtin models: function pointers registered by code in this process ---- */

typedef struct {
    char name[PORTAL_QNN_MAX_BUILTIN_NAME + 1];
    QnnModel_ComposeGraphsFn_t compose;
    QnnModel_FreeGraphsInfoFn_t free_graphs;
} builtin_model;

static struct {
    pthread_mutex_t lock;
    builtin_model entries[PORTAL_QNN_MAX_BUILTINS];
    uint32_t count;
} g_builtins = {.lock = PTHREAD_MUTEX_INITIALIZER};

static bool builtin_name_valid(const char *name) {
    if (name == NULL) {
        return false;
    }
    size_t length = strnlen(name, PORTAL_QNN_MAX_BUILTIN_NAME + 1);
    if (length == 0 || length > PORTAL_QNN_MAX_BUILTIN_NAME) {
        return false;
    }
    for (size_t i = 0; i < length; i++) {
        char c = name[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '.' || c == '-';
        if (!ok) {
            return false;
        }
    }
    return true;
}

/* The registered entry for name, or NULL; the builtin lock must be held. */
static const builtin_model *find_builtin_locked(const char *name) {
    for (uint32_t i = 0; i < g_builtins.count; i++) {
        if (strcmp(g_builtins.entries[i].name, name) == 0) {
            return &g_builtins.entries[i];
        }
    }
    return NULL;
}

SKEL_EXPORT int portal_qnn_register_builtin(const char *name, QnnModel_ComposeGraphsFn_t compose,
                                            QnnModel_FreeGraphsInfoFn_t free_graphs) {
    if (!builtin_name_valid(name) || compose == NULL || free_graphs == NULL) {
        return AEE_EBADPARM;
    }
    int rc = AEE_SUCCESS;
    (void)pthread_mutex_lock(&g_builtins.lock);
    if (find_builtin_locked(name) != NULL) {
        rc = AEE_EALREADYLOADED;
    } else if (g_builtins.count == PORTAL_QNN_MAX_BUILTINS) {
        rc = AEE_EOUTOFHANDLES;
    } else {
        builtin_model *entry = &g_builtins.entries[g_builtins.count];
        /* builtin_name_valid bounded the length, so this copies the NUL too. */
        memcpy(entry->name, name, strlen(name) + 1);
        entry->compose = compose;
        entry->free_graphs = free_graphs;
        g_builtins.count++;
    }
    (void)pthread_mutex_unlock(&g_builtins.lock);
    return rc;
}

static int lookup_builtin(const char *name, QnnModel_ComposeGraphsFn_t *compose,
                          QnnModel_FreeGraphsInfoFn_t *free_graphs) {
    int rc = AEE_ERESOURCENOTFOUND;
    (void)pthread_mutex_lock(&g_builtins.lock);
    const builtin_model *entry = find_builtin_locked(name);
    if (entry != NULL) {
        *compose = entry->compose;
        *free_graphs = entry->free_graphs;
        rc = AEE_SUCCESS;
    }
    (void)pthread_mutex_unlock(&g_builtins.lock);
    return rc;
}

/* ---- open / close ---- */

SKEL_EXPORT int portal_qnn_open(const char *uri, remote_handle64 *h) {
    if (uri == NULL || h == NULL) {
        return AEE_EBADPARM;
    }
    int rc = skel_registry_open(&g_portal_handles, sizeof(portal_context), NULL, h);
    if (rc != AEE_SUCCESS) {
        return rc;
    }
    FARF(MEDIUM, "portal_qnn: opened %s", uri);
    return AEE_SUCCESS;
}

SKEL_EXPORT int portal_qnn_close(remote_handle64 h) {
    skel_object *object = skel_registry_remove(&g_portal_handles, h);
    if (object == NULL) {
        return AEE_EINVHANDLE;
    }
    portal_context *context = (portal_context *)object;
    for (uint32_t i = 0; i < PORTAL_QNN_MAX_MODELS; i++) {
        if (context->models[i].loaded) {
            qnn_model_unload(&context->models[i]);
        }
    }
    skel_object_destroy(object);
    free(context);
    return AEE_SUCCESS;
}

/* ---- model slots ---- */

static portal_context *acquire(remote_handle64 h) {
    return (portal_context *)skel_registry_acquire(&g_portal_handles, h);
}

static void release(portal_context *context) {
    skel_registry_release(&g_portal_handles, &context->base);
}

/* The loaded model at index, or NULL with *rc saying why. */
static qnn_model *loaded_model(portal_context *context, unsigned int index, int *rc) {
    if (index >= PORTAL_QNN_MAX_MODELS) {
        *rc = AEE_EBADPARM;
        return NULL;
    }
    if (!context->models[index].loaded) {
        *rc = AEE_EBADSTATE;
        return NULL;
    }
    return &context->models[index];
}

static int free_slot(const portal_context *context, uint32_t *slot) {
    for (uint32_t i = 0; i < PORTAL_QNN_MAX_MODELS; i++) {
        if (!context->models[i].loaded) {
            *slot = i;
            return AEE_SUCCESS;
        }
    }
    return AEE_EOUTOFHANDLES;
}

/* Load into slot and report the result in the IDL's rout values. */
static int load_into(portal_context *context, uint32_t slot, void *library,
                     QnnModel_ComposeGraphsFn_t compose, QnnModel_FreeGraphsInfoFn_t free_graphs,
                     unsigned int *model_index, unsigned int *num_graphs,
                     unsigned int *qnn_status) {
    qnn_model *model = &context->models[slot];
    uint32_t status = QNN_SUCCESS;
    int rc = qnn_model_load(model, library, compose, free_graphs, &status);
    *qnn_status = status;
    if (rc == AEE_SUCCESS && model->loaded) {
        *model_index = slot;
        *num_graphs = model->num_graphs;
    }
    return rc;
}

/* Keep why a model_load failed (its AEE code or QNN error), or forget it after a success. */
static void record_load(portal_context *context, int rc, unsigned int qnn_status) {
    if (rc != AEE_SUCCESS) {
        (void)snprintf(context->load_error, sizeof(context->load_error),
                       "model_load refused: AEE error 0x%08x", (unsigned)rc);
    } else if (qnn_status != QNN_SUCCESS) {
        (void)snprintf(context->load_error, sizeof(context->load_error),
                       "composing or finalizing the model failed: QNN error %u", qnn_status);
    } else {
        context->load_error[0] = '\0';
    }
}

static bool starts_with(const char *text, const char *prefix) {
    return strncmp(text, prefix, strlen(prefix)) == 0;
}

SKEL_EXPORT int portal_qnn_model_load(remote_handle64 _h, const char *model_uri,
                                      unsigned int *model_index, unsigned int *num_graphs,
                                      unsigned int *qnn_status) {
    if (model_uri == NULL || model_index == NULL || num_graphs == NULL || qnn_status == NULL) {
        return AEE_EBADPARM;
    }
    size_t length = strnlen(model_uri, PORTAL_QNN_MAX_URI_BYTES);
    if (length == 0 || length == PORTAL_QNN_MAX_URI_BYTES) {
        return AEE_EBADPARM;
    }
    *model_index = PORTAL_QNN_NO_MODEL;
    *num_graphs = 0;
    *qnn_status = QNN_SUCCESS;
    portal_context *context = acquire(_h);
    if (context == NULL) {
        return AEE_EINVHANDLE;
    }
    uint32_t slot = 0;
    void *library = NULL;
    QnnModel_ComposeGraphsFn_t compose = NULL;
    QnnModel_FreeGraphsInfoFn_t free_graphs = NULL;
    /* The free slot is found before any library is opened: a full table runs no model code. */
    int rc = free_slot(context, &slot);
    if (rc == AEE_SUCCESS) {
        if (starts_with(model_uri, PORTAL_QNN_BUILTIN_PREFIX)) {
            rc = lookup_builtin(model_uri + strlen(PORTAL_QNN_BUILTIN_PREFIX), &compose,
                                &free_graphs);
        } else {
            rc = qnn_model_open_library(model_uri, &library, &compose, &free_graphs);
        }
    }
    if (rc == AEE_SUCCESS) {
        rc = load_into(context, slot, library, compose, free_graphs, model_index, num_graphs,
                       qnn_status);
    }
    record_load(context, rc, *qnn_status);
    release(context);
    return rc;
}

SKEL_EXPORT int portal_qnn_model_load_functions(remote_handle64 h,
                                                QnnModel_ComposeGraphsFn_t compose,
                                                QnnModel_FreeGraphsInfoFn_t free_graphs,
                                                unsigned int *model_index,
                                                unsigned int *num_graphs,
                                                unsigned int *qnn_status) {
    if (compose == NULL || free_graphs == NULL || model_index == NULL || num_graphs == NULL ||
        qnn_status == NULL) {
        return AEE_EBADPARM;
    }
    *model_index = PORTAL_QNN_NO_MODEL;
    *num_graphs = 0;
    *qnn_status = QNN_SUCCESS;
    portal_context *context = acquire(h);
    if (context == NULL) {
        return AEE_EINVHANDLE;
    }
    uint32_t slot = 0;
    int rc = free_slot(context, &slot);
    if (rc == AEE_SUCCESS) {
        rc = load_into(context, slot, NULL, compose, free_graphs, model_index, num_graphs,
                       qnn_status);
    }
    record_load(context, rc, *qnn_status);
    release(context);
    return rc;
}

SKEL_EXPORT int portal_qnn_set_input(remote_handle64 _h, unsigned int model_index,
                                     unsigned int graph_index, unsigned int tensor_index,
                                     const unsigned char *data, int dataLen) {
    if (dataLen < 0) {
        return AEE_EBADPARM;
    }
    portal_context *context = acquire(_h);
    if (context == NULL) {
        return AEE_EINVHANDLE;
    }
    int rc = AEE_SUCCESS;
    qnn_model *model = loaded_model(context, model_index, &rc);
    if (model != NULL) {
        rc = qnn_model_set_input(model, graph_index, tensor_index, data, (size_t)dataLen);
    }
    release(context);
    return rc;
}

SKEL_EXPORT int portal_qnn_execute(remote_handle64 _h, unsigned int model_index,
                                   unsigned int graph_index, unsigned int *qnn_status) {
    if (qnn_status == NULL) {
        return AEE_EBADPARM;
    }
    portal_context *context = acquire(_h);
    if (context == NULL) {
        return AEE_EINVHANDLE;
    }
    int rc = AEE_SUCCESS;
    qnn_model *model = loaded_model(context, model_index, &rc);
    if (model != NULL) {
        uint32_t status = QNN_SUCCESS;
        rc = qnn_model_execute(model, graph_index, &status);
        *qnn_status = status;
    }
    release(context);
    return rc;
}

SKEL_EXPORT int portal_qnn_get_output(remote_handle64 _h, unsigned int model_index,
                                      unsigned int graph_index, unsigned int tensor_index,
                                      unsigned char *data, int dataLen, unsigned int *data_len) {
    if (dataLen < 0 || data_len == NULL) {
        return AEE_EBADPARM;
    }
    portal_context *context = acquire(_h);
    if (context == NULL) {
        return AEE_EINVHANDLE;
    }
    int rc = AEE_SUCCESS;
    qnn_model *model = loaded_model(context, model_index, &rc);
    if (model != NULL) {
        uint32_t produced = 0;
        rc = qnn_model_get_output(model, graph_index, tensor_index, data, (size_t)dataLen,
                                  &produced);
        *data_len = produced;
    }
    release(context);
    return rc;
}

SKEL_EXPORT int portal_qnn_model_unload(remote_handle64 _h, unsigned int model_index) {
    portal_context *context = acquire(_h);
    if (context == NULL) {
        return AEE_EINVHANDLE;
    }
    int rc = AEE_SUCCESS;
    qnn_model *model = loaded_model(context, model_index, &rc);
    if (model != NULL) {
        qnn_model_unload(model);
    }
    release(context);
    return rc;
}

SKEL_EXPORT int portal_qnn_graph_info(remote_handle64 _h, unsigned int model_index,
                                      unsigned int graph_index, portal_qnn_tensor_spec *inputs,
                                      int inputsLen, portal_qnn_tensor_spec *outputs,
                                      int outputsLen, unsigned int *num_inputs,
                                      unsigned int *num_outputs) {
    if (inputsLen < 0 || outputsLen < 0 || num_inputs == NULL || num_outputs == NULL) {
        return AEE_EBADPARM;
    }
    portal_context *context = acquire(_h);
    if (context == NULL) {
        return AEE_EINVHANDLE;
    }
    int rc = AEE_SUCCESS;
    const qnn_model *model = loaded_model(context, model_index, &rc);
    if (model != NULL) {
        uint32_t inputs_found = 0;
        uint32_t outputs_found = 0;
        rc = qnn_model_describe(model, graph_index, inputs, (size_t)inputsLen, outputs,
                                (size_t)outputsLen, &inputs_found, &outputs_found);
        if (rc == AEE_SUCCESS) {
            *num_inputs = inputs_found;
            *num_outputs = outputs_found;
        }
    }
    release(context);
    return rc;
}

SKEL_EXPORT int portal_qnn_last_error(remote_handle64 _h, unsigned int model_index,
                                      unsigned char *text, int textLen, unsigned int *text_len) {
    if (textLen < 0 || (textLen != 0 && text == NULL) || text_len == NULL) {
        return AEE_EBADPARM;
    }
    portal_context *context = acquire(_h);
    if (context == NULL) {
        return AEE_EINVHANDLE;
    }
    int rc = AEE_SUCCESS;
    uint32_t copied = 0;
    if (model_index == PORTAL_QNN_NO_MODEL) {
        qnn_copy_text(context->load_error, sizeof(context->load_error), text, (size_t)textLen,
                      &copied);
        *text_len = copied;
    } else {
        const qnn_model *model = loaded_model(context, model_index, &rc);
        if (model != NULL) {
            qnn_model_last_error(model, text, (size_t)textLen, &copied);
            *text_len = copied;
        }
    }
    release(context);
    return rc;
}

SKEL_EXPORT int portal_qnn_graph_name(remote_handle64 _h, unsigned int model_index,
                                      unsigned int graph_index, unsigned char *name, int nameLen,
                                      unsigned int *name_len) {
    if (nameLen < 0 || (nameLen != 0 && name == NULL) || name_len == NULL) {
        return AEE_EBADPARM;
    }
    portal_context *context = acquire(_h);
    if (context == NULL) {
        return AEE_EINVHANDLE;
    }
    int rc = AEE_SUCCESS;
    const qnn_model *model = loaded_model(context, model_index, &rc);
    if (model != NULL) {
        uint32_t copied = 0;
        rc = qnn_model_graph_name(model, graph_index, name, (size_t)nameLen, &copied);
        if (rc == AEE_SUCCESS) {
            *name_len = copied;
        }
    }
    release(context);
    return rc;
}

SKEL_EXPORT int portal_qnn_run(remote_handle64 _h, unsigned int model_index,
                               unsigned int graph_index, const unsigned char *inputs,
                               int inputsLen, unsigned char *outputs, int outputsLen,
                               unsigned int *qnn_status) {
    if (inputsLen < 0 || outputsLen < 0 || qnn_status == NULL) {
        return AEE_EBADPARM;
    }
    portal_context *context = acquire(_h);
    if (context == NULL) {
        return AEE_EINVHANDLE;
    }
    int rc = AEE_SUCCESS;
    qnn_model *model = loaded_model(context, model_index, &rc);
    if (model != NULL) {
        uint32_t status = QNN_SUCCESS;
        rc = qnn_model_run(model, graph_index, inputs, (size_t)inputsLen, outputs,
                           (size_t)outputsLen, &status);
        *qnn_status = status;
    }
    release(context);
    return rc;
}

SKEL_EXPORT int portal_qnn_output_dims(remote_handle64 _h, unsigned int model_index,
                                       unsigned int graph_index, unsigned int *dims,
                                       int dimsLen, unsigned int *num_outputs) {
    if (dimsLen < 0 || (dimsLen != 0 && dims == NULL) || num_outputs == NULL) {
        return AEE_EBADPARM;
    }
    portal_context *context = acquire(_h);
    if (context == NULL) {
        return AEE_EINVHANDLE;
    }
    int rc = AEE_SUCCESS;
    const qnn_model *model = loaded_model(context, model_index, &rc);
    if (model != NULL) {
        uint32_t count = 0;
        rc = qnn_model_output_dims(model, graph_index, dims, (size_t)dimsLen, &count);
        if (rc == AEE_SUCCESS) {
            *num_outputs = count;
        }
    }
    release(context);
    return rc;
}

SKEL_EXPORT int portal_qnn_run_dims(remote_handle64 _h, unsigned int model_index,
                                    unsigned int graph_index, const unsigned char *inputs,
                                    int inputsLen, unsigned char *outputs, int outputsLen,
                                    unsigned int *dims, int dimsLen, unsigned int *qnn_status,
                                    unsigned int *num_outputs) {
    if (inputsLen < 0 || outputsLen < 0 || dimsLen < 0 || (dimsLen != 0 && dims == NULL) ||
        qnn_status == NULL || num_outputs == NULL) {
        return AEE_EBADPARM;
    }
    portal_context *context = acquire(_h);
    if (context == NULL) {
        return AEE_EINVHANDLE;
    }
    int rc = AEE_SUCCESS;
    qnn_model *model = loaded_model(context, model_index, &rc);
    if (model != NULL) {
        uint32_t outputs_count = qnn_model_num_outputs(model, graph_index);
        /* Every check before the graph runs: a dims buffer too small changes nothing. */
        if (outputs_count != 0 &&
            (size_t)dimsLen < (size_t)outputs_count * QNN_MODEL_DIMS_STRIDE) {
            rc = AEE_EBUFFERTOOSMALL;
        } else {
            uint32_t status = QNN_SUCCESS;
            uint32_t count = 0;
            rc = qnn_model_run(model, graph_index, inputs, (size_t)inputsLen, outputs,
                               (size_t)outputsLen, &status);
            if (rc == AEE_SUCCESS && status == QNN_SUCCESS) {
                rc = qnn_model_output_dims(model, graph_index, dims, (size_t)dimsLen, &count);
            } else if (rc == AEE_SUCCESS && dimsLen != 0) {
                memset(dims, 0, (size_t)dimsLen * sizeof(*dims));
            }
            *qnn_status = status;
            *num_outputs = count;
        }
    }
    release(context);
    return rc;
}
