"""The running daemon: reached through its socket, its status judged, and whether
its DSP processes run unsigned.
"""

from __future__ import annotations

import errno
import os

import npu_client
from npu_protocol import DaemonStatus
from npud.ops.backend import EMULATED_SUFFIX
from npud.ops.doctor_checks.device import npu_present
from npud.ops.doctor_checks.target import SIGNING_FIX, Finding, Status, Target


def check_daemon(target: Target, *, timeout: float = 5.0) -> tuple[Finding, DaemonStatus | None]:
    """Connect to npud and report its status; say why and what to do when that fails."""
    check = "daemon"
    try:
        with npu_client.connect(target.socket, name="npud-doctor", timeout=timeout) as client:
            status = client.status()
    except npu_client.ConnectFailed as exc:
        return Finding(check, Status.FAIL, str(exc), connect_fix(exc.__cause__)), None
    except npu_client.NotPermitted as exc:
        fix = (
            f"add uid {os.getuid()} to [access] allow_uids (or a group to allow_gids) in "
            "/etc/npud/npud.toml, then sudo systemctl reload npud"
        )
        return Finding(check, Status.FAIL, f"npud refused this user: {exc}", fix), None
    except (npu_client.NpuError, OSError) as exc:
        return (
            Finding(
                check,
                Status.FAIL,
                f"npud at {target.socket} did not answer: {exc}",
                "systemctl status npud; journalctl -u npud -b",
            ),
            None,
        )
    return _judge_status(target, status), status


def _judge_status(target: Target, status: DaemonStatus) -> Finding:
    check = "daemon"
    others = max(status.totals.clients - 1, 0)  # the doctor's own connection is one
    shell = (
        f"shell verified (sha256 {status.shell.sha256[:16]}..., {status.shell.detail})"
        if status.shell.verified
        else f"shell NOT verified ({status.shell.detail or 'no detail'})"
    )
    device = f" on {status.device}" if status.device else ""
    if status.device and status.backend != "kernel" and EMULATED_SUFFIX not in status.device:
        device += f" {EMULATED_SUFFIX}"  # from a daemon that does not label it itself
    detail = (
        f"npud {status.daemon_version} at {target.socket}: backend {status.backend}{device}, "
        f"epoch {status.epoch}, {status.restarts} DSP restart(s), {others} other client(s), "
        f"{shell}"
    )
    if not status.shell.verified:
        return Finding(check, Status.FAIL, detail, "journalctl -u npud -b says why; " + SIGNING_FIX)
    emulated_by_choice = target.config.backend.kind == "emulator"
    if status.backend == "emulator" and npu_present(target) and not emulated_by_choice:
        return Finding(
            check,
            Status.WARN,
            detail + "; it runs on the emulator although this machine has an NPU",
            "it started before the CDSP was up (backend auto): sudo systemctl restart npud; "
            "the shipped unit runs --backend kernel to prevent this",
        )
    return Finding(check, Status.OK, detail)


def check_unsigned_pd(status: DaemonStatus) -> Finding | None:
    """WARN when the DSP answers UNSIGNED_PD_SUPPORT = 0 (None when it reported no
    capabilities). Advisory: libcdsprpc never reads the attribute, and npud asks for
    the unsigned PD anyway; a daemon that answers runs it, so the firmware accepted it."""
    dsp = status.dsp
    if not dsp.arch_ver:
        return None  # no capabilities reported (the DSP process is not up)
    check = "unsigned PD"
    if dsp.unsigned_pd_support:
        return Finding(check, Status.OK, f"the CDSP (Hexagon v{dsp.arch_ver:x}) has unsigned PDs")
    return Finding(
        check,
        Status.WARN,
        f"the CDSP firmware (Hexagon v{dsp.arch_ver:x}) answers UNSIGNED_PD_SUPPORT = 0, yet "
        "runs npud's unsigned PD (libcdsprpc never reads the attribute either)",
        'nothing while npud works; if a firmware update makes npud stop with "refused the '
        'unsigned PD", install a CDSP firmware with unsigned PD support',
    )


def connect_fix(cause: BaseException | None) -> str:
    """What to do about the OSError that stopped the connection."""
    if isinstance(cause, PermissionError):
        return (
            "add yourself to the socket's group: sudo usermod -aG npu $USER, then log in "
            "again (or run as a member of npu)"
        )
    if isinstance(cause, OSError) and cause.errno in (errno.ENOENT, errno.ECONNREFUSED):
        return (
            "npud is not running: sudo systemctl enable --now npud.socket (or start it by "
            "hand, `make run` in a checkout; --socket or NPUD_SOCKET if it listens elsewhere)"
        )
    return "systemctl status npud.socket npud.service; journalctl -u npud -b"
