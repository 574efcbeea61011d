/*
 * Host stand-in for the header qaic generates from idl/echo.idl
 * (`qaic -mdll idl/echo.idl` writes echo.h, echo_skel.c and echo_stub.c).
 *
 * It declares the implementation functions with the C signatures qaic gives
 * them, so skel/echo_imp.c compiles unchanged against either header: on the
 * Hexagon build the generated echo.h is found first and a drift between the
 * IDL and the implementation fails the compile there.
 */
#ifndef NPUD_SKEL_QAIC_ECHO_H
#define NPUD_SKEL_QAIC_ECHO_H

#include "AEEStdDef.h"
#include "remote.h"

#ifdef __cplusplus
extern "C" {
#endif

/* method 0: remotectl runs it when a client opens the URI below */
int echo_open(const char *uri, remote_handle64 *h);
/* method 1: remotectl runs it on close (or when the process goes away) */
int echo_close(remote_handle64 h);
/* method 2: long echo(in sequence<octet> in_buf, rout sequence<octet> out_buf) */
int echo_echo(remote_handle64 _h, const unsigned char *in_buf, int in_bufLen,
              unsigned char *out_buf, int out_bufLen);

#ifndef echo_URI
#define echo_URI "file:///libecho_skel.so?echo_skel_handle_invoke&_modver=1.0"
#endif

#ifdef __cplusplus
}
#endif

#endif /* NPUD_SKEL_QAIC_ECHO_H */
