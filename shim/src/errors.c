/*
 * errors.c -- every failure becomes the AEE code libcdsprpc would return.
 *
 * libcdsprpc returns a skel's or the DSP's result unchanged (0x80000400 + n),
 * and turns a failed ioctl's errno into a bare HLOS code
 * (convert_kernel_to_user_error in qualcomm/fastrpc). npud's errors stand for
 * what the kernel would have said, so each is given the errno it stands for
 * and then that table's answer. The choices are listed in shim/README.md
 * ("Errors"); tests/shim checks every npud code has one.
 */
#include <errno.h>

#include "AEEStdErr.h"
#include "remote.h"
#include "shim.h"

int shim_aee_from_errno(int err) {
    switch (err) {
    case EIO:
    case ETOOMANYREFS:
    case EADDRNOTAVAIL:
    case ENOTTY:
    case EBADRQC:
        return AEE_ERPC;
    case EFAULT:
    case ECHRNG:
    case EBADFD:
    case EINVAL:
    case EBADF:
    case EBADE:
    case EBADR:
    case EOVERFLOW:
    case EHOSTDOWN:
    case EEXIST:
    case EBADMSG:
        return AEE_EBADPARM;
    case ENXIO:
    case ENODEV:
    case ENOKEY:
        return AEE_ENOSUCHDEVICE;
    case ENOBUFS:
    case ENOMEM:
        return AEE_ENOMEMORY;
    case ENOSR:
    case EDQUOT:
    case ETIMEDOUT:
    case EUSERS:
    case ESHUTDOWN:
        return AEE_EEXPIRED;
    case ENOTCONN:
    case ECONNREFUSED:
    case ENOENT: /* no socket: npud is not running */
        return AEE_ECONNREFUSED;
    case ECONNRESET:
    case EPIPE:
        return AEE_ECONNRESET;
    case EPROTONOSUPPORT:
        return AEE_EUNSUPPORTED;
    case EFBIG:
        return AEE_EFILE;
    case EACCES:
    case EPERM:
        return AEE_EBADPERMS;
    default:
        return AEE_ERPC;
    }
}

int shim_aee_from_npud(int code, uint32_t dsp_rc) {
    switch (code) {
    /* The DSP's own answer, unchanged, as the INVOKE ioctl's return value. */
    case 100: /* FASTRPC */
    case 101: /* OPEN_FAILED: remotectl open's result */
    case 102: /* INVOKE_FAILED */
    case 103: /* MMAP_FAILED */
        return dsp_rc != 0 ? (int)dsp_rc : AEE_EFAILED;
    case 104: /* DSP_RESTARTED: EPIPE */
    case 110: /* SESSION_CLOSED */
    case 513: /* CONNECTION_CLOSED */
    case 603: /* SHUTTING_DOWN: the DSP process goes with npud */
        return AEE_ECONNRESET;
    case 105: /* NO_FREE_SESSION: EBUSY */
    case 108: /* DEVICE_ERROR */
    case 604: /* INTERNAL_ERROR */
        return AEE_ERPC;
    case 106: /* UNSUPPORTED */
        return AEE_EUNSUPPORTED;
    case 107: /* DEVICE_NOT_FOUND: ENODEV */
        return AEE_ENOSUCHDEVICE;
    case 109: /* UNKNOWN_HANDLE */
        return AEE_EINVHANDLE;
    case 200: /* DMA_BUF_ALLOC */
    case 201: /* DMA_SIZE_OVERFLOW */
    case 202: /* DMA_EXCEEDS_MAX_SIZE */
        return AEE_ENORPCMEMORY;
    case 203: /* INVALID_FD: EBADF */
    case 204: /* SLICE_OUT_OF_RANGE: EFAULT */
    case 205: /* UNKNOWN_BUFFER */
    case 206: /* INVALID_ARGUMENT: EINVAL */
        return AEE_EBADPARM;
    case 400: /* SESSION_BUSY */
        return AEE_EITEMBUSY;
    case 401: /* SHELL_VERIFY: no DSP process can be made */
        return AEE_EUNABLETOLOAD;
    case 508: /* UNSUPPORTED_VERSION */
        return AEE_EVERSIONNOTSUPPORT;
    case 600: /* NOT_PERMITTED: EPERM */
    case 606: /* ADMISSION_REFUSED */
        return AEE_EBADPERMS;
    case 601: /* QUOTA_EXCEEDED: ENOMEM */
        return AEE_ENOMEMORY;
    case 602: /* TIMEOUT: ETIMEDOUT */
    case 605: /* DEADLINE_EXCEEDED */
        return AEE_EEXPIRED;
    default: /* the models' 3xx, the wire's 5xx, codes added later */
        return AEE_ERPC;
    }
}

int shim_check_domain(int domain) {
    if (domain == -1 || domain == CDSP_DOMAIN_ID) {
        return 0;
    }
    if (domain >= 0 && domain < 32) { /* 8 domains x 4 sessions: valid, not ours */
        return AEE_EUNSUPPORTED;
    }
    return AEE_EBADPARM;
}
