"""The developer's scripts behind `make test` and `make run`: test-deps.sh and run-dev.sh.

Both are run for real with stand-ins on PATH (an apt-get that records what it
was asked, an npud that says READY=1 and prints its arguments), as root and,
where the tests run as root, as the user nobody.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest

import npu_client
from tests.scripts.snapshots import REPO

NOBODY: Final = 65534
IS_ROOT: Final = os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs root to act as root and as nobody")
BASH: Final = shutil.which("bash") or "/bin/bash"
BASIC_TOOLS: Final = ("cat", "id", "stat", "dirname", "mkdir", "readlink")
"""What the scripts use besides the tools under test: the only commands on PATH."""
SYSTEM_PYTHON: Final = shutil.which("python3", path="/usr/bin:/usr/local/bin:/bin")
"""A python3 every user can run (the venv's may live under /root): run-dev.sh's supervisor."""
needs_python = pytest.mark.skipif(SYSTEM_PYTHON is None, reason="no system python3")


@dataclass
class Sandbox:
    """A world-readable scratch directory: nobody must read the scripts and stand-ins."""

    root: Path

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def script(self, name: str) -> Path:
        return self.root / name

    def stub(self, name: str, body: str, *, interpreter: str = BASH) -> Path:
        path = self.bin / name
        path.write_text(f"#!{interpreter}\n{body}\n")
        path.chmod(0o755)
        return path

    def run(
        self, script: str, *args: str, as_nobody: bool = False, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [BASH, str(self.script(script)), *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
            env={"PATH": str(self.bin), "LANG": "C.UTF-8", **(env or {})},
            user=NOBODY if as_nobody else None,
            cwd=self.root,
        )


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    # Not tmp_path: pytest's directory is private to root, and nobody must get in.
    root = Path(os.path.realpath(os.environ.get("TMPDIR", "/tmp")))
    with tempfile.TemporaryDirectory(dir=root) as name:
        box = Sandbox(Path(name))
        box.root.chmod(0o755)
        box.bin.mkdir(mode=0o755)
        box.bin.chmod(0o755)
        for tool in BASIC_TOOLS:
            found = shutil.which(tool)
            assert found, tool
            (box.bin / tool).symlink_to(found)
        if SYSTEM_PYTHON is not None:
            (box.bin / "python3").symlink_to(SYSTEM_PYTHON)
        for script in ("test-deps.sh", "run-dev.sh", "run_until_ready.py"):
            shutil.copy(REPO / "scripts" / script, box.script(script))
        yield box


# --- test-deps.sh -------------------------------------------------------------------------

APT_STUB: Final = 'printf "%s\\n" "$*" >> "${0%/*}/../apt.log"'


def apt_calls(box: Sandbox) -> list[str]:
    log = box.root / "apt.log"
    return log.read_text().splitlines() if log.exists() else []


def test_help_explains_and_installs_nothing(sandbox: Sandbox) -> None:
    sandbox.stub("apt-get", APT_STUB)
    result = sandbox.run("test-deps.sh", "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Usage: test-deps.sh")
    for package in ("shellcheck", "systemd", "linux-libc-dev", "groff-base"):
        assert f"({package})" in result.stdout
    assert apt_calls(sandbox) == []


def test_a_bad_argument_is_a_usage_error(sandbox: Sandbox) -> None:
    result = sandbox.run("test-deps.sh", "--install-everything")
    assert result.returncode == 64
    assert "unknown argument: --install-everything" in result.stderr


def test_check_lists_what_is_missing_and_fails(sandbox: Sandbox) -> None:
    sandbox.stub("apt-get", APT_STUB)
    result = sandbox.run("test-deps.sh", "--check")
    assert result.returncode == 1
    assert "missing gcc make shellcheck systemd-analyze" in result.stderr
    assert "sudo apt-get install gcc make shellcheck systemd " in result.stderr
    assert apt_calls(sandbox) == []


@needs_root
def test_root_installs_each_missing_package_once(sandbox: Sandbox) -> None:
    sandbox.stub("apt-get", APT_STUB)
    sandbox.stub("shellcheck", "exit 0")  # present: not asked for
    result = sandbox.run("test-deps.sh")
    assert result.returncode == 0, result.stderr
    update, install = apt_calls(sandbox)
    assert update == "update -qq"
    packages = install.split()[install.split().index("--no-install-recommends") + 1 :]
    assert {"gcc", "make", "systemd", "zstd", "dash", "groff-base"} <= set(packages)
    assert "shellcheck" not in packages
    assert packages.count("systemd") == 1  # three tools, one package
    assert "installing" in result.stderr


@needs_root
def test_anyone_else_is_told_what_to_install(sandbox: Sandbox) -> None:
    sandbox.stub("apt-get", APT_STUB)
    result = sandbox.run("test-deps.sh", as_nobody=True)
    assert result.returncode == 0, result.stderr
    assert "sudo apt-get install gcc make shellcheck" in result.stderr
    assert "skip until then" in result.stderr
    assert apt_calls(sandbox) == []


# --- run-dev.sh (make run) ----------------------------------------------------------------

NPUD_STUB: Final = """\
import os, socket, sys
print("npud-stub: reading the configuration", file=sys.stderr, flush=True)
with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
    notify.sendto(b"READY=1\\nSTATUS=serving", os.environ["NOTIFY_SOCKET"])
print("npud " + " ".join(sys.argv[1:]))
"""
"""An npud that is ready at once (sd_notify, as npud tells systemd) and prints its arguments."""


def run_dev(
    box: Sandbox,
    socket: str = "",
    *args: str,
    as_nobody: bool = False,
    env: dict[str, str] | None = None,
    npud: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    if SYSTEM_PYTHON is None:
        pytest.skip("run-dev.sh needs a python3 every user can run")
    if npud is None:
        npud = box.stub("npud", NPUD_STUB, interpreter=SYSTEM_PYTHON)
    return box.run(
        "run-dev.sh", socket, *args, as_nobody=as_nobody, env={"NPUD": str(npud), **(env or {})}
    )


@pytest.fixture
def shared_tmp(sandbox: Sandbox) -> Path:
    """A /tmp-like directory: everyone may create entries, only in their own name."""
    path = sandbox.root / "tmp"
    path.mkdir()
    path.chmod(0o1777)
    return path


@needs_root
def test_a_person_gets_a_private_socket_and_is_told_where(
    sandbox: Sandbox, shared_tmp: Path
) -> None:
    result = run_dev(sandbox, as_nobody=True, env={"TMPDIR": str(shared_tmp)})
    assert result.returncode == 0, result.stderr
    socket = shared_tmp / f"npud-{NOBODY}" / "npud.sock"
    assert result.stdout.strip() == f"npud --backend auto --socket {socket}"
    assert f"export NPUD_SOCKET={socket}" in result.stderr
    st = (shared_tmp / f"npud-{NOBODY}").stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (NOBODY, 0o700)


@needs_root
def test_a_directory_squatted_by_someone_else_is_refused(
    sandbox: Sandbox, shared_tmp: Path
) -> None:
    (shared_tmp / f"npud-{NOBODY}").mkdir(mode=0o700)  # root's, not nobody's
    result = run_dev(sandbox, as_nobody=True, env={"TMPDIR": str(shared_tmp)})
    assert result.returncode == 73
    assert "is not a directory of yours" in result.stderr
    assert result.stdout == ""


@needs_root
def test_the_runtime_directory_is_preferred(sandbox: Sandbox) -> None:
    runtime = sandbox.root / "run-user"
    runtime.mkdir(mode=0o700)
    os.chown(runtime, NOBODY, NOBODY)
    result = run_dev(sandbox, as_nobody=True, env={"XDG_RUNTIME_DIR": str(runtime)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == f"{runtime}/npud/npud.sock"


@needs_root
def test_a_socket_the_person_cannot_create_is_refused_with_a_hint(sandbox: Sandbox) -> None:
    locked = sandbox.root / "locked"
    locked.mkdir(mode=0o755)
    result = run_dev(sandbox, f"{locked}/npud/npud.sock", as_nobody=True)
    assert result.returncode == 73
    assert f"cannot create {locked}/npud/npud.sock ({locked} is not writable" in result.stderr
    assert "SOCKET=" in result.stderr
    assert "npu group" in result.stderr
    assert result.stdout == ""


@needs_root
def test_root_serves_the_system_path_and_says_who_can_connect(sandbox: Sandbox) -> None:
    result = run_dev(sandbox)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "npud --backend auto --socket /run/npud/npud.sock"
    assert "only root can connect" in result.stderr
    assert "socket_group" in result.stderr


def test_an_explicit_socket_is_used_as_given(sandbox: Sandbox) -> None:
    socket = sandbox.root / "mine.sock"
    result = run_dev(sandbox, str(socket))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"npud --backend auto --socket {socket}"


def test_serving_is_said_once_npud_is_ready_and_not_before(sandbox: Sandbox) -> None:
    socket = sandbox.root / "mine.sock"
    result = run_dev(sandbox, str(socket))
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    starting = lines.index(f"make run: starting npud on {socket} as {_me()}")
    reading = lines.index("npud-stub: reading the configuration")
    serving = next(i for i, line in enumerate(lines) if line.startswith("make run: serving on"))
    assert starting < reading < serving
    assert lines[serving].endswith(f"in other terminals: export NPUD_SOCKET={socket}")


def test_an_npud_that_ends_before_it_is_ready_is_never_said_to_serve(sandbox: Sandbox) -> None:
    refusing = sandbox.stub("npud", 'echo "npud: bad configuration: x" >&2; exit 78')
    result = run_dev(sandbox, str(sandbox.root / "mine.sock"), npud=refusing)
    assert result.returncode == 78
    assert "make run: starting npud on" in result.stderr
    assert "serving" not in result.stderr
    assert result.stderr.endswith(
        "npud: bad configuration: x\nmake run: npud ended before it was ready (exit status 78)\n"
    )


def test_a_real_npud_with_a_bad_config_is_started_and_never_serving(sandbox: Sandbox) -> None:
    npud = REPO / ".venv" / "bin" / "npud"
    if not os.access(npud, os.X_OK):
        pytest.skip("no development venv")
    config = sandbox.root / "npud.toml"
    config.write_text("[daemon]\nlog_levl = 'info'\n")
    socket = str(sandbox.root / "mine.sock")
    result = run_dev(sandbox, socket, "--config", str(config), npud=npud)
    assert result.returncode == 78, result.stderr
    assert f"make run: starting npud on {socket}" in result.stderr
    assert "unknown key daemon.log_levl (did you mean log_level?)" in result.stderr
    assert "serving" not in result.stderr


@needs_root
def test_a_venv_python_the_person_cannot_run_is_named_with_one_to_use(
    sandbox: Sandbox, shared_tmp: Path
) -> None:
    private = sandbox.root / "private"  # like /root: only its owner gets in
    private.mkdir(mode=0o700)
    (private / "python3").symlink_to(SYSTEM_PYTHON or "/usr/bin/python3")
    venv_bin = sandbox.root / "venv-bin"
    venv_bin.mkdir(mode=0o755)
    (venv_bin / "python").symlink_to(private / "python3")
    npud = venv_bin / "npud"
    npud.write_text(f"#!{venv_bin}/python\nprint('npud ran')\n")
    npud.chmod(0o755)
    result = run_dev(sandbox, as_nobody=True, env={"TMPDIR": str(shared_tmp)}, npud=npud)
    assert result.returncode == 69
    assert result.stdout == ""
    assert "bad interpreter" not in result.stderr
    assert f"nobody cannot run {venv_bin}/python, the Python that {npud} names" in result.stderr
    # The first python3 on PATH that nobody can run: the sandbox links the system one.
    assert f"make clean && make install PYTHON={sandbox.bin}/python3" in result.stderr


def test_the_supervisor_passes_sigterm_on_and_exits_with_npuds_status(tmp_path: Path) -> None:
    """SIGTERM (systemctl, kill) reaches npud through the supervisor, and its status is
    the supervisor's (128 + 15 for a child killed by it)."""
    child = tmp_path / "npud"
    child.write_text(
        "import os, signal, socket\n"
        "with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:\n"
        "    s.sendto(b'READY=1', os.environ['NOTIFY_SOCKET'])\n"
        "signal.pause()\n"
    )
    with subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "run_until_ready.py"), "--prog", "t",
         "--ready", "up", "--", sys.executable, str(child)],
        stderr=subprocess.PIPE,
        text=True,
    ) as supervisor:  # fmt: skip
        assert supervisor.stderr is not None
        assert supervisor.stderr.readline() == "t: up\n"
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(timeout=60) == 128 + signal.SIGTERM
        assert supervisor.stderr.read() == ""  # it was ready: no "ended before" line


