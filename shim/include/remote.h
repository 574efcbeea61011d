/*
 * remote.h -- npud's libcdsprpc: remote handles, invokes and controls.
 *
 * Written for npud from the FastRPC ABI: the names, values and layouts are
 * those programs built for Qualcomm's libcdsprpc use (qualcomm/fastrpc's
 * inc/remote.h and the Hexagon SDK's), so that such programs compile against
 * this header unchanged and run on npud's libcdsprpc.so.1. Only the functions
 * npud's library exports are declared (see shim/README.md).
 *
 * Also here, because newer SDK headers have them and llama.cpp's Hexagon
 * backend needs them to compile: FASTRPC_MAP_FD_EXTENDED and
 * FASTRPC_MAP_FD_DELAYED_EXTENDED, and the types of remote_system_request
 * (which npud's library does NOT export: a program falls back to the static
 * domain list, CDSP = 3).
 */
#ifndef REMOTE_H
#define REMOTE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the scalars word of an invoke ------------------------------------------------
 * bits 29-31 method attributes, 24-28 method index, 16-23 input buffers,
 * 8-15 output buffers, 4-7 input handles, 0-3 output handles. */
#define REMOTE_SCALARS_METHOD_ATTR(sc) (((sc) >> 29) & 0x7)
#define REMOTE_SCALARS_METHOD(sc) (((sc) >> 24) & 0x1f)
#define REMOTE_SCALARS_INBUFS(sc) (((sc) >> 16) & 0x0ff)
#define REMOTE_SCALARS_OUTBUFS(sc) (((sc) >> 8) & 0x0ff)
#define REMOTE_SCALARS_INHANDLES(sc) (((sc) >> 4) & 0x0f)
#define REMOTE_SCALARS_OUTHANDLES(sc) ((sc) & 0x0f)
#define REMOTE_SCALARS_MAKEX(attr, method, in, out, hin, hout)                          \
    ((((uint32_t)(attr) & 0x7) << 29) | (((uint32_t)(method) & 0x1f) << 24) |           \
     (((uint32_t)(in) & 0xff) << 16) | (((uint32_t)(out) & 0xff) << 8) |                \
     (((uint32_t)(hin) & 0x0f) << 4) | ((uint32_t)(hout) & 0x0f))
#define REMOTE_SCALARS_MAKE(method, in, out) REMOTE_SCALARS_MAKEX(0, method, in, out, 0, 0)
#define REMOTE_SCALARS_LENGTH(sc)                                                      \
    (REMOTE_SCALARS_INBUFS(sc) + REMOTE_SCALARS_OUTBUFS(sc) +                           \
     REMOTE_SCALARS_INHANDLES(sc) + REMOTE_SCALARS_OUTHANDLES(sc))

/* ---- domains ------------------------------------------------------------------------
 * npud brokers the CDSP only; an effective domain id is domain + 8 * session. */
#define ADSP_DOMAIN_ID 0
#define MDSP_DOMAIN_ID 1
#define SDSP_DOMAIN_ID 2
#define CDSP_DOMAIN_ID 3
#define CDSP1_DOMAIN_ID 4

#define ADSP_DOMAIN_NAME "adsp"
#define MDSP_DOMAIN_NAME "mdsp"
#define SDSP_DOMAIN_NAME "sdsp"
#define CDSP_DOMAIN_NAME "cdsp"
#define CDSP1_DOMAIN_NAME "cdsp1"
#define GDSP0_DOMAIN_NAME "gdsp0"
#define GDSP1_DOMAIN_NAME "gdsp1"

/* What a module URI appends to name its domain. */
#define ADSP_DOMAIN "&_dom=adsp"
#define MDSP_DOMAIN "&_dom=mdsp"
#define SDSP_DOMAIN "&_dom=sdsp"
#define CDSP_DOMAIN "&_dom=cdsp"
#define CDSP1_DOMAIN "&_dom=cdsp1"
#define GDSP0_DOMAIN "&_dom=gdsp0"
#define GDSP1_DOMAIN "&_dom=gdsp1"

#define MAX_DOMAIN_URI_SIZE 12

typedef struct domain {
    int id;                        /* a *_DOMAIN_ID */
    char uri[MAX_DOMAIN_URI_SIZE]; /* its URI suffix, e.g. CDSP_DOMAIN */
} domain_t;

