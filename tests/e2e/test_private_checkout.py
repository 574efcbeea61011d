"""npud from a checkout other users cannot read (issue 27): root's home is 0700, and a
clone there is root's alone. As root, an emulated DSP process confines itself to
another user (``[emulator] pd_user``); what it imports after that, it cannot read. So
the zygote that forks them imports everything a child runs before it drops its
privileges, the driver's own skels included."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Final

import numpy as np
import pytest

import npu_client
from npud.fastrpc.session import FastRpcSession
from npud.ops.backend import DEV_SHELL
from npud.sim import DSP_LIBRARY_DIR, EmulatedDriver, SimConfig
from npud.sim.builtin_skels import BUILTIN_SKELS
from npud.sim.pd_spawner import skel_modules
from tests.e2e.daemon import Npud, wait_until_serving
from tests.emulator import onnx_models, probe_skel

REPO: Final = Path(__file__).resolve().parents[2]
SOURCES: Final = ("npud", "idl", "protocol/src", "client/src")
"""What npud runs from (npud/idl/files is a link to idl/)."""


def _private_checkout(tmp_path: Path) -> Path:
    checkout = tmp_path / "checkout"
    checkout.mkdir(mode=0o700)
    checkout.chmod(0o700)
    for source in SOURCES:
        shutil.copytree(
            REPO / source,
            checkout / source,
            symlinks=True,
            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"),
        )
    return checkout


@pytest.mark.skipif(os.geteuid() != 0, reason="as another user, DSP processes run as that user")
def test_a_model_loads_and_runs_from_a_checkout_only_root_can_read(tmp_path: Path) -> None:
    checkout = _private_checkout(tmp_path)
    path = [str(checkout), str(checkout / "protocol" / "src"), str(checkout / "client" / "src")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    where = subprocess.run(
        [sys.executable, "-c", "import npud, npu_protocol; print(npud.__file__)"],
        env=env,
        cwd=checkout,
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(where.stdout.strip()).is_relative_to(checkout)  # not this tree's npud

    run = tmp_path / "run"
    run.mkdir()
    config = run / "npud.toml"
    config.write_text("[backend]\nkind = 'emulator'\n")
    log_path = run / "npud.log"
    socket_path = run / "npud.sock"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "npud.daemon.main", "--config", str(config),
             "--socket", str(socket_path), "--log-format", "json"],
            env=env,
            cwd=checkout,
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    daemon = Npud(process, socket_path, log_path, config)
    model_path = run / "affine.onnx"
    model_path.write_bytes(onnx_models.affine())
    try:
        wait_until_serving(daemon)
        with (
            npu_client.connect(str(socket_path), name="private", timeout=60) as npu,
            npu.load_model(model_path) as model,
        ):
            a = np.array([1, 2, 3], np.float32)
            out = model.run({"a": a, "b": np.full(3, 0.5, np.float32), "k": 41})
            np.testing.assert_array_equal(out["y"], a * 2 + 0.5)
            assert int(out["n"]) == 42
        assert daemon.stop() == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert "No module named" not in daemon.log()


def test_the_driver_has_its_own_skels_imported_before_the_children_confine(
    tmp_path: Path,
) -> None:
    """A skel outside npud (the tests' probe) is found in a child by its module: the
    zygote that forks the driver's children imports that module before it confines
    itself; npud's own skels are its PRELOAD, so the built-in table asks for nothing
    more (and shares the zygote)."""
    assert skel_modules(BUILTIN_SKELS) == ()
    assert skel_modules(probe_skel.PROBE_SKELS) == ("tests.emulator.probe_skel",)
    library = tmp_path / "dsp"
    library.mkdir()
    probe_skel.write_descriptor(library)
    for path in DSP_LIBRARY_DIR.iterdir():
        (library / path.name).write_bytes(path.read_bytes())
    driver = EmulatedDriver(SimConfig(skels=probe_skel.PROBE_SKELS, pd_isolation="process"))
    try:
        session = FastRpcSession.open(driver, library_path=(library,))
        try:
            session.load_shell(DEV_SHELL.read_bytes())
            session.remote_open(probe_skel.URI)  # made in the child: found by its module
            child = driver.pd_pid(session.fileno())
            assert child is not None
            status = Path(f"/proc/{child}/status").read_text()
            zygote = int(status.split("PPid:")[1].split()[0])
            argv = Path(f"/proc/{zygote}/cmdline").read_bytes().split(b"\0")
            assert argv[argv.index(b"--preload") + 1] == b"tests.emulator.probe_skel", argv
        finally:
            session.close()
    finally:
        driver.shutdown()
