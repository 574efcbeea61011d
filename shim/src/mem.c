/*
 * mem.c -- rpcmem, fastrpc_mmap/munmap and registered buffers.
 *
 * rpcmem_alloc asks npud for a DMA-BUF ("alloc"), maps the fd it gets
 * (MAP_SHARED) and keeps {address, size, fd, dsp_fd, npud buffer id}. The
 * number the program is given for it (rpcmem_to_fd) is dsp_fd, the number the
 * DSP knows the buffer by, because programs pass it on to the DSP inside
 * their own messages (dspqueue packets, skel arguments): it is not an fd of
 * this process. fastrpc_mmap and fastrpc_munmap name buffers by that number.
 *
 * Everything here is under g_mem_lock, never held across a call to npud. A
 * buffer lives as long as the connection that allocated it (its generation);
 * its DSP mapping as long as the session epoch it was made in.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "AEEStdErr.h"
#include "conn.h"
#include "mem.h"
#include "remote.h"
#include "rpcmem.h"
#include "shim.h"
#include "wire.h"

#define PAGE 4096u

struct buffer {
    struct buffer *next;
    struct raw_buffer raw;
    uint64_t gen;
    uint32_t flags;      /* rpcmem flags: RPCMEM_HEAP_NOREG passes it by copy */
    int mapped;          /* fastrpc_mmap done (or under way: map_epoch 0) */
    uint64_t map_epoch;
    int map_refs;        /* dspqueue references */
    size_t map_len;
};

struct registration {
    struct registration *next;
    char *buf;
    size_t size;
    int fd;
    int attr;
    int refs;
};

struct dma_handle {
    struct dma_handle *next;
    int fd;
    uint32_t len;
    uint32_t attr;
    int refs;
};

static pthread_mutex_t g_mem_lock = PTHREAD_MUTEX_INITIALIZER;
static struct buffer *g_buffers;
static struct registration *g_regs;
static struct dma_handle *g_dma;

void mem_fork_lock(void) {
    pthread_mutex_lock(&g_mem_lock);
}

void mem_fork_unlock(void) {
    pthread_mutex_unlock(&g_mem_lock);
}

/* ---- npud buffers ---------------------------------------------------------------------- */

struct alloc_ctx {
    size_t size;
    uint32_t id;
    size_t got;
    int fd;
    int dsp_fd;
};

static void encode_alloc(void *ctx, msgpack_packer *pk, uint32_t id) {
    const struct alloc_ctx *a = ctx;
    msgpack_pack_map(pk, 3);
    mp_kv_str(pk, "type", "alloc");
    mp_kv_uint(pk, "id", id);
    mp_kv_uint(pk, "size", a->size);
}

static int take_alloc(void *ctx, const msgpack_object *msg, int fd) {
    struct alloc_ctx *a = ctx;
    uint64_t id = 0;
    uint64_t size = 0;
    const msgpack_object *dsp_fd = mp_get(msg, "dsp_fd");
    if (fd < 0 || mp_uint(mp_get(msg, "buffer"), &id) != 0 || id == 0 || id > UINT32_MAX ||
        mp_uint(mp_get(msg, "size"), &size) != 0 || size < a->size || size > WIRE_MAX_BUFFER ||
        dsp_fd == NULL || dsp_fd->type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
        dsp_fd->via.u64 == 0 || dsp_fd->via.u64 > INT32_MAX) {
        /* dsp_fd must be > 0: dspqueue and llama.cpp refuse 0 */
        if (fd >= 0) {
            close(fd);
        }
        return AEE_ERPC;
    }
    a->id = (uint32_t)id;
    a->got = (size_t)size;
    a->fd = fd;
    a->dsp_fd = (int)dsp_fd->via.u64;
    return 0;
}

struct id_ctx {
    const char *type;
    const char *key;
    uint32_t value;
    int flags; /* map: the fastrpc_map_flags, or -1 to leave out */
};

static void encode_id(void *ctx, msgpack_packer *pk, uint32_t id) {
    const struct id_ctx *r = ctx;
    msgpack_pack_map(pk, r->flags >= 0 ? 4 : 3);
    mp_kv_str(pk, "type", r->type);
    mp_kv_uint(pk, "id", id);
    mp_kv_uint(pk, r->key, r->value);
    if (r->flags >= 0) {
        mp_kv_uint(pk, "flags", (uint64_t)r->flags);
    }
}