/* ---- handles and arguments ------------------------------------------------------- */
typedef uint32_t remote_handle;   /* a handle of remote_handle_open */
typedef uint64_t remote_handle64; /* a handle of remote_handle64_open (npud: < 2^32) */

typedef struct {
    void *pv;    /* the buffer */
    size_t nLen; /* its length in bytes */
} remote_buf;

typedef struct {
    uint64_t pv;
    int64_t nLen;
} remote_buf64;

typedef struct {
    int32_t fd;      /* a registered DMA handle (remote_register_dma_handle) */
    uint32_t offset; /* offset into it */
} remote_dma_handle;

typedef struct {
    int32_t fd;
    uint32_t offset;
    uint32_t len;
} remote_dma_handle64;

/* One argument of an invoke: in order, input buffers, output buffers, input
 * handles, output handles (REMOTE_SCALARS_*). */
typedef union {
    remote_buf buf;
    remote_handle h;
    remote_handle64 h64;
    remote_dma_handle dma;
} remote_arg;

typedef union {
    remote_buf64 buf;
    remote_handle h;
    remote_handle64 h64;
    remote_dma_handle64 dma;
} remote_arg64;

/* ---- remote_handle_control / remote_handle64_control --------------------------- */
enum handle_control_req_id {
    DSPRPC_RESERVED,           /* 0 */
    DSPRPC_CONTROL_LATENCY,    /* 1: struct remote_rpc_control_latency */
    DSPRPC_GET_DSP_INFO,       /* 2: struct remote_dsp_capability */
    DSPRPC_CONTROL_WAKELOCK,   /* 3 */
    DSPRPC_GET_DOMAIN,         /* 4: remote_rpc_get_domain_t */
    DSPRPC_SET_PATH,           /* 5 */
    DSPRPC_GET_PATH,           /* 6 */
    DSPRPC_SMMU_SUPPORT,       /* 7 */
    DSPRPC_KALLOC_SUPPORT,     /* 8 */
    DSPRPC_PM,                 /* 9 */
    DSPRPC_RPC_POLL,           /* 10 */
    DSPRPC_ASYNC_WAKE,         /* 11 */
    DSPRPC_NOTIF_WAKE,         /* 12 */
    DSPRPC_REMOTE_PROCESS_KILL,/* 13 */
    DSPRPC_SET_MODE,           /* 14 */
};

enum remote_rpc_latency_flags {
    RPC_DISABLE_QOS,  /* 0 */
    RPC_PM_QOS,       /* 1 */
    RPC_ADAPTIVE_QOS, /* 2 */
    RPC_POLL_QOS,     /* 3 */
};

struct remote_rpc_control_latency {
    uint32_t enable;  /* enum remote_rpc_latency_flags */
    uint32_t latency; /* microseconds */
};

/* DSPRPC_GET_DSP_INFO: fill domain and attribute_ID, read capability. */
typedef struct remote_dsp_capability {
    uint32_t domain;
    uint32_t attribute_ID; /* enum remote_dsp_attributes */
    uint32_t capability;
} fastrpc_capability;

enum remote_dsp_attributes {
    DOMAIN_SUPPORT,              /* 0: the DSP is present */
    UNSIGNED_PD_SUPPORT,         /* 1 */
    HVX_SUPPORT_64B,             /* 2 */
    HVX_SUPPORT_128B,            /* 3 */
    VTCM_PAGE,                   /* 4 */
    VTCM_COUNT,                  /* 5 */
    ARCH_VER,                    /* 6: e.g. 0x73 for v73 */
    HMX_SUPPORT_DEPTH,           /* 7 */
    HMX_SUPPORT_SPATIAL,         /* 8 */
    ASYNC_FASTRPC_SUPPORT,       /* 9 */
    STATUS_NOTIFICATION_SUPPORT, /* 10 */
    MCID_MULTICAST,              /* 11 */
};

#define FASTRPC_WAKELOCK_CONTROL_SUPPORTED 1

struct remote_rpc_control_wakelock {
    uint32_t enable;
};

typedef struct remote_rpc_get_domain {
    int domain;
} remote_rpc_get_domain_t;

