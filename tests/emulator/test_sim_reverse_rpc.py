"""Skel loading through reverse RPC: the listener contract, dlopen errors, concurrency."""

from __future__ import annotations

import os
import pathlib
import struct
import threading
from collections.abc import Iterator

import pytest

from npud.fastrpc.kernel import abi
from npud.sim import DSP_LIBRARY_DIR, EmulatedDriver, SimConfig
from tests.emulator.sim_helpers import (
    AEE_EBADPARM,
    AEE_EBADSTATE,
    AEE_ENOSUCHMOD,
    AEE_ENOSUCHSYMBOL,
    AEE_ENOTINITIALIZED,
    AEE_EUNSUPPORTED,
    APPS_STD_HANDLE,
    ECHO_URI,
    NPU_TEST_URI,
    SC_LISTENER_GET_IN_BUFS2,
    SC_LISTENER_INIT2,
    SC_LISTENER_NEXT2,
    SC_REMOTECTL_OPEN,
    OpenResult,
    ReverseResponder,
    call,
    echo,
    exit_process,
    fill,
    init_create,
    open_skel,
    remotectl_open,
    running_process,
)
from tests.polling import wait_until

LOAD_SEQUENCE = [
    (0, SC_REMOTECTL_OPEN),  # apps_remotectl open "apps_std"
    (APPS_STD_HANDLE, 0x13050100),  # fopen_with_env
    (APPS_STD_HANDLE, 0x0A010100),  # flen
    (APPS_STD_HANDLE, 0x04010200),  # fread
    (APPS_STD_HANDLE, 0x03010000),  # fclose
]


@pytest.fixture
def driver() -> Iterator[EmulatedDriver]:
    driver = EmulatedDriver(SimConfig(reverse_rpc_timeout=5.0))
    yield driver
    stats = driver.statistics()
    assert (stats.device_fds_open, stats.reverse_requests_pending) == (0, 0)
    assert stats.invokes_in_flight == 0


def _library_dir(tmp_path: pathlib.Path, **files: str | bytes) -> pathlib.Path:
    for name, content in files.items():
        data = content.encode() if isinstance(content, str) else content
        (tmp_path / name).write_bytes(data)
    return tmp_path


def _load_failure(driver: EmulatedDriver, directory: pathlib.Path, uri: str) -> OpenResult:
    fd = driver.open(abi.CDSP_SECURE_NODE, os.O_RDWR)
    try:
        assert init_create(driver, fd) == 0
        responder = ReverseResponder(driver, fd, directory).start()
        opened = remotectl_open(driver, fd, uri)
        exit_process(driver, fd)
        responder.join()
    finally:
        driver.close(fd)
    assert opened.result == 0  # remotectl itself worked; dlopen failed
    assert opened.handle == 0
    return opened


# -- the happy path --------------------------------------------------------------------


def test_a_skel_is_read_from_the_host_through_the_listener(driver: EmulatedDriver) -> None:
    with running_process(driver) as (fd, responder):
        handle = open_skel(driver, fd, ECHO_URI)
        assert echo(driver, fd, handle, b"abc", 3) == (0, b"abc")
        assert responder.requests == LOAD_SEQUENCE
        assert driver.statistics().reverse_requests_pending == 0


def test_apps_std_is_opened_once_per_process(driver: EmulatedDriver) -> None:
    with running_process(driver) as (fd, responder):
        open_skel(driver, fd, ECHO_URI)
        open_skel(driver, fd, NPU_TEST_URI)
        open_skel(driver, fd, ECHO_URI)
        assert responder.requests.count((0, SC_REMOTECTL_OPEN)) == 1
        assert responder.requests.count((APPS_STD_HANDLE, 0x13050100)) == 3


def test_a_bare_interface_name_binds_the_plain_entry_point(driver: EmulatedDriver) -> None:
    with running_process(driver) as (fd, _):
        handle = open_skel(driver, fd, "echo")
        prim = struct.pack("<II", 2, 2)
        assert call(driver, fd, handle, 0x00020100, [prim, b"hi"], [2]) == (0, [b"hi"])
        assert call(driver, fd, handle, 0x02020100, [prim, b"hi"], [2])[0] == AEE_EUNSUPPORTED