def _me() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name


def test_make_test_installs_the_tools_first_and_ci_forbids_skipping() -> None:
    makefile = (REPO / "Makefile").read_text()
    assert "\ntest: test-deps lint typecheck unit\n" in makefile
    assert "\ntest-deps:\n\t@bash scripts/test-deps.sh\n" in makefile
    assert '\nrun: $(STAMP)\n\t@bash scripts/run-dev.sh "$(SOCKET)" $(ARGS)\n' in makefile
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert ci.index("export NPUD_REQUIRE_TOOLS=1") < ci.index("make test")
    assert "scripts/check-client-install.sh" in ci


MAKE_RUN_MINUTES: Final = 2.0
"""How long the README's first command runs before it is stopped: long enough for npud's
STATUS= lines (one each 5 s) to fill a notify queue nobody reads (ten datagrams) twice."""


@pytest.mark.timeout(int(MAKE_RUN_MINUTES * 60) + 120)
def test_make_run_serves_for_minutes_and_stops_on_sigterm(tmp_path: Path) -> None:
    """Issue 27: `make run`'s helper stopped reading the notify socket after READY=1, the
    queue filled after about 55 s, and npud's next sd_notify blocked its event loop for
    good (no client welcomed, SIGTERM ignored). The helper now reads until npud ends,
    and npud never waits on the socket anyway."""
    npud = REPO / ".venv" / "bin" / "npud"
    if not os.access(npud, os.X_OK):
        pytest.skip("no development venv (make install)")
    socket_path = tmp_path / "npud.sock"
    output = tmp_path / "make-run.log"
    with (
        open(output, "w") as log,
        subprocess.Popen(
            [BASH, str(REPO / "scripts" / "run-dev.sh"), str(socket_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "NPUD": str(npud)},
            start_new_session=True,
        ) as helper,
    ):
        try:
            deadline = time.monotonic() + 60
            while "make run: serving on" not in output.read_text():
                assert helper.poll() is None, output.read_text()
                assert time.monotonic() < deadline, output.read_text()
                time.sleep(0.1)
            (npud_pid,) = _children(helper.pid)
            time.sleep(MAKE_RUN_MINUTES * 60)
            with npu_client.connect(str(socket_path), name="after-minutes", timeout=10) as npu:
                assert npu.status().totals.clients == 1
            os.kill(npud_pid, signal.SIGTERM)
            assert helper.wait(60) == 0, output.read_text()
        finally:
            if helper.poll() is None:
                os.killpg(helper.pid, signal.SIGKILL)
                helper.wait()
    text = output.read_text()
    assert "ended before it was ready" not in text
    # The helper read every STATUS= line: npud never met a full queue.
    assert "the notify socket takes no more messages" not in text, text


def _children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