static int free_on(struct conn *c, uint32_t id) {
    struct id_ctx r = {.type = "free", .key = "buffer", .value = id, .flags = -1};
    struct conn_request req = {
        .reply_type = "free_reply", .encode = encode_id, .encode_ctx = &r};
    return conn_call(c, &req);
}

int mem_raw_alloc(struct conn *c, size_t size, struct raw_buffer *out) {
    struct alloc_ctx a = {.size = size, .fd = -1};
    struct conn_request req = {
        .reply_type = "alloc_reply",
        .encode = encode_alloc,
        .encode_ctx = &a,
        .on_reply = take_alloc,
        .reply_ctx = &a,
        .acquires = 1,
    };
    int rc = conn_call(c, &req);
    if (rc != 0) {
        return rc;
    }
    void *p;
    if (FAULT("mmap")) {
        p = MAP_FAILED;
        errno = ENOMEM;
    } else {
        p = mmap(NULL, a.got, PROT_READ | PROT_WRITE, MAP_SHARED, a.fd, 0);
    }
    if (p == MAP_FAILED) {
        rc = shim_aee_from_errno(errno);
        close(a.fd);
        (void)free_on(c, a.id);
        return rc;
    }
    out->ptr = p;
    out->size = a.got;
    out->fd = a.fd;
    out->dsp_fd = a.dsp_fd;
    out->id = a.id;
    return 0;
}

void mem_raw_free(struct conn *c, struct raw_buffer *b) {
    munmap(b->ptr, b->size);
    close(b->fd);
    if (c != NULL) {
        (void)free_on(c, b->id);
    }
    memset(b, 0, sizeof(*b));
}

/* ---- rpcmem ------------------------------------------------------------------------------- */

void *mem_alloc(size_t size, uint32_t flags) {
    if (size == 0) {
        errno = EINVAL;
        return NULL;
    }
    struct buffer *b = x_calloc(1, sizeof(*b));
    if (b == NULL) {
        return NULL;
    }
    struct conn *c;
    int rc = conn_get(&c);
    if (rc == 0) {
        uint64_t largest = conn_welcome(c)->max_buffer_size;
        if (size > largest) {
            /* npud's limits.max_buffer_size ([client_limits] max_buffer_size) */
            shim_log("rpcmem_alloc: %zu bytes is more than npud's largest buffer, %llu", size,
                     (unsigned long long)largest);
            rc = AEE_ENORPCMEMORY;
        } else {
            rc = mem_raw_alloc(c, size, &b->raw);
        }
        b->gen = conn_gen(c);
        conn_put(c);
    }
    if (rc != 0) {
        shim_log("rpcmem_alloc(%zu) failed: 0x%x", size, (unsigned)rc);
        free(b);
        errno = ENOMEM;
        return NULL;
    }
    b->flags = flags;
    pthread_mutex_lock(&g_mem_lock);
    b->next = g_buffers;
    g_buffers = b;
    pthread_mutex_unlock(&g_mem_lock);
    return b->raw.ptr;
}

void mem_free(void *p) {
    if (p == NULL) {
        return;
    }
    pthread_mutex_lock(&g_mem_lock);
    struct buffer **link = &g_buffers;
    while (*link != NULL && (*link)->raw.ptr != p) {
        link = &(*link)->next;
    }
    struct buffer *b = *link;
    if (b != NULL) {
        *link = b->next;
    }
    pthread_mutex_unlock(&g_mem_lock);
    if (b == NULL) {
        shim_log("rpcmem_free(%p): not an rpcmem buffer", p);
        return;
    }
    struct conn *c = NULL;
    if (conn_get_gen(b->gen, &c) != 0) {
        c = NULL; /* the connection is gone and the buffer with it */
    }
    /* npud unmaps a mapped buffer from the DSP before it frees it. */
    mem_raw_free(c, &b->raw);
    if (c != NULL) {
        conn_put(c);
    }
    free(b);
}

static struct buffer *containing(const void *p) {
    for (struct buffer *b = g_buffers; b != NULL; b = b->next) {
        const char *start = b->raw.ptr;
        if ((const char *)p >= start && (const char *)p < start + b->raw.size) {
            return b;
        }
    }
    return NULL;
}

/* The buffer the DSP knows as fd: a live one, else one of an ended connection
 * (whose number an old caller may still hold). */
static struct buffer *by_dsp_fd(int fd) {
    struct buffer *dead = NULL;
    for (struct buffer *b = g_buffers; b != NULL; b = b->next) {
        if (b->raw.dsp_fd == fd) {
            if (conn_alive(b->gen)) {
                return b;
            }
            dead = b;
        }
    }
    return dead;
}

