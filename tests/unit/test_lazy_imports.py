"""Start-up loads only what the daemon needs: no tools, no cryptography, no emulator on a device."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap


def modules_after(program: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``program``."""
    code = textwrap.dedent(program) + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return set(json.loads(result.stdout.splitlines()[-1]))


def test_importing_the_daemon_loads_no_tool_and_no_cryptography() -> None:
    loaded = modules_after("import npud.daemon.main")
    unwanted = {
        "npud.ops.doctor",
        "npud.ops.doctor_checks",
        "npud.ops.sign_shell",
        "npud.sim.driver",
    }
    assert not loaded & unwanted
    assert not {name for name in loaded if name.startswith("cryptography")}


def test_the_kernel_profile_never_loads_the_emulator() -> None:
    loaded = modules_after(
        """
        from npud.ops.backend import select_profile
        from npud.ops.config import parse_config
        from npud.fastrpc.kernel.driver import KernelDriver
        profile = select_profile(parse_config(""), "kernel")
        assert isinstance(profile.make_driver(), KernelDriver)
        """
    )
    assert not {name for name in loaded if name.startswith("npud.sim")}


def test_the_emulator_loads_when_the_emulator_profile_makes_its_driver() -> None:
    program = textwrap.dedent(
        """
        from npud.ops.backend import select_profile
        from npud.ops.config import parse_config
        profile = select_profile(parse_config(""), "emulator")
        assert profile.library_path[0].name == "dsp_libs"
        """
    )
    assert "npud.sim.driver" not in modules_after(program)
    assert "npud.sim.driver" in modules_after(program + "\nprofile.make_driver()\n")


def test_the_doctor_still_runs_from_the_daemons_command() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "npud.daemon.main", "doctor", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0
    assert "npud doctor" in result.stdout


def test_the_serving_daemon_loads_no_numpy_and_no_onnxruntime() -> None:
    # npud imports npu_client for its transport; the client's numpy support (an
    # optional extra) and the emulator's onnxruntime load only when a model runs.
    loaded = modules_after(
        "import npud.daemon.server, npud.daemon.broker, npud.datapath.workers, npud.ops.backend"
    )
    heavy = {"numpy", "onnxruntime", "onnx"}
    assert not {name for name in loaded if name.split(".")[0] in heavy}


def test_the_serving_daemon_parses_no_model_idl_and_loads_no_model_code() -> None:
    # The reverse-RPC services' IDL (remotectl, the listener, apps_std) comes with the
    # modules every session needs; apps_mem's, portal_qnn's and the emulator's skels'
    # is parsed at its first use, the model code (npud.requests.models, portal_qnn, the ONNX
    # reader) loaded at the first load.
    loaded = modules_after(
        """
        import npud.daemon.main, npud.daemon.server, npud.daemon.broker, npud.datapath.workers, npud.ops.backend
        import npud.requests, npud.sim.driver, npud.sim.pd_host, npud.sim.process
        from npud.fastrpc.reverse.apps_mem import apps_mem_idl
        from npud.sim.skels import load_idl
        assert apps_mem_idl.cache_info().currsize == 0
        assert load_idl.cache_info().currsize == 0
        """
    )
    deferred = {
        "npud.requests.models",
        "npud.fastrpc.stubs.portal_qnn",
        "npud.fastrpc.stubs.model_format",
        "npud.formats.onnx_proto",
    }
    assert not loaded & deferred


def test_an_idl_is_parsed_at_its_first_use_and_once() -> None:
    loaded = modules_after(
        """
        import sys
        from npud.fastrpc.reverse.apps_mem import apps_mem_idl
        from npud.sim.skels import EchoSkel, load_idl
        assert apps_mem_idl.cache_info().currsize == 0
        interface = apps_mem_idl()
        assert interface.name == "apps_mem" and apps_mem_idl() is interface
        assert EchoSkel().methods()[0].name == "echo"
        assert load_idl("echo") is load_idl("echo")
        assert apps_mem_idl.cache_info().currsize == 1
        """
    )
    assert "npud.idl" in loaded


def test_the_emulators_zygote_starts_with_the_profile_and_the_driver_shares_it() -> None:
    modules_after(
        """
        from npud.ops.backend import select_profile
        from npud.ops.config import parse_config
        from npud.sim.pd_host import live_zygotes
        profile = select_profile(parse_config(""), "emulator")
        with profile.zygote_started():
            started = live_zygotes()
            assert len(started) == 1
            driver = profile.make_driver()
            assert live_zygotes() == started
            driver.shutdown()
            assert live_zygotes() == started  # the profile's lease still holds it
        assert live_zygotes() == []
        """
    )


def test_no_zygote_starts_on_a_device_or_with_pd_threads() -> None:
    loaded = modules_after(
        """
        from npud.ops.backend import select_profile
        from npud.ops.config import parse_config
        for text, kind in (("", "kernel"), ("[emulator]\\npd_isolation = 'thread'\\n", "emulator")):
            with select_profile(parse_config(text), kind).zygote_started():
                pass
        """
    )
    assert "npud.sim.pd_host" not in loaded


def test_choosing_a_profile_loads_no_driver_and_no_shell_code() -> None:
    # npud chooses its profile first and starts the emulator's zygote with it: cheap.
    loaded = modules_after(
        """
        from npud.ops.backend import select_profile
        from npud.ops.config import parse_config
        for kind in ("kernel", "emulator", "auto"):
            select_profile(parse_config(""), kind)
        """
    )
    assert not loaded & {"npud.fastrpc.kernel.driver", "npud.fastrpc.trust.shell", "npu_protocol"}
