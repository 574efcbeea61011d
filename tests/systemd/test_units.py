"""What the units promise, and that they agree with npud and with each other.

The socket path, config path, device nodes and users appear in several files
(the units, sysusers.d, tmpfiles.d, the udev rule, install.sh, npud's own
defaults); these tests fail when one of them changes alone.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import textwrap

import pytest

from npud.fastrpc.kernel import abi
from npud.ops import config
from tests.systemd.units import (
    REPO,
    SERVICE,
    SOCKET,
    SYSUSERS,
    TMPFILES,
    UDEV_RULES,
    config_lines,
    install_script_venv,
    read_unit,
    seconds,
)

service = read_unit(SERVICE)
socket_unit = read_unit(SOCKET)


def _exec_start() -> list[str]:
    return shlex.split(service.value("Service", "ExecStart"))


def _sysusers() -> tuple[set[str], dict[str, str], set[tuple[str, str]]]:
    """(groups, user -> primary group, (user, group) memberships) from sysusers.d."""
    groups: set[str] = set()
    users: dict[str, str] = {}
    members: set[tuple[str, str]] = set()
    for fields in config_lines(SYSUSERS):
        kind, name = fields[0], fields[1]
        if kind == "g":
            groups.add(name)
        elif kind == "u":
            uid_gid = fields[2]
            users[name] = uid_gid.split(":", 1)[1] if ":" in uid_gid else name
        elif kind == "m":
            members.add((name, fields[2]))
        else:
            pytest.fail(f"unexpected sysusers.d line type {kind!r}")
    return groups, users, members


def test_service_is_notify_with_watchdog_reload_and_restart_limits() -> None:
    # systemd 252 (Debian 12) has no Type=notify-reload; reload is SIGHUP.
    assert service.value("Service", "Type") == "notify"
    assert service.value("Service", "NotifyAccess") == "main"
    assert service.value("Service", "ExecReload") == "/bin/kill -HUP $MAINPID"
    assert seconds(service.value("Service", "WatchdogSec")) > 0
    assert service.value("Service", "Restart") == "on-failure"
    # What stays wrong however often it restarts: a bad command line, a bad configuration
    # (npud's sysexits statuses, npud --help).
    assert service.value("Service", "RestartPreventExitStatus").split() == ["64", "78"]
    assert int(service.value("Unit", "StartLimitBurst")) > 0
    assert seconds(service.value("Unit", "StartLimitIntervalSec")) > 0


def test_stop_timeout_leaves_room_for_the_shutdown_grace() -> None:
    grace = config.DaemonConfig().shutdown_grace_s
    assert seconds(service.value("Service", "TimeoutStopSec")) > grace


def test_exec_start_matches_npud_defaults_and_the_install_script() -> None:
    argv = _exec_start()
    assert argv[0] == f"{install_script_venv()}/bin/npud"
    assert argv[argv.index("--config") + 1] == config.DEFAULT_CONFIG
    # On the device a missing NPU must fail, not fall back to the emulator.
    assert argv[argv.index("--backend") + 1] == "kernel"


def test_hardening_the_issue_asks_for() -> None:
    def one(key: str) -> str:
        return service.value("Service", key)

    assert one("DevicePolicy") == "closed"
    assert sorted(service.values("Service", "DeviceAllow")) == sorted(
        f"{node} rw" for node in abi.CDSP_NODES
    )
    assert one("ProtectSystem") == "strict"
    assert one("ProtectHome") == "yes"
    assert one("PrivateTmp") == "yes"
    assert one("NoNewPrivileges") == "yes"
    assert one("RestrictAddressFamilies") == "AF_UNIX"
    assert one("CapabilityBoundingSet") == ""
    assert one("AmbientCapabilities") == ""
    filters = service.values("Service", "SystemCallFilter")
    assert filters[0] == "@system-service"
    assert "~@privileged" in " ".join(filters[1:]).split()
    assert one("User") == "npud"


def test_socket_matches_npud_default_path_and_mode() -> None:
    assert socket_unit.value("Socket", "ListenStream") == config.DEFAULT_SOCKET
    assert socket_unit.value("Socket", "SocketMode") == config.DaemonConfig().socket_mode
    assert socket_unit.value("Socket", "Accept") == "no"
    assert "npud.socket" in service.value("Unit", "Requires").split()


def test_users_and_groups_named_by_the_units_are_declared() -> None:
    groups, users, members = _sysusers()
    user = service.value("Service", "User")
    assert user in users
    assert service.value("Service", "Group") == users[user]
    assert users[user] in groups
    for group in service.value("Service", "SupplementaryGroups").split():
        assert group in groups
        assert (user, group) in members
    assert socket_unit.value("Socket", "SocketUser") in users
    assert socket_unit.value("Socket", "SocketGroup") in groups


def test_the_groups_deploy_md_adds_users_to_are_the_ones_that_let_them_in() -> None:
    """deploy.md tells the admin which groups to put users in (usermod -aG); each must be
    declared by sysusers.d, and do what the doc says: npu reaches the socket (its
    group), npu-realtime is what the shipped npud.toml grants realtime to; and the
    shipped config must not grant realtime or access to everyone (issue 16, item 12)."""
    doc = (REPO / "docs" / "deploy.md").read_text()
    added = {
        group for groups in re.findall(r"usermod -aG ([\w,-]+)", doc) for group in groups.split(",")
    }
    declared, _, _ = _sysusers()
    assert added == {"npu", "npu-realtime"}
    assert added <= declared
    assert socket_unit.value("Socket", "SocketGroup") == "npu"
    shipped = config.load_config(REPO / "config" / "npud.toml")
    assert shipped.access.realtime_groups == ("npu-realtime",)
    assert (shipped.access.realtime_uids, shipped.access.realtime_gids) == ((), ())
    assert shipped == config.Config(), "the shipped example is the defaults"


def test_runtime_directory_agrees_with_tmpfiles_and_the_socket() -> None:
    runtime_dir = "/run/" + service.value("Service", "RuntimeDirectory")
    assert config.DEFAULT_SOCKET.startswith(runtime_dir + "/")
    [entry] = [fields for fields in config_lines(TMPFILES) if fields[1] == runtime_dir]
    kind, _path, mode, owner, group = entry[:5]
    assert kind == "d"
    assert mode == service.value("Service", "RuntimeDirectoryMode")
    assert owner == service.value("Service", "User")
    assert group == socket_unit.value("Socket", "SocketGroup")
    # Removing the directory on stop would delete npud.socket's socket file.
    assert service.value("Service", "RuntimeDirectoryPreserve") == "yes"


_UDEV_KEYS = {"ACTION", "SUBSYSTEM", "KERNEL", "ATTR", "GROUP", "MODE", "TAG", "OWNER"}
_UDEV_PAIR = re.compile(
    r'^(?P<key>[A-Z]+)(?:\{(?P<attr>[a-z_/]+)\})?(?P<op>==|!=|\+=|=)"(?P<value>[^"]*)"$'
)


def _udev_rules() -> list[list[dict[str, str]]]:
    rules = []
    for number, raw in enumerate(UDEV_RULES.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pairs = []
        for part in line.split(", "):
            match = _UDEV_PAIR.match(part)
            assert match, f"{UDEV_RULES.name}:{number}: cannot parse {part!r}"
            assert match["key"] in _UDEV_KEYS, f"{UDEV_RULES.name}:{number}: {match['key']}"
            pairs.append(match.groupdict(default=""))
        rules.append(pairs)
    return rules


def test_udev_gives_both_nodes_to_the_daemons_device_group() -> None:
    _groups, _users, members = _sysusers()
    device_group = next(group for user, group in members if user == "npud")
    by_kernel = {}
    for rule in _udev_rules():
        kernel = [p["value"] for p in rule if p["key"] == "KERNEL" and p["op"] == "=="]
        if kernel:
            by_kernel[kernel[0]] = {p["key"]: p["value"] for p in rule if p["op"] == "="}
    for node in abi.CDSP_NODES:
        assigned = by_kernel[node.removeprefix("/dev/")]
        assert assigned["GROUP"] == device_group
        assert assigned["MODE"] == "0660"


def test_udev_turns_runtime_pm_off_for_the_cdsp() -> None:
    pm_rules = [
        rule
        for rule in _udev_rules()
        if any(p["attr"] == "power/control" and p["op"] == "=" for p in rule)
    ]
    assert pm_rules
    for rule in pm_rules:
        assert {"key": "SUBSYSTEM", "attr": "", "op": "==", "value": "remoteproc"} in rule
        assert {"key": "ATTR", "attr": "power/control", "op": "=", "value": "on"} in rule


_MDWE_PROBE = textwrap.dedent(
    """
    import ctypes, errno, mmap, pkgutil, sys
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 65, 1
    if libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0:
        sys.exit(77 if ctypes.get_errno() == errno.EINVAL else 1)
    try:
        mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    except PermissionError:
        pass
    else:
        sys.exit("PR_SET_MDWE did not take effect")
    callback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(lambda a, b: 0)
    values = (ctypes.c_int * 3)(3, 1, 2)
    libc.qsort(values, 3, ctypes.sizeof(ctypes.c_int), callback)
    import npud
    for module in pkgutil.walk_packages(npud.__path__, "npud."):
        if not module.name.endswith(".__main__"):
            __import__(module.name)
    print("ok")
    """
)


def test_npud_imports_under_memory_deny_write_execute() -> None:
    # MemoryDenyWriteExecute=yes forbids writable+executable memory. The
    # kernel's PR_SET_MDWE (Linux 6.3+) enforces the same rule on this process,
    # so importing every npud module and running a ctypes callback (libffi
    # closure) under it shows the daemon does not need W+X pages.
    result = subprocess.run(
        [sys.executable, "-c", _MDWE_PROBE], capture_output=True, text=True, check=False
    )
    if result.returncode == 77:
        pytest.skip("kernel without PR_SET_MDWE (needs Linux 6.3+)")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "ok"
