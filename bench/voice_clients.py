"""The voice day's clients, shared by ``bench.voice_day`` and its ``--llm`` mode
(``bench.voice_llm``): the realtime Silero VAD run in this process (:class:`Vad`), and
the child that loads Kokoro and a background client (:data:`LOAD`), both from
examples/voice_day.py.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any, NamedTuple

import numpy as np

import npu_client
from bench import harness

EXAMPLE = harness.REPO_ROOT / "examples" / "voice_day.py"
BACKGROUND_MS = 50

LOAD = """
import importlib.util, json, sys, threading, time
from pathlib import Path
import numpy as np
import npu_client
spec = importlib.util.spec_from_file_location("voice_day", sys.argv[1])
example = importlib.util.module_from_spec(spec)
sys.modules["voice_day"] = example
spec.loader.exec_module(example)
socket, cache, background_ms = sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
play = len(sys.argv) > 5 and sys.argv[5] == "play"
kokoro = example.Kokoro.load(example.VOICES[0], example.DEFAULT_TOKENS)
sentences = [phonemes for _, phonemes in example.SENTENCES]
model = example.kokoro_model(cache)
work = (background_ms * 1000).to_bytes(4, "little")
first = {}

def tts(seconds, out):
    end, index = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        phonemes = sentences[index % len(sentences)]
        for name, value in kokoro.inputs(phonemes).items():
            views[name][...] = value
        began = time.monotonic()
        voice.execute()
        out["synthesis_s"] += time.monotonic() - began
        audio = np.array(audio_out)
        if first.setdefault(phonemes, audio) is not audio and not np.array_equal(
            first[phonemes], audio
        ):
            raise SystemExit(f"TTS gave {phonemes!r} different audio under load")
        audio_s = example.audio_length(audio) / example.TTS_RATE
        out["audio_s"] += audio_s
        out["sentences"] += 1
        index += 1
        if play:  # a speaker plays it before the next utterance is synthesised
            time.sleep(max(0.0, min(audio_s, end - time.monotonic())))

def background(seconds, out):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        skel.invoke(example.BUSY_METHOD, [work])
        out["background_calls"] += 1

with (
    npu_client.connect(socket, name="bench-tts") as tts_client,
    tts_client.load_model(model, shapes=kokoro.shapes) as voice,
    npu_client.connect(socket, name="bench-bg", priority="background") as bg_client,
    bg_client.open(example.TEST_SKEL) as skel,
):
    views = {name: voice.input_view(name) for name in ("tokens", "style", "speed")}
    audio_out = voice.output_view("audio")
    print("READY", flush=True)
    for line in sys.stdin:
        seconds = float(line)
        out = {"synthesis_s": 0.0, "audio_s": 0.0, "sentences": 0, "background_calls": 0}
        began = time.monotonic()
        work_of = (tts, background) if background_ms else (tts,)
        threads = [threading.Thread(target=f, args=(seconds, out)) for f in work_of]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        out["wall_s"] = time.monotonic() - began
        print(json.dumps(out), flush=True)
"""


class Phase(NamedTuple):
    p50_ms: float
    p99_ms: float
    dsp_p99_ms: float  # the runs' time in npud's DSP call (its reply's dsp_us)
    misses: int
    probabilities: list[float]


def load_example() -> Any:
    import importlib.util  # noqa: PLC0415  (the example is a file, not a package)

    spec = importlib.util.spec_from_file_location("voice_day", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("voice_day", module)
    spec.loader.exec_module(module)
    return module


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    if not ordered:  # the phase's first chunk missed its deadline
        return float("nan")
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


class Vad:
    """The realtime client, connected and loaded once; :meth:`phase` runs it for a while."""

    def __init__(self, example: Any, socket: str, stack: contextlib.ExitStack) -> None:
        self._example = example
        npu = stack.enter_context(
            npu_client.connect(
                socket,
                name="bench-voice-vad",
                priority="realtime",
                budget=(example.PERIOD, example.VAD_BUDGET),
            )
        )
        self._model = stack.enter_context(
            npu.load_model(example.silero_model(), shapes=example.VAD_SHAPES)
        )
        self._model.set_input("sr", np.array(example.RATE, np.int64))
        signal = example.test_signal(6.0)
        padded = np.concatenate([np.zeros(example.CONTEXT, np.float32), signal])
        self._chunks = [
            padded[start : start + example.CONTEXT + example.CHUNK].reshape(1, -1)
            for start in range(0, signal.size - example.CHUNK + 1, example.CHUNK)
        ]

    def phase(self, seconds: float) -> Phase:
        ex, vad = self._example, self._model
        vad.set_input("state", np.zeros((2, 1, 128), np.float32))
        audio, state = vad.input_view("input"), vad.input_view("state")
        probability, new_state = vad.output_view("output"), vad.output_view("stateN")
        latencies: list[float] = []
        dsp: list[float] = []
        probabilities: list[float] = []
        misses = 0
        count = int(seconds / ex.PERIOD)
        begin = time.monotonic()
        for index in range(count):
            due = begin + index * ex.PERIOD
            time.sleep(max(0.0, due - time.monotonic()))
            audio[...] = self._chunks[index % len(self._chunks)]
            try:
                vad.execute(deadline=ex.PERIOD)
            except npu_client.DeadlineExceeded:
                misses += 1
                break  # the recurrence is broken: the rest of the phase is not comparable
            latency = time.monotonic() - due
            state[...] = new_state
            latencies.append(latency * 1000)
            dsp.append(vad.last_dsp_us / 1000)
            misses += latency > ex.MISS_AFTER
            probabilities.append(float(probability[0, 0]))
        return Phase(
            percentile(latencies, 0.5),
            percentile(latencies, 0.99),
            percentile(dsp, 0.99),
            misses,
            probabilities,
        )