def test_a_small_listener_buffer_uses_get_in_bufs2(driver: EmulatedDriver) -> None:
    with running_process(driver, capacity=8) as (fd, responder):
        handle = open_skel(driver, fd, NPU_TEST_URI)
        assert responder.partial_fetches > 0
        assert fill(driver, fd, handle, 1, 3) == (0, b"\x01\x02\x03")


def test_libraries_ship_with_the_package() -> None:
    names = sorted(path.name for path in DSP_LIBRARY_DIR.iterdir())
    assert names == [
        "libdspqueue_rpc_skel.so",
        "libecho_skel.so",
        "libggml-htp-v73.so",
        "libnpu_test_skel.so",
        "libportal_qnn_skel.so",
    ]
    for path in DSP_LIBRARY_DIR.iterdir():
        assert path.read_text().startswith("NPUD-SIM-SKEL 1\n")


# -- dlopen failures --------------------------------------------------------------------


def test_a_missing_library(driver: EmulatedDriver) -> None:
    opened = _load_failure(
        driver, DSP_LIBRARY_DIR, "file:///libnope_skel.so?nope_skel_handle_invoke"
    )
    assert opened.dl_error == AEE_ENOSUCHMOD
    assert opened.text.startswith(
        "libnope_skel.so: cannot open shared object file: No such file or directory"
    )


def test_an_undefined_symbol(driver: EmulatedDriver) -> None:
    opened = _load_failure(
        driver, DSP_LIBRARY_DIR, "file:///libecho_skel.so?foo_skel_handle_invoke"
    )
    assert opened.dl_error == AEE_ENOSUCHSYMBOL
    assert opened.text == "libecho_skel.so: undefined symbol: foo_skel_handle_invoke"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x7fELF\x01\x01\x01" + bytes(60), "not a simulator skel descriptor"),
        ("NPUD-SIM-SKEL 2\nskel=echo\nsymbols=x_skel_invoke\n", "not a simulator skel descriptor"),
        ("NPUD-SIM-SKEL 1\nskel=warp\nsymbols=x_skel_invoke\n", "skel 'warp' is not built into"),
        ("NPUD-SIM-SKEL 1\nskel=echo\n", "needs both skel= and symbols="),
        ("NPUD-SIM-SKEL 1\nskel=echo\nskel=echo\nsymbols=x\n", "line 3"),
        ("NPUD-SIM-SKEL 1\nlicense=MIT\n", "line 2"),
        (b"NPUD-SIM-SKEL 1\n\xff\xfe", "not UTF-8"),
        ("NPUD-SIM-SKEL 1\nskel=echo\nsymbols=x_entry\n", "neither a *_skel_handle_invoke"),
        ("x" * 70000, "too large"),
    ],
)
def test_bad_descriptors(
    driver: EmulatedDriver, tmp_path: pathlib.Path, content: str | bytes, message: str
) -> None:
    directory = _library_dir(tmp_path, **{"libx_skel.so": content})
    symbol = "x_entry" if "x_entry" in str(content) else "x_skel_invoke"
    opened = _load_failure(driver, directory, f"file:///libx_skel.so?{symbol}")
    assert opened.text.startswith("libx_skel.so: "), opened.text
    assert message in opened.text


def test_comments_and_blank_lines_are_allowed(
    driver: EmulatedDriver, tmp_path: pathlib.Path
) -> None:
    content = "NPUD-SIM-SKEL 1\n\n# a comment\n  skel = echo  \nsymbols= mine_skel_invoke , y\n"
    directory = _library_dir(tmp_path, **{"libmine_skel.so": content})
    with running_process(driver) as (fd, responder):
        responder.directory = directory
        handle = open_skel(driver, fd, "mine")
        assert call(driver, fd, handle, 0x00020100, [struct.pack("<II", 1, 1), b"!"], [1]) == (
            0,
            [b"!"],
        )


@pytest.mark.parametrize(
    "uri",
    [
        "file:///",
        "file:///libecho_skel.so",
        "file:///libecho_skel.so?a_skel_invoke&b_skel_invoke",
        "not a name!",
        "",
    ],
)
def test_bad_module_names_fail_without_reverse_calls(driver: EmulatedDriver, uri: str) -> None:
    with running_process(driver) as (fd, responder):
        opened = remotectl_open(driver, fd, uri)
        assert (opened.result, opened.handle, opened.dl_error) == (0, 0, AEE_ENOSUCHMOD)
        assert opened.text
        assert responder.requests == []


