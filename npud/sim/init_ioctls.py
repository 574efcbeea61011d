"""The emulated driver's INIT commands that read the caller's memory: INIT_CREATE
(the shell image, from a dma-buf or user memory), INIT_CREATE_STATIC, INIT_ATTACH_SNS.

They check the request as ``fastrpc_init_create_process`` does, then hand the
process to make to :class:`npud.sim.driver.EmulatedDriver` (``create_process``),
which binds it to the fd.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import Final

from npu_protocol.aee import AEE
from npud.sim import layout
from npud.sim.config import SimConfig
from npud.sim.device_file import DeviceFile
from npud.sim.dmabuf import DmaBufRegistry
from npud.sim.errors import fault
from npud.sim.ioctl_args import IoctlBuffer, arg_view
from npud.sim.mappings import MappingTable, dsp_mapping
from npud.sim.process import ProcessInfo, ProcessKind
from npud.sim.usermem import UserMemory

INIT_FILELEN_MAX: Final = 2 * 1024 * 1024
INIT_FILE_NAMELEN_MAX: Final = 128
MODE_UNSIGNED_MODULE: Final = 0x8


class InitIoctls:
    """The INIT commands of one driver; ``require_alive`` raises EPIPE once the fd's
    channel died, ``create_process`` makes the fd's DSP process (a DSP result)."""

    def __init__(
        self,
        config: SimConfig,
        dmabufs: DmaBufRegistry,
        mappings: MappingTable,
        usermem: UserMemory,
        require_alive: Callable[[DeviceFile, str], None],
        create_process: Callable[[DeviceFile, ProcessInfo, bytes], int],
    ) -> None:
        self._config = config
        self._dmabufs = dmabufs
        self._mappings = mappings
        self._usermem = usermem
        self._require_alive = require_alive
        self._create_process = create_process

    def init_create(self, device: DeviceFile, arg: IoctlBuffer) -> int:
        view = arg_view(arg, layout.INIT_CREATE_STRUCT.size, writable=False)
        request = layout.InitCreate._make(layout.INIT_CREATE_STRUCT.unpack(view))
        if (
            self._config.secure_channel
            and not device.secure
            and not (request.attrs & MODE_UNSIGNED_MODULE)
        ):
            raise fault(errno.ECONNREFUSED, "INIT_CREATE: signed PD through the non-secure node")
        if request.filelen > INIT_FILELEN_MAX:
            raise fault(errno.EINVAL, f"INIT_CREATE: filelen {request.filelen} exceeds 2 MiB")
        if request.attrs & MODE_UNSIGNED_MODULE and not self._config.creates_unsigned_pd:
            # A firmware without unsigned PDs refuses the create (whatever capability 1 says).
            return AEE.EUNSUPPORTED.dsp
        image = self._read_shell(request, device.channel.generation)
        info = ProcessInfo(
            ProcessKind.USER_PD, device.client_id, request.attrs, request.siglen, len(image)
        )
        return self._create_process(device, info, image)

    def _read_shell(self, request: layout.InitCreate, channel: int) -> bytes:
        """The shell image: from the dma-buf ``filefd`` when given, else from ``file``."""
        if not request.filelen:
            return b""
        if request.filefd:
            # EBADF for -1 too, as in the kernel
            buffer = self._dmabufs.identify(request.filefd, channel=channel)
            if buffer is None:
                raise fault(errno.EINVAL, f"INIT_CREATE: filefd {request.filefd} is not a dma-buf")
            if request.filelen > buffer.size:
                raise fault(errno.EINVAL, "INIT_CREATE: filelen exceeds the dma-buf")
            offset = self._mappings.locate(buffer, request.file, request.filelen, "INIT_CREATE")
            with dsp_mapping(request.filefd, buffer) as mapping:
                return bytes(mapping[offset : offset + request.filelen])
        return bytes(self._usermem.read(request.file, request.filelen))

    def init_attach_sns(self, device: DeviceFile, arg: IoctlBuffer) -> int:
        self._require_alive(device, "INIT_ATTACH_SNS")
        return AEE.EUNSUPPORTED.dsp  # the CDSP has no sensors PD

    def init_create_static(self, device: DeviceFile, arg: IoctlBuffer) -> int:
        view = arg_view(arg, layout.INIT_CREATE_STATIC_STRUCT.size, writable=False)
        request = layout.InitCreateStatic._make(layout.INIT_CREATE_STATIC_STRUCT.unpack(view))
        if request.namelen > INIT_FILE_NAMELEN_MAX:
            raise fault(errno.EINVAL, f"INIT_CREATE_STATIC: namelen {request.namelen} > 128")
        self._usermem.read(request.name, request.namelen)
        self._require_alive(device, "INIT_CREATE_STATIC")
        return AEE.EUNSUPPORTED.dsp  # static PDs (audiopd, sensorspd) live on the ADSP
