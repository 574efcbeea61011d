"""``load_llm`` on the peer build's tiny llamas: llama.cpp on the NPU through npud, in this
process, through both clients: tokens equal to the CPU's, greedy and sampled, text whole
and streamed, a context size, stop strings, closing, and every refusal."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import aclosing
from pathlib import Path

import pytest
import trio

import npu_client
from npu_client import trio_client
from npu_client._llm import Libraries
from tests.e2e.daemon import Npud, start_npud
from tests.llm.conftest import MODELS, PROMPT, model

HERE = Path(__file__).parent
HIGH: dict[str, float | int] = {"temperature": 1000.0, "top_k": 40, "top_p": 1.0}
"""Sampling that is close to uniform over the 40 likeliest tokens: the seed decides."""


def cpu_tokens(libraries: Libraries, path: Path, count: int, *sampling: float | int) -> list[int]:
    """The CPU's tokens (tests/llm/cpu_reference.py, a process of its own)."""
    result = subprocess.run(
        [sys.executable, str(HERE / "cpu_reference.py"), str(libraries.directory), str(path),
         PROMPT, str(count), *(str(value) for value in sampling)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    tokens = json.loads(result.stdout)
    assert isinstance(tokens, list)
    return [int(token) for token in tokens]


@pytest.fixture(scope="module")
def npu(npud: Npud) -> Iterator[npu_client.Client]:
    with npu_client.connect(npud.socket_path, name="llm-test") as client:
        yield client


def llm_rows(npu: npu_client.Client) -> list[tuple[str, int]]:
    """(domain, buffers) of the process's llama.cpp connection in npud."""
    return [(row.domain, row.buffers) for row in npu.status().clients if row.name == "llm-test-llm"]


@pytest.mark.parametrize("kind", MODELS)
def test_greedy_tokens_are_the_cpus(
    npu: npu_client.Client, libraries: Libraries, models: Path, kind: str
) -> None:
    path = model(models, kind)
    expected = cpu_tokens(libraries, path, 64)
    assert len(expected) == 64
    with npu.load_llm(path) as llm:
        tokens = list(llm.tokens(PROMPT, max_tokens=64, temperature=0))
        text = llm.generate(PROMPT, max_tokens=64, temperature=0)
        pieces = list(llm.stream(PROMPT, max_tokens=64, temperature=0))
        stats = llm.statistics()
        assert tokens == expected
        assert text == llm.detokenize(expected) == "".join(pieces)
        assert len(pieces) > 1  # streamed as it is made, not all at the end
        assert (stats.prompt_tokens, stats.tokens, stats.stopped_by) == (
            len(llm.tokenize(PROMPT)),
            64,
            "length",
        )
        assert 0 < stats.first_token_s <= stats.seconds  # fmt: skip
    # It ran on the NPU: the process's llama.cpp is a client of npud, in a DSP process of
    # its own (the load put its layers there: llama.cpp refuses an HTP0 it cannot reach).
    [(domain, _)] = llm_rows(npu)
    assert domain != npu.domain


@pytest.mark.parametrize("seed", [7, 8])
def test_sampled_tokens_follow_the_seed(
    npu: npu_client.Client, libraries: Libraries, models: Path, seed: int
) -> None:
    """The default draw (temperature 0.8, top-k 40, top-p 0.95) gives the CPU's tokens
    with the same seed (the tiny models' planted answers are likely enough to be drawn
    whatever the rounding); a draw near uniform over 40 tokens depends on the seed, and
    the same seed draws the same again (which token wins there turns on the order of
    nearly equal logits, which the NPU's rounding may change: no CPU comparison)."""
    path = model(models, "f16")
    default = (0.8, 40, 0.95, seed)
    expected = cpu_tokens(libraries, path, 16, *default)
    with npu.load_llm(path) as llm:
        drawn = list(llm.tokens(PROMPT, max_tokens=16, seed=seed))
        first = list(llm.tokens(PROMPT, max_tokens=16, seed=seed, **HIGH))  # type: ignore[arg-type]
        again = list(llm.tokens(PROMPT, max_tokens=16, seed=seed, **HIGH))  # type: ignore[arg-type]
        other = list(llm.tokens(PROMPT, max_tokens=16, seed=seed + 100, **HIGH))  # type: ignore[arg-type]
    assert drawn == expected
    assert first == again
    assert other != first
    assert first != expected  # the draw mattered


def test_stop_strings_end_the_text_before_them(npu: npu_client.Client, models: Path) -> None:
    with npu.load_llm(model(models, "q4_0")) as llm:
        whole = llm.generate(PROMPT, max_tokens=32, temperature=0)
        assert whole.startswith("65666768696a")
        assert llm.generate(PROMPT, max_tokens=32, temperature=0, stop="6a") == "6566676869"
        assert llm.statistics().stopped_by == "stop"
        # A stop string that begins inside a token ("68" "69" "6a"): the text is cut there.
        streamed = list(llm.stream(PROMPT, max_tokens=32, temperature=0, stop=["x", "8696"]))
        assert "".join(streamed) == "6566676"
        # Tokens: those whose text lies wholly before it.
        tokens = list(llm.tokens(PROMPT, max_tokens=32, temperature=0, stop="8696"))
        assert llm.detokenize(tokens) == "656667"
        assert llm.generate(PROMPT, max_tokens=32, temperature=0, stop="zz") == whole


def test_the_context_size_bounds_prompt_and_answer(npu: npu_client.Client, models: Path) -> None:
    with npu.load_llm(model(models, "q4_0"), n_ctx=100) as llm:
        assert llm.n_ctx == 256  # llama.cpp rounds it up to a multiple of 256
        prompt_tokens = len(llm.tokenize(PROMPT))
        tokens = list(llm.tokens(PROMPT, max_tokens=None, temperature=0))
        assert len(tokens) == 256 - prompt_tokens
        assert llm.statistics().stopped_by == "context"
        long = "hello world " * 100  # 240 tokens: 16 left for the answer
        assert len(llm.generate(long, max_tokens=None, temperature=0)) == 16 * 2
        assert llm.statistics().stopped_by == "context"
        with pytest.raises(npu_client.InvalidArgument, match="the context holds 256"):
            llm.generate(long * 2)
    with npu.load_llm(model(models, "q4_0"), n_ctx=512) as llm:
        assert llm.n_ctx == 512


def test_close_gives_the_models_memory_back(npu: npu_client.Client, models: Path) -> None:
    with npu.load_llm(model(models, "q8_0")):
        pass  # the backend's own session exists from now on
    [(_, idle)] = llm_rows(npu)
    llm = npu.load_llm(model(models, "q8_0"))
    llm.generate(PROMPT, max_tokens=4)
    [(_, loaded)] = llm_rows(npu)
    assert loaded > idle  # weights, KV cache and compute buffers: npud's DMA-BUFs
    llm.close()
    assert llm_rows(npu) == [(llm_rows(npu)[0][0], idle)]
    assert llm.closed
    with pytest.raises(npu_client.ModelNotLoaded, match="was closed"):
        llm.generate(PROMPT)
    llm.close()  # idempotent


def test_a_stream_left_open_and_a_close_meanwhile(npu: npu_client.Client, models: Path) -> None:
    llm = npu.load_llm(model(models, "q4_0"))
    stream = llm.stream(PROMPT, max_tokens=32, temperature=0)
    assert next(stream)
    with pytest.raises(npu_client.SessionBusy, match="still open"):
        llm.generate(PROMPT)  # this thread's own stream holds the turn
    llm.close()
    with pytest.raises(npu_client.ModelNotLoaded):
        list(stream)


def test_closing_the_client_closes_its_llms(
    npud: Npud, npu: npu_client.Client, models: Path
) -> None:
    other = npu_client.connect(npud.socket_path, name="llm-test")
    llm = other.load_llm(model(models, "q4_0"))
    other.close()
    assert llm.closed


def test_bad_arguments_and_files_are_refused(
    npu: npu_client.Client, models: Path, tmp_path: Path
) -> None:
    with pytest.raises(npu_client.ModelFileUnreadable, match="No such file"):
        npu.load_llm(tmp_path / "absent.gguf")
    onnx = tmp_path / "vad.onnx"
    onnx.write_bytes(b"\x08\x07onnx")
    with pytest.raises(npu_client.ModelFormatError, match="not a GGUF file"):
        npu.load_llm(onnx)
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 60)
    with pytest.raises(npu_client.ModelMalformed, match=r"llama\.cpp cannot load"):
        npu.load_llm(broken)
    with pytest.raises(npu_client.InvalidArgument, match="n_ctx"):
        npu.load_llm(model(models, "q4_0"), n_ctx=2)
    with npu.load_llm(model(models, "q4_0")) as llm:
        for bad, message in (
            ({"max_tokens": 0}, "max_tokens"),
            ({"temperature": -1.0}, "temperature"),
            ({"top_p": 0.0}, "top_p"),
            ({"top_k": -1}, "top_k"),
            ({"seed": -1}, "seed"),
            ({"stop": [""]}, "stop string"),
        ):
            with pytest.raises(npu_client.InvalidArgument, match=message):
                llm.stream(PROMPT, **bad)  # refused at the call
        with pytest.raises(npu_client.InvalidArgument, match="no chat template"):
            llm.apply_chat_template([{"role": "user", "content": "hi"}])


def test_one_npud_per_process(npu: npu_client.Client, models: Path, tmp_path: Path) -> None:
    from tests.client.peer import Peer

    with npu.load_llm(model(models, "q4_0")):
        pass
    with (
        Peer(str(tmp_path / "other.sock")) as peer,
        npu_client.connect(peer.path) as elsewhere,
        pytest.raises(npu_client.InvalidArgument, match="one npud per process"),
    ):
        elsewhere.load_llm(model(models, "q4_0"))


# --- trio ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", MODELS)
async def test_trio_greedy_tokens_are_the_cpus(
    npud: Npud, libraries: Libraries, models: Path, kind: str
) -> None:
    path = model(models, kind)
    expected = cpu_tokens(libraries, path, 64)
    async with (
        npu_client.open_trio_client(npud.socket_path, name="llm-test") as npu,
        await npu.load_llm(path) as llm,
    ):
        assert isinstance(llm, trio_client.TrioLlm)
        tokens = [token async for token in llm.tokens(PROMPT, max_tokens=64, temperature=0)]
        text = await llm.generate(PROMPT, max_tokens=64, temperature=0)
        async with aclosing(llm.stream(PROMPT, max_tokens=64, temperature=0)) as stream:
            pieces = [piece async for piece in stream]
        assert tokens == expected
        assert text == await llm.detokenize(expected) == "".join(pieces)


async def test_trio_generation_is_cancelled_between_tokens(npud: Npud, models: Path) -> None:
    async with npu_client.open_trio_client(npud.socket_path, name="llm-test") as npu:
        llm = await npu.load_llm(model(models, "q4_0"))
        seen: list[int] = []
        with trio.move_on_after(0.05):
            async for token in llm.tokens(PROMPT, max_tokens=None, temperature=0):
                seen.append(token)
        assert 0 < len(seen) < 250  # ended early, between two tokens
        # The turn was given back: the next generation runs.
        assert (await llm.generate(PROMPT, max_tokens=4, temperature=0)) == "65666768"
    assert llm.closed  # closed with its client


def test_an_npud_that_refuses_llama_cpp_a_dsp_process_is_no_npu(
    tmp_path: Path, libraries: Libraries, models: Path
) -> None:
    """The Hexagon backend asks npud for a DSP process of its own; refused, llama.cpp has no
    NPU, and load_llm says so rather than loading the model on the CPU (a process of its
    own: a process's llama.cpp reaches one npud)."""
    refusing = start_npud(tmp_path, "[domains]\nallow_isolate = false\n")
    program = (
        "import json, sys, npu_client\n"
        "with npu_client.connect(sys.argv[1]) as npu:\n"
        "    try:\n"
        "        npu.load_llm(sys.argv[2])\n"
        "    except npu_client.NpuError as exc:\n"
        "        print(json.dumps([type(exc).__name__, str(exc)]))\n"
    )
    try:
        result = subprocess.run(
            [sys.executable, "-c", program, str(refusing.socket_path), str(model(models, "q4_0"))],
            env={**os.environ, "NPUD_LLAMA_LIB": str(libraries.directory)},
            capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
    finally:
        assert refusing.stop() == 0
    kind, message = json.loads(result.stdout)
    assert kind == "DeviceNotFound"
    assert message.startswith(
        f"llama.cpp could not use the NPU through npud at {refusing.socket_path}"
    )
    assert "allow_isolate" in message


def test_npuctl_llm_writes_the_answer(npud: Npud, libraries: Libraries, models: Path) -> None:
    path = model(models, "q4_0")
    expected = cpu_tokens(libraries, path, 16)

    def npuctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "npu_client.npuctl", "--socket", str(npud.socket_path),
             "llm", str(path), *args],
            env={**os.environ, "NPUD_LLAMA_LIB": str(libraries.directory)},
            capture_output=True, text=True, timeout=120, check=False, input=PROMPT,
        )  # fmt: skip

    text = npuctl(PROMPT, "--max-tokens", "16", "--temperature", "0")
    assert (text.returncode, text.stderr) == (0, "")
    report = npuctl("-", "--max-tokens", "16", "--temperature", "0", "--json")  # from stdin
    assert report.returncode == 0, report.stderr
    decoded = json.loads(report.stdout)
    assert decoded["tokens"] == expected
    assert text.stdout == decoded["text"] + "\n"
    assert decoded["statistics"]["stopped_by"] == "length"
    stopped = npuctl(PROMPT, "--temperature", "0", "--stop", "6a", "--ctx", "256")
    assert stopped.stdout == "6566676869\n"


