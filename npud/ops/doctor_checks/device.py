"""The hardware: the FastRPC device nodes (present, owned, open to the service), the
CDSP remoteproc (booted) and its runtime power management.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Final

from npud.ops.doctor_checks.target import (
    CLIENT_GROUP,
    DEVICE_GROUP,
    SERVICE_USER,
    UDEV_FIX,
    Accounts,
    Finding,
    Status,
    Target,
    read_attribute,
)

_LIVE_STATES: Final = ("running", "attached")
"""remoteproc states of a booted DSP: "attached" is one an earlier boot stage started."""


def npu_present(target: Target) -> bool:
    """A device node or a CDSP remoteproc: the machine has an NPU, working or not."""
    nodes = target.kernel_profile().nodes
    return any(os.path.exists(node) for node in nodes) or bool(find_cdsp_remoteprocs(target))


def check_device_nodes(target: Target, accounts: Accounts) -> list[Finding]:
    """Each configured node: present, a character device, and openable by the service.

    On ``/`` a node must be a character device. Under another root any file
    stands for one, since making device nodes needs privileges tests do not have.
    A machine with no node and no CDSP remoteproc has no NPU: one line says so.
    """
    nodes = target.kernel_profile().nodes
    usable = [node for node in nodes if os.path.exists(node)]
    if not usable and not find_cdsp_remoteprocs(target):
        # Not a fault: npud runs on its emulator here. On a laptop where this is
        # wrong, the CDSP remoteproc would exist (its line then says why).
        return [
            Finding(
                "device nodes",
                Status.SKIP,
                f"no NPU on this machine: none of {', '.join(nodes)} exists and there is "
                "no CDSP remoteproc",
            )
        ]
    findings = []
    for node in nodes:
        check = f"device node {node}"
        if os.path.exists(node):
            findings.append(_check_one_node(target, accounts, check, node))
        elif usable:
            findings.append(
                Finding(
                    check,
                    Status.WARN,
                    f"missing; npud uses {usable[0]} instead",
                    "the driver makes both CDSP nodes when the DSP boots: check "
                    "`dmesg | grep -i fastrpc`, then reboot",
                )
            )
        else:
            findings.append(
                Finding(
                    check,
                    Status.FAIL,
                    "missing: the CDSP is there but its FastRPC nodes are not (the DSP is down)",
                    "see the CDSP remoteproc line; the nodes appear when the DSP runs",
                )
            )
    return findings


def _check_one_node(target: Target, accounts: Accounts, check: str, node: str) -> Finding:
    try:
        st = os.stat(node)
    except OSError as exc:
        return Finding(check, Status.FAIL, f"cannot stat: {exc.strerror}", UDEV_FIX)
    if target.is_live and not stat.S_ISCHR(st.st_mode):
        return Finding(
            check,
            Status.FAIL,
            "exists but is not a character device (something created a file in its place)",
            f"sudo rm {node} and reboot, so the driver creates the node again",
        )
    mode = stat.S_IMODE(st.st_mode)
    owner = f"{accounts.user_name(st.st_uid)}:{accounts.group_name(st.st_gid)}"
    shown = f"{_node_kind(st)} {owner} {mode:04o}"
    you = (
        "you can open it too"
        if os.access(node, os.R_OK | os.W_OK)
        else "you cannot open it (not needed: clients go through npud)"
    )
    rw_group = stat.S_IRGRP | stat.S_IWGRP
    rw_other = stat.S_IROTH | stat.S_IWOTH
    if mode & rw_other == rw_other:
        return Finding(
            check,
            Status.WARN,
            f"{shown}: every user can open it and go around npud's access control",
            UDEV_FIX,
        )
    if st.st_gid == accounts.gids.get(CLIENT_GROUP) and mode & rw_group == rw_group:
        return Finding(
            check,
            Status.WARN,
            f"{shown}: every member of {CLIENT_GROUP} can open it and go around npud",
            UDEV_FIX,
        )
    service_can = (
        st.st_gid == accounts.gids.get(DEVICE_GROUP) and mode & rw_group == rw_group
    ) or (st.st_uid == accounts.uids.get(SERVICE_USER) and mode & 0o600 == 0o600)
    if service_can:
        return Finding(check, Status.OK, f"{shown}: the npud service can open it; {you}")
    if DEVICE_GROUP not in accounts.gids:
        why = f"group {DEVICE_GROUP} does not exist"
        fix = "sudo scripts/install.sh (creates it with systemd-sysusers), then " + UDEV_FIX
    else:
        why = f"needs group {DEVICE_GROUP} with read and write (0660)"
        fix = UDEV_FIX
    return Finding(check, Status.FAIL, f"{shown}: the npud service cannot open it ({why})", fix)


def _node_kind(st: os.stat_result) -> str:
    # On / anything else was refused before this is asked.
    return "character device" if stat.S_ISCHR(st.st_mode) else "file (a device under --root)"


def find_cdsp_remoteprocs(target: Target) -> list[Path]:
    """``/sys/class/remoteproc/remoteproc*`` of the CDSP, as scripts/deploy_npu.sh finds it.

    Recent kernels name it ``cdsp``; older ones name it after its platform
    device and only the firmware name says cdsp.
    """
    base = target.path("/sys/class/remoteproc")
    try:
        entries = sorted(base.glob("remoteproc*"), key=_remoteproc_number)
    except OSError:
        return []
    found = []
    for entry in entries:
        name = read_attribute(entry / "name") or ""
        firmware = read_attribute(entry / "firmware") or ""
        if "cdsp" in name or "cdsp" in firmware:
            found.append(entry)
    return found


def _remoteproc_number(path: Path) -> tuple[int, str]:
    suffix = path.name.removeprefix("remoteproc")
    return (int(suffix) if suffix.isdigit() else -1, path.name)


def _remoteproc_label(rproc: Path) -> str:
    return f"{rproc.name} ({read_attribute(rproc / 'name') or 'no name'})"


def check_remoteproc_state(target: Target) -> list[Finding]:
    check = "CDSP remoteproc"
    remoteprocs = find_cdsp_remoteprocs(target)
    if not remoteprocs:
        return [
            Finding(
                check,
                Status.FAIL,
                f"no remoteproc named cdsp under {target.path('/sys/class/remoteproc')}",
                "the kernel has not probed the CDSP: check the qcom_q6v5_pas module "
                "(`lsmod`, `dmesg | grep -i remoteproc`)",
            )
        ]
    findings = []
    for rproc in remoteprocs:
        label = _remoteproc_label(rproc)
        state = read_attribute(rproc / "state")
        if state in _LIVE_STATES:
            findings.append(Finding(check, Status.OK, f"{label}: {state}"))
            continue
        state_file = rproc / "state"
        fix = (
            f"echo start | sudo tee {state_file}; if it does not stay running, "
            "`dmesg | grep -i remoteproc` says why (often the firmware)"
        )
        if state == "crashed":
            fix = (
                f"the DSP crashed: echo stop | sudo tee {state_file}, then echo start; "
                "`dmesg | grep -i remoteproc` shows the crash reason"
            )
        shown = state if state is not None else "unreadable"
        findings.append(Finding(check, Status.FAIL, f"{label}: state {shown}, not running", fix))
    return findings


def check_runtime_pm(target: Target) -> list[Finding]:
    """power/control of the CDSP remoteproc must be "on" (the hardware notes)."""
    check = "CDSP runtime PM"
    remoteprocs = find_cdsp_remoteprocs(target)
    if not remoteprocs:
        return [Finding(check, Status.SKIP, "no CDSP remoteproc (see above)")]
    findings = []
    for rproc in remoteprocs:
        control_file = rproc / "power" / "control"
        control = read_attribute(control_file)
        label = _remoteproc_label(rproc)
        if control == "on":
            findings.append(
                Finding(check, Status.OK, f"{label}: power/control is on (runtime PM off)")
            )
            continue
        shown = f'"{control}"' if control is not None else "unreadable"
        findings.append(
            Finding(
                check,
                Status.FAIL,
                f"{label}: power/control is {shown}; the CDSP must not be runtime-suspended",
                f"echo on | sudo tee {control_file} (the udev rule from "
                "scripts/install.sh and scripts/deploy_npu.sh set it at every boot)",
            )
        )
    return findings