static int still_listed(const struct buffer *b) {
    for (const struct buffer *x = g_buffers; x != NULL; x = x->next) {
        if (x == b) {
            return 1;
        }
    }
    return 0;
}

int mem_none_of(uint64_t gen) {
    pthread_mutex_lock(&g_mem_lock);
    int none = 1;
    for (const struct buffer *b = g_buffers; b != NULL; b = b->next) {
        if (b->gen == gen) {
            none = 0;
            break;
        }
    }
    pthread_mutex_unlock(&g_mem_lock);
    return none;
}

int mem_to_fd(void *p) {
    pthread_mutex_lock(&g_mem_lock);
    struct buffer *b = containing(p);
    /* the address rpcmem_alloc returned, nothing inside: libcdsprpc's
     * rpcmem_to_fd compares the base pointer alone */
    int fd = b != NULL && b->raw.ptr == p && conn_alive(b->gen) ? b->raw.dsp_fd : -1;
    pthread_mutex_unlock(&g_mem_lock);
    return fd;
}

int mem_resolve(uint64_t gen, const void *p, size_t len, uint32_t *buffer, uint64_t *offset) {
    const char *start = p;
    const char *last = start + (len - 1);
    int rc = 0;
    pthread_mutex_lock(&g_mem_lock);
    for (struct buffer *b = g_buffers; b != NULL; b = b->next) {
        const char *base = b->raw.ptr;
        if (b->gen != gen || (b->flags & RPCMEM_HEAP_NOREG) || start < base ||
            start >= base + b->raw.size) {
            continue;
        }
        if (last < start || last >= base + b->raw.size) {
            rc = AEE_EBADPARM;
        } else {
            *buffer = b->raw.id;
            *offset = (uint64_t)(start - base);
            rc = 1;
        }
        goto out;
    }
    for (struct registration *r = g_regs; r != NULL; r = r->next) {
        if (start < r->buf || start >= r->buf + r->size) {
            continue;
        }
        if (last < start || last >= r->buf + r->size) {
            rc = AEE_EBADPARM;
            goto out;
        }
        /* Registered with one of our buffers' numbers, inside our mapping of it:
         * by reference. Any other fd is not one npud can reach: by copy. */
        for (struct buffer *b = g_buffers; b != NULL; b = b->next) {
            const char *base = b->raw.ptr;
            if (b->gen == gen && b->raw.dsp_fd == r->fd && start >= base &&
                last < base + b->raw.size) {
                *buffer = b->raw.id;
                *offset = (uint64_t)(start - base);
                rc = 1;
                goto out;
            }
        }
        goto out;
    }
out:
    pthread_mutex_unlock(&g_mem_lock);
    return rc;
}

/* ---- fastrpc_mmap ------------------------------------------------------------------------- */

struct map_ctx {
    uint64_t address;
};

static int take_map(void *ctx, const msgpack_object *msg, int fd) {
    struct map_ctx *m = ctx;
    (void)fd;
    return mp_uint(mp_get(msg, "dsp_address"), &m->address) == 0 ? 0 : AEE_ERPC;
}

