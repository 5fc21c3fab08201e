"""kvtier.fingerprint: a checkpoint's digest changes with what changes its KV and with
nothing else; the model id is the same in every process."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from kvtier import fingerprint as fp


def write_safetensors(path: Path, tensors: dict[str, bytes], metadata: dict[str, str] | None = None) -> None:
    """A safetensors file of uint8 tensors (the format: u64 header length, JSON header,
    then the data; offsets relative to the data's start)."""
    header: dict[str, object] = {"__metadata__": metadata or {"format": "pt"}}
    offset, data = 0, b""
    for name, raw in tensors.items():
        header[name] = {"dtype": "U8", "shape": [len(raw)], "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        data += raw
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def tensors(seed: int, count: int = 6, size: int = 10_000) -> dict[str, bytes]:
    return {f"model.layers.{i}.weight": bytes((seed * 31 + i * 7 + j) % 251 for j in range(size))
            for i in range(count)}


@pytest.fixture
def model(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    write_safetensors(folder / "model-00001-of-00002.safetensors", dict(list(tensors(0).items())[:3]))
    write_safetensors(folder / "model-00002-of-00002.safetensors", dict(list(tensors(0).items())[3:]))
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "rope_theta": 10000.0}))
    (folder / "tokenizer_config.json").write_text("{}")
    (folder / "generation_config.json").write_text(json.dumps({"temperature": 0.6}))
    return folder


def digest(folder: Path) -> str:
    return fp.checkpoint_digest(folder).digest


def edit(path: Path, offset_from_data: int, name: str = "model.layers.4.weight") -> None:
    """Changes one byte of tensor `name` at `offset_from_data` in its data."""
    raw = bytearray(path.read_bytes())
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    at = 8 + length + header[name]["data_offsets"][0] + offset_from_data
    raw[at] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_reads_every_weight_file_and_samples_every_tensor(model):
    result = fp.checkpoint_digest(model)
    assert result.files == 2 and result.tensors == 6
    assert result.bytes == sum(p.stat().st_size for p in model.glob("*.safetensors"))
    assert len(result.digest) == 64


def test_the_same_weights_in_another_folder_have_the_same_digest(model, tmp_path):
    copy = tmp_path / "elsewhere" / "llama"
    shutil.copytree(model, copy)
    os.utime(copy / "config.json", (1, 1))  # times are not content
    assert digest(copy) == digest(model)


@pytest.mark.parametrize("where", ["start", "middle", "end"])
def test_a_fine_tune_changes_it_wherever_the_tensors_change(model, where):
    before = digest(model)
    shard = model / "model-00002-of-00002.safetensors"
    # A fine-tune changes every value of the tensors it trains; one byte at each
    # sampled place of one tensor is the least that shows.
    edit(shard, {"start": 0, "middle": (10_000 - fp.TENSOR_SAMPLE_BYTES) // 2, "end": 9_999}[where])
    assert digest(model) != before


def test_replaced_weights_of_the_same_shapes_change_it(model):
    before = digest(model)
    write_safetensors(model / "model-00001-of-00002.safetensors", dict(list(tensors(1).items())[:3]))
    assert digest(model) != before


def test_configuration_and_quantization_files_change_it_tokenizer_files_do_not(model):
    before = digest(model)
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": "other"}))
    (model / "generation_config.json").write_text(json.dumps({"temperature": 1.0}))
    assert digest(model) == before, "files that do not change the KV must not split the cache"
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "rope_theta": 500000.0}))
    changed = digest(model)
    assert changed != before
    (model / "quantize_config.json").write_text(json.dumps({"bits": 4, "group_size": 128}))
    assert digest(model) != changed


def test_a_weight_file_added_removed_or_renamed_changes_it(model):
    before = digest(model)
    (model / "extra.bin").write_bytes(b"\x01" * 100_000)
    added = digest(model)
    assert added != before
    (model / "extra.bin").rename(model / "extra2.bin")
    assert digest(model) not in (before, added)
    (model / "extra2.bin").unlink()
    assert digest(model) == before


def test_opaque_weight_files_are_sampled_across_their_length(tmp_path):
    folder = tmp_path / "pt"
    folder.mkdir()
    data = bytearray(os.urandom(1 << 20))
    (folder / "pytorch_model.bin").write_bytes(bytes(data))
    before = digest(folder)
    data[(1 << 20) - 1] ^= 1  # the last byte: inside the last sample
    (folder / "pytorch_model.bin").write_bytes(bytes(data))
    assert digest(folder) != before
    assert fp.checkpoint_digest(folder).tensors == 0


