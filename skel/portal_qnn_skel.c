/*
 * portal_qnn_skel_handle_invoke: the hand-written unmarshalling of
 * idl/portal_qnn.idl (qaic generates it on the Hexagon build).
 *
 * Layouts (qaic rules, shared/reference/fastrpc-abi.md 5.4; every scalar u32):
 *
 *   0 open          0x00020001  see skel_invoke_open
 *   1 close         0x01000010  see skel_invoke_close
 *   2 model_load    0x02020100  primIn {len(model_uri) with NUL}, model_uri,
 *                               primROut {model_index, num_graphs, qnn_status}
 *   3 set_input     0x03020000  primIn {model_index, graph_index, tensor_index, len(data)}, data
 *   4 execute       0x04010100  primIn {model_index, graph_index}, primROut {qnn_status}
 *   5 get_output    0x05010200  primIn {model_index, graph_index, tensor_index, capacity(data)},
 *                               primROut {data_len}, data
 *   6 model_unload  0x06010000  primIn {model_index}
 *   7 graph_info    0x07010300  primIn {model_index, graph_index, capacity(inputs),
 *                               capacity(outputs)} (capacities in records),
 *                               primROut {num_inputs, num_outputs}, inputs, outputs
 *   8 run           0x08020200  primIn {model_index, graph_index, len(inputs), capacity(outputs)},
 *                               inputs, primROut {qnn_status}, outputs
 *   9 last_error    0x09010200  primIn {model_index, capacity(text)}, primROut {text_len}, text
 *  10 graph_name    0x0A010200  primIn {model_index, graph_index, capacity(name)},
 *                               primROut {name_len}, name
 *  11 output_dims   0x0B010200  primIn {model_index, graph_index, capacity(dims)} (in u32s),
 *                               primROut {num_outputs}, dims
 *  12 model_ref, 13 chain: not in this skel (AEE_EUNSUPPORTED: npud runs a chain's steps
 *                   one by one)
 *  14 run_dims      0x0E020300  primIn {model_index, graph_index, len(inputs), capacity(outputs),
 *                               capacity(dims)}, inputs, primROut {qnn_status, num_outputs},
 *                               outputs, dims
 *
 * Every buffer is checked before the implementation runs, so a badly
 * marshalled call never has a side effect. Wrong counts or lengths:
 * AEE_EBADPARM; any other method: AEE_EUNSUPPORTED. rout values are written
 * only on AEE_SUCCESS (the kernel copies outputs back only then).
 */
#include <stdint.h>

#include "AEEStdErr.h"
#include "portal_qnn.h"
#include "remote.h"
#include "skel_marshal.h"

SKEL_EXPORT int portal_qnn_skel_handle_invoke(remote_handle64 h, uint32_t sc, remote_arg *pra);

static int invoke_model_load(remote_handle64 h, uint32_t sc, remote_arg *pra) {
    uint32_t uri_length = 0;
    const char *uri = NULL;
    int rc = skel_check_counts(sc, pra, 2, 1, 0, 0);
    if (rc == AEE_SUCCESS) {
        rc = skel_read_u32s(&pra[0], &uri_length, 1);
    }
    if (rc == AEE_SUCCESS) {
        rc = skel_read_string(&pra[1], uri_length, &uri);
    }
    if (rc == AEE_SUCCESS) {
        rc = skel_check_u32s_room(&pra[2], 3);
    }
    if (rc != AEE_SUCCESS) {
        return rc;
    }
    unsigned int model_index = 0;
    unsigned int num_graphs = 0;
    unsigned int qnn_status = 0;
    rc = portal_qnn_model_load(h, uri, &model_index, &num_graphs, &qnn_status);
    if (rc == AEE_SUCCESS) {
        const uint32_t prim_rout[3] = {model_index, num_graphs, qnn_status};
        rc = skel_write_u32s(&pra[2], prim_rout, 3);
    }
    return rc;
}