/* ---- remote_session_control ------------------------------------------------------- */
enum session_control_req_id {
    FASTRPC_RESERVED_1,                    /* 0 */
    FASTRPC_THREAD_PARAMS,                 /* 1 */
    DSPRPC_CONTROL_UNSIGNED_MODULE,        /* 2: struct remote_rpc_control_unsigned_module */
    FASTRPC_RESERVED_2,                    /* 3 */
    FASTRPC_RELATIVE_THREAD_PRIORITY,      /* 4 */
    FASTRPC_RESERVED_3,                    /* 5 */
    FASTRPC_REMOTE_PROCESS_KILL,           /* 6 */
    FASTRPC_SESSION_CLOSE,                 /* 7 */
    FASTRPC_CONTROL_PD_DUMP,               /* 8 */
    FASTRPC_REMOTE_PROCESS_EXCEPTION,      /* 9 */
    FASTRPC_REMOTE_PROCESS_TYPE,           /* 10 */
    FASTRPC_REGISTER_STATUS_NOTIFICATIONS, /* 11 */
    FASTRPC_PD_INITMEM_SIZE,               /* 12 */
    FASTRPC_RESERVE_NEW_SESSION,           /* 13: remote_rpc_reserve_new_session_t */
    FASTRPC_GET_EFFECTIVE_DOMAIN_ID,       /* 14: remote_rpc_effective_domain_id_t */
    FASTRPC_GET_URI,                       /* 15: remote_rpc_get_uri_t */
    FASTRPC_MAX_THREAD_PARAM,              /* 16 */
    FASTRPC_CONTEXT_CREATE,                /* 17 */
    FASTRPC_CONTEXT_DESTROY,               /* 18 */
};

struct remote_rpc_thread_params {
    int domain;
    int prio;
    int stack_size;
};

struct remote_rpc_control_unsigned_module {
    int domain; /* an effective domain id, or -1 for all */
    int enable;
};

struct remote_rpc_relative_thread_priority {
    int domain;
    int relative_thread_priority;
};

struct remote_rpc_session_close {
    int domain;
};

struct remote_rpc_pd_initmem_size {
    int domain;
    uint32_t pd_initmem_size;
};

enum fastrpc_process_type {
    PROCESS_TYPE_SIGNED,
    PROCESS_TYPE_UNSIGNED,
};

struct remote_process_type {
    int domain;
    int process_type;
};

typedef struct remote_rpc_reserve_new_session {
    char *domain_name;         /* in: e.g. "cdsp" */
    uint32_t domain_name_len;  /* in: without the NUL */
    char *session_name;        /* in */
    uint32_t session_name_len; /* in */
    uint32_t effective_domain_id; /* out */
    uint32_t session_id;          /* out */
} remote_rpc_reserve_new_session_t;

typedef struct remote_rpc_effective_domain_id {
    char *domain_name;            /* in: e.g. "cdsp" */
    uint32_t domain_name_len;     /* in: without the NUL */
    uint32_t session_id;          /* in: 0 for the default session */
    uint32_t effective_domain_id; /* out: domain + 8 * session */
} remote_rpc_effective_domain_id_t;

typedef struct remote_rpc_get_uri {
    char *domain_name;        /* in: e.g. "cdsp" */
    uint32_t domain_name_len; /* in: without the NUL */
    uint32_t session_id;      /* in */
    char *module_uri;         /* in: the module's URI */
    uint32_t module_uri_len;  /* in: without the NUL */
    char *uri;                /* out: module_uri + "&_dom=<name>&_session=<id>" */
    uint32_t uri_len;         /* in: the size of uri; too small is AEE_EBADSIZE */
} remote_rpc_get_uri_t;

/* ---- mapping buffers into the DSP (fastrpc_mmap) --------------------------------- */
enum fastrpc_map_flags {
    FASTRPC_MAP_STATIC,          /* 0 */
    FASTRPC_MAP_RESERVED,        /* 1 */
    FASTRPC_MAP_FD,              /* 2: mapped now, until fastrpc_munmap */
    FASTRPC_MAP_FD_DELAYED,      /* 3: the DSP maps it when it first uses it */
    FASTRPC_MAP_RESERVED_4,
    FASTRPC_MAP_RESERVED_5,
    FASTRPC_MAP_RESERVED_6,
    FASTRPC_MAP_RESERVED_7,
    FASTRPC_MAP_RESERVED_8,
    FASTRPC_MAP_RESERVED_9,
    FASTRPC_MAP_RESERVED_10,
    FASTRPC_MAP_RESERVED_11,
    FASTRPC_MAP_RESERVED_12,
    FASTRPC_MAP_RESERVED_13,
    FASTRPC_MAP_RESERVED_14,
    FASTRPC_MAP_RESERVED_15,
    FASTRPC_MAP_FD_NOMAP,            /* 16 */
    FASTRPC_MAP_FD_EXTENDED,         /* 17: FD with 64-bit DMA addressing */
    FASTRPC_MAP_FD_DELAYED_EXTENDED, /* 18: FD_DELAYED with 64-bit DMA addressing */
    FASTRPC_MAP_MAX,
};

