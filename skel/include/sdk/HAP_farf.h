/*
 * Host stand-in for the Hexagon SDK's HAP_farf.h logging macro.
 *
 * FARF(LEVEL, fmt, ...) prints when FARF_<LEVEL> is 1. As on the DSP, ERROR,
 * FATAL and ALWAYS are on by default and LOW, MEDIUM and HIGH are off unless
 * the build defines FARF_<LEVEL>=1. On the host the message goes to stderr;
 * on the DSP the SDK's header routes it to the DSP log (and, with runtime
 * logging enabled, to the HLOS through adspmsgd).
 */
#ifndef NPUD_SKEL_HAP_FARF_H
#define NPUD_SKEL_HAP_FARF_H

#include <stdio.h>

#ifndef FARF_LOW
#define FARF_LOW 0
#endif
#ifndef FARF_MEDIUM
#define FARF_MEDIUM 0
#endif
#ifndef FARF_HIGH
#define FARF_HIGH 0
#endif
#ifndef FARF_ERROR
#define FARF_ERROR 1
#endif
#ifndef FARF_FATAL
#define FARF_FATAL 1
#endif
#ifndef FARF_ALWAYS
#define FARF_ALWAYS 1
#endif

/* The first variadic argument is the format string, so FARF(ERROR, "text") works in C11. */
#define FARF(level, ...)                                                          \
    do {                                                                          \
        if (FARF_##level) {                                                       \
            (void)fprintf(stderr, "%s:%d:" #level ": ", __FILE__, __LINE__);      \
            (void)fprintf(stderr, __VA_ARGS__);                                   \
            (void)fputc('\n', stderr);                                            \
        }                                                                         \
    } while (0)

#endif /* NPUD_SKEL_HAP_FARF_H */
