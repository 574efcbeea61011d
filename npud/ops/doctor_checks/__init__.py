"""The checks behind ``npud doctor``: each one looks at one thing and explains it.

Every check reads the installation under a root directory (``/`` on the
laptop, a fake tree in tests), so ``<root>/dev``, ``<root>/sys``,
``<root>/etc``, ``<root>/usr/lib``, ``<root>/lib/firmware`` and ``<root>/opt``
are what is looked at. Paths that come from the configuration
(``backend.nodes``, ``shell.path``...) or from ``$QAIRT_ROOT`` are paths on the
target system and are looked up under the root too. The daemon's socket is
the exception: it is connected to as given, because it is a live endpoint
rather than a file of the installation.

A check returns :class:`Finding` objects: a status, one line of detail and,
where there is one, the fix. Nothing here writes anything or needs privileges.

The checks by what they look at: :mod:`.device` (nodes, remoteproc, runtime PM),
:mod:`.firmware`, :mod:`.software` (shell, key, libraries) and :mod:`.daemon`; the
target, its accounts and a finding are in :mod:`.target`.
"""

from __future__ import annotations

from npud.ops.doctor_checks.daemon import check_daemon, check_unsigned_pd, connect_fix
from npud.ops.doctor_checks.device import (
    check_device_nodes,
    check_remoteproc_state,
    check_runtime_pm,
    find_cdsp_remoteprocs,
    npu_present,
)
from npud.ops.doctor_checks.firmware import (
    KNOWN_BAD_FIRMWARE,
    KNOWN_GOOD_FIRMWARE,
    FirmwareUnreadableError,
    check_firmware,
    firmware_candidates,
    firmware_verdict,
    image_version,
    read_firmware_version,
)
from npud.ops.doctor_checks.software import (
    DSP_SKEL_LIBRARY,
    QAIRT_HOST_LIBRARIES,
    check_dsp_libraries,
    check_qairt,
    check_shell,
    check_signing_key,
)
from npud.ops.doctor_checks.target import (
    CLIENT_GROUP,
    DEFAULT_QAIRT_ROOT,
    DEPLOY_FIX,
    DEVICE_GROUP,
    SERVICE_USER,
    SIGNING_FIX,
    UDEV_FIX,
    Accounts,
    Finding,
    Readable,
    Status,
    Target,
    read_attribute,
)

__all__ = [
    "CLIENT_GROUP",
    "DEFAULT_QAIRT_ROOT",
    "DEPLOY_FIX",
    "DEVICE_GROUP",
    "DSP_SKEL_LIBRARY",
    "KNOWN_BAD_FIRMWARE",
    "KNOWN_GOOD_FIRMWARE",
    "QAIRT_HOST_LIBRARIES",
    "SERVICE_USER",
    "SIGNING_FIX",
    "UDEV_FIX",
    "Accounts",
    "Finding",
    "FirmwareUnreadableError",
    "Readable",
    "Status",
    "Target",
    "check_daemon",
    "check_device_nodes",
    "check_dsp_libraries",
    "check_firmware",
    "check_qairt",
    "check_remoteproc_state",
    "check_runtime_pm",
    "check_shell",
    "check_signing_key",
    "check_unsigned_pd",
    "connect_fix",
    "find_cdsp_remoteprocs",
    "firmware_candidates",
    "firmware_verdict",
    "image_version",
    "npu_present",
    "read_attribute",
    "read_firmware_version",
]
