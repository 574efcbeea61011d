/*
 * The table of open handles of one skel library.
 *
 * A remote_handle64 interface hands its client an opaque 64-bit handle from
 * <iface>_open and gets it back on every call. The skels keep every live
 * handle in a registry so that a stale or forged value is refused with
 * AEE_EINVHANDLE instead of being dereferenced. Handles are serial numbers,
 * never reused while the library is loaded, so a handle closed long ago cannot
 * alias an object opened later at the same address.
 *
 * Calls and close: acquire() counts the caller in and returns the object with
 * its lock held (one call at a time per handle; calls on other handles never
 * wait for it). remove() takes the object out of the table, so no new call can
 * find it, and waits until every caller that acquired it has released it; it
 * is then the caller's to destroy.
 */
#ifndef NPUD_SKEL_HANDLES_H
#define NPUD_SKEL_HANDLES_H

#include <pthread.h>
#include <stdint.h>

#include "remote.h"

/* Open handles per skel library; one more open fails with AEE_EOUTOFHANDLES. */
#define SKEL_MAX_HANDLES 16u

/* Embed as the first member of a skel's per-handle state. */
typedef struct {
    pthread_mutex_t lock; /* held by the one call running on this handle */
    uint32_t users;       /* callers between acquire and release; registry lock */
} skel_object;

typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t released; /* signalled when an object's users drop to 0 */
    uint64_t last_handle;
    remote_handle64 handles[SKEL_MAX_HANDLES]; /* 0 = free entry */
    skel_object *objects[SKEL_MAX_HANDLES];
} skel_registry;

#define SKEL_REGISTRY_INIT                                                        \
    {.lock = PTHREAD_MUTEX_INITIALIZER, .released = PTHREAD_COND_INITIALIZER}

/* AEE_SUCCESS, or AEE_EFAILED when the mutex cannot be created. */
int skel_object_init(skel_object *object);
void skel_object_destroy(skel_object *object);

/* Register object and return its new handle in *handle; AEE_EOUTOFHANDLES when full. */
int skel_registry_add(skel_registry *registry, skel_object *object, remote_handle64 *handle);

/* What every skel's open does: allocate a zeroed per-handle state of `size`
 * bytes whose first member is a skel_object, initialise it and register it.
 * On success *object (when not NULL) is the new state and *handle its handle; on failure
 * nothing is left allocated. */
int skel_registry_open(skel_registry *registry, size_t size, skel_object **object,
                       remote_handle64 *handle);

/* The live object for handle, locked, or NULL when handle is not open. */
skel_object *skel_registry_acquire(skel_registry *registry, remote_handle64 handle);

/* End the call that acquire() started. */
void skel_registry_release(skel_registry *registry, skel_object *object);

/* Unregister handle and wait until no call holds it; NULL when handle is not open. */
skel_object *skel_registry_remove(skel_registry *registry, remote_handle64 handle);

#endif /* NPUD_SKEL_HANDLES_H */
