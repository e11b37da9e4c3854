"""Writes the GGUF fixtures of tests/data/gguf/ and the fuzz seeds of fuzz/corpus/gguf/ with the `gguf` package.

tests/data/gguf/quants.gguf holds random blocks of every type hybridlm dequantizes (one tensor per type, named
after it, plus a 3-d Q8_0 tensor) and metadata of every GGUF value type; it is written by gguf's GGUFWriter.
tests/data/gguf/quants_expected.safetensors holds, per tensor, the fp32 values gguf's own dequantizer gives for
the file as gguf's GGUFReader reads it back (Q8_K, which gguf cannot dequantize, from ggml's formula d * q in
numpy). The C++ test (tests/test_gguf.cpp) asserts hybridlm's reader gives the same metadata and the same bits.

Random blocks are random bytes with the scale fields overwritten by finite fp16 values (half of them of a
realistic size, half any finite bit pattern, subnormals included), so every quant and scale bit is exercised and
no product overflows. Rerun only to change the fixtures (the output is the same for the same gguf and numpy):

    python3 -m venv build/gguf_venv && build/gguf_venv/bin/pip install -r tools/gguf_check/requirements.txt
    build/gguf_venv/bin/python tools/gguf_check/make_fixtures.py
"""
import json
import pathlib
import struct

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "gguf"
SEEDS = ROOT / "fuzz" / "corpus" / "gguf"

# type: (row length, rows, byte offsets of its f16 scale fields in a block)
TYPES = {
    T.F32: (64, 4, ()),
    T.F16: (64, 4, ()),
    T.BF16: (64, 4, ()),
    T.Q4_0: (256, 4, (0,)),
    T.Q4_1: (256, 4, (0, 2)),
    T.Q5_0: (256, 4, (0,)),
    T.Q5_1: (256, 4, (0, 2)),
    T.Q8_0: (256, 4, (0,)),
    T.Q2_K: (512, 4, (80, 82)),
    T.Q3_K: (512, 4, (108,)),
    T.Q4_K: (512, 4, (0, 2)),
    T.Q5_K: (512, 4, (0, 2)),
    T.Q6_K: (512, 4, (208,)),
    T.Q8_K: (512, 4, ()),  # its scale is an f32 at offset 0, set below
}


def finite_f16(rng, n):
    """n finite fp16 values as uint16 bits: half of realistic scale size, half any finite pattern."""
    realistic = (rng.standard_normal(n) * rng.choice([1e-3, 1e-2, 1e-1, 1.0], n)).astype(np.float16).view(np.uint16)
    bits = rng.integers(0, 1 << 16, n, dtype=np.uint16)
    exp_all_ones = (bits & 0x7C00) == 0x7C00
    bits[exp_all_ones] &= np.uint16(0xBFFF)  # clear the top exponent bit: finite
    return np.where(rng.random(n) < 0.5, realistic, bits).astype(np.uint16)


