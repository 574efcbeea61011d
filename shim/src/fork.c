/*
 * fork.c -- a process that forks: the child starts clean, the parent is untouched.
 *
 * After fork() the child has one thread, copies of the parent's fds (npud's
 * socket among them) and of its memory, locks included. Nothing of the
 * parent's connection may be used there: a request sent on the shared socket
 * is answered to the parent's reader thread, which the child does not have.
 * So the child handler forgets the connection (closing only the child's copy
 * of the socket: no shutdown, which would end the parent's too), the dspqueue
 * domain and the locks' state; everything made before the fork is of an
 * ended connection in the child (AEE_ECONNRESET, buffers stay mapped until
 * rpcmem_free), and the child's first call that needs npud connects anew,
 * as its own client. The short locks (buffers, handles, stats) are taken
 * around the fork so the child never sees a list half changed; the
 * connection's and dspqueue's, which can be held across a call to npud, are
 * not (a fork would wait for that call): the child makes them anew.
 */
#include <pthread.h>

#include "shim.h"

static void prepare(void) {
    handles_fork_lock();
    mem_fork_lock();
    stats_fork_lock();
}

static void parent(void) {
    stats_fork_unlock();
    mem_fork_unlock();
    handles_fork_unlock();
}

static void child(void) {
    stats_fork_child();
    mem_fork_unlock();
    handles_fork_unlock();
    conn_fork_child();
    dspqueue_fork_child();
}

__attribute__((constructor)) static void fork_init(void) {
    (void)pthread_atfork(prepare, parent, child);
}