static int invoke_set_input(remote_handle64 h, uint32_t sc, remote_arg *pra) {
    uint32_t prim_in[4] = {0, 0, 0, 0};
    int rc = skel_check_counts(sc, pra, 2, 0, 0, 0);
    if (rc == AEE_SUCCESS) {
        rc = skel_read_u32s(&pra[0], prim_in, 4);
    }
    if (rc == AEE_SUCCESS) {
        rc = skel_check_sequence(&pra[1], prim_in[3]);
    }
    if (rc != AEE_SUCCESS) {
        return rc;
    }
    return portal_qnn_set_input(h, prim_in[0], prim_in[1], prim_in[2],
                                (const unsigned char *)pra[1].buf.pv, (int)prim_in[3]);
}

static int invoke_execute(remote_handle64 h, uint32_t sc, remote_arg *pra) {
    uint32_t prim_in[2] = {0, 0};
    int rc = skel_check_counts(sc, pra, 1, 1, 0, 0);
    if (rc == AEE_SUCCESS) {
        rc = skel_read_u32s(&pra[0], prim_in, 2);
    }
    if (rc == AEE_SUCCESS) {
        rc = skel_check_u32s_room(&pra[1], 1);
    }
    if (rc != AEE_SUCCESS) {
        return rc;
    }
    unsigned int qnn_status = 0;
    rc = portal_qnn_execute(h, prim_in[0], prim_in[1], &qnn_status);
    if (rc == AEE_SUCCESS) {
        const uint32_t prim_rout[1] = {qnn_status};
        rc = skel_write_u32s(&pra[1], prim_rout, 1);
    }
    return rc;
}

static int invoke_get_output(remote_handle64 h, uint32_t sc, remote_arg *pra) {
    uint32_t prim_in[4] = {0, 0, 0, 0};
    int rc = skel_check_counts(sc, pra, 1, 2, 0, 0);
    if (rc == AEE_SUCCESS) {
        rc = skel_read_u32s(&pra[0], prim_in, 4);
    }
    if (rc == AEE_SUCCESS) {
        rc = skel_check_u32s_room(&pra[1], 1);
    }
    if (rc == AEE_SUCCESS) {
        rc = skel_check_sequence(&pra[2], prim_in[3]);
    }
    if (rc != AEE_SUCCESS) {
        return rc;
    }
    unsigned int data_len = 0;
    rc = portal_qnn_get_output(h, prim_in[0], prim_in[1], prim_in[2],
                               (unsigned char *)pra[2].buf.pv, (int)prim_in[3], &data_len);
    if (rc == AEE_SUCCESS) {
        const uint32_t prim_rout[1] = {data_len};
        rc = skel_write_u32s(&pra[1], prim_rout, 1);
    }
    return rc;
}

static int invoke_model_unload(remote_handle64 h, uint32_t sc, remote_arg *pra) {
    uint32_t model_index = 0;
    int rc = skel_check_counts(sc, pra, 1, 0, 0, 0);
    if (rc == AEE_SUCCESS) {
        rc = skel_read_u32s(&pra[0], &model_index, 1);
    }
    if (rc != AEE_SUCCESS) {
        return rc;
    }
    return portal_qnn_model_unload(h, model_index);
}

static int invoke_graph_info(remote_handle64 h, uint32_t sc, remote_arg *pra) {
    uint32_t prim_in[4] = {0, 0, 0, 0};
    int rc = skel_check_counts(sc, pra, 1, 3, 0, 0);
    if (rc == AEE_SUCCESS) {
        rc = skel_read_u32s(&pra[0], prim_in, 4);
    }
    if (rc == AEE_SUCCESS) {
        rc = skel_check_u32s_room(&pra[1], 2);
    }
    if (rc == AEE_SUCCESS) {
        rc = skel_check_records(&pra[2], prim_in[2], sizeof(portal_qnn_tensor_spec));
    }
    if (rc == AEE_SUCCESS) {
        rc = skel_check_records(&pra[3], prim_in[3], sizeof(portal_qnn_tensor_spec));
    }
    if (rc != AEE_SUCCESS) {
        return rc;
    }
    unsigned int num_inputs = 0;
    unsigned int num_outputs = 0;
    rc = portal_qnn_graph_info(h, prim_in[0], prim_in[1], (portal_qnn_tensor_spec *)pra[2].buf.pv,
                               (int)prim_in[2], (portal_qnn_tensor_spec *)pra[3].buf.pv,
                               (int)prim_in[3], &num_inputs, &num_outputs);
    if (rc == AEE_SUCCESS) {
        const uint32_t prim_rout[2] = {num_inputs, num_outputs};
        rc = skel_write_u32s(&pra[1], prim_rout, 2);
    }
    return rc;
}

