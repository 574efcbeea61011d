"""The emulated driver's GET_DSP_INFO: one attribute of the DSP's capability table.

The first query on a channel asks the DSP and the kernel caches the table for the
channel's life (``Channel.capabilities``, under the driver lock); the checks and
the copy-back follow the kernel versions ``SimConfig`` names (docs/emulator.md).
"""

from __future__ import annotations

import errno
import threading
from typing import Final

from npud.sim import layout
from npud.sim.config import MAX_DSP_ATTRIBUTES, SimConfig
from npud.sim.device_file import DeviceFile
from npud.sim.errors import fault
from npud.sim.ioctl_args import IoctlBuffer, arg_view

OLD_KERNEL_DEV_MAX: Final = 5  # FASTRPC_DEV_MAX before K-2026 (K-6.12ish)
MDSP_DOMAIN_ID: Final = 1


class DspInfoIoctl:
    """GET_DSP_INFO for one driver; ``lock`` is the driver lock, which guards the channels."""

    def __init__(self, config: SimConfig, lock: threading.Lock) -> None:
        self._config = config
        self._lock = lock

    def get_dsp_info(self, device: DeviceFile, arg: IoctlBuffer) -> int:
        view = arg_view(arg, layout.CAPABILITY_STRUCT.size, writable=True)
        request = layout.Capability._make(layout.CAPABILITY_STRUCT.unpack(view))
        if self._config.capability_domain_check and (
            request.domain >= OLD_KERNEL_DEV_MAX or request.domain == MDSP_DOMAIN_ID
        ):
            raise fault(errno.ECHRNG, f"GET_DSP_INFO: domain {request.domain} is invalid")
        if request.attribute_id >= MAX_DSP_ATTRIBUTES:
            raise fault(errno.EOVERFLOW, f"GET_DSP_INFO: attribute {request.attribute_id} >= 256")
        channel = device.channel
        with self._lock:
            table = channel.capabilities
            if table is None:
                # The first query asks the DSP; the answer is cached for the channel's life.
                if not channel.alive:
                    raise fault(errno.EPIPE, "GET_DSP_INFO: the DSP restarted")
                if not self._config.capability_api:
                    raise fault(errno.EOPNOTSUPP, "GET_DSP_INFO: the DSP has no capability API")
                table = channel.capabilities = self._config.capability_table()
        value = table[request.attribute_id]
        if self._config.capability_copyback_bug:
            layout.U32.pack_into(view, layout.CAPABILITY_DOMAIN_OFFSET, value)
        else:
            layout.U32.pack_into(view, layout.CAPABILITY_VALUE_OFFSET, value)
        return 0
