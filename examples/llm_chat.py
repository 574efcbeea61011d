"""A chat with an LLM on the NPU: llama.cpp through npud, in this process.

    python examples/llm_chat.py MODEL.gguf [--socket PATH] [--system TEXT] [--ctx N]
                                [--max-tokens N] [--temperature T]

Reads your lines from stdin (``you>`` on a terminal) and writes the answers as the
model makes them. The conversation is the prompt: the model's own chat template
(in its GGUF) writes it; a model without one gets ``User:``/``Assistant:`` turns.
When the conversation outgrows the context, its oldest turns are dropped. End
with Ctrl-D.

Needs llama.cpp's libraries and llama-cpp-python: ``make llm`` in npud's source
tree (``client/README.md``, "LLMs"). The whole of it, in three lines::

    import npu_client
    with npu_client.connect() as npu, npu.load_llm("model.gguf") as llm:
        print(llm.generate("Hello", max_tokens=32))
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Final

import npu_client

Turn = dict[str, str]
PLAIN_STOP: Final = "\nUser:"
"""Where a model without a chat template would start writing the user's next turn."""


def prompt_of(llm: npu_client.Llm, turns: list[Turn], *, template: bool) -> str:
    """The conversation as the model reads it, the assistant's turn opened."""
    if template:
        return llm.apply_chat_template(turns)
    lines = [
        f"{'User' if turn['role'] == 'user' else turn['role'].capitalize()}: {turn['content']}"
        for turn in turns
    ]
    return "\n".join(lines) + "\nAssistant:"


def fit(llm: npu_client.Llm, turns: list[Turn], room: int, *, template: bool) -> list[Turn]:
    """``turns`` without its oldest exchanges (a system turn stays) until the prompt
    leaves ``room`` tokens of the context for the answer."""
    system = [turn for turn in turns[:1] if turn["role"] == "system"]
    rest = turns[len(system) :]
    while len(rest) > 1:
        prompt = prompt_of(llm, system + rest, template=template)
        if len(llm.tokenize(prompt)) + room <= llm.n_ctx:
            break
        rest = rest[2:] if len(rest) > 2 else rest[1:]
    return system + rest


def chat(llm: npu_client.Llm, args: argparse.Namespace) -> None:
    template = True
    try:
        llm.apply_chat_template([{"role": "user", "content": "hi"}])
    except npu_client.InvalidArgument:
        template = False  # no chat template in this model: plain turns
    turns: list[Turn] = [{"role": "system", "content": args.system}] if args.system else []
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            print("you> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line:
            break
        if not line.strip():
            continue
        turns.append({"role": "user", "content": line.strip()})
        turns = fit(llm, turns, args.max_tokens, template=template)
        answer = []
        stop = () if template else (PLAIN_STOP,)
        for piece in llm.stream(
            prompt_of(llm, turns, template=template),
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            stop=stop,
        ):
            print(piece, end="", flush=True)
            answer.append(piece)
        print(flush=True)
        turns.append({"role": "assistant", "content": "".join(answer).strip()})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path, help="a GGUF model file")
    parser.add_argument("--socket", help="npud's socket (default: $NPUD_SOCKET, else npud's)")
    parser.add_argument("--system", default="", help="a system message to begin with")
    parser.add_argument("--ctx", type=int, default=2048, help="tokens of context (default 2048)")
    parser.add_argument("--max-tokens", type=int, default=256, help="per answer (default 256)")
    parser.add_argument("--temperature", type=float, default=0.7, help="0: greedy (default 0.7)")
    args = parser.parse_args(argv)
    try:
        with (
            npu_client.connect(args.socket, name="llm-chat", priority="background") as npu,
            npu.load_llm(args.model, n_ctx=args.ctx) as llm,
        ):
            print(f"{llm.description} on the NPU, {llm.n_ctx} tokens of context", file=sys.stderr)
            chat(llm, args)
    except npu_client.NpuError as exc:  # npud, the libraries, the model: one line says which
        print(f"llm_chat: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