int mem_map(int domain, int fd, void *addr, int offset, size_t length, uint32_t flags) {
    int rc = shim_check_domain(domain);
    if (rc != 0) {
        return rc;
    }
    /* libcdsprpc's checks: the low 16 bits are the flags, the others attributes
     * (none defined: 0); any flag below FASTRPC_MAP_MAX but RESERVED goes to the
     * kernel, which passes it to the DSP; the offset 0. */
    if (fd < 0 || offset != 0 || (flags & ~0xffffu) != 0 || flags >= FASTRPC_MAP_MAX ||
        flags == FASTRPC_MAP_RESERVED) {
        return AEE_EBADPARM;
    }
    pthread_mutex_lock(&g_mem_lock);
    struct buffer *b = by_dsp_fd(fd);
    if (b != NULL && !conn_alive(b->gen)) {
        pthread_mutex_unlock(&g_mem_lock);
        return AEE_ECONNRESET; /* the buffer went with its connection */
    }
    if (b == NULL || length > b->raw.size) {
        /* not a buffer, or longer than it: the kernel's MEM_MAP fails, and libcdsprpc
         * answers a failed MEM_MAP with AEE_EFAILED */
        pthread_mutex_unlock(&g_mem_lock);
        return AEE_EFAILED;
    }
    if ((addr != NULL && addr != b->raw.ptr) || length + PAGE <= b->raw.size) {
        /* npud maps whole buffers: at their address, the length asked at rpcmem_alloc */
        pthread_mutex_unlock(&g_mem_lock);
        return AEE_EBADPARM;
    }
    if (b->mapped && (b->map_epoch == 0 || conn_alive_epoch(b->gen, b->map_epoch))) {
        pthread_mutex_unlock(&g_mem_lock);
        return AEE_EALREADY;
    }
    b->mapped = 1;
    b->map_epoch = 0; /* under way */
    b->map_refs = 0;
    uint64_t gen = b->gen;
    struct id_ctx r = {.type = "map", .key = "buffer", .value = b->raw.id, .flags = (int)flags};
    pthread_mutex_unlock(&g_mem_lock);

    struct map_ctx m = {0};
    struct conn_request req = {
        .reply_type = "map_reply",
        .encode = encode_id,
        .encode_ctx = &r,
        .on_reply = take_map,
        .reply_ctx = &m,
        .acquires = 1,
    };
    struct conn *c;
    rc = conn_get_gen(gen, &c);
    if (rc == 0) {
        rc = conn_call(c, &req);
        conn_put(c);
    }
    if (rc != 0 && req.npud_code == NPUD_MMAP_FAILED) {
        rc = AEE_EFAILED; /* what libcdsprpc answers for a failed MEM_MAP */
    }
    pthread_mutex_lock(&g_mem_lock);
    if (still_listed(b)) {
        b->mapped = rc == 0;
        b->map_epoch = rc == 0 ? req.epoch : 0;
        b->map_len = length;
    }
    pthread_mutex_unlock(&g_mem_lock);
    return rc;
}

int mem_unmap(int domain, int fd, void *addr, size_t length) {
    (void)addr;   /* libcdsprpc finds the mapping by fd alone */
    (void)length;
    int rc = shim_check_domain(domain);
    if (rc != 0) {
        return rc;
    }
    if (fd < 0) {
        return AEE_EBADPARM;
    }
    pthread_mutex_lock(&g_mem_lock);
    struct buffer *b = by_dsp_fd(fd);
    if (b == NULL || !b->mapped || b->map_epoch == 0) {
        pthread_mutex_unlock(&g_mem_lock);
        return AEE_ENOSUCHMAP;
    }
    if (!conn_alive(b->gen)) {
        b->mapped = 0;
        pthread_mutex_unlock(&g_mem_lock);
        return AEE_ECONNRESET; /* npud went, and the mapping with it */
    }
    if (b->map_refs > 0) {
        pthread_mutex_unlock(&g_mem_lock);
        return AEE_EBADPARM; /* dspqueue still holds it */
    }
    b->mapped = 0;
    if (!conn_alive_epoch(b->gen, b->map_epoch)) {
        pthread_mutex_unlock(&g_mem_lock);
        return AEE_ECONNRESET; /* the restart took the mapping */
    }
    uint64_t gen = b->gen;
    uint64_t epoch = b->map_epoch;
    struct id_ctx r = {.type = "unmap", .key = "buffer", .value = b->raw.id, .flags = -1};
    pthread_mutex_unlock(&g_mem_lock);

    struct conn_request req = {.reply_type = "unmap_reply", .encode = encode_id, .encode_ctx = &r};
    struct conn *c;
    rc = conn_get_gen(gen, &c);
    if (rc == 0) {
        rc = conn_call(c, &req);
        conn_put(c);
    }
    if (rc != 0 && rc != AEE_ECONNRESET) {
        rc = AEE_EFAILED;
        pthread_mutex_lock(&g_mem_lock);
        if (still_listed(b)) {
            b->mapped = 1; /* still mapped, as libcdsprpc keeps it on failure */
            b->map_epoch = epoch;
        }
        pthread_mutex_unlock(&g_mem_lock);
    }
    return rc;
}

int mem_buffer_ref(int fd, int delta, void **va, size_t *size) {
    int rc = AEE_ENOSUCHMAP;
    pthread_mutex_lock(&g_mem_lock);
    struct buffer *b = by_dsp_fd(fd);
    if (b != NULL && b->mapped && b->map_epoch != 0 && conn_alive_epoch(b->gen, b->map_epoch)) {
        if (b->map_refs + delta < 0) {
            rc = AEE_EBADPARM;
        } else {
            b->map_refs += delta;
            if (va != NULL) {
                *va = b->raw.ptr;
            }
            if (size != NULL) {
                *size = b->map_len;
            }
            rc = 0;
        }
    }
    pthread_mutex_unlock(&g_mem_lock);
    return rc;
}