def random_blocks(rng, qtype, n_blocks):
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (n_blocks, type_size), dtype=np.uint8)
    for off in TYPES[qtype][2]:
        blocks[:, off:off + 2] = finite_f16(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    if qtype == T.Q8_K:
        d = (rng.standard_normal(n_blocks) * 1e-2).astype(np.float32)
        blocks[:, 0:4] = d.view(np.uint8).reshape(n_blocks, 4)
    return blocks


def tensor_bytes(rng, qtype):
    row, rows, _ = TYPES[qtype]
    n = row * rows
    if qtype == T.F32:
        v = rng.standard_normal(n).astype(np.float32)
        v[:6] = [np.inf, -np.inf, np.nan, -0.0, np.float32(1e-45), np.finfo(np.float32).max]
        return v.view(np.uint8).reshape(rows, -1)
    if qtype == T.F16:
        bits = rng.integers(0, 1 << 16, n, dtype=np.uint16)  # every pattern: subnormals, inf, NaN (quiet, signalling)
        bits[:8] = [0x0000, 0x8000, 0x0001, 0x83FF, 0x7BFF, 0x7C00, 0xFC00, 0x7E00]
        return bits.view(np.uint8).reshape(rows, -1)
    if qtype == T.BF16:
        bits = rng.integers(0, 1 << 16, n, dtype=np.uint16)
        bits[:6] = [0x0000, 0x8000, 0x0001, 0x7F80, 0xFF80, 0x7FC0]
        return bits.view(np.uint8).reshape(rows, -1)
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = random_blocks(rng, qtype, n // block_size)
    return blocks.reshape(rows, -1)


def reference_dequantize(data, qtype):
    if qtype == T.Q8_K:  # not in gguf.quants; ggml's dequantize_row_q8_K: y = d * q
        blocks = data.reshape(-1, gguf.GGML_QUANT_SIZES[T.Q8_K][1])
        d = blocks[:, 0:4].copy().view(np.float32)
        q = blocks[:, 4:260].copy().view(np.int8).astype(np.float32)
        return (d * q).reshape(*data.shape[:-1], -1)
    if qtype == T.BF16:
        return gguf.quants.BF16.dequantize(data)
    return gguf.quants.dequantize(data, qtype)


def add_every_value_type(w):
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_float32("test.f32", 0.1)
    w.add_bool("test.bool_true", True)
    w.add_bool("test.bool_false", False)
    w.add_string("test.string", "h\u00e9llo \u2713 \u65e5\u672c")
    w.add_uint64("test.u64", 2**63 + 5)
    w.add_int64("test.i64", -(2**62) - 7)
    w.add_float64("test.f64", 0.1)
    w.add_key_value("test.array_u8", [0, 7, 255], V.ARRAY, sub_type=V.UINT8)
    w.add_key_value("test.array_i16", [-32768, 0, 32767], V.ARRAY, sub_type=V.INT16)
    w.add_key_value("test.array_u32", [1, 4000000000], V.ARRAY, sub_type=V.UINT32)
    w.add_key_value("test.array_i64", [-(2**63), 2**63 - 1], V.ARRAY, sub_type=V.INT64)
    w.add_key_value("test.array_f32", [0.5, -1.25, 3.0e38], V.ARRAY, sub_type=V.FLOAT32)
    w.add_key_value("test.array_f64", [0.1, -2.5], V.ARRAY, sub_type=V.FLOAT64)
    w.add_key_value("test.array_bool", [True, False, True], V.ARRAY, sub_type=V.BOOL)
    w.add_key_value("test.array_string", ["a", "", "\u00fc\u00df", "two words"], V.ARRAY, sub_type=V.STRING)
    w.add_key_value("test.array_nested", [[1, 2, 3], [-4]], V.ARRAY, sub_type=V.ARRAY)


def write_safetensors(path, tensors):
    """A minimal safetensors writer (F32 only), so the expected values do not go through hybridlm's GGUF code."""
    header, blobs, off = {}, [], 0
    for name, arr in tensors.items():
        b = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((8 - len(text) % 8) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text.encode() + b"".join(blobs))


def write_quants(rng):
    path = OUT / "quants.gguf"
    w = gguf.GGUFWriter(str(path), "test")
    w.add_custom_alignment(64)
    add_every_value_type(w)
    for qtype in TYPES:
        w.add_tensor(qtype.name, tensor_bytes(rng, qtype), raw_dtype=qtype)
    w.add_tensor("q8_0_3d", random_blocks(rng, T.Q8_0, 12).reshape(2, 3, -1), raw_dtype=T.Q8_0)  # ne = [64, 3, 2]
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    r = gguf.GGUFReader(str(path))
    expected = {}
    for t in r.tensors:
        values = reference_dequantize(np.asarray(t.data), t.tensor_type)
        row = int(t.shape[0])
        assert values.dtype == np.float32 and values.shape[-1] == row, (t.name, values.shape)
        expected[t.name] = values
    write_safetensors(OUT / "quants_expected.safetensors", expected)
    return path


def write_seeds(rng):
    SEEDS.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(SEEDS / "metadata"), "seed")
    add_every_value_type(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()

    w = gguf.GGUFWriter(str(SEEDS / "small_tensors"), "seed")
    w.add_uint32("seed.block_count", 1)
    w.add_tensor("f32", rng.standard_normal((2, 4)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal(8).astype(np.float16))
    for qtype in (T.Q4_0, T.Q5_1, T.Q8_0):
        w.add_tensor(qtype.name, random_blocks(rng, qtype, 2).reshape(1, -1), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    w = gguf.GGUFWriter(str(SEEDS / "k_quants"), "seed")
    w.add_custom_alignment(16)
    for qtype in (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K):
        w.add_tensor(qtype.name, random_blocks(rng, qtype, 1).reshape(1, -1), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20261208)
    path = write_quants(rng)
    write_seeds(rng)
    total = sum(p.stat().st_size for p in list(OUT.iterdir()) + list(SEEDS.iterdir()))
    print(f"wrote {path} and its expected values, fuzz seeds in {SEEDS}; {total} bytes in all")


if __name__ == "__main__":
    main()