/* Buffer attributes (remote_register_buf_attr, remote_register_dma_handle_attr). */
#define FASTRPC_ATTR_NONE 0
#define FASTRPC_ATTR_NON_COHERENT 2
#define FASTRPC_ATTR_COHERENT 4
#define FASTRPC_ATTR_KEEP_MAP 8
#define FASTRPC_ATTR_NOMAP 16
#define FASTRPC_ATTR_FORCE_NOFLUSH 32
#define FASTRPC_ATTR_FORCE_NOINVALIDATE 64
#define FASTRPC_ATTR_TRY_MAP_STATIC 128

/* ---- device discovery (types only: remote_system_request is not exported) -------- */
#ifndef MAX_DOMAIN_NAMELEN
#define MAX_DOMAIN_NAMELEN 30
#endif

typedef enum {
    FASTRPC_ALL_DOMAINS = 0,
    FASTRPC_NSP = 1,
    FASTRPC_LPASS = 2,
    FASTRPC_SDSP = 3,
    FASTRPC_MODEM = 4,
    FASTRPC_HPASS = 5,
} fastrpc_domain_type;

typedef struct {
    int id;
    int instance_id;
    char name[MAX_DOMAIN_NAMELEN];
    fastrpc_domain_type type;
    int status;
    uint32_t card;
    uint32_t soc_id;
    uint32_t reserved[10];
} fastrpc_domain;

#define DOMAINS_LIST_FLAGS_TYPE_POS 5
#define DOMAINS_LIST_FLAGS_SET_TYPE(flags, type)                                        \
    ((flags) | ((type) & ((1 << DOMAINS_LIST_FLAGS_TYPE_POS) - 1)))

typedef struct {
    fastrpc_domain *domains;
    int max_domains;
    int num_domains;
    uint64_t flags;
} fastrpc_domains_info;

typedef enum {
    FASTRPC_GET_DOMAINS = 0,
} system_req_id;

typedef struct {
    system_req_id id;
    union {
        fastrpc_domains_info sys;
    };
} system_req_payload;

/* ---- the functions ---------------------------------------------------------------- */

/* Open a module on the DSP. name is its URI, e.g.
 * "file:///libecho_skel.so?echo_skel_handle_invoke&_modver=1.0&_dom=cdsp". */
int remote_handle_open(const char *name, remote_handle *ph);
int remote_handle64_open(const char *name, remote_handle64 *ph);

/* Call method REMOTE_SCALARS_METHOD(sc) with REMOTE_SCALARS_LENGTH(sc) arguments
 * (pra may be NULL when there are none). Returns the skel's result. */
int remote_handle_invoke(remote_handle h, uint32_t sc, remote_arg *pra);
int remote_handle64_invoke(remote_handle64 h, uint32_t sc, remote_arg *pra);

int remote_handle_close(remote_handle h);
int remote_handle64_close(remote_handle64 h);

int remote_handle_control(uint32_t req, void *data, uint32_t datalen);
int remote_handle64_control(remote_handle64 h, uint32_t req, void *data, uint32_t datalen);
int remote_session_control(uint32_t req, void *data, uint32_t datalen);

/* Map a buffer (fd from rpcmem_to_fd) into the DSP process; offset 0, the whole
 * buffer, flags FASTRPC_MAP_FD or FASTRPC_MAP_FD_DELAYED. */
int fastrpc_mmap(int domain, int fd, void *addr, int offset, size_t length,
                 enum fastrpc_map_flags flags);
int fastrpc_munmap(int domain, int fd, void *addr, size_t length);

/* Let invokes pass [buf, buf + size) by reference (fd -1 forgets it again). */
void remote_register_buf(void *buf, int size, int fd);
void remote_register_buf_attr(void *buf, int size, int fd, int attr);

/* DMA handles for the handle slots of an invoke. */
int remote_register_dma_handle(int fd, uint32_t len);
int remote_register_dma_handle_attr(int fd, uint32_t len, uint32_t attr);

#ifdef __cplusplus
}
#endif

#endif /* REMOTE_H */