def test_the_dlerror_text_is_truncated_to_the_buffer(driver: EmulatedDriver) -> None:
    with running_process(driver) as (fd, _):
        opened = remotectl_open(driver, fd, "file:///libnope_skel.so?nope_skel_invoke", capacity=16)
        assert opened.text == "libnope_skel.so"[:15]


def test_host_errors_name_the_library(driver: EmulatedDriver) -> None:
    def refuse_reads(handle: int, sc: int, inputs: list[bytes]) -> tuple[int, list[bytes]] | None:
        return (0x5C, []) if sc == 0x04010200 else None  # AEE_EFREAD

    with running_process(driver, hook=refuse_reads) as (fd, responder):
        opened = remotectl_open(driver, fd, ECHO_URI)
        assert opened.dl_error == AEE_ENOSUCHMOD
        assert opened.text.startswith("libecho_skel.so: cannot read file: apps_std fread")
        assert responder.requests[-1] == (APPS_STD_HANDLE, 0x03010000)  # still closed


def test_the_host_may_refuse_apps_std(driver: EmulatedDriver) -> None:
    def refuse(handle: int, sc: int, inputs: list[bytes]) -> tuple[int, list[bytes]] | None:
        text = b"apps_std is disabled".ljust(256, b"\0")
        return (0, [struct.pack("<II", 0, 0x3E), text]) if handle == 0 else None

    with running_process(driver, hook=refuse) as (fd, _):
        opened = remotectl_open(driver, fd, ECHO_URI)
        assert "apps_std is disabled" in opened.text


def test_a_reply_with_wrong_lengths_fails_the_reverse_call(driver: EmulatedDriver) -> None:
    def short_reply(handle: int, sc: int, inputs: list[bytes]) -> tuple[int, list[bytes]] | None:
        return (0, [struct.pack("<II", APPS_STD_HANDLE, 0), b"x"]) if handle == 0 else None

    with running_process(driver, hook=short_reply) as (fd, _):
        opened = remotectl_open(driver, fd, ECHO_URI)
        assert "0x8000040E (AEE_EBADPARM)" in opened.text


# -- no listener, slow listener --------------------------------------------------------


def test_no_listener_fails_the_open_in_time() -> None:
    driver = EmulatedDriver(SimConfig(reverse_rpc_timeout=0.05))
    fd = driver.open(abi.CDSP_NODE, os.O_RDWR)
    try:
        assert init_create(driver, fd) == 0
        opened = remotectl_open(driver, fd, ECHO_URI)
        assert opened.dl_error == AEE_ENOSUCHMOD
        assert (
            opened.text
            == "libecho_skel.so: cannot open shared object file: no reverse-RPC listener"
        )
        assert driver.statistics().reverse_requests_pending == 0
    finally:
        driver.close(fd)


def test_a_listener_that_answers_too_late() -> None:
    driver = EmulatedDriver(SimConfig(reverse_rpc_timeout=0.05))
    release = threading.Event()

    def slow(handle: int, sc: int, inputs: list[bytes]) -> tuple[int, list[bytes]] | None:
        if handle == 0 and not release.is_set():
            release.wait(5)
        return None

    with running_process(driver, hook=slow) as (fd, _):
        opened = remotectl_open(driver, fd, ECHO_URI)
        assert opened.text.endswith("the reverse-RPC listener did not answer")
        release.set()  # the late reply is dropped; the next load works
        open_skel(driver, fd, ECHO_URI)


# -- the listener's own calls ------------------------------------------------------------


