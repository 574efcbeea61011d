/*
 * AEEStdDef.h -- npud's libcdsprpc: the basic types of the FastRPC API.
 *
 * Written for npud from the published ABI (the same names as Qualcomm's
 * AEEStdDef.h, which programs built for libcdsprpc include). Only what the
 * API of libcdsprpc uses is declared here.
 */
#ifndef AEESTDDEF_H
#define AEESTDDEF_H

#include <stdint.h>

/* The result of every API call: 0 (AEE_SUCCESS) or an AEE code (AEEStdErr.h). */
typedef int AEEResult;

#endif /* AEESTDDEF_H */
