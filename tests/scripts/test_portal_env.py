"""config/portal-npu.sh: sourced (twice) in real shells, the variables it leaves behind."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.scripts.snapshots import REPO
from tests.tools import require_tool

SCRIPT = REPO / "config" / "portal-npu.sh"
SHOW = 'printf "%s\\n" "$QAIRT_ROOT" "$LD_LIBRARY_PATH" "$ADSP_LIBRARY_PATH"'


def source_and_show(
    shell: str, env: dict[str, str], *, times: int = 2, prelude: str = ""
) -> subprocess.CompletedProcess[str]:
    sourcing = "; ".join([f". {SCRIPT}"] * times)
    return subprocess.run(
        [shell, "-c", f"{prelude}{sourcing}; {SHOW}"],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )


@pytest.fixture
def runtime(tmp_path: Path) -> dict[str, str]:
    """QAIRT_ROOT and NPU_DSP_LIBRARY_DIR pointing at directories that exist."""
    (tmp_path / "qairt" / "lib").mkdir(parents=True)
    (tmp_path / "dsp").mkdir()
    return {"QAIRT_ROOT": str(tmp_path / "qairt"), "NPU_DSP_LIBRARY_DIR": str(tmp_path / "dsp")}


def test_sourcing_twice_sets_each_entry_once(runtime: dict[str, str]) -> None:
    result = source_and_show("bash", runtime, prelude="set -eu; ")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    qairt, ld_path, adsp_path = result.stdout.splitlines()
    assert qairt == runtime["QAIRT_ROOT"]
    assert ld_path == f"{runtime['QAIRT_ROOT']}/lib"  # no trailing ':' (the cwd)
    assert adsp_path == runtime["NPU_DSP_LIBRARY_DIR"]


def test_existing_paths_are_kept_after_ours(runtime: dict[str, str]) -> None:
    env = {**runtime, "LD_LIBRARY_PATH": "/a:/b", "ADSP_LIBRARY_PATH": "/x;/y"}
    result = source_and_show("bash", env)
    assert result.returncode == 0, result.stderr
    _qairt, ld_path, adsp_path = result.stdout.splitlines()
    assert ld_path == f"{runtime['QAIRT_ROOT']}/lib:/a:/b"
    assert adsp_path == f"{runtime['NPU_DSP_LIBRARY_DIR']};/x;/y"


def test_an_entry_already_present_is_not_added_again(runtime: dict[str, str]) -> None:
    ours = f"{runtime['QAIRT_ROOT']}/lib"
    env = {**runtime, "LD_LIBRARY_PATH": f"/a:{ours}:/b"}
    result = source_and_show("bash", env, times=3)
    _qairt, ld_path, _adsp = result.stdout.splitlines()
    assert ld_path == f"/a:{ours}:/b"


def test_defaults_are_the_deployed_locations_and_missing_ones_are_reported() -> None:
    result = source_and_show("bash", {}, times=1)
    assert result.returncode == 0
    qairt, ld_path, adsp_path = result.stdout.splitlines()
    assert qairt == "/opt/qcom/qairt/2.44"
    assert ld_path == "/opt/qcom/qairt/2.44/lib"
    assert adsp_path == "/usr/lib/dsp/cdsp"
    if not Path("/opt/qcom/qairt/2.44/lib").is_dir():
        assert "/opt/qcom/qairt/2.44/lib does not exist" in result.stderr


@pytest.mark.parametrize("shell", ["sh", "dash"])
def test_posix_shells_give_the_same_result(shell: str, runtime: dict[str, str]) -> None:
    require_tool(shell, "dash")
    env = {**runtime, "LD_LIBRARY_PATH": "/a"}
    result = source_and_show(shell, env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1:] == [
        f"{runtime['QAIRT_ROOT']}/lib:/a",
        runtime["NPU_DSP_LIBRARY_DIR"],
    ]


def test_leaves_no_helper_function_behind(runtime: dict[str, str]) -> None:
    result = subprocess.run(
        ["bash", "-c", f". {SCRIPT}; declare -F _npu_path_with || echo gone"],
        env={"PATH": "/usr/bin:/bin", **runtime},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.stdout.strip() == "gone"
