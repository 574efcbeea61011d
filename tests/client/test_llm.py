"""``load_llm`` without the peer build: where its libraries are looked for, every way they
can be missing (each said with what and how to get it), the checks of a model file and of
a generation's arguments, and that importing npu_client and is_available stay cheap.
The LLM itself on the NPU: tests/llm (they need ``make llm``)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import npu_client
from npu_client import _llm
from npu_client._llm import (
    LLAMA_CPP_PYTHON_VERSION,
    Libraries,
    LlmUnavailable,
    Sampling,
    check_model_file,
    check_request,
    locate_libraries,
)
from tests.client.peer import Peer

REPO = Path(__file__).parents[2]
FILES = ("libllama.so", "libggml.so", "libggml-cpu.so", "libggml-hexagon.so", "libcdsprpc.so")


def full_directory(path: Path, version: str = LLAMA_CPP_PYTHON_VERSION) -> Libraries:
    path.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        (path / name).write_bytes(b"")
    (path / _llm.VERSION_FILE).write_text(f"{version}\n")
    return Libraries(path)


def test_the_libraries_are_looked_for_where_make_llm_puts_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("NPUD_LLAMA_LIB", raising=False)
    monkeypatch.delenv("NPUD_PEER_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _llm.default_libraries() == tmp_path / "xdg" / "npud-peer" / "llm"
    monkeypatch.setenv("NPUD_PEER_CACHE", str(tmp_path / "peer"))
    assert _llm.default_libraries() == tmp_path / "peer" / "llm"
    full_directory(tmp_path / "peer" / "llm")
    assert locate_libraries().directory == tmp_path / "peer" / "llm"
    monkeypatch.setenv("NPUD_LLAMA_LIB", str(tmp_path / "mine"))
    full_directory(tmp_path / "mine")
    assert locate_libraries().directory == tmp_path / "mine"
    assert npu_client.llm_libraries() == tmp_path / "mine"  # the public name of it
    monkeypatch.setenv("NPUD_LLAMA_LIB", str(tmp_path / "none"))
    with pytest.raises(npu_client.LlmUnavailable, match="`make llm`"):
        npu_client.llm_libraries()


def test_missing_libraries_are_named_with_how_to_build_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("NPUD_LLAMA_LIB", str(tmp_path / "absent"))
    with pytest.raises(LlmUnavailable) as none:
        locate_libraries()
    assert f"no $NPUD_LLAMA_LIB={tmp_path / 'absent'}" in str(none.value)
    assert "`make llm`" in str(none.value)
    assert isinstance(none.value, npu_client.Unsupported)  # an NpuUsageError, code 106
    partial = tmp_path / "partial"
    full_directory(partial)
    (partial / "libggml-hexagon.so").unlink()
    (partial / "libcdsprpc.so").unlink()
    monkeypatch.setenv("NPUD_LLAMA_LIB", str(partial))
    with pytest.raises(LlmUnavailable, match=r"has no libggml-hexagon\.so, libcdsprpc\.so; build"):
        locate_libraries()


def fake_binding(version: str, libllama: Path) -> SimpleNamespace:
    return SimpleNamespace(
        __version__=version, llama_cpp=SimpleNamespace(_lib=SimpleNamespace(_name=str(libllama)))
    )


@pytest.mark.parametrize(
    ("binding_version", "built_for", "loaded", "message"),
    [
        ("0.3.1", LLAMA_CPP_PYTHON_VERSION, "ours", r"llama-cpp-python 0\.3\.36 \(installed: 0\.3\.1"),
        (LLAMA_CPP_PYTHON_VERSION, "0.2.0", "ours", r"are for 0\.2\.0; build them with `make llm`"),
        (LLAMA_CPP_PYTHON_VERSION, LLAMA_CPP_PYTHON_VERSION, "elsewhere",
         r"llama_cpp was imported before load_llm and loaded /elsewhere/libllama\.so"),
    ],
)  # fmt: skip
def test_a_binding_that_does_not_match_its_libraries_is_refused(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    binding_version: str,
    built_for: str,
    loaded: str,
    message: str,
) -> None:
    libraries = full_directory(tmp_path / "llm", built_for)
    libllama = libraries.libllama if loaded == "ours" else Path("/elsewhere/libllama.so")
    monkeypatch.setattr(
        "npu_client._llm.importlib.import_module",
        lambda name: fake_binding(binding_version, libllama),
    )
    with pytest.raises(LlmUnavailable, match=message):
        _llm._import_binding(libraries)


def test_a_missing_binding_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def missing(name: str) -> Any:
        raise ModuleNotFoundError(f"No module named {name!r}")

    monkeypatch.setattr("npu_client._llm.importlib.import_module", missing)
    with pytest.raises(LlmUnavailable) as caught:
        _llm._import_binding(full_directory(tmp_path / "llm"))
    assert "llama-cpp-python 0.3.36, the binding: `make llm` installs it" in str(caught.value)
    assert "-DLLAMA_BUILD=OFF" in str(caught.value)


def test_load_llm_without_the_libraries_fails_before_anything_loads(
    peer: Peer, tmp_path: Path
) -> None:
    """In a process of its own: a process's llama.cpp, once loaded, stays."""
    program = (
        "import json, sys, npu_client\n"
        "with npu_client.connect(sys.argv[1]) as npu:\n"
        "    try:\n"
        "        npu.load_llm(sys.argv[2])\n"
        "    except npu_client.LlmUnavailable as exc:\n"
        "        print(json.dumps([exc.name, str(exc), 'llama_cpp' in sys.modules]))\n"
    )
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(60))
    result = subprocess.run(
        [sys.executable, "-c", program, peer.path, str(model)],
        env={"NPUD_LLAMA_LIB": str(tmp_path / "none"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    name, message, imported = json.loads(result.stdout)
    assert name == "UNSUPPORTED"
    assert message.startswith("not supported: llama.cpp's libraries with the Hexagon backend")
    assert imported is False


def test_a_model_file_is_checked_before_llama_cpp_sees_it(tmp_path: Path) -> None:
    with pytest.raises(npu_client.ModelFileUnreadable, match="No such file or directory"):
        check_model_file(tmp_path / "absent.gguf")
    with pytest.raises(npu_client.ModelFileUnreadable, match="Is a directory"):
        check_model_file(tmp_path)
    onnx = tmp_path / "model.onnx"
    onnx.write_bytes(b"\x08\x08\x12\x04")
    with pytest.raises(npu_client.ModelFormatError, match="is not a GGUF file"):
        check_model_file(onnx)
    (tmp_path / "ok.gguf").write_bytes(b"GGUF\x03\0\0\0")
    check_model_file(tmp_path / "ok.gguf")


@pytest.mark.parametrize(
    ("max_tokens", "sampling", "stop", "message"),
    [
        (0, Sampling(), (), "max_tokens must be at least 1"),
        (True, Sampling(), (), "max_tokens"),
        (None, Sampling(temperature=-0.1), (), "temperature must be 0 or more"),
        (None, Sampling(temperature=float("nan")), (), "temperature"),
        (None, Sampling(top_k=-1), (), "top_k"),
        (None, Sampling(top_p=0), (), "top_p must be in"),
        (None, Sampling(top_p=1.5), (), "top_p"),
        (None, Sampling(seed=2**32), (), "seed must be a u32"),
        (None, Sampling(), ("",), "a stop string is a non-empty str"),
    ],
)
def test_bad_generation_arguments_are_refused(
    max_tokens: Any, sampling: Sampling, stop: tuple[str, ...], message: str
) -> None:
    with pytest.raises(npu_client.InvalidArgument, match=message):
        check_request(max_tokens, sampling, stop)


def test_good_generation_arguments_pass() -> None:
    check_request(None, Sampling(temperature=0), ("</s>",))
    check_request(1, Sampling(temperature=2.0, top_k=0, top_p=1.0, seed=0), ())


@pytest.mark.parametrize(
    ("text", "stops", "held"),
    [("abc", ("cd",), 1), ("abc", ("bcx",), 2), ("abc", ("x",), 0), ("", ("ab",), 0),
     ("aab", ("abab", "b"), 2), ("abc", (), 0)],
)  # fmt: skip
def test_text_that_may_begin_a_stop_string_is_held_back(
    text: str, stops: tuple[str, ...], held: int
) -> None:
    assert _llm._longest_prefix_tail(text, stops) == held


def test_the_extra_pins_the_binding_the_peer_build_is_made_from() -> None:
    pyproject = tomllib.loads((REPO / "client" / "pyproject.toml").read_text())
    assert pyproject["project"]["optional-dependencies"]["llm"] == [
        f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"
    ]
    script = (REPO / "scripts" / "peer-llama.sh").read_text()
    assert re.search(rf"^readonly VERSION={re.escape(LLAMA_CPP_PYTHON_VERSION)}$", script, re.M)


def test_importing_npu_client_and_is_available_load_no_llama_cpp(peer: Peer) -> None:
    program = (
        "import sys, npu_client\n"
        "npu_client.is_available(sys.argv[1])\n"
        "print(sorted(name for name in sys.modules if name.startswith('llama')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program, peer.path],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout == "[]\n"


def npuctl(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "npu_client.npuctl", *args],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_npuctl_llm_says_what_is_wrong_with_its_exit_status(peer: Peer, tmp_path: Path) -> None:
    onnx = tmp_path / "vad.onnx"
    onnx.write_bytes(b"\x08\x08")
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    none = str(tmp_path / "none")
    for args, status, message in (
        ([str(tmp_path / "absent.gguf"), "hi"], 66, "unreadable model file: "),
        ([str(onnx), "hi"], 65, "is not a GGUF file"),
        ([str(gguf), "hi"], 69, "`make llm`"),
        ([str(gguf), "hi", "--temperature", "-1"], 64, "must be 0 or more"),
        ([str(gguf), "hi", "--max-tokens", "0"], 64, "must be at least 1"),
    ):
        result = npuctl("--socket", peer.path, "llm", *args, NPUD_LLAMA_LIB=none)
        assert result.returncode == status, result.stderr
        assert message in result.stderr
        assert result.stdout == ""
        assert "Traceback" not in result.stderr
