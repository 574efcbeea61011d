"""An LLM on the NPU through ``load_llm`` vs llama.cpp's ``llama-simple``: same model, same npud.

Both run llama.cpp with its Hexagon backend through npud (on the emulator, a child
process), on the peer build's tiny q4_0 llama, greedy, the same prompt and number of
tokens. The subject is ``npu_client``'s ``load_llm`` in this process: each round loads
the model afresh (as llama-simple does in each of its runs) and times its first
generation. The baseline is ``llama-simple`` from the same build, one process per round,
loading npud's libcdsprpc.so as a llama.cpp program does; its own figures are read from
its output (``decoded N tokens in T s, speed: X t/s``, and llama.cpp's ``prompt eval
time``). The two take turns round by round (which goes first alternates).

Rows (median of the per-round ratios, IQR):

* ``llm.tokens_per_s``: load_llm's tokens/s / llama-simple's, both counted as
  llama-simple counts (the tokens over the time from the prompt's evaluation to the
  last token). Goal >= 0.95.
* ``llm.first_token``: load_llm's time to its first token (the call to the first token
  chosen) / llama-simple's prompt evaluation time (its first token's, without its
  sampling: a baseline that leaves out what it does). Goal <= 1.1.
* ``llm.trio_tokens_per_s``: the same rate through the trio client (a worker-thread
  step per token) / llama-simple's. No goal.

Figure ``python_lines``: the lines of Python that generate 32 tokens on the NPU, the
example of client/README.md's section "LLMs", run as written (on this npud and model)
and checked to print 32 tokens' text.

Needs the peer build's LLM libraries and llama-cpp-python (``make llm``), and its tiny
model (``make peer-llama``'s models step): without them ``python -m bench`` shows it
skipped, saying which is missing.
Run: ``python -m bench.llm [--rounds N] [--tokens N]``, or ``python -m bench --only llm``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Final, NamedTuple

import trio

import npu_client
from bench import harness
from bench.client_cost import running_npud

PROMPT: Final = "hello world"
MODEL: Final = "tiny-llama-q4_0.gguf"
TOKENS_PER_S_GOAL: Final = 0.95
FIRST_TOKEN_GOAL: Final = 1.1
README: Final = harness.REPO_ROOT / "client" / "README.md"


class Run(NamedTuple):
    tokens_per_s: float
    first_token_s: float


def llama_simple(libraries: Path, model: Path, socket: str, tokens: int) -> Run:
    """One llama-simple run through npud: its speed and its prompt's evaluation time."""
    program = Path(os.path.realpath(libraries / "libllama.so")).parent / "llama-simple"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GGML_", "NPUD_"))}
    env.update(
        LD_LIBRARY_PATH=str(libraries),  # its libcdsprpc.so: npud's
        NPUD_SOCKET=socket,
        GGML_HEXAGON_MBUF="256",
    )
    result = subprocess.run(
        [str(program), "-m", str(model), "-n", str(tokens), PROMPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    log = result.stderr
    speed = re.search(r"decoded (\d+) tokens in [\d.]+ s, speed: ([\d.]+) t/s", log)
    prompt = re.search(r"prompt eval time =\s+([\d.]+) ms", log)
    if result.returncode != 0 or speed is None or prompt is None:
        raise RuntimeError(f"llama-simple exited {result.returncode}:\n{log[-2000:]}")
    if "assigned to device HTP0" not in log:
        raise RuntimeError("llama-simple did not offload to the NPU (HTP0):\n" + log[-2000:])
    if int(speed.group(1)) != tokens:
        raise RuntimeError(f"llama-simple decoded {speed.group(1)} tokens, not {tokens}")
    return Run(float(speed.group(2)), float(prompt.group(1)) / 1000)


def through_load_llm(npu: npu_client.Client, model: Path, tokens: int) -> Run:
    """A fresh load and its first generation, greedy."""
    with npu.load_llm(model) as llm:
        produced = list(llm.tokens(PROMPT, max_tokens=tokens, temperature=0))
        stats = llm.statistics()
    if len(produced) != tokens:
        raise RuntimeError(f"load_llm made {len(produced)} tokens, not {tokens}")
    return Run(stats.tokens_per_s, stats.first_token_s)


def through_trio(socket: str, model: Path, tokens: int) -> Run:
    async def generate() -> Run:
        async with (
            npu_client.open_trio_client(socket, name="bench-llm") as npu,
            await npu.load_llm(model) as llm,
        ):
            produced = [t async for t in llm.tokens(PROMPT, max_tokens=tokens, temperature=0)]
            stats = llm.statistics()
        if len(produced) != tokens:
            raise RuntimeError(f"TrioLlm made {len(produced)} tokens, not {tokens}")
        return Run(stats.tokens_per_s, stats.first_token_s)

    return trio.run(generate)


def readme_example(model: Path, socket: str, libraries: Path) -> int:
    """The README's example of LLMs, run as written on ``model``: its lines of Python."""
    section = README.read_text().split("\n## LLMs\n", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    lines = [line for line in code.splitlines() if line.strip()]
    result = subprocess.run(
        [sys.executable, "-c", code.replace('"model.gguf"', repr(str(model)))],
        env={**os.environ, "NPUD_SOCKET": socket, "NPUD_LLAMA_LIB": str(libraries)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    text = result.stdout.strip()
    # The tiny llama's tokens are two hex digits each: 32 tokens, 64 characters.
    if result.returncode != 0 or not re.fullmatch(r"[0-9a-f]{64}", text):
        raise RuntimeError(f"the README's example failed: {result.stdout!r} {result.stderr}")
    return len(lines)


def prerequisites() -> tuple[Path, Path]:
    """The peer build's LLM libraries and tiny model, llama-cpp-python installed; or
    :class:`harness.UnavailableError` saying which is missing and how to get it."""
    try:
        libraries = npu_client.llm_libraries()
    except npu_client.LlmUnavailable as exc:
        raise harness.UnavailableError(str(exc)) from exc
    if importlib.util.find_spec("llama_cpp") is None:
        raise harness.UnavailableError("llama-cpp-python is not installed: `make llm` installs it")
    model = libraries.parent / "models" / MODEL
    if not model.exists():
        raise harness.UnavailableError(
            f"no {model}: the peer build's models step makes it (make peer-llama)"
        )
    return libraries, model


def measure(
    socket: str, rounds: int, tokens: int, progress: harness.Context | None
) -> list[harness.Row]:
    libraries, model = prerequisites()
    runs: list[tuple[Run, Run, Run]] = []
    with npu_client.connect(socket, name="bench-llm") as npu:
        try:
            through_load_llm(npu, model, tokens)  # warm up both sides once: files, caches
        except npu_client.LlmUnavailable as exc:  # a binding of another version
            raise harness.UnavailableError(str(exc)) from exc
        llama_simple(libraries, model, socket, tokens)
        for index in range(rounds):
            if index % 2:
                baseline = llama_simple(libraries, model, socket, tokens)
                subject = through_load_llm(npu, model, tokens)
            else:
                subject = through_load_llm(npu, model, tokens)
                baseline = llama_simple(libraries, model, socket, tokens)
            trio_run = through_trio(socket, model, tokens)
            runs.append((subject, baseline, trio_run))
            if progress is not None:
                progress.progress(
                    f"llm round {index + 1}/{rounds}: {subject.tokens_per_s:.0f} vs "
                    f"{baseline.tokens_per_s:.0f} t/s"
                )
    lines = readme_example(model, socket, libraries)
    figures = {
        "load_llm_tokens_per_s": harness.median([s.tokens_per_s for s, _, _ in runs]),
        "llama_simple_tokens_per_s": harness.median([b.tokens_per_s for _, b, _ in runs]),
        "trio_tokens_per_s": harness.median([t.tokens_per_s for _, _, t in runs]),
        "load_llm_first_token_ms": harness.median([s.first_token_s for s, _, _ in runs]) * 1000,
        "llama_simple_prompt_eval_ms": harness.median([b.first_token_s for _, b, _ in runs]) * 1000,
        "tokens": tokens,
        "python_lines": lines,
    }
    return [
        harness.ratio_row(
            "llm.tokens_per_s",
            "load_llm t/s / llama-simple t/s (same model, npud, run)",
            [s.tokens_per_s / b.tokens_per_s for s, b, _ in runs],
            figures,
            harness.Goal("ratio", TOKENS_PER_S_GOAL, "at_least"),
        ),
        harness.ratio_row(
            "llm.first_token",
            "load_llm first token / llama-simple prompt eval",
            [s.first_token_s / b.first_token_s for s, b, _ in runs],
            figures,
            harness.Goal("ratio", FIRST_TOKEN_GOAL),
        ),
        harness.ratio_row(
            "llm.trio_tokens_per_s",
            "TrioLlm t/s / llama-simple t/s",
            [t.tokens_per_s / b.tokens_per_s for _, b, t in runs],
            figures,
        ),
    ]


# --- a module of python -m bench (bench/README.md) -----------------------------------------

NAME = "llm"
SUMMARY = "an LLM through load_llm vs llama-simple, same model and npud (needs make llm)"


def rows(ctx: harness.Context) -> list[harness.Row]:
    prerequisites()  # before npud starts: said at once when missing
    with running_npud(ctx.workdir) as socket:
        return measure(socket, ctx.rounds(11, 3), ctx.rounds(64, 32), ctx)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.llm",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=11, help="interleaved rounds (default 11)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per generation (64)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.tokens < 1:
        parser.error("--rounds and --tokens must be at least 1")
    try:
        prerequisites()  # before npud starts: said at once, not after its start-up
    except harness.UnavailableError as exc:
        parser.exit(2, f"{parser.prog}: {exc}\n")
    with (
        tempfile.TemporaryDirectory(prefix="bench-llm-") as workdir,
        running_npud(Path(workdir)) as socket,
    ):
        started = time.monotonic()
        result = measure(socket, args.rounds, args.tokens, None)
    print(harness.format_table(result))
    print(f"({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
