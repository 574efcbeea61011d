/*
 * stats.c -- how many requests this process sent npud, by kind, written at exit to the
 * file NPUD_SHIM_STATS names (one "kind count" line each). It is how the peer bench counts
 * npud round trips per generated token; an operator can use it the same way.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

#define KINDS 16

/* One lock: a request costs a socket round trip, next to which it is nothing. */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static const char *g_names[KINDS];
static unsigned long g_counts[KINDS];
static int g_used;
static int g_forked; /* a fork's child: the file is the parent's */

void stats_fork_lock(void) {
    pthread_mutex_lock(&g_mu);
}

void stats_fork_unlock(void) {
    pthread_mutex_unlock(&g_mu);
}

void stats_fork_child(void) {
    g_used = 0;
    g_forked = 1;
    pthread_mutex_unlock(&g_mu);
}

void stats_count(const char *reply_type) {
    pthread_mutex_lock(&g_mu);
    int i = 0;
    while (i < g_used && strcmp(g_names[i], reply_type) != 0) {
        i++;
    }
    if (i == g_used && g_used < KINDS) {
        g_names[g_used++] = reply_type; /* reply types are string literals */
    }
    if (i < g_used) {
        g_counts[i]++;
    }
    pthread_mutex_unlock(&g_mu);
}

__attribute__((destructor)) static void stats_write(void) {
    const char *path = getenv("NPUD_SHIM_STATS");
    if (g_forked || path == NULL || path[0] == '\0') {
        return;
    }
    FILE *out = fopen(path, "w");
    if (out == NULL) {
        shim_log("stats: cannot write %s", path);
        return;
    }
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < g_used; i++) {
        fprintf(out, "%s %lu\n", g_names[i], g_counts[i]);
    }
    pthread_mutex_unlock(&g_mu);
    fclose(out);
}
