"""tokenizer/gguf_meta.py on small GGUF files written here byte by byte, and on the default model."""

import pathlib
import struct
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

from tokenizer.gguf_meta import GGUFError, read_header, read_metadata  # noqa: E402
from tests.conftest import gguf_str, model_path, write_gguf


KVS = [("general.architecture", 8, "llama"), ("u8", 0, 255), ("i8", 1, -128), ("u16", 2, 65535),
       ("i16", 3, -32768), ("u32", 4, 2 ** 32 - 1), ("i32", 5, -2 ** 31), ("f32", 6, 0.5), ("bool", 7, True),
       ("u64", 10, 2 ** 64 - 1), ("i64", 11, -2 ** 63), ("f64", 12, 1e-300),
       ("tokens", 9, (8, ["<|a|>", "Ġb", "中", ""])), ("types", 9, (5, [3, 1, 1, 4])),
       ("nested", 9, (9, [(4, [1, 2]), (8, ["x"])])), ("llama.context_length", 4, 8192)]


def test_every_type_and_order(tmp_path):
    write_gguf(tmp_path / "m.gguf", KVS)
    meta = read_metadata(tmp_path / "m.gguf")
    assert list(meta) == [k for k, _, _ in KVS]
    assert meta["u64"] == 2 ** 64 - 1 and meta["i64"] == -2 ** 63 and meta["f32"] == 0.5
    assert meta["bool"] is True and meta["tokens"] == ["<|a|>", "Ġb", "中", ""]
    assert meta["nested"] == [[1, 2], ["x"]] and meta["types"] == [3, 1, 1, 4]
    assert read_header(tmp_path / "m.gguf") == {"version": 3, "n_tensors": 2, "n_kv": len(KVS)}


def test_keys_filter(tmp_path):
    write_gguf(tmp_path / "m.gguf", KVS)
    assert read_metadata(tmp_path / "m.gguf", keys=["llama.context_length", "absent"]) == {
        "llama.context_length": 8192}


def test_truncation_names_the_key(tmp_path):
    body = write_gguf(tmp_path / "m.gguf", KVS)
    cut = body.index(b"tokens") + 20
    (tmp_path / "t.gguf").write_bytes(body[:cut])
    with pytest.raises(GGUFError, match="'tokens'"):
        read_metadata(tmp_path / "t.gguf")


def test_bad_files(tmp_path):
    write_gguf(tmp_path / "magic.gguf", KVS, magic=b"GGML")
    write_gguf(tmp_path / "v1.gguf", KVS, version=1)
    (tmp_path / "empty.gguf").write_bytes(b"")
    body = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gguf_str("weird") + struct.pack("<I", 99)
    (tmp_path / "type.gguf").write_bytes(body + b"\0" * 16)
    with pytest.raises(GGUFError, match="magic"):
        read_metadata(tmp_path / "magic.gguf")
    with pytest.raises(GGUFError, match="version 1"):
        read_metadata(tmp_path / "v1.gguf")
    with pytest.raises(GGUFError):
        read_metadata(tmp_path / "empty.gguf")
    with pytest.raises(GGUFError, match="type 99 for 'weird'"):
        read_metadata(tmp_path / "type.gguf")


def test_huge_count_is_refused(tmp_path):
    body = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gguf_str("tokens") + struct.pack("<IIQ", 9, 8, 2 ** 40)
    (tmp_path / "h.gguf").write_bytes(body + b"\0" * 64)
    with pytest.raises(GGUFError, match="'tokens'"):
        read_metadata(tmp_path / "h.gguf")


@pytest.mark.skipif(model_path() is None, reason="default model GGUF not installed")
def test_default_model():
    meta = read_metadata(model_path())
    assert meta["general.architecture"] == "llama"
    assert meta["llama.context_length"] == 8192
    assert meta["tokenizer.ggml.pre"] == "smollm"
    assert len(meta["tokenizer.ggml.tokens"]) == 49152 and len(meta["tokenizer.ggml.merges"]) == 48900
    assert read_header(model_path())["n_tensors"] == 272


def test_tensor_infos_and_decode_traffic(tmp_path):
    """read_tensor_infos walks past the metadata to the tensor table; tools/weight_traffic.py sizes
    each kind as the engine holds it (Q5_0 widened to Q8_0, or kept 5-bit by the AVX-512 kernels) with the
    tied head apart."""
    from tests import gguf_writer
    from tools import weight_traffic
    from tokenizer.gguf_meta import read_tensor_infos
    vocab = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": [f"t{i}" for i in range(64)]}
    path = gguf_writer.random_model(tmp_path / "m.gguf", "llama", vocab, wtype="Q5_0", embd_type="Q8_0")
    infos = {name: (t, ne) for name, t, ne in read_tensor_infos(str(path))}
    assert infos["token_embd.weight"] == (8, [256, 64]) and infos["blk.1.ffn_down.weight"] == (6, [512, 256])
    traffic = {k: (types, mb) for k, types, mb, _ in weight_traffic.weight_traffic(str(path))}
    assert traffic["output head"] == ("Q8_0", pytest.approx(256 * 64 * 34 / 32 / 1e6))
    assert traffic["ffn_down"] == ("Q5_0->Q8_0", pytest.approx(2 * 512 * 256 * 34 / 32 / 1e6))
    traffic = {k: (types, mb) for k, types, mb, _ in weight_traffic.weight_traffic(str(path), "avx512_vnni")}
    assert traffic["ffn_down"] == ("Q5_0", pytest.approx(2 * 512 * 256 * 22 / 32 / 1e6))
    assert traffic["output head"] == ("Q8_0", pytest.approx(256 * 64 * 34 / 32 / 1e6))
