"""npud.toml's sections about the daemon itself: ``[daemon]`` (socket, logging,
shutdown), ``[backend]`` (which driver, which device), ``[shell]`` (the DSP shell
and its signature) and ``[access]`` (who may connect, who is realtime)."""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec

from npud.fastrpc.kernel import abi
from npud.ops.config_values import Id, Seconds, doc

DEFAULT_SOCKET: Final = "/run/npud/npud.sock"
DEFAULT_KERNEL_SHELL: Final = "/usr/lib/dsp/cdsp/fastrpc_shell_unsigned_3"
DEFAULT_KERNEL_PUBLIC_KEY: Final = "/etc/npud/shell-signing.pub"
DEFAULT_KERNEL_LIBRARY_PATH: Final = ("/usr/lib/dsp/cdsp", "/usr/lib/dsp", "/usr/lib/rfsa/adsp")

Backend = Literal["auto", "kernel", "emulator"]
LogFormat = Literal["auto", "json", "console"]
LogLevel = Literal["debug", "info", "warning", "error"]


class DaemonConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """The socket, logging and shutdown. A reload (SIGHUP) applies log_level; the rest
    needs a restart."""

    socket: Annotated[
        str, doc("Listening socket, when systemd does not pass one (socket activation).")
    ] = DEFAULT_SOCKET
    socket_mode: Annotated[
        str,
        msgspec.Meta(pattern=r"^0?[0-7]{3}$"),
        doc("Permission bits of the socket, octal, as a string."),
    ] = "0660"
    socket_group: Annotated[
        str,
        doc(
            "Group that owns the socket; empty keeps the daemon's own group. Under systemd "
            "leave it empty: the socket unit sets the group (npu)."
        ),
    ] = ""
    log_format: Annotated[
        LogFormat,
        doc(
            "auto: JSON lines when stderr is not a terminal (the journal, with syslog "
            "priority prefixes), readable text on a terminal."
        ),
    ] = "auto"
    log_level: Annotated[LogLevel, doc("The least severe level that is logged.")] = "info"
    shutdown_grace_s: Annotated[
        Seconds, doc("Seconds that calls already running on the DSP get to finish at shutdown.")
    ] = 10.0
    hello_timeout_s: Annotated[
        float,
        msgspec.Meta(gt=0, le=3600),
        doc("Seconds a new connection has to send its Hello before it is closed."),
    ] = 5.0
    max_handshakes: Annotated[
        int,
        msgspec.Meta(ge=1, le=100_000),
        doc(
            "Connections that have not said Hello yet, all users together; more are refused "
            "at once. They are counted apart from clients, so sockets that connect and say "
            "nothing cannot shut clients out."
        ),
    ] = 64
    max_handshakes_per_uid: Annotated[
        int,
        msgspec.Meta(ge=1, le=100_000),
        doc("Connections of one user that have not said Hello yet."),
    ] = 8
    frame_timeout_s: Annotated[
        float,
        msgspec.Meta(gt=0, le=3600),
        doc("Seconds a welcomed client may leave a frame half sent before it is dropped."),
    ] = 10.0
    call_watchdog_s: Annotated[
        float,
        msgspec.Meta(ge=0, le=86_400),
        doc(
            "A DSP call still running after this many seconds is taken as hung: it is "
            "reported, the DSP process of its domain is ended and that domain's session "
            "restarted (the domain's clients are told; other domains see nothing), and its "
            "client pays (hung_call_penalty). 0 turns the watchdog off."
        ),
    ] = 30.0
    hung_call_penalty: Annotated[
        Literal["throttle", "revoke"],
        doc(
            "What the client whose call the watchdog caught pays, beyond the restart of its "
            "domain's DSP process: throttle runs its calls one at a time in the background "
            "class for hung_call_throttle_s; revoke closes its connection at once."
        ),
    ] = "throttle"
    hung_call_throttle_s: Annotated[
        float,
        msgspec.Meta(ge=0, le=86_400),
        doc("Seconds a client stays throttled after a call of it hung."),
    ] = 60.0
    hung_calls_before_revoke: Annotated[
        int,
        msgspec.Meta(ge=0, le=1000),
        doc(
            "A client whose calls hung this many times is revoked (its connection closed "
            "with NOT_PERMITTED), whatever hung_call_penalty says; 0 never revokes."
        ),
    ] = 2
    dropped_connections_before_refusal: Annotated[
        int,
        msgspec.Meta(ge=0, le=1000),
        doc(
            "A user whose connections npud dropped for breaking the protocol (a fatal frame, "
            "too many stray fds, too many requests refused NOT_PERMITTED) this many times "
            "has its new connections refused (NOT_PERMITTED) for dropped_connection_penalty_s "
            "after the last drop; root and npud's own user are exempt; 0 never refuses."
        ),
    ] = 3
    dropped_connection_penalty_s: Annotated[
        float,
        msgspec.Meta(ge=0, le=86_400),
        doc("Seconds a dropped connection counts against its user."),
    ] = 60.0
    refused_requests_before_drop: Annotated[
        int,
        msgspec.Meta(ge=0, le=1_000_000),
        doc(
            "A connection whose requests were refused NOT_PERMITTED this many times is "
            "dropped for breaking the protocol (and counts against its user); 0 never drops."
        ),
    ] = 64
    log_burst: Annotated[
        int,
        msgspec.Meta(ge=1, le=1_000_000),
        doc(
            "Lines one connection may log about its refused requests and stray fds before "
            "the rest are counted and summed up in one line every log_summary_interval_s."
        ),
    ] = 20
    log_summary_interval_s: Annotated[
        float,
        msgspec.Meta(gt=0, le=3600),
        doc("Seconds between the summary lines of a connection whose lines are held back."),
    ] = 10.0
    model_check_s: Annotated[
        float,
        msgspec.Meta(gt=0, le=3600),
        doc(
            "Seconds the checks of one model file may take (its kind, external data, loops, "
            "shapes: a walk of its protobuf fields, on a thread of the load's own); a file "
            "that takes longer is refused MODEL_REJECTED. Real models take milliseconds; a "
            "file of millions of tiny fields takes seconds."
        ),
    ] = 10.0
    trace: Annotated[
        str,
        doc(
            "Record every FastRPC driver call, session operation and reverse-RPC call to this "
            "file (docs/trace-format.md); empty records nothing. The trace holds the bytes of "
            "buffers and of the files the DSP reads: keep it private. --trace overrides it."
        ),
    ] = ""

    @property
    def socket_mode_bits(self) -> int:
        return int(self.socket_mode, 8)


class BackendConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """The driver npud runs on: the kernel's FastRPC device, or the built-in emulator.
    Changes need a restart."""

    kind: Annotated[
        Backend,
        doc(
            "auto uses the kernel driver where a device node exists and the emulator "
            "otherwise; kernel fails without a device (--backend overrides this key)."
        ),
    ] = "auto"
    nodes: Annotated[
        tuple[str, ...],
        doc("Device nodes to try, in order (libcdsprpc's order: the secure node first)."),
    ] = abi.CDSP_NODES
    library_path: Annotated[
        tuple[str, ...],
        doc(
            "Directories the DSP may load skel libraries from, served through reverse RPC. "
            "Empty: /usr/lib/dsp/cdsp, /usr/lib/dsp and /usr/lib/rfsa/adsp on the device; "
            "the emulator's own skel directory on the emulator."
        ),
    ] = ()


class ShellConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """The DSP shell npud verifies (SHA-256 and an Ed25519 signature, fail-closed) and
    loads. Changes need a restart."""

    path: Annotated[
        str,
        doc(
            "The DSP shell. Empty: /usr/lib/dsp/cdsp/fastrpc_shell_unsigned_3 on the device; "
            "the development shell that ships with npud on the emulator. PATH.sha256 and "
            "PATH.sig sit beside it."
        ),
    ] = ""
    public_key: Annotated[
        str,
        doc(
            "File with the Ed25519 public key (64 hex characters or PEM). Empty: "
            "/etc/npud/shell-signing.pub on the device; the development key on the emulator. "
            "The kernel backend refuses the development key."
        ),
    ] = ""
    trusted_uids: Annotated[
        tuple[Id, ...],
        doc("Owners allowed for the shell, its .sha256 and .sig, and the key file."),
    ] = (0,)


class AccessConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Who may connect and who may have the realtime class, checked with SO_PEERCRED.
    A reload (SIGHUP) applies changes without dropping clients."""

    allow_uids: Annotated[
        tuple[Id, ...],
        doc(
            "Users allowed to connect, besides root and the daemon's own user. Under "
            "systemd the socket's group (npu) already limits who can reach the socket."
        ),
    ] = ()
    allow_gids: Annotated[
        tuple[Id, ...],
        doc("Groups whose members may connect: primary or supplementary (usermod -aG)."),
    ] = ()
    realtime_uids: Annotated[
        tuple[Id, ...],
        doc(
            "Users who may be granted the realtime class (voice), besides root and the "
            "daemon's own user; anyone else asking for it gets normal. A reload that takes "
            "a user off demotes its live realtime connections."
        ),
    ] = ()
    realtime_gids: Annotated[
        tuple[Id, ...],
        doc("Groups (primary or supplementary) whose members may be granted realtime."),
    ] = ()
    realtime_groups: Annotated[
        tuple[Annotated[str, msgspec.Meta(pattern=r"^[a-z_][a-z0-9_-]{0,31}$")], ...],
        doc(
            "Groups, by name, whose members may be granted realtime (sysusers.d makes "
            "npu-realtime: add the voice service's user to it). A name the system does "
            "not know matches no one."
        ),
    ] = ("npu-realtime",)