def test_a_damaged_safetensors_header_is_read_as_an_opaque_file_not_an_error(tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    for name, raw in {"huge.safetensors": struct.pack("<Q", 1 << 60) + b"{}",
                      "short.safetensors": b"\x01\x02",
                      "notjson.safetensors": struct.pack("<Q", 4) + b"nope" + b"x" * 100,
                      "list.safetensors": struct.pack("<Q", 2) + b"[]"}.items():
        (folder / name).write_bytes(raw)
    result = fp.checkpoint_digest(folder)
    assert result.files == 4 and result.tensors == 0
    # Offsets that point past the file are skipped, not read.
    header = json.dumps({"t": {"dtype": "U8", "shape": [9], "data_offsets": [0, 1 << 40]}}).encode()
    (folder / "past.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"x" * 9)
    assert fp.checkpoint_digest(folder).tensors == 0


def test_not_a_folder_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        fp.checkpoint_digest(tmp_path / "missing")


def test_the_digest_and_model_id_are_the_same_in_another_process(model):
    parts = {"weights": digest(model), "dtype": "torch.bfloat16", "quantization": None,
             "config": {"rope_theta": 1e6, "layers": [1, 2]}}
    here = fp.model_id(fp.digest_of(parts))
    code = ("import json, sys; from kvtier import fingerprint as fp; "
            "parts = json.loads(sys.argv[2]); parts['weights'] = fp.checkpoint_digest(sys.argv[1]).digest; "
            "print(fp.model_id(fp.digest_of(parts)))")
    out = subprocess.run([sys.executable, "-c", code, str(model), json.dumps({**parts, "weights": None})],
                         check=True, capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "7"})
    assert out.stdout.strip() == here
    assert here.startswith("kvtier-model:") and len(here) <= 256
    assert fp.digest_of({**parts, "dtype": "torch.float16"}) != fp.digest_of(parts)
    assert fp.digest_of(dict(reversed(list(parts.items())))) == fp.digest_of(parts)


def test_a_checkpoints_kv_cache_scales_change_it(tmp_path):
    # fp8 KV caches read per-layer scales from the checkpoint: one scalar each.
    folder = tmp_path / "fp8"
    folder.mkdir()
    scales = {f"model.layers.{i}.self_attn.{kv}_scale": struct.pack("<f", 0.5 + i) for i in range(4)
              for kv in ("k", "v")}
    write_safetensors(folder / "model.safetensors", {**tensors(0), **scales})
    before = digest(folder)
    scales["model.layers.3.self_attn.v_scale"] = struct.pack("<f", 3.75)
    write_safetensors(folder / "model.safetensors", {**tensors(0), **scales})
    assert digest(folder) != before


def test_libkvtier_computes_the_same_checkpoint_digest(model, tmp_path):
    """kvtier_checkpoint_digest (C ABI) against this module, byte for byte, over every
    kind of folder above: the same scheme for engines that are not in Python."""
    import ctypes

    from kvtier import _lib

    function = getattr(_lib.library(), "kvtier_checkpoint_digest", None)
    assert function is not None

    def native(folder: Path) -> tuple[str, int]:
        out = ctypes.create_string_buffer(65)
        tensors = ctypes.c_uint64(0)
        _lib.check(function(os.fsencode(folder), out, len(out), ctypes.byref(tensors)))
        return out.value.decode(), tensors.value

    folders = [model]
    opaque = tmp_path / "opaque"
    opaque.mkdir()
    (opaque / "pytorch_model.bin").write_bytes(os.urandom((1 << 20) + 333))
    (opaque / "small.pt").write_bytes(b"tiny")
    (opaque / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "b"}}))
    folders.append(opaque)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "short.safetensors").write_bytes(b"\x01\x02")
    (bad / "notjson.safetensors").write_bytes(struct.pack("<Q", 4) + b"nope" + b"x" * 100)
    header = json.dumps({"t": {"dtype": "U8", "shape": [9], "data_offsets": [0, 1 << 40]},
                         "u": {"dtype": "U8", "shape": [3], "data_offsets": [-5, 3]},
                         "v": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]},
                         "w": {"dtype": "U8", "shape": [1], "data_offsets": [True, 1]},
                         "x": "not an entry"}).encode()
    (bad / "odd.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"0123456789")
    (bad / "sub.safetensors").mkdir()  # a folder named like weights: skipped
    folders.append(bad)
    empty = tmp_path / "empty"
    empty.mkdir()
    folders.append(empty)
    for folder in folders:
        expected = fp.checkpoint_digest(folder)
        assert native(folder) == (expected.digest, expected.tensors), folder
    out = ctypes.create_string_buffer(65)
    with pytest.raises(Exception, match="not a directory"):
        _lib.check(function(os.fsencode(tmp_path / "missing"), out, len(out), None))
    with pytest.raises(Exception, match="65 are needed"):
        _lib.check(function(os.fsencode(model), out, 64, None))