def test_the_chat_example_answers_each_line(npud: Npud, libraries: Libraries, models: Path) -> None:
    """examples/llm_chat.py: a model without a chat template gets plain turns; a long
    conversation drops its oldest turns instead of overflowing the context."""
    lines = "hello\n" + "\n".join(["hello world " * 5] * 30) + "\n"
    result = subprocess.run(
        [sys.executable, str(HERE.parents[1] / "examples" / "llm_chat.py"), str(model(models, "q4_0")),
         "--socket", str(npud.socket_path), "--temperature", "0", "--max-tokens", "8",
         "--ctx", "256"],
        env={**os.environ, "NPUD_LLAMA_LIB": str(libraries.directory)},
        capture_output=True, text=True, timeout=300, check=False, input=lines,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    answers = result.stdout.splitlines()
    assert len(answers) == 31
    assert all(len(answer) == 16 for answer in answers)  # 8 tokens of two hex digits
    assert "on the NPU, 256 tokens of context" in result.stderr


async def test_trio_close_ends_a_stream_and_the_llms_thread(npud: Npud, models: Path) -> None:
    """Each TrioLlm makes its tokens on one thread of its own (llama.cpp's OpenMP pool is
    per calling thread); closing it mid-stream ends the stream at its next token and the
    thread with it."""
    before = {thread.ident for thread in threading.enumerate()}
    async with npu_client.open_trio_client(npud.socket_path, name="llm-test") as npu:
        llm = await npu.load_llm(model(models, "q4_0"))
        stream = llm.stream(PROMPT, max_tokens=None, temperature=0)
        assert await stream.__anext__()
        await llm.close()
        with pytest.raises(npu_client.ModelNotLoaded):
            async for _ in stream:
                pass
        await llm.close()  # idempotent
    left = [t for t in threading.enumerate() if t.ident not in before and t.name.startswith("llm-")]
    assert left == []


def test_the_readme_example_generates_32_tokens_in_three_lines(
    npud: Npud, libraries: Libraries, models: Path
) -> None:
    section = (HERE.parents[1] / "client" / "README.md").read_text().split("\n## LLMs\n", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert len([line for line in code.splitlines() if line.strip()]) == 3
    result = subprocess.run(
        [sys.executable, "-c", code.replace('"model.gguf"', repr(str(model(models, "q4_0"))))],
        env={**os.environ, "NPUD_SOCKET": str(npud.socket_path),
             "NPUD_LLAMA_LIB": str(libraries.directory)},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"[0-9a-f]{64}\n", result.stdout)  # 32 tokens of two hex digits
