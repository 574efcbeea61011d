/*
 * Host stand-in for the Hexagon SDK's AEEStdErr.h: the AEE result codes the
 * skels return. Values as listed in shared/reference/fastrpc-abi.md 5.7 and
 * protocol/src/npu_protocol/aee.py (tests/skel compares the two).
 *
 * On the DSP every code carries AEE_EOFFSET = 0x80000400 (what a client sees as
 * the INVOKE ioctl's return value); HLOS-side and host builds use the bare
 * number. The Hexagon build uses the SDK's own header instead of this one.
 */
#ifndef NPUD_SKEL_AEESTDERR_H
#define NPUD_SKEL_AEESTDERR_H

#if defined(__hexagon__)
#define AEE_EOFFSET 0x80000400
#else
#define AEE_EOFFSET 0x00000000
#endif

#define AEE_SUCCESS 0
#define AEE_EFAILED (AEE_EOFFSET + 0x001)           /* general failure */
#define AEE_ENOMEMORY (AEE_EOFFSET + 0x002)         /* out of memory */
#define AEE_EALREADYLOADED (AEE_EOFFSET + 0x005)    /* already registered / loaded */
#define AEE_EUNABLETOLOAD (AEE_EOFFSET + 0x006)     /* dlopen failed */
#define AEE_EBADSTATE (AEE_EOFFSET + 0x00D)         /* wrong state for this call */
#define AEE_EBADPARM (AEE_EOFFSET + 0x00E)          /* bad parameter */
#define AEE_EINVALIDFORMAT (AEE_EOFFSET + 0x011)    /* malformed data */
#define AEE_EUNSUPPORTED (AEE_EOFFSET + 0x014)      /* unknown method */
#define AEE_ERESOURCENOTFOUND (AEE_EOFFSET + 0x016) /* named resource not found */
#define AEE_EBUFFERTOOSMALL (AEE_EOFFSET + 0x026)   /* output buffer too small */
#define AEE_EINVHANDLE (AEE_EOFFSET + 0x02C)        /* invalid handle */
#define AEE_EOUTOFHANDLES (AEE_EOFFSET + 0x02D)     /* no free handle / slot */
#define AEE_ENOSUCHSYMBOL (AEE_EOFFSET + 0x042)     /* dlsym failed */
#define AEE_EBADSIZE (AEE_EOFFSET + 0x04D)          /* size does not match */
#define AEE_ENOTINITIALIZED (AEE_EOFFSET + 0x06B)   /* data not produced / not set */

#endif /* NPUD_SKEL_AEESTDERR_H */