def test_listener_protocol_errors(driver: EmulatedDriver) -> None:
    fd = driver.open(abi.CDSP_SECURE_NODE, os.O_RDWR)
    try:
        assert init_create(driver, fd) == 0
        next2 = struct.pack("<IiII", 0, -1, 0, 16)
        assert call(driver, fd, 3, SC_LISTENER_NEXT2, [next2, b""], [16, 16])[0] == (
            AEE_ENOTINITIALIZED
        )
        assert call(driver, fd, 3, SC_LISTENER_INIT2, [], [])[0] == 0
        assert call(driver, fd, 7, 0x05000000, [], [])[0] == 0  # adsp_listener1 init2
        bad_prev = struct.pack("<IiII", 0, -1, 4, 16)  # announces 4 bytes of prevbufs, sends 0
        assert call(driver, fd, 3, SC_LISTENER_NEXT2, [bad_prev, b""], [16, 16])[0] == AEE_EBADPARM
        bad_cap = struct.pack("<IiII", 0, -1, 0, 32)  # announces 32 bytes of bufs, gives 16
        assert call(driver, fd, 3, SC_LISTENER_NEXT2, [bad_cap, b""], [16, 16])[0] == AEE_EBADPARM
        fetch = struct.pack("<III", 99, 0, 16)
        assert call(driver, fd, 3, SC_LISTENER_GET_IN_BUFS2, [fetch], [4, 16])[0] == AEE_EBADPARM
        assert call(driver, fd, 3, 0x09000000, [], [])[0] == AEE_EUNSUPPORTED
    finally:
        driver.close(fd)


def test_exit_wakes_a_listener_blocked_in_next2(driver: EmulatedDriver) -> None:
    fd = driver.open(abi.CDSP_SECURE_NODE, os.O_RDWR)
    try:
        assert init_create(driver, fd) == 0
        responder = ReverseResponder(driver, fd).start()
        wait_until(lambda: driver.statistics().invokes_in_flight == 1)
        assert exit_process(driver, fd) == 0
        responder.join()
        assert responder.exit_result == AEE_EBADSTATE
    finally:
        driver.close(fd)


def test_exit_fails_a_pending_open(driver: EmulatedDriver) -> None:
    fd = driver.open(abi.CDSP_SECURE_NODE, os.O_RDWR)
    results: list[OpenResult] = []
    try:
        assert init_create(driver, fd) == 0
        opener = threading.Thread(
            target=lambda: results.append(remotectl_open(driver, fd, ECHO_URI))
        )
        opener.start()
        wait_until(lambda: driver.statistics().reverse_requests_pending == 1)
        assert exit_process(driver, fd) == 0
        opener.join(10)
        assert results[0].result == AEE_EBADSTATE
    finally:
        driver.close(fd)


def test_concurrent_opens_share_one_listener(driver: EmulatedDriver) -> None:
    with running_process(driver, capacity=16) as (fd, responder):
        results: list[tuple[int, bytes]] = []
        lock = threading.Lock()

        def open_and_echo(index: int) -> None:
            handle = open_skel(driver, fd, ECHO_URI if index % 2 else "echo")
            sc = 0x02020100 if index % 2 else 0x00020100
            data = f"thread-{index}".encode()
            result, (out,) = call(
                driver,
                fd,
                handle,
                sc,
                [struct.pack("<II", len(data), len(data)), data],
                [len(data)],
            )
            with lock:
                results.append((result, out))

        threads = [threading.Thread(target=open_and_echo, args=(index,)) for index in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert sorted(results) == sorted((0, f"thread-{i}".encode()) for i in range(6))
        assert responder.requests.count((0, SC_REMOTECTL_OPEN)) == 1
        assert driver.statistics().remote_handles_open == 6


def test_interrupted_listeners_retry_and_requests_are_resent(driver: EmulatedDriver) -> None:
    entered, release = threading.Event(), threading.Event()

    def hold_first_fopen(
        handle: int, sc: int, inputs: list[bytes]
    ) -> tuple[int, list[bytes]] | None:
        if sc == 0x13050100 and not release.is_set():
            entered.set()
            release.wait(5)
        return None

    with running_process(driver, hook=hold_first_fopen) as (fd, responder):
        wait_until(lambda: driver.statistics().invokes_in_flight == 1)
        driver.faults.interrupt_listeners()  # idle listener: EINTERRUPTED, retry
        wait_until(lambda: responder.interruptions == 1)
        results: list[OpenResult] = []
        opener = threading.Thread(
            target=lambda: results.append(remotectl_open(driver, fd, ECHO_URI))
        )
        opener.start()
        assert entered.wait(5)
        driver.faults.interrupt_listeners()  # the fopen being served is re-sent under a new ctx
        release.set()
        opener.join(10)
        assert (results[0].result, results[0].dl_error) == (0, 0)
        assert responder.requests.count((APPS_STD_HANDLE, 0x13050100)) == 2