/* ---- the exported functions ---------------------------------------------------------------- */

SHIM_API void rpcmem_init(void) {}

SHIM_API void rpcmem_deinit(void) {}

SHIM_API void *rpcmem_alloc(int heapid, uint32_t flags, int size) {
    (void)heapid; /* libcdsprpc on Linux ignores the heap too */
    if (size <= 0) {
        errno = EINVAL;
        return NULL;
    }
    return mem_alloc((size_t)size, flags);
}

SHIM_API void *rpcmem_alloc2(int heapid, uint32_t flags, size_t size) {
    (void)heapid;
    return mem_alloc(size, flags);
}

SHIM_API void rpcmem_free(void *po) {
    mem_free(po);
}

SHIM_API int rpcmem_to_fd(void *po) {
    return mem_to_fd(po);
}

SHIM_API int fastrpc_mmap(int domain, int fd, void *addr, int offset, size_t length,
                          enum fastrpc_map_flags flags) {
    return mem_map(domain, fd, addr, offset, length, (uint32_t)flags);
}

SHIM_API int fastrpc_munmap(int domain, int fd, void *addr, size_t length) {
    return mem_unmap(domain, fd, addr, length);
}

static void register_buf(void *buf, size_t size, int fd, int attr) {
    if (fd == -1) {
        /* forget a registration: the same address and size as registered */
        pthread_mutex_lock(&g_mem_lock);
        struct registration **link = &g_regs;
        while (*link != NULL && ((*link)->buf != buf || (*link)->size != size)) {
            link = &(*link)->next;
        }
        struct registration *r = *link;
        struct registration *gone = NULL;
        if (r != NULL && --r->refs == 0) {
            *link = r->next;
            gone = r;
        }
        pthread_mutex_unlock(&g_mem_lock);
        free(gone);
        if (r == NULL) {
            errno = EINVAL;
        }
        return;
    }
    if (buf == NULL || size == 0 || fd < 0) {
        errno = EINVAL;
        return;
    }
    struct registration *fresh = x_calloc(1, sizeof(*fresh));
    pthread_mutex_lock(&g_mem_lock);
    struct registration *r = g_regs;
    while (r != NULL && r->buf != buf) {
        r = r->next;
    }
    if (r != NULL) {
        r->size = size;
        r->fd = fd;
        if (attr != 0) {
            r->attr = attr;
        }
        r->refs++;
    } else if (fresh != NULL) {
        fresh->buf = buf;
        fresh->size = size;
        fresh->fd = fd;
        fresh->attr = attr;
        fresh->refs = 1;
        fresh->next = g_regs;
        g_regs = fresh;
        fresh = NULL;
        r = g_regs;
    }
    pthread_mutex_unlock(&g_mem_lock);
    free(fresh);
    if (r == NULL) {
        errno = ENOMEM;
    }
}

SHIM_API void remote_register_buf(void *buf, int size, int fd) {
    register_buf(buf, size > 0 ? (size_t)size : 0, fd, 0);
}

SHIM_API void remote_register_buf_attr(void *buf, int size, int fd, int attr) {
    register_buf(buf, size > 0 ? (size_t)size : 0, fd, attr);
}

SHIM_API int remote_register_dma_handle_attr(int fd, uint32_t len, uint32_t attr) {
    if ((attr != 0 && attr != FASTRPC_ATTR_NOMAP) || fd < 0) {
        return AEE_EBADPARM;
    }
    struct dma_handle *fresh = x_calloc(1, sizeof(*fresh));
    int rc = 0;
    pthread_mutex_lock(&g_mem_lock);
    struct dma_handle *d = g_dma;
    while (d != NULL && d->fd != fd) {
        d = d->next;
    }
    if (d != NULL) {
        if (d->attr == 0) {
            d->attr = attr;
        }
        d->refs++;
    } else if (fresh != NULL) {
        fresh->fd = fd;
        fresh->len = len;
        fresh->attr = attr;
        fresh->refs = 1;
        fresh->next = g_dma;
        g_dma = fresh;
        fresh = NULL;
    } else {
        rc = AEE_ENOMEMORY;
    }
    pthread_mutex_unlock(&g_mem_lock);
    free(fresh);
    return rc;
}

SHIM_API int remote_register_dma_handle(int fd, uint32_t len) {
    return remote_register_dma_handle_attr(fd, len, 0);
}
