"""Writes gguf-py's fp32 values of the first rows of every tensor of a GGUF file, for the opt-in check of hybridlm's
reader on a released file (tests/test_gguf.cpp, Gguf.ReleasedFileFromEnvironment):

    build/gguf_venv/bin/python tools/gguf_check/dequantize_released.py model.gguf build/model_expected.safetensors
    HLM_GGUF_FILE=model.gguf HLM_GGUF_EXPECTED=build/model_expected.safetensors \
        build/release/hybridlm_tests --gtest_filter=Gguf.ReleasedFileFromEnvironment

Each entry is named after its tensor and holds its first ROWS rows (all rows when fewer), shape [rows, row length].
Tensors of a type gguf-py cannot dequantize are left out.
"""
import sys
import pathlib

import numpy as np
import gguf

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from make_fixtures import write_safetensors  # noqa: E402

ROWS = 4


def main(src, dst):
    r = gguf.GGUFReader(src)
    out = {}
    for t in r.tensors:
        row = int(t.shape[0])
        block_size, type_size = gguf.GGML_QUANT_SIZES[t.tensor_type]
        raw = np.asarray(t.data).view(np.uint8).reshape(-1, row // block_size * type_size)[:ROWS]
        try:
            values = gguf.quants.dequantize(raw, t.tensor_type)
        except NotImplementedError:
            continue
        out[t.name] = np.asarray(values, dtype=np.float32).reshape(raw.shape[0], row)
    write_safetensors(pathlib.Path(dst), out)
    print(f"{dst}: first {ROWS} rows of {len(out)} of {len(r.tensors)} tensors")


if __name__ == "__main__":
    main(*sys.argv[1:3])
