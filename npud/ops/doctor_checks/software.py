"""The software npud loads: the signed DSP shell and its key, the QAIRT host
libraries and the DSP-side library.
"""

from __future__ import annotations

import os
from typing import Final

from npud.fastrpc.kernel.errors import ShellVerifyError
from npud.fastrpc.trust.shell import is_development_key, key_fingerprint, load_public_key_file
from npud.ops.doctor_checks.target import DEPLOY_FIX, SIGNING_FIX, Finding, Status, Target

QAIRT_HOST_LIBRARIES: Final = ("libQnnHtp.so", "libQnnSystem.so", "libQnnHtpV73Stub.so")
"""What config/portal-npu.sh says ``$QAIRT_ROOT/lib`` holds for QNN on the HTP."""
DSP_SKEL_LIBRARY: Final = "libQnnHtpV73Skel.so"
"""The HTP's DSP-side library, found through npud's DSP library path."""


def check_signing_key(target: Target) -> tuple[Finding, bool]:
    """The kernel profile's public key; also whether the shell can be checked with it."""
    check = "shell signing key"
    profile = target.kernel_profile()
    path = profile.public_key_path
    if not os.path.lexists(path):
        # Said here rather than by load_public_key_file, which has no message for it.
        return (
            Finding(
                check,
                Status.FAIL,
                f"public key {path} does not exist",
                "install your key's public half: " + SIGNING_FIX,
            ),
            False,
        )
    try:
        key = load_public_key_file(path, trusted_uids=profile.trusted_uids)
    except ShellVerifyError as exc:
        detail, fix = _split_fix(exc.reason)
        return Finding(check, Status.FAIL, detail, fix or SIGNING_FIX), False
    if is_development_key(key):
        return (
            Finding(
                check,
                Status.FAIL,
                f"{path} is the development key, whose private half is public; "
                "npud refuses it on the device",
                "make your own key (npud-sign-shell genkey), sign the shell with it and "
                "install its .pub: " + SIGNING_FIX,
            ),
            False,
        )
    return Finding(
        check, Status.OK, f"{path}: Ed25519, fingerprint {key_fingerprint(key)[:16]}"
    ), True


def check_shell(target: Target, key_usable: bool) -> Finding:
    """The shell, its .sha256 and .sig: present, owned, not writable, matching, signed."""
    check = "DSP shell"
    profile = target.kernel_profile()
    if not key_usable:
        return Finding(
            check,
            Status.SKIP,
            f"{profile.shell_path} not checked: no usable signing key (see above)",
        )
    try:
        verified = profile.verify_shell()
    except ShellVerifyError as exc:
        detail, fix = _split_fix(exc.reason)
        return Finding(check, Status.FAIL, detail, fix or SIGNING_FIX)
    return Finding(
        check,
        Status.OK,
        f"{verified.path}: {verified.size} bytes, sha256 {verified.sha256[:16]}..., "
        "digest and signature valid",
    )


def _split_fix(reason: str) -> tuple[str, str]:
    """Shell verification messages end in "; fix: ..." where they know the fix."""
    detail, _, fix = reason.partition("; fix: ")
    return detail, fix


def check_qairt(target: Target) -> Finding:
    check = "QAIRT runtime"
    lib = target.path(target.qairt_root) / "lib"
    missing = [name for name in QAIRT_HOST_LIBRARIES if not (lib / name).is_file()]
    if not missing:
        return Finding(check, Status.OK, f"{lib}: {', '.join(QAIRT_HOST_LIBRARIES)}")
    return Finding(
        check,
        Status.FAIL,
        f"{lib} lacks {', '.join(missing)} (QAIRT_ROOT={target.qairt_root})",
        DEPLOY_FIX + " (or set QAIRT_ROOT to where the runtime is)",
    )


def check_dsp_libraries(target: Target) -> Finding:
    """The HTP skel in npud's DSP library path: what the DSP asks npud for."""
    check = "DSP libraries"
    directories = target.kernel_profile().library_path
    for directory in directories:
        if (directory / DSP_SKEL_LIBRARY).is_file():
            return Finding(check, Status.OK, f"{directory / DSP_SKEL_LIBRARY}")
    return Finding(
        check,
        Status.FAIL,
        f"{DSP_SKEL_LIBRARY} is in none of {', '.join(map(str, directories))} "
        "(npud's DSP library path)",
        DEPLOY_FIX,
    )
