"""The CPU's tokens for a prompt, from llama-cpp-python alone: the oracle of tests/llm.

Run as a script in a process of its own (a process's ggml registry keeps every backend
it loaded): only llama.cpp's CPU backend is loaded. Greedy tokens come from the
binding's high-level ``Llama.generate`` (its own code, not npu_client's); sampled ones
from llama.cpp's sampler chain built here as npu_client documents it (top-k, top-p,
temperature, a seeded draw). Prints the token ids as one JSON list.

    python cpu_reference.py LIBDIR MODEL PROMPT N [TEMPERATURE TOP_K TOP_P SEED]
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import sys
from typing import Any


def main(argv: list[str]) -> int:
    libdir, model, prompt, count = argv[0], argv[1], argv[2], int(argv[3])
    os.environ["LLAMA_CPP_LIB_PATH"] = libdir
    lib: Any = importlib.import_module("llama_cpp")  # after LLAMA_CPP_LIB_PATH
    ggml = ctypes.CDLL(os.path.join(libdir, "libggml.so"))
    ggml.ggml_backend_load.restype = ctypes.c_void_p
    ggml.ggml_backend_load.argtypes = [ctypes.c_char_p]
    if not ggml.ggml_backend_load(os.path.join(libdir, "libggml-cpu.so").encode()):
        raise SystemExit("the CPU backend did not load")
    llm = lib.Llama(model, n_gpu_layers=0, n_ctx=512, verbose=False)
    tokens = llm.tokenize(prompt.encode(), add_bos=True, special=True)
    if len(argv) == 4:
        out = greedy(lib, llm, tokens, count)
    else:
        temperature, top_k, top_p, seed = float(argv[4]), int(argv[5]), float(argv[6]), int(argv[7])
        out = sampled(lib, llm, tokens, count, (temperature, top_k, top_p, seed))
    print(json.dumps(out))
    llm.close()
    return 0


def greedy(lib: Any, llm: Any, tokens: list[int], count: int) -> list[int]:
    out: list[int] = []
    for token in llm.generate(tokens, temp=0.0, repeat_penalty=1.0):
        if lib.llama_vocab_is_eog(llm._model.vocab, token) or len(out) == count:
            break
        out.append(int(token))
    return out


def sampled(
    lib: Any, llm: Any, tokens: list[int], count: int, how: tuple[float, int, float, int]
) -> list[int]:
    temperature, top_k, top_p, seed = how
    ctx, vocab = llm._ctx.ctx, llm._model.vocab
    chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
    for sampler in (
        lib.llama_sampler_init_top_k(top_k),
        lib.llama_sampler_init_top_p(top_p, 1),
        lib.llama_sampler_init_temp(temperature),
        lib.llama_sampler_init_dist(seed),
    ):
        lib.llama_sampler_chain_add(chain, sampler)
    prompt = (lib.llama_token * len(tokens))(*tokens)
    batch = lib.llama_batch_get_one(prompt, len(tokens))
    last = (lib.llama_token * 1)()
    out: list[int] = []
    while len(out) < count:
        if lib.llama_decode(ctx, batch) != 0:
            raise SystemExit("decode failed")
        token = int(lib.llama_sampler_sample(chain, ctx, -1))
        if lib.llama_vocab_is_eog(vocab, token):
            break
        out.append(token)
        last[0] = token
        batch = lib.llama_batch_get_one(last, 1)
    lib.llama_sampler_free(chain)
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