static int invoke_run(remote_handle64 h, uint32_t sc, remote_arg *pra) {
    uint32_t prim_in[4] = {0, 0, 0, 0};
    int rc = skel_check_counts(sc, pra, 2, 2, 0, 0);
    if (rc == AEE_SUCCESS) {
        rc = skel_read_u32s(&pra[0], prim_in, 4);
    }
    if (rc == AEE_SUCCESS) {
        rc = skel_check_sequence(&pra[1], prim_in[2]);
    }
    if (rc == AEE_SUCCESS) {
        rc = skel_check_u32s_room(&pra[2], 1);
    }
    if (rc == AEE_SUCCESS) {
        rc = skel_check_sequence(&pra[3], prim_in[3]);
    }
    if (rc != AEE_SUCCESS) {
        return rc;
    }
    unsigned int qnn_status = 0;
    rc = portal_qnn_run(h, prim_in[0], prim_in[1], (const unsigned char *)pra[1].buf.pv,
                        (int)prim_in[2], (unsigned char *)pra[3].buf.pv, (int)prim_in[3],
                        &qnn_status);
    if (rc == AEE_SUCCESS) {
        const uint32_t prim_rout[1] = {qnn_status};
        rc = skel_write_u32s(&pra[2], prim_rout, 1);
    }
    return rc;
}

static int invoke_last_error(remote_handle64 h, uint32_t sc, remote_arg *pra) {
    uint32_t prim_in[2] = {0, 0};
    int rc = skel_check_counts(sc, pra, 1, 2, 0, 0);
    if (rc == AEE_SUCCESS) {
        rc = skel_read_u32s(&pra[0], prim_in, 2);
    }
    if (rc == AEE_SUCCESS) {
        rc = skel_check_u32s_room(&pra[1], 1);
    }
    if (rc == AEE_SUCCESS) {
        rc = skel_check_sequence(&pra[2], prim_in[1]);
    }
    if (rc != AEE_SUCCESS) {
        return rc;
    }
    unsigned int text_len = 0;
    rc = portal_qnn_last_error(h, prim_in[0], (unsigned char *)pra[2].buf.pv, (int)prim_in[1],
                               &text_len);
    if (rc == AEE_SUCCESS) {
        const uint32_t prim_rout[1] = {text_len};
        rc = skel_write_u32s(&pra[1], prim_rout, 1);
    }
    return rc;
}

static int invoke_graph_name(remote_handle64 h, uint32_t sc, remote_arg *pra) {
    uint32_t prim_in[3] = {0, 0, 0};
    int rc = skel_check_counts(sc, pra, 1, 2, 0, 0);
    if (rc == AEE_SUCCESS) {
        rc = skel_read_u32s(&pra[0], prim_in, 3);
    }
    if (rc == AEE_SUCCESS) {
        rc = skel_check_u32s_room(&pra[1], 1);
    }
    if (rc == AEE_SUCCESS) {
        rc = skel_check_sequence(&pra[2], prim_in[2]);
    }
    if (rc != AEE_SUCCESS) {
        return rc;
    }
    unsigned int name_len = 0;
    rc = portal_qnn_graph_name(h, prim_in[0], prim_in[1], (unsigned char *)pra[2].buf.pv,
                               (int)prim_in[2], &name_len);
    if (rc == AEE_SUCCESS) {
        const uint32_t prim_rout[1] = {name_len};
        rc = skel_write_u32s(&pra[1], prim_rout, 1);
    }
    return rc;
}

