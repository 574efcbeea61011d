"""AEE result codes (Qualcomm ``AEEStdErr.h``) and how to name them.

The DSP returns ``0x80000400 + n`` (``DSP_AEE_EOFFSET``); HLOS-side library
code uses the bare ``n``. A handful of codes (``AEE_ENOSUCH``,
``AEE_EINTERRUPTED``, ``AEE_ECONNRESET``, ``AEE_EWOULDBLOCK``) are bare on both
sides. :func:`aee_name` accepts either form.
"""

from __future__ import annotations

import enum
from typing import Final

DSP_AEE_EOFFSET: Final = 0x80000400


class AEE(enum.IntEnum):
    """Bare AEE error numbers (add :data:`DSP_AEE_EOFFSET` for the DSP's form)."""

    SUCCESS = 0
    EFAILED = 0x001
    ENOMEMORY = 0x002
    ECLASSNOTSUPPORT = 0x003
    EVERSIONNOTSUPPORT = 0x004
    EALREADYLOADED = 0x005
    EUNABLETOLOAD = 0x006
    EUNABLETOUNLOAD = 0x007
    EALARMPENDING = 0x008
    EINVALIDTIME = 0x009
    EBADCLASS = 0x00A
    EBADMETRIC = 0x00B
    EEXPIRED = 0x00C
    EBADSTATE = 0x00D
    EBADPARM = 0x00E
    ESCHEMENOTSUPPORTED = 0x00F
    EBADITEM = 0x010
    EINVALIDFORMAT = 0x011
    EINCOMPLETEITEM = 0x012
    ENOPERSISTMEMORY = 0x013
    EUNSUPPORTED = 0x014
    EPRIVLEVEL = 0x015
    ERESOURCENOTFOUND = 0x016
    EREENTERED = 0x017
    EBADTASK = 0x018
    EALLOCATED = 0x019
    EALREADY = 0x01A
    EADSAUTHBAD = 0x01B
    ENEEDSERVICEPROG = 0x01C
    EMEMPTR = 0x01D
    EHEAP = 0x01E
    EIDLE = 0x01F
    EITEMBUSY = 0x020
    EBADSID = 0x021
    ENOTYPE = 0x022
    ENEEDMORE = 0x023
    EADSCAPS = 0x024
    EBADSHUTDOWN = 0x025
    EBUFFERTOOSMALL = 0x026
    ENOSUCH = 0x027
    EACKPENDING = 0x028
    ENOTOWNER = 0x029
    EINVALIDITEM = 0x02A
    ENOTALLOWED = 0x02B
    EINVHANDLE = 0x02C
    EOUTOFHANDLES = 0x02D
    EINTERRUPTED = 0x02E
    ENOMORE = 0x02F
    ECPUEXCEPTION = 0x030
    EREADONLY = 0x031
    EINVALIDFD = 0x03A
    EINVALIDDEVICE = 0x03B
    ENOSUCHMOD = 0x03E
    ENOSUCHSYMBOL = 0x042
    ENOSUCHDEVICE = 0x043
    ENOSUCHFILE = 0x045
    ENOSUCHHANDLE = 0x046
    ENOSUCHMAP = 0x048
    EBADOFFSET = 0x04C
    EBADSIZE = 0x04D
    EBADPERMS = 0x04E
    EBADFD = 0x04F
    EBADELF = 0x052
    EFOPEN = 0x057
    EEOF = 0x05B
    EFREAD = 0x05C
    EMMAP = 0x065
    ENOTINITIALIZED = 0x06B
    EUNSUPPORTEDAPI = 0x06C
    EINVARGS = 0x071
    ECONNREFUSED = 0x072
    EUNSIGNEDMOD = 0x081
    ECONNRESET = 104
    ERPC = 0x200
    EFILE = 0x201
    EWOULDBLOCK = 516

    @property
    def dsp(self) -> int:
        """The code as the DSP returns it (``0x80000400 + n``)."""
        return DSP_AEE_EOFFSET + int(self)


def aee_name(rc: int) -> str | None:
    """``AEE_EBADPARM`` for 0x8000040E or 14; None where the code is not known."""
    rc &= 0xFFFFFFFF
    n = rc - DSP_AEE_EOFFSET if rc >= DSP_AEE_EOFFSET else rc
    try:
        return f"AEE_{AEE(n).name}"
    except ValueError:
        return None


def describe_result(rc: int) -> str:
    """``0x8000040E (AEE_EBADPARM)``: how every DSP result code is shown."""
    rc &= 0xFFFFFFFF
    name = aee_name(rc)
    return f"0x{rc:08X} ({name})" if name else f"0x{rc:08X}"
