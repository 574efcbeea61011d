"""voice_day's ``--llm`` mode: llama.cpp decoding as a third client beside realtime VAD and Kokoro.

The clients: the realtime Silero VAD (``bench.voice_clients.Vad``, in this process),
Kokoro TTS as a normal client (voice_day's load child, without its busy client)
speaking as a voice pipeline does: it synthesises an utterance, then plays it
(waits for the audio's duration) before it synthesises the next, so its DSP
duty cycle is about its real-time factor, not 100 % (voice_day's own mode
synthesises back to back, as a stress for the VAD); its real-time factor is
still synthesis time over audio time, utterance by utterance, and the
peer build's ``llama-simple`` decoding the tiny q4_0 llama in a loop
through npud's libcdsprpc (``NPUD_PRIORITY=background``; its dspqueue needs a DSP
process of its own, so it has its own domain). The emulator models the device's
DSP (``[emulator] dsp_units = 4, hmx_units = 1``: four HVX contexts and the one HMX
unit, which the VAD's and Kokoro's graphs and llama.cpp's MUL_MAT batches take
turns on; docs/emulator.md, "Concurrency"), so the three compete for a DSP, not
only for the host's CPUs.

The host is not the device: its 2 cores run the emulated DSP's work (the VAD's
and Kokoro's graphs, llama.cpp's op batches, computed for real in the DSP
processes) and the CPU-side work (llama-simple's own ops, the clients, the
host's other users) at once, and measured on a shared host the VAD's latency
was the host's: its p99 and misses were as bad beside a bare CPU burner or
with nothing running as beside llama.cpp, its time all inside the DSP call
(issue 28). So, as a device's DSP is a processor of its own, each phase runs
npud, its DSP processes and the VAD's thread at host priority ``DSP_NICE``
(-10) and everything else at its own: the CPU side's load no longer decides
the DSP's latency, while the DSP's pieces still share the host's cores (and
the model charges each the CPU time it took, docs/emulator.md). The DSP's own
pieces together (Kokoro's graphs back to back, llama.cpp's batches, the VAD)
still need about all of the 2 cores, so the VAD has a DSP process of its own
(a ``[domains]`` rule) run before them (``VAD_NICE``, -15), as is its thread
here: its latency is then what the model makes of its sharing the HVX
contexts and the HMX with them, not its wait for a host core. Without the
right to raise a priority (CAP_SYS_NICE) it runs as before;
``dsp_prioritised`` in the figures says which.

Three daemons run side by side: one gating the batches (``[scheduler] batches =
"gated"``, the default: a background batch waits for realtime and normal calls),
one gating them for realtime calls only (``batch_yield = "realtime"``: its batches
share the DSP with Kokoro's graphs) and one with the rule of before (``batches =
"counted"``). A round runs phases of ``--seconds``: ``quiet`` (VAD alone), ``all``
(VAD, TTS and llama.cpp) and ``llm`` (llama.cpp alone) on the gating and the counting
daemons, ``voice`` (VAD and TTS) on the gating one, ``all`` on the realtime-only one
(whose other phases would be the gating one's: nothing it runs alone is held); their
order alternates round by round. Rows (the median of the
per-round ratios, with their spread):

* ``voice_llm.vad_misses``: VAD chunks over 30 ms late with llama.cpp decoding
  (a count; goal 0);
* ``voice_llm.vad_p99``: VAD p99 with llama.cpp (and TTS) / alone (goal <= 1.5);
* ``voice_llm.vad_p99_ungated``: the same with today's rule (no goal: what
  gating buys);
* ``voice_llm.vad_p99_yield_realtime``: the same where batches yield to realtime
  calls only (no goal);
* ``voice_llm.vad_p99_beside_tts``: VAD p99 with llama.cpp (and TTS) / with the TTS
  alone (no goal: what llama.cpp adds to what Kokoro does, the HMX being one);
* ``voice_llm.tts_rtf``: Kokoro's real-time factor with llama.cpp / without
  (goal <= 1.2);
* ``voice_llm.tts_rtf_yield_realtime``: the same where batches yield to realtime
  calls only (no goal: what holding them for Kokoro's graphs buys Kokoro);
* ``voice_llm.tts_rtf_ungated``: the same on the ungated daemon, over the same
  voice phase (no goal);
* ``voice_llm.llm_beside_voice``: llama.cpp's tokens/s beside voice / alone
  (goal >= 0.8);
* ``voice_llm.llm_beside_voice_yield_realtime``: the same where batches yield to
  realtime calls only (no goal: what holding them for Kokoro's graphs costs the LLM);
* ``voice_llm.llm_beside_voice_ungated``: the same with today's rule (no goal:
  what the gate costs beside voice, the rest being the DSP's and the host's
  sharing);
* ``voice_llm.llm_gate_cost``: llama.cpp's tokens/s alone, gating on / off
  (goal >= 0.95);
* ``voice_llm.dsp_share``: llama.cpp's DSP time in npud's status (what ``npuctl
  top`` shows) / the emulated DSP's own count (the ``OPBATCH`` times of
  ``GGML_HEXAGON_PROFILE``), alone (goal within 10 %). npud charges each batch
  the DSP time its answer reports, which the emulator's DSP tells and a
  device's kernel does not (there npud estimates: docs/scheduling.md, "The
  LLM's batches"); the report leaves out the worker's mapping of a batch's
  buffers, which ``OPBATCH`` counts;
* ``voice_llm.dsp_share_estimate``: the same on the ungated daemon, whose
  emulator reports no DSP time (``[emulator] report_dsp_time = false``), as a
  device's kernel reports none: what npud's estimate makes of the batches
  (no goal: the estimate a device gets);
* ``voice_llm.added_per_batch``: the time a batch costs at the client beyond
  the DSP's own time / one call's round trip (a 64-byte echo through the same
  npud) (no goal here: it includes llama.cpp's own CPU work between two batches
  and the emulated DSP process's thread hand-offs; the issue's goal, the time npud
  adds per batch / one call's round trip <= 2, is ``bench.batch_rtt``'s
  ``added_per_batch``, measured against a minimal server making the same emulator
  calls).

Figures: the phases' VAD p50/p99 and misses, the TTS real-time factors, the
tokens/s, the DSP times, and ``voice_dsp_share``: the voice clients' share of the
phase's time on the DSP in npud's count (VAD and Kokoro, without llama.cpp), beside
``llm_dsp_share_alone``, the share of its decoding time llama.cpp's batches hold the
DSP. ``--plot FILE`` draws the per-round ratios against
their goals (needs matplotlib: ``pip install -e '.[bench]'``).

Needs the peer build (``make peer-llama``; its cache is ``$NPUD_PEER_CACHE``,
else ``~/.cache/npud-peer``) and the voice extra.
Run: ``python -m bench.voice_day --llm [--rounds N] [--seconds S] [--plot FILE]``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import statistics
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final, NamedTuple

import npu_client
from bench import harness, processes, voice_clients

EMULATOR: Final = "[emulator]\ndsp_units = 4\nhmx_units = 1\n"
GATES: Final = ("gated", "yield-realtime", "counted")
"""The daemons: batches gated (the default: a background batch waits for realtime and
normal calls), gated for realtime calls only (``batch_yield = "realtime"``), counted."""
DSP_NICE: Final = -10
"""The host priority of the emulated DSP's threads (see the module docstring)."""
VAD_NICE: Final = -15
"""The host priority of the VAD's thread and of its DSP process's."""
VAD_DOMAIN: Final = (
    '[[domains.rule]]\nname = "voice-vad"\nclients = ["bench-voice-vad"]\nisolate = true\n'
)
"""The VAD has a DSP process of its own, which the host runs first (``VAD_NICE``)."""
TOKENS: Final = 128
PROMPT: Final = "hello world"
MODEL: Final = "tiny-llama-q4_0.gguf"
ECHO_URI: Final = "file:///libecho_skel.so?echo_skel_handle_invoke&_modver=1.0&_dom=cdsp"


