/*
 * Host stand-in for the Hexagon SDK's AEEStdDef.h: the one type the skels use.
 * The Hexagon build uses the SDK's own header instead.
 */
#ifndef NPUD_SKEL_AEESTDDEF_H
#define NPUD_SKEL_AEESTDDEF_H

/* The result of every IDL method: 0 on success, else an AEE code. */
typedef int AEEResult;

#endif /* NPUD_SKEL_AEESTDDEF_H */
