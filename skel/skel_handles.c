/* The table of open handles of one skel library (see include/skel_handles.h). */
#include "skel_handles.h"

#include <stddef.h>
#include <stdlib.h>

#include "AEEStdErr.h"

int skel_object_init(skel_object *object) {
    object->users = 0;
    return pthread_mutex_init(&object->lock, NULL) == 0 ? AEE_SUCCESS : AEE_EFAILED;
}

void skel_object_destroy(skel_object *object) {
    (void)pthread_mutex_destroy(&object->lock);
}

int skel_registry_add(skel_registry *registry, skel_object *object, remote_handle64 *handle) {
    int rc = AEE_EOUTOFHANDLES;
    (void)pthread_mutex_lock(&registry->lock);
    for (size_t i = 0; i < SKEL_MAX_HANDLES; i++) {
        if (registry->handles[i] == 0) {
            /* Serial numbers from 1: 0 is never a handle, and 2^64 opens never wrap. */
            registry->last_handle++;
            registry->handles[i] = registry->last_handle;
            registry->objects[i] = object;
            *handle = registry->last_handle;
            rc = AEE_SUCCESS;
            break;
        }
    }
    (void)pthread_mutex_unlock(&registry->lock);
    return rc;
}

/* Index of handle in the table, or SKEL_MAX_HANDLES; the registry lock must be held. */
int skel_registry_open(skel_registry *registry, size_t size, skel_object **object,
                       remote_handle64 *handle) {
    if (size < sizeof(skel_object) || handle == NULL) {
        return AEE_EBADPARM;
    }
    skel_object *fresh = calloc(1, size);
    if (fresh == NULL) {
        return AEE_ENOMEMORY;
    }
    int rc = skel_object_init(fresh);
    if (rc != AEE_SUCCESS) {
        free(fresh);
        return rc;
    }
    rc = skel_registry_add(registry, fresh, handle);
    if (rc != AEE_SUCCESS) {
        skel_object_destroy(fresh);
        free(fresh);
        return rc;
    }
    if (object != NULL) {
        *object = fresh;
    }
    return AEE_SUCCESS;
}

static size_t find_locked(const skel_registry *registry, remote_handle64 handle) {
    if (handle == 0) {
        return SKEL_MAX_HANDLES;
    }
    for (size_t i = 0; i < SKEL_MAX_HANDLES; i++) {
        if (registry->handles[i] == handle) {
            return i;
        }
    }
    return SKEL_MAX_HANDLES;
}

skel_object *skel_registry_acquire(skel_registry *registry, remote_handle64 handle) {
    skel_object *object = NULL;
    (void)pthread_mutex_lock(&registry->lock);
    size_t i = find_locked(registry, handle);
    if (i < SKEL_MAX_HANDLES) {
        object = registry->objects[i];
        object->users++; /* remove() now waits for us before the object can be freed */
    }
    (void)pthread_mutex_unlock(&registry->lock);
    if (object != NULL) {
        /* Taken without the registry lock: a long call here never stalls other handles. */
        (void)pthread_mutex_lock(&object->lock);
    }
    return object;
}

void skel_registry_release(skel_registry *registry, skel_object *object) {
    (void)pthread_mutex_unlock(&object->lock);
    (void)pthread_mutex_lock(&registry->lock);
    object->users--;
    if (object->users == 0) {
        (void)pthread_cond_broadcast(&registry->released);
    }
    (void)pthread_mutex_unlock(&registry->lock);
}

skel_object *skel_registry_remove(skel_registry *registry, remote_handle64 handle) {
    skel_object *object = NULL;
    (void)pthread_mutex_lock(&registry->lock);
    size_t i = find_locked(registry, handle);
    if (i < SKEL_MAX_HANDLES) {
        object = registry->objects[i];
        registry->handles[i] = 0;
        registry->objects[i] = NULL;
        while (object->users != 0) {
            (void)pthread_cond_wait(&registry->released, &registry->lock);
        }
    }
    (void)pthread_mutex_unlock(&registry->lock);
    return object;
}