class Peer(NamedTuple):
    program: Path
    shim: Path
    model: Path


def find_peer() -> Peer:
    """The peer build's llama-simple, npud's libcdsprpc.so.1 and the tiny model."""
    base = os.environ.get("NPUD_PEER_CACHE") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "npud-peer"
    )
    cache = Path(base)
    peer = Peer(cache / "build-cpu/bin/llama-simple", cache / "shim", cache / "models" / MODEL)
    for path in peer:
        if not path.exists():
            raise harness.UnavailableError(f"{path} is missing: build the peer (make peer-llama)")
    return peer


class LlmRun(NamedTuple):
    tokens: int
    decode_s: float
    per_token_ms: float
    opbatch_us: list[int]
    """The DSP's own time of each batch (GGML_HEXAGON_PROFILE), the prompt's first."""
    npud_dsp_us: int
    """The client's DSP time in npud's status, taken as it printed its speed."""
    held_us: dict[str, int]
    """Its batches' time held by the gate, by reason (the status row's ``held``), then."""


class Llama:
    """llama-simple in a loop on one daemon, on a thread of its own (:meth:`start`)."""

    def __init__(self, peer: Peer, socket: str) -> None:
        self._peer = peer
        self._socket = socket
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.runs: list[LlmRun] = []
        self.error: BaseException | None = None

    def start(self) -> None:
        self._stop.clear()
        self.runs = []
        self._thread = threading.Thread(target=self._loop, name="bench-llama", daemon=True)
        self._thread.start()

    def stop(self) -> list[LlmRun]:
        """Stop after the run under way; its runs (RuntimeError if one failed)."""
        self._stop.set()
        assert self._thread is not None
        self._thread.join()
        if self.error is not None:
            raise RuntimeError(f"llama-simple failed: {self.error}") from self.error
        if not self.runs:
            raise RuntimeError("llama-simple finished no run in the phase")
        return self.runs

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self.runs.append(self._once())
        except BaseException as exc:  # reported by stop(), on the bench's thread
            self.error = exc

    def _once(self) -> LlmRun:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GGML_", "NPUD_"))}
        env.update(
            LD_LIBRARY_PATH=str(self._peer.shim),
            NPUD_SOCKET=self._socket,
            NPUD_PRIORITY="background",
            NPUD_CLIENT_NAME="bench-llama",
            GGML_HEXAGON_MBUF="256",
            GGML_HEXAGON_PROFILE="1",
        )
        args = [str(self._peer.program), "-m", str(self._peer.model), "-n", str(TOKENS), PROMPT]
        process = subprocess.Popen(
            args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        assert process.stderr is not None
        lines: list[str] = []
        seen: tuple[int, dict[str, int]] = (0, {})
        try:
            for line in process.stderr:
                lines.append(line)
                if "decoded " in line and " t/s" in line:
                    # Its decode is over and it is still connected: its DSP time now.
                    seen = _accounting_of(self._socket, process.pid)
        finally:
            process.wait(60)
        log = "".join(lines)
        speed = re.search(r"decoded (\d+) tokens in ([\d.]+) s, speed: [\d.]+ t/s", log)
        evaluated = re.search(r"eval time =\s+([\d.]+) ms /\s+(\d+) runs", log)
        if process.returncode != 0 or speed is None or evaluated is None:
            raise RuntimeError(f"exit {process.returncode}:\n{log[-2000:]}")
        if "assigned to device HTP0" not in log:
            raise RuntimeError("llama-simple did not offload to the NPU (HTP0)")
        opbatch = [int(m) for m in re.findall(r"profile-op OPBATCH\|.*\|usec (\d+)", log)]
        return LlmRun(
            int(speed.group(1)),
            float(speed.group(2)),
            float(evaluated.group(1)) / int(evaluated.group(2)),
            opbatch,
            *seen,
        )


def _accounting_of(socket: str, pid: int) -> tuple[int, dict[str, int]]:
    """Client ``pid``'s DSP time in npud's status, and its batches' time held by reason
    (asked on a connection of its own)."""
    with npu_client.connect(socket, name="bench-llm-watch") as watch:
        for row in watch.status().clients:
            if row.pid == pid:
                return row.dsp_us, {hold.reason: hold.held_us for hold in row.held}
    return 0, {}


def _voice_dsp_us(socket: str) -> int:
    """The DSP time in npud's status of every client but llama.cpp's (the voice clients')."""
    with npu_client.connect(socket, name="bench-llm-watch") as watch:
        return sum(
            row.dsp_us
            for row in watch.status().clients
            if row.name not in ("bench-llama", "bench-llm-watch")
        )


def held_ms_per_token(runs: list[LlmRun], reason: str) -> float:
    """The gate's hold for ``reason``, per token decoded (the prompt's batches included)."""
    return sum(run.held_us.get(reason, 0) for run in runs) / 1000 / sum(r.tokens for r in runs)


def tokens_per_s(runs: list[LlmRun]) -> float:
    return sum(r.tokens for r in runs) / sum(r.decode_s for r in runs)


class Daemon:
    """One npud (gating or not) with its VAD, its TTS child and its llama.cpp loop."""

    def __init__(
        self, example: Any, gate: str, workdir: Path, peer: Peer, stack: contextlib.ExitStack
    ) -> None:

        self.gate = gate
        # The ungated daemon's emulator reports no DSP time with its answers, as a
        # device's kernel reports none: its figures show npud's estimate of a batch.
        report = "report_dsp_time = false\n" if gate == "counted" else ""
        scheduler = (
            '[scheduler]\nbatches = "counted"\n'
            if gate == "counted"
            else (
                '[scheduler]\nbatches = "gated"\n'
                + ('batch_yield = "realtime"\n' if gate == "yield-realtime" else "")
            )
        )
        config = EMULATOR + report + scheduler + VAD_DOMAIN
        socket, self.pid = stack.enter_context(
            processes.npud_process(workdir, f"npud-{gate}", config)
        )
        self.socket = str(socket)
        args = [
            sys.executable,
            "-c",
            voice_clients.LOAD,
            str(voice_clients.EXAMPLE),
            self.socket,
            str(workdir / "cache"),
            "0",  # no busy background client: llama.cpp is the background
            "play",  # each utterance is played (its audio's time) before the next
        ]
        self.tts = stack.enter_context(processes.ready_child(args, f"the TTS load ({gate})"))
        before = processes.descendants(self.pid)
        self.vad = voice_clients.Vad(example, self.socket, stack)
        self.vad.phase(1.0)  # warm-up
        self.vad_dsp = processes.descendants(self.pid) - before
        """The VAD's DSP process (its domain's), started for it."""
        self.llama = Llama(peer, self.socket)
        self.prioritised = 0
        """Threads of npud and its DSP processes last given :data:`DSP_NICE`."""

    def echo_rtt_ms(self, calls: int = 300) -> float:
        """The median round trip of a 64-byte echo call through this npud."""
        prim, data = struct.pack("<II", 64, 64), bytes(64)
        with (
            npu_client.connect(self.socket, name="bench-echo") as client,
            client.open(ECHO_URI) as echo,
        ):
            samples = []
            for _ in range(calls):
                began = time.perf_counter()
                echo.invoke(2, [prim, data], [64])
                samples.append(time.perf_counter() - began)
        return statistics.median(samples[calls // 4 :]) * 1000

    def phase(self, kind: str, seconds: float) -> dict[str, Any]:
        """One phase: ``quiet``, ``voice``, ``all`` or ``llm``."""

        out: dict[str, Any] = {}
        if kind in ("all", "llm"):
            self.llama.start()
        if kind in ("voice", "all"):
            assert self.tts.stdin is not None
            self.tts.stdin.write(f"{seconds}\n")
            self.tts.stdin.flush()
        voice_before, began = _voice_dsp_us(self.socket), time.monotonic()
        try:
            # The emulated DSP is a processor of its own: its host threads (npud's and
            # its DSP processes', those the llama run starts included) go before the
            # CPU-side work on the host's cores (llama-simple, Kokoro's client, the
            # host's other users), and so does the VAD's thread (an audio thread).
            self.prioritised = processes.raise_priority(self.pid, DSP_NICE)
            for pid in self.vad_dsp:
                processes.raise_priority(pid, VAD_NICE)
            if kind == "llm":
                time.sleep(seconds)
            else:
                with _thread_priority(VAD_NICE if self.prioritised else 0):
                    out["vad"] = self.vad.phase(seconds)
        finally:
            if kind in ("all", "llm"):
                out["llm"] = self.llama.stop()
        # The voice clients' share of the DSP's time in the phase (npud's count).
        elapsed = time.monotonic() - began
        out["voice_dsp_share"] = (_voice_dsp_us(self.socket) - voice_before) / 1e6 / elapsed
        if kind in ("voice", "all"):
            assert self.tts.stdout is not None
            line = self.tts.stdout.readline()
            if not line:
                raise RuntimeError(f"the TTS child ended (exit {self.tts.wait(30)})")
            tts = json.loads(line)
            if not tts["sentences"]:
                raise RuntimeError("the TTS synthesised no sentence in the phase")
            out["rtf"] = tts["synthesis_s"] / tts["audio_s"]
        return out


@contextlib.contextmanager
def _thread_priority(nice: int) -> Iterator[None]:
    """The calling thread runs at host priority ``nice`` in the block (threads it starts
    meanwhile inherit it: start none)."""
    tid = threading.get_native_id()
    before = os.getpriority(os.PRIO_PROCESS, tid)
    try:
        os.setpriority(os.PRIO_PROCESS, tid, nice)
    except PermissionError:
        yield
        return
    try:
        yield
    finally:
        os.setpriority(os.PRIO_PROCESS, tid, before)


def _schedule(index: int) -> Iterator[tuple[str, str]]:
    order = [
        ("gated", "quiet"),
        ("gated", "voice"),
        ("gated", "all"),
        ("gated", "llm"),
        ("yield-realtime", "all"),
        ("counted", "quiet"),
        ("counted", "all"),
        ("counted", "llm"),
    ]
    yield from (order if index % 2 == 0 else reversed(order))


def measure(
    workdir: Path, rounds: int, seconds: float, progress: harness.Context | None = None
) -> list[harness.Row]:

    example = voice_clients.load_example()
    peer = find_peer()
    results: list[dict[tuple[str, str], dict[str, Any]]] = []
    rtts: list[float] = []
    with contextlib.ExitStack() as stack:
        daemons = {gate: Daemon(example, gate, workdir, peer, stack) for gate in GATES}
        for index in range(rounds):
            this: dict[tuple[str, str], dict[str, Any]] = {}
            for gate, kind in _schedule(index):
                if progress is not None:
                    progress.progress(f"round {index + 1}/{rounds}: {kind} ({gate})")
                this[gate, kind] = daemons[gate].phase(kind, seconds)
            rtts.append(daemons["gated"].echo_rtt_ms())
            results.append(this)
        prioritised = min(daemon.prioritised for daemon in daemons.values())
    return _rows(results, rtts, seconds, prioritised)


def _rows(
    results: list[dict[tuple[str, str], dict[str, Any]]],
    rtts: list[float],
    seconds: float,
    prioritised: int = 0,
) -> list[harness.Row]:
    def vad(r: dict[tuple[str, str], dict[str, Any]], gate: str, kind: str) -> Any:
        return r[gate, kind]["vad"]

    def llm(r: dict[tuple[str, str], dict[str, Any]], gate: str, kind: str) -> list[LlmRun]:
        result: list[LlmRun] = r[gate, kind]["llm"]
        return result

    def share(r: dict[tuple[str, str], dict[str, Any]], gate: str = "gated") -> float:
        runs = llm(r, gate, "llm")
        return sum(run.npud_dsp_us for run in runs) / sum(sum(run.opbatch_us) for run in runs)

    def llm_dsp_share(r: dict[tuple[str, str], dict[str, Any]]) -> float:
        """The share of its decoding time llama.cpp's batches hold the DSP, alone."""
        runs = llm(r, "gated", "llm")
        return sum(sum(run.opbatch_us[1:]) for run in runs) / 1e6 / sum(r.decode_s for r in runs)

    def added(r: dict[tuple[str, str], dict[str, Any]], rtt: float) -> float:
        runs = llm(r, "gated", "llm")
        per_token = statistics.median(run.per_token_ms for run in runs)
        dsp = statistics.median(us / 1000 for run in runs for us in run.opbatch_us[1:])
        return (per_token - dsp) / rtt

    figures = {
        "quiet_p99_ms": statistics.median(vad(r, "gated", "quiet").p99_ms for r in results),
        "llm_p99_ms": statistics.median(vad(r, "gated", "all").p99_ms for r in results),
        "llm_p99_ms_ungated": statistics.median(vad(r, "counted", "all").p99_ms for r in results),
        "llm_p50_ms": statistics.median(vad(r, "gated", "all").p50_ms for r in results),
        "voice_p99_ms": statistics.median(vad(r, "gated", "voice").p99_ms for r in results),
        # The VAD's time in npud's DSP call (its reply's dsp_us): the rest of its latency
        # is npud's queue and the round trip.
        "quiet_dsp_p99_ms": statistics.median(vad(r, "gated", "quiet").dsp_p99_ms for r in results),
        "voice_dsp_p99_ms": statistics.median(vad(r, "gated", "voice").dsp_p99_ms for r in results),
        "llm_dsp_p99_ms": statistics.median(vad(r, "gated", "all").dsp_p99_ms for r in results),
        "llm_dsp_p99_ms_ungated": statistics.median(
            vad(r, "counted", "all").dsp_p99_ms for r in results
        ),
        "misses_gated": float(sum(vad(r, "gated", "all").misses for r in results)),
        "misses_ungated": float(sum(vad(r, "counted", "all").misses for r in results)),
        "misses_yield_realtime": float(
            sum(vad(r, "yield-realtime", "all").misses for r in results)
        ),
        "tts_rtf_voice": statistics.median(r["gated", "voice"]["rtf"] for r in results),
        "tts_rtf_all": statistics.median(r["gated", "all"]["rtf"] for r in results),
        "tts_rtf_all_ungated": statistics.median(r["counted", "all"]["rtf"] for r in results),
        "tts_rtf_all_yield_realtime": statistics.median(
            r["yield-realtime", "all"]["rtf"] for r in results
        ),
        "llm_tokens_per_s_alone": statistics.median(
            tokens_per_s(llm(r, "gated", "llm")) for r in results
        ),
        "llm_tokens_per_s_beside_voice": statistics.median(
            tokens_per_s(llm(r, "gated", "all")) for r in results
        ),
        "llm_tokens_per_s_beside_voice_ungated": statistics.median(
            tokens_per_s(llm(r, "counted", "all")) for r in results
        ),
        "llm_tokens_per_s_beside_voice_yield_realtime": statistics.median(
            tokens_per_s(llm(r, "yield-realtime", "all")) for r in results
        ),
        "llm_tokens_per_s_alone_ungated": statistics.median(
            tokens_per_s(llm(r, "counted", "llm")) for r in results
        ),
        "voice_dsp_share": statistics.median(
            r["gated", "voice"]["voice_dsp_share"] for r in results
        ),
        "llm_dsp_share_alone": statistics.median(llm_dsp_share(r) for r in results),
        "batch_dsp_ms": statistics.median(
            us / 1000 for r in results for run in llm(r, "gated", "llm") for us in run.opbatch_us
        ),
        "batch_ms_at_client": statistics.median(
            run.per_token_ms for r in results for run in llm(r, "gated", "llm")
        ),
        "echo_rtt_ms": statistics.median(rtts),
        "llm_ms_per_token_beside_voice": statistics.median(
            1000 / tokens_per_s(llm(r, "gated", "all")) for r in results
        ),
        **{
            f"held_ms_per_token_{reason}": statistics.median(
                held_ms_per_token(llm(r, "gated", "all"), reason) for r in results
            )
            for reason in ("realtime_on_dsp", "realtime_due", "realtime_overdue", "normal_on_dsp")
        },
        "dsp_prioritised": float(prioritised > 0),
    }
    row = harness.ratio_row
    shares = [share(r) for r in results]
    return [
        row(
            "voice_llm.vad_misses",
            f"VAD chunks over 30 ms late with llama.cpp decoding, per {seconds:g} s (a count)",
            [float(vad(r, "gated", "all").misses) for r in results],
            figures,
            harness.Goal("ratio", 0),
        ),
        row(
            "voice_llm.vad_p99",
            "VAD p99 with llama.cpp and Kokoro / VAD alone (batches gated)",
            [vad(r, "gated", "all").p99_ms / vad(r, "gated", "quiet").p99_ms for r in results],
            figures,
            harness.Goal("ratio", 1.5),
        ),
        row(
            "voice_llm.vad_p99_ungated",
            "the same with today's rule (batches counted, not gated)",
            [vad(r, "counted", "all").p99_ms / vad(r, "counted", "quiet").p99_ms for r in results],
            figures,
        ),
        row(
            "voice_llm.vad_p99_yield_realtime",
            "the same where batches yield to realtime calls only (batch_yield = 'realtime')",
            [
                vad(r, "yield-realtime", "all").p99_ms / vad(r, "gated", "quiet").p99_ms
                for r in results
            ],
            figures,
        ),
        row(
            "voice_llm.vad_p99_beside_tts",
            "VAD p99 with llama.cpp and Kokoro / with Kokoro alone (what llama.cpp adds)",
            [vad(r, "gated", "all").p99_ms / vad(r, "gated", "voice").p99_ms for r in results],
            figures,
        ),
        row(
            "voice_llm.tts_rtf",
            "Kokoro real-time factor with llama.cpp / without",
            [r["gated", "all"]["rtf"] / r["gated", "voice"]["rtf"] for r in results],
            figures,
            harness.Goal("ratio", 1.2),
        ),
        row(
            "voice_llm.tts_rtf_yield_realtime",
            "the same where batches yield to realtime calls only (batch_yield = 'realtime')",
            [r["yield-realtime", "all"]["rtf"] / r["gated", "voice"]["rtf"] for r in results],
            figures,
        ),
        row(
            "voice_llm.tts_rtf_ungated",
            "the same with today's rule (batches counted, not gated)",
            [r["counted", "all"]["rtf"] / r["gated", "voice"]["rtf"] for r in results],
            figures,
        ),
        row(
            "voice_llm.llm_beside_voice",
            "llama.cpp tokens/s beside voice / alone",
            [
                tokens_per_s(llm(r, "gated", "all")) / tokens_per_s(llm(r, "gated", "llm"))
                for r in results
            ],
            figures,
            harness.Goal("ratio", 0.8, "at_least"),
        ),
        row(
            "voice_llm.llm_beside_voice_yield_realtime",
            "the same where batches yield to realtime calls only (batch_yield = 'realtime')",
            [
                tokens_per_s(llm(r, "yield-realtime", "all")) / tokens_per_s(llm(r, "gated", "llm"))
                for r in results
            ],
            figures,
        ),
        row(
            "voice_llm.llm_beside_voice_ungated",
            "the same with today's rule (what the gate costs beside voice, and what the "
            "host's sharing does without it)",
            [
                tokens_per_s(llm(r, "counted", "all")) / tokens_per_s(llm(r, "counted", "llm"))
                for r in results
            ],
            figures,
        ),
        row(
            "voice_llm.llm_gate_cost",
            "llama.cpp tokens/s alone, gating on / off",
            [
                tokens_per_s(llm(r, "gated", "llm")) / tokens_per_s(llm(r, "counted", "llm"))
                for r in results
            ],
            figures,
            harness.Goal("ratio", 0.95, "at_least"),
        ),
        row(
            "voice_llm.dsp_share",
            "llama.cpp's DSP time in npud's status / the emulated DSP's own count",
            shares,
            {**figures, "share_error": abs(statistics.median(shares) - 1)},
            harness.Goal("share_error", 0.10),
        ),
        row(
            "voice_llm.dsp_share_estimate",
            "the same where the emulator reports no DSP time, as a device's kernel reports "
            "none (npud's estimate: doorbell to answer less the path's round trip; the "
            "ungated daemon)",
            [share(r, "counted") for r in results],
            figures,
        ),
        row(
            "voice_llm.added_per_batch",
            "a batch's time at the client beyond its DSP time / one call's round trip "
            "(llama.cpp's own CPU work included: bench.batch_rtt has the goal, npud's part)",
            [added(r, rtt) for r, rtt in zip(results, rtts, strict=True)],
            figures,
        ),
    ]


def plot(rows: list[harness.Row], path: Path) -> None:
    """The rows' ratios with their spread, against their goals (needs matplotlib)."""
    import matplotlib  # noqa: PLC0415  (a bench-only extra)

    matplotlib.use("Agg")
    from matplotlib import pyplot  # noqa: PLC0415

    counts = [row for row in rows if row.name == "voice_llm.vad_misses"]
    ratios = [row for row in rows if row not in counts]
    figure, (left, axes) = pyplot.subplots(
        1, 2, figsize=(13, 5.5), gridspec_kw={"width_ratios": [1, 7]}
    )
    misses = counts[0].figures if counts else {}
    left.bar(
        ["gated", "rt only", "counted"],
        [
            misses.get("misses_gated", 0.0),
            misses.get("misses_yield_realtime", 0.0),
            misses.get("misses_ungated", 0.0),
        ],
        color=["#4477aa", "#77aadd", "#999999"],
    )
    left.set_title("VAD misses (all rounds)")
    left.tick_params(axis="x", rotation=45)
    left.set_ylim(0, max(1.0, *(bar.get_height() for bar in left.patches)) * 1.1)
    names = [row.name.removeprefix("voice_llm.") for row in ratios]
    spread = [[row.ratio - row.q1 for row in ratios], [row.q3 - row.ratio for row in ratios]]
    axes.bar(names, [row.ratio for row in ratios], yerr=spread, capsize=4, color="#4477aa")
    for index, row in enumerate(ratios):
        if row.goal is not None:
            limit = row.goal.limit if row.goal.figure == "ratio" else 1 + row.goal.limit
            axes.hlines(limit, index - 0.4, index + 0.4, colors="#cc3311")
    axes.set_ylabel("ratio (median of rounds, IQR); red: goal")
    axes.set_title("voice beside llama.cpp on one emulated DSP (4 HVX, 1 HMX)")
    pyplot.setp(axes.get_xticklabels(), rotation=40, ha="right")
    figure.tight_layout()
    figure.savefig(path)
    pyplot.close(figure)
