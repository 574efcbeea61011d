/*
 * controls.c -- what a program asks of the library rather than of the DSP:
 * remote_handle_control and remote_handle64_control (latency, the DSP's
 * attributes from the Welcome, the domain), remote_session_control (unsigned
 * modules, effective domain ids, a module's URI), and the names of libcdsprpc's
 * domains.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdio.h>
#include <string.h>

#include "AEEStdErr.h"
#include "conn.h"
#include "handles.h"
#include "remote.h"
#include "shim.h"

static const char *const DOMAIN_NAMES[] = {"adsp", "mdsp", "sdsp", "cdsp", "cdsp1", "gdsp0",
                                           "gdsp1"};

static int dsp_info(struct remote_dsp_capability *cap, uint32_t len) {
    if (cap == NULL || len < sizeof(*cap)) {
        return AEE_EBADPARM;
    }
    if (cap->domain >= NUM_DOMAINS * NUM_SESSIONS) {
        return AEE_EBADPARM;
    }
    if (cap->attribute_ID >= 260) { /* libcdsprpc's FASTRPC_MAX_ATTRIBUTES */
        return AEE_EBADPARM;
    }
    cap->capability = 0;
    if (cap->domain % NUM_DOMAINS != CDSP_DOMAIN_ID) {
        /* npud brokers the CDSP alone: any other DSP is absent here */
        return cap->attribute_ID == DOMAIN_SUPPORT ? 0 : AEE_EUNSUPPORTED;
    }
    struct conn *c;
    int rc = conn_get(&c);
    if (rc != 0) {
        return cap->attribute_ID == DOMAIN_SUPPORT ? 0 : rc;
    }
    uint32_t id = cap->attribute_ID;
    if (id < SHIM_DSP_ATTRIBUTES) {
        cap->capability = conn_welcome(c)->caps[id];
    } else if (id >= SHIM_DSP_INTERNAL_FIRST && id < SHIM_DSP_INTERNAL_FIRST + SHIM_DSP_INTERNAL) {
        cap->capability = conn_welcome(c)->internal[id - SHIM_DSP_INTERNAL_FIRST];
    }
    /* 256..259, the driver's (PERF_V2_DRIVER_SUPPORT .. DSPSIGNAL_DRIVER_SUPPORT):
     * 0, which libcdsprpc answers itself on mainline kernels; the DSP's others
     * (12..127, 132..255, unassigned): 0, npud does not ask for them. */
    conn_put(c);
    return 0;
}

/* The controls remote_handle_control and remote_handle64_control share. */
static int handle_control(uint32_t req, void *data, uint32_t len) {
    switch (req) {
    case DSPRPC_CONTROL_LATENCY: {
        const struct remote_rpc_control_latency *l = data;
        if (l == NULL || len != sizeof(*l) || l->enable > RPC_POLL_QOS) {
            return AEE_EBADPARM;
        }
        return 0; /* npud schedules; QoS requests change nothing */
    }
    case DSPRPC_GET_DSP_INFO:
        return dsp_info(data, len);
    case DSPRPC_GET_DOMAIN: {
        remote_rpc_get_domain_t *d = data;
        if (d == NULL || len != sizeof(*d)) {
            return AEE_EBADPARM;
        }
        d->domain = CDSP_DOMAIN_ID;
        return 0;
    }
    default:
        return AEE_EUNSUPPORTED;
    }
}

static int get_uri(remote_rpc_get_uri_t *u, uint32_t len) {
    if (u == NULL || len != sizeof(*u) || u->domain_name == NULL || u->domain_name_len == 0 ||
        u->session_id >= NUM_SESSIONS) {
        return AEE_EBADPARM;
    }
    int domain = shim_domain_by_name(u->domain_name);
    if (domain < 0 || u->module_uri == NULL || u->module_uri_len == 0 || u->uri == NULL ||
        u->uri_len <= u->module_uri_len) {
        return AEE_EBADPARM;
    }
    int need = snprintf(NULL, 0, "%s&_dom=%s&_session=%u", u->module_uri, DOMAIN_NAMES[domain],
                        u->session_id);
    int rc = need < 0 || u->uri_len <= (uint32_t)need ? AEE_EBADSIZE : 0;
    snprintf(u->uri, u->uri_len, "%s&_dom=%s&_session=%u", u->module_uri, DOMAIN_NAMES[domain],
             u->session_id);
    return rc;
}

static int session_control(uint32_t req, void *data, uint32_t len) {
    switch (req) {
    case DSPRPC_CONTROL_UNSIGNED_MODULE: {
        const struct remote_rpc_control_unsigned_module *u = data;
        if (u == NULL || len != sizeof(*u) ||
            (u->domain != -1 && (u->domain < 0 || u->domain >= NUM_DOMAINS * NUM_SESSIONS))) {
            return AEE_EBADPARM;
        }
        return 0; /* npud's DSP processes are unsigned PDs */
    }
    case FASTRPC_GET_EFFECTIVE_DOMAIN_ID: {
        remote_rpc_effective_domain_id_t *e = data;
        if (e == NULL || len != sizeof(*e) || e->domain_name == NULL || e->domain_name_len == 0 ||
            e->session_id >= NUM_SESSIONS) {
            return AEE_EBADPARM;
        }
        int domain = shim_domain_by_name(e->domain_name);
        if (domain < 0) {
            return AEE_EBADPARM;
        }
        e->effective_domain_id = (uint32_t)domain + NUM_DOMAINS * e->session_id;
        return 0;
    }
    case FASTRPC_GET_URI:
        return get_uri(data, len);
    default:
        /* FASTRPC_RESERVE_NEW_SESSION among them: a client has one DSP process */
        return AEE_EUNSUPPORTED;
    }
}

SHIM_API int remote_handle_control(uint32_t req, void *data, uint32_t datalen) {
    return handle_control(req, data, datalen);
}

SHIM_API int remote_handle64_control(remote_handle64 h, uint32_t req, void *data,
                                     uint32_t datalen) {
    struct handle found;
    int rc = h > UINT32_MAX ? AEE_EINVHANDLE : handle_lookup((uint32_t)h, &found);
    if (rc != 0) {
        return rc;
    }
    return handle_control(req, data, datalen);
}

SHIM_API int remote_session_control(uint32_t req, void *data, uint32_t datalen) {
    return session_control(req, data, datalen);
}