static int invoke_output_dims(remote_handle64 h, uint32_t sc, remote_arg *pra) {
    uint32_t prim_in[3] = {0, 0, 0};
    int rc = skel_check_counts(sc, pra, 1, 2, 0, 0);
    if (rc == AEE_SUCCESS) {
        rc = skel_read_u32s(&pra[0], prim_in, 3);
    }
    if (rc == AEE_SUCCESS) {
        rc = skel_check_u32s_room(&pra[1], 1);
    }
    if (rc == AEE_SUCCESS) {
        rc = skel_check_records(&pra[2], prim_in[2], sizeof(uint32_t));
    }
    if (rc != AEE_SUCCESS) {
        return rc;
    }
    unsigned int num_outputs = 0;
    rc = portal_qnn_output_dims(h, prim_in[0], prim_in[1], (unsigned int *)pra[2].buf.pv,
                                (int)prim_in[2], &num_outputs);
    if (rc == AEE_SUCCESS) {
        const uint32_t prim_rout[1] = {num_outputs};
        rc = skel_write_u32s(&pra[1], prim_rout, 1);
    }
    return rc;
}

static int invoke_run_dims(remote_handle64 h, uint32_t sc, remote_arg *pra) {
    uint32_t prim_in[5] = {0, 0, 0, 0, 0};
    int rc = skel_check_counts(sc, pra, 2, 3, 0, 0);
    if (rc == AEE_SUCCESS) {
        rc = skel_read_u32s(&pra[0], prim_in, 5);
    }
    if (rc == AEE_SUCCESS) {
        rc = skel_check_sequence(&pra[1], prim_in[2]);
    }
    if (rc == AEE_SUCCESS) {
        rc = skel_check_u32s_room(&pra[2], 2);
    }
    if (rc == AEE_SUCCESS) {
        rc = skel_check_sequence(&pra[3], prim_in[3]);
    }
    if (rc == AEE_SUCCESS) {
        rc = skel_check_records(&pra[4], prim_in[4], sizeof(uint32_t));
    }
    if (rc != AEE_SUCCESS) {
        return rc;
    }
    unsigned int qnn_status = 0;
    unsigned int num_outputs = 0;
    rc = portal_qnn_run_dims(h, prim_in[0], prim_in[1], (const unsigned char *)pra[1].buf.pv,
                             (int)prim_in[2], (unsigned char *)pra[3].buf.pv, (int)prim_in[3],
                             (unsigned int *)pra[4].buf.pv, (int)prim_in[4], &qnn_status,
                             &num_outputs);
    if (rc == AEE_SUCCESS) {
        const uint32_t prim_rout[2] = {qnn_status, num_outputs};
        rc = skel_write_u32s(&pra[2], prim_rout, 2);
    }
    return rc;
}

int portal_qnn_skel_handle_invoke(remote_handle64 h, uint32_t sc, remote_arg *pra) {
    switch (REMOTE_SCALARS_METHOD(sc)) {
    case 0:
        return skel_invoke_open(portal_qnn_open, sc, pra);
    case 1:
        return skel_invoke_close(portal_qnn_close, sc, pra);
    case 2:
        return invoke_model_load(h, sc, pra);
    case 3:
        return invoke_set_input(h, sc, pra);
    case 4:
        return invoke_execute(h, sc, pra);
    case 5:
        return invoke_get_output(h, sc, pra);
    case 6:
        return invoke_model_unload(h, sc, pra);
    case 7:
        return invoke_graph_info(h, sc, pra);
    case 8:
        return invoke_run(h, sc, pra);
    case 9:
        return invoke_last_error(h, sc, pra);
    case 10:
        return invoke_graph_name(h, sc, pra);
    case 11:
        return invoke_output_dims(h, sc, pra);
    case 14:
        return invoke_run_dims(h, sc, pra);
    default:
        return AEE_EUNSUPPORTED;
    }
}
