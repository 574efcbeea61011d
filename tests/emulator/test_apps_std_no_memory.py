"""apps_std's ``_fd`` calls when no DMA-BUF is to be had (issue 29, item 6).

libcdsprpc's ``apps_std_fopen_fd`` answers AEE_ENORPCMEMORY (0x68) when rpcmem
has no buffer for the file; AEE_ENOMEMORY would be 2, the DSP's ENOENT, and a
loader would take the file for missing and move on.
"""

from __future__ import annotations

import errno

import pytest

from npud.fastrpc.kernel import abi
from npud.fastrpc.reverse.apps_std import ENORPCMEMORY, SharingError
from npud.fastrpc.session import FastRpcSession
from npud.ops.backend import DEV_SHELL
from npud.sim import DSP_LIBRARY_DIR, EmulatedDriver


class Bytes:
    def __init__(self, data: bytes) -> None:
        self._data = data

    def read_at(self, offset: int, count: int) -> bytes:
        return self._data[offset : offset + count]


def test_no_buffer_for_a_shared_file_is_enorpcmemory() -> None:
    driver = EmulatedDriver()
    session = FastRpcSession.open(driver, library_path=[DSP_LIBRARY_DIR])
    try:
        session.load_shell(DEV_SHELL.read_bytes())
        host = session.reverse_host
        assert host is not None
        driver.faults.fail_next_ioctl(abi.FASTRPC_IOCTL_ALLOC_DMA_BUFF, errno.ENOMEM)
        with pytest.raises(SharingError) as caught:
            host.share(Bytes(b"x" * 5000), 5000)
        assert caught.value.result == ENORPCMEMORY == 0x68
        # The next share finds memory again and nothing of the failed one is left.
        maps = driver.statistics().mem_maps
        fd = host.share(Bytes(b"y" * 5000), 5000)
        assert driver.statistics().mem_maps == maps + 1
        host.unshare(fd)
        assert driver.statistics().mem_maps == maps
    finally:
        session.close()
