"""Write a tiny llama GGUF whose greedy continuation is decided by a wide margin.

For greedy-decode tests of llama.cpp's Hexagon path through npud
(scripts/peer-llama.sh). Needs numpy and gguf-py from the llama-cpp-python
sdist (the script installs both into its own virtual environment).

The planted structure: token t's embedding is an orthonormal code c_t
(scaled); row v of the output matrix is c_(v-1), so the residual stream of
the last token picks the successor (t + 1) mod V. Attention and FFN weights
are random and small (--noise): every op runs on real data, and none moves
the argmax. Greedy text is therefore "t+1, t+2, ..." from the last prompt
token, which llama.cpp's "test" tokenizer prints as hex ids. A correct DSP
must reproduce the CPU's text exactly, whatever the weight type.

Shapes are multiples of 32, so every MUL_MAT suits the Hexagon backend's
repacked (q4_0, q8_0, ...) path.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import gguf  # from the sdist: vendor/llama.cpp/gguf-py
import numpy as np

TYPES = {
    "f32": gguf.GGMLQuantizationType.F32,
    "f16": gguf.GGMLQuantizationType.F16,
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
    "q4_0": gguf.GGMLQuantizationType.Q4_0,
    "q4_1": gguf.GGMLQuantizationType.Q4_1,
}
FILE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7}


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--type", default="f16", choices=sorted(TYPES), help="2-D weights")
    parser.add_argument("--vocab", type=int, default=128)
    parser.add_argument("--embd", type=int, default=128)
    parser.add_argument("--ff", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--ctx", type=int, default=256)
    parser.add_argument("--noise", type=float, default=0.02, help="stdev of attention/FFN")
    parser.add_argument("--margin", type=float, default=8.0, help="scale of the output logits")
    parser.add_argument("--seed", type=int, default=1234)
    return parser.parse_args()


def main() -> int:
    a = parse()
    if a.embd < a.vocab:
        print("--embd must be at least --vocab (orthonormal token codes)", file=sys.stderr)
        return 2
    rng = np.random.default_rng(a.seed)
    vocab, embd, ff, heads, layers = a.vocab, a.embd, a.ff, a.heads, a.layers
    qtype = TYPES[a.type]

    q, _ = np.linalg.qr(rng.standard_normal((embd, embd)))
    codes = q[:vocab].astype(np.float32)  # unit rows
    tok_embd = (codes * np.float32(np.sqrt(embd))).astype(np.float32)  # rms 1 per token
    output = (np.roll(codes, 1, axis=0) * np.float32(a.margin)).astype(np.float32)

    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name("npud-tiny-llama")
    w.add_context_length(a.ctx)
    w.add_embedding_length(embd)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(heads)
    w.add_rope_dimension_count(embd // heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_file_type(FILE_TYPES[a.type])
    w.add_tokenizer_model("test")
    w.add_token_list([f"tok_{i}" for i in range(vocab)])
    w.add_token_scores([0.0] * vocab)
    w.add_token_types([1] * vocab)
    w.add_bos_token_id(0)
    w.add_add_bos_token(False)

    def matrix(name: str, values: Any) -> None:
        values = np.ascontiguousarray(values, dtype=np.float32)
        if qtype == gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, values)
        elif qtype == gguf.GGMLQuantizationType.F16:
            w.add_tensor(name, values.astype(np.float16))
        else:
            packed = gguf.quants.quantize(values, qtype)
            w.add_tensor(name, packed, raw_shape=packed.shape, raw_dtype=qtype)

    w.add_tensor("token_embd.weight", tok_embd)  # stays f32: GET_ROWS on the CPU
    w.add_tensor("output_norm.weight", np.ones(embd, np.float32))
    matrix("output.weight", output)
    for layer in range(layers):
        prefix = f"blk.{layer}."
        w.add_tensor(prefix + "attn_norm.weight", np.ones(embd, np.float32))
        w.add_tensor(prefix + "ffn_norm.weight", np.ones(embd, np.float32))
        for name, shape in (
            ("attn_q", (embd, embd)),
            ("attn_k", (embd, embd)),
            ("attn_v", (embd, embd)),
            ("attn_output", (embd, embd)),
            ("ffn_gate", (ff, embd)),
            ("ffn_up", (ff, embd)),
            ("ffn_down", (embd, ff)),
        ):
            matrix(prefix + name + ".weight", rng.standard_normal(shape) * a.noise)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {a.out}: llama V={vocab} E={embd} F={ff} heads={heads} layers={layers} {a.type}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
