"""One exception class per stable error code, and each one raised by a real answer."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import npu_client
import npu_protocol as p
from npu_client._errors import NpuError, error_class
from npu_protocol.errors import template_fields
from tests.client.peer import Peer, PeerConnection


def _fields_for(code: p.ErrorCode) -> dict[str, int | str]:
    """Values for every field of the code's template (result codes as integers)."""
    return {
        name: 0x8000040E if name in {"rc", "code"} else f"<{name}>"
        for name in sorted(template_fields(code))
    }


def test_every_code_has_exactly_one_class_exported_by_the_package() -> None:
    classes = {code: error_class(code) for code in p.ErrorCode}
    assert len(set(classes.values())) == len(p.ErrorCode)
    for code, cls in classes.items():
        assert issubclass(cls, NpuError)
        assert cls is not NpuError
        assert cls.error_code is code
        assert getattr(npu_client, cls.__name__) is cls
        assert cls.__name__ in npu_client.__all__
    assert dict(npu_client.ERROR_CLASSES) == classes


# How callers catch them, by the code's family (PROTOCOL.md section 11) with the
# exceptions that family lumps together spelled out.
EXPECTED_GROUP = {
    **{code: npu_client.NpuConnectionError for code in p.ErrorCode if 500 <= code < 600},
    p.ErrorCode.SHUTTING_DOWN: npu_client.NpuConnectionError,
    p.ErrorCode.NOT_PERMITTED: npu_client.NpuAccessError,
    p.ErrorCode.QUOTA_EXCEEDED: npu_client.NpuAccessError,
    p.ErrorCode.ADMISSION_REFUSED: npu_client.NpuAccessError,
    **{code: npu_client.NpuModelError for code in p.ErrorCode if 300 <= code < 400},
    **{
        code: npu_client.NpuUsageError
        for code in (
            p.ErrorCode.UNKNOWN_HANDLE,
            p.ErrorCode.UNKNOWN_BUFFER,
            p.ErrorCode.INVALID_ARGUMENT,
            p.ErrorCode.INVALID_FD,
            p.ErrorCode.SLICE_OUT_OF_RANGE,
            p.ErrorCode.DMA_SIZE_OVERFLOW,
            p.ErrorCode.DMA_EXCEEDS_MAX_SIZE,
            p.ErrorCode.UNSUPPORTED,
        )
    },
}


def test_every_class_is_in_exactly_one_group_as_users_catch_them() -> None:
    for code in p.ErrorCode:
        cls = error_class(code)
        groups = [group for group in npu_client.GROUPS if issubclass(cls, group)]
        assert len(groups) == 1, (code.name, groups)
        assert groups[0] is EXPECTED_GROUP.get(code, npu_client.NpuDspError), code.name
    assert issubclass(npu_client.ConnectFailed, npu_client.NpuConnectionError)
    assert issubclass(npu_client.Timeout, TimeoutError)  # still caught as the builtin


def test_class_names_follow_the_code_names() -> None:
    expected = {
        p.ErrorCode.DSP_RESTARTED: "DspRestarted",
        p.ErrorCode.QUOTA_EXCEEDED: "QuotaExceeded",
        p.ErrorCode.NOT_PERMITTED: "NotPermitted",
        p.ErrorCode.UNKNOWN_HANDLE: "UnknownHandle",
        p.ErrorCode.CONNECTION_CLOSED: "ConnectionClosedError",
        p.ErrorCode.SHUTTING_DOWN: "ShuttingDownError",
        p.ErrorCode.TIMEOUT: "Timeout",
    }
    for code, name in expected.items():
        assert error_class(code).__name__ == name


def test_unknown_numbers_fall_back_to_the_base_class() -> None:
    assert error_class(999) is NpuError
    error = NpuError("from the future", code=999, fields={"x": 1})
    assert (error.code, error.name, error.message, dict(error.fields)) == (
        999,
        "ERROR_999",
        "from the future",
        {"x": 1},
    )
    with pytest.raises(TypeError, match="needs a code"):
        NpuError("no code")


def test_a_subclass_knows_its_code_and_fields_are_read_only() -> None:
    error = npu_client.QuotaExceeded("buffers quota exceeded: the limit is 4", fields={"limit": 4})
    assert error.code is p.ErrorCode.QUOTA_EXCEEDED
    assert error.name == "QUOTA_EXCEEDED"
    with pytest.raises(TypeError):
        error.fields["limit"] = 5  # type: ignore[index]


def test_connect_failed_is_a_connection_closed() -> None:
    error = npu_client.ConnectFailed("cannot connect", path="/x")
    assert isinstance(error, npu_client.ConnectionClosedError)
    assert error.code is p.ErrorCode.CONNECTION_CLOSED
    assert error.path == "/x"


@pytest.mark.parametrize("code", list(p.ErrorCode), ids=lambda code: code.name)
def test_each_code_from_the_daemon_raises_its_class(peer: Peer, code: p.ErrorCode) -> None:
    fields = _fields_for(code)

    def refuse(conn: PeerConnection, request: p.AnyRequest) -> object:
        if isinstance(request, p.StatusRequest):
            return p.ErrorMessage.for_code(code, id=request.id, **fields)
        return None

    peer.intercept = refuse
    with npu_client.connect(peer.path, name="errors") as client:
        with pytest.raises(error_class(code)) as caught:
            client.status()
        assert client.ping(b"on") == b"on"  # an error with an id ends only its request
    error = caught.value
    assert error.code == code
    assert error.message == p.format_message(code, **fields)
    assert dict(error.fields) == fields


def test_an_unknown_code_from_the_daemon_raises_npu_error(peer: Peer) -> None:
    def future(conn: PeerConnection, request: p.AnyRequest) -> object:
        return p.ErrorMessage(id=request.id, code=799, message="a newer daemon", fields={"n": 1})

    peer.intercept = future
    with npu_client.connect(peer.path, name="errors") as client, pytest.raises(NpuError) as caught:
        client.ping()
    assert type(caught.value) is NpuError
    assert (caught.value.code, caught.value.message) == (799, "a newer daemon")


def test_an_error_answer_fails_only_its_request(peer: Peer) -> None:
    def once(conn: PeerConnection, request: p.AnyRequest) -> object:
        if isinstance(request, p.AllocRequest):
            return p.ErrorMessage.for_code(
                p.ErrorCode.QUOTA_EXCEEDED, id=request.id, resource="buffer bytes", limit=4096
            )
        return None

    peer.intercept = once
    with npu_client.connect(peer.path, name="errors") as client:
        with pytest.raises(npu_client.QuotaExceeded, match="buffer bytes quota exceeded"):
            client.alloc(8192)
        assert client.ping(b"still here") == b"still here"


def test_no_exception_class_name_is_defined_twice_across_the_packages() -> None:
    # One tree: the daemon raises CodedError(ErrorCode.X) and the client maps
    # the code to its class, so no package keeps a second class of the same name
    # that a caller could catch by mistake.
    where: dict[str, set[str]] = {}
    for package in ("npu_protocol", "npu_client", "npud"):
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            module = importlib.import_module(info.name)
            for name, value in vars(module).items():
                if (
                    inspect.isclass(value)
                    and issubclass(value, BaseException)
                    and value.__module__ == info.name
                ):
                    where.setdefault(name, set()).add(info.name)
    assert len(where) > len(p.ErrorCode)  # the walk saw the client's classes
    assert {name: sorted(mods) for name, mods in where.items() if len(mods) > 1} == {}
