"""Model fingerprints: one digest of what determines a model's KV bytes.

kvtierd keeps blocks of different layouts apart, and a layout names the model by
``Layout.model_id``. Two engines whose layouts match share blocks; so the model id must
change whenever the KV the engine computes for the same tokens could change, or one
model's KV is served to another with no error (after an operator replaces the weights in
a model folder and restarts the engine, kvtierd's NVMe still holds the old weights' KV).

The key scheme every engine follows: ``Layout.model_id`` is :func:`model_id` of a
fingerprint, the :func:`digest_of` a dict holding at least

- ``weights``: :func:`checkpoint_digest` of the folder the weights are read from;
- the weights' dtype and quantization (method and its config);
- the KV cache's dtype and where its scales come from;
- the model's configuration as the engine applies it (architecture, rope and position
  settings after any overrides);
- the attention implementation, where the engine lets one choose it.

The same dict gives the same digest in any process (canonical JSON, SHA-256). An
operator who knows two deployments compute the same KV may name them with one model id
of their own instead: that is a promise kvtier cannot check.

libkvtier's ``kvtier_checkpoint_digest`` (client/kvtier.h) computes the same checkpoint
digest for engines in C or C++. :func:`checkpoint_digest` reads no more than the checkpoint already records plus a few
bytes of every tensor: the name and size of every weight file; a safetensors file's
header (names, dtypes, shapes, offsets, metadata) and 64 bytes at the start, middle and
end of every tensor's data; 16 evenly spaced 4 KiB samples of any other weight file;
and the content of the configuration files that travel with the weights. A fine-tune,
a merged adapter or another quantization changes the sampled bytes of every tensor it
touches; an edit of a few values deep inside one tensor can escape the samples.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
import time
from collections.abc import Mapping
from typing import Any

SCHEME = "kvtier-model-v1"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".npz", ".h5", ".msgpack")
# Configuration files read whole: what the weights mean (config.json, params.json),
# their quantization, the index that maps tensors to files, legacy KV-scale files.
CONFIG_NAMES = ("config.json", "params.json", "quantize_config.json", "quant_config.json",
                "hf_quant_config.json", "quantization_config.json", "kv_cache_scales.json")
CONFIG_SUFFIXES = (".index.json",)
TENSOR_SAMPLE_BYTES = 64
FILE_SAMPLES = 16
FILE_SAMPLE_BYTES = 4096
MAX_HEADER_BYTES = 100 << 20  # a safetensors header larger than this is read as an opaque file
MAX_CONFIG_BYTES = 64 << 20


@dataclasses.dataclass(frozen=True)
class CheckpointDigest:
    """What :func:`checkpoint_digest` read: the digest and how much it covered."""
    digest: str  # SHA-256, hex
    files: int  # weight files
    bytes: int  # their total size
    tensors: int  # safetensors tensors sampled
    seconds: float  # how long reading took


def checkpoint_digest(folder: str | os.PathLike[str]) -> CheckpointDigest:
    """The digest of the checkpoint in `folder` (its top level, as engines load it).
    Raises FileNotFoundError when `folder` is not a directory."""
    started = time.monotonic()
    root = os.fspath(folder)
    if not os.path.isdir(root):
        raise FileNotFoundError(f"{root} is not a directory")
    h = hashlib.sha256(SCHEME.encode())
    files = total = tensors = 0
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if not os.path.isfile(path):
            continue
        lower = name.lower()
        if lower.endswith(WEIGHT_SUFFIXES):
            size = os.path.getsize(path)
            h.update(b"W" + _field(name) + struct.pack("<Q", size))
            files += 1
            total += size
            with open(path, "rb") as f:
                sampled = _sample_safetensors(f, size, h) if lower.endswith(".safetensors") else None
                if sampled is None:
                    _sample_file(f, size, h)
                else:
                    tensors += sampled
        elif lower in CONFIG_NAMES or lower.endswith(CONFIG_SUFFIXES):
            size = os.path.getsize(path)
            with open(path, "rb") as f:
                content = f.read(MAX_CONFIG_BYTES)
            h.update(b"C" + _field(name) + struct.pack("<Q", size) + _field(content))
    return CheckpointDigest(h.hexdigest(), files, total, tensors, time.monotonic() - started)


def digest_of(parts: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of `parts` as canonical JSON (sorted keys; values JSON cannot hold
    written as their str())."""
    text = json.dumps({"scheme": SCHEME, **parts}, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def model_id(fingerprint: str) -> str:
    """The Layout.model_id of a fingerprint (128 bits of it: what kvtierd compares)."""
    return f"kvtier-model:{fingerprint[:32]}"


def _field(data: str | bytes) -> bytes:
    raw = data.encode() if isinstance(data, str) else data
    return struct.pack("<Q", len(raw)) + raw


def _pread(f, offset: int, count: int) -> bytes:
    return os.pread(f.fileno(), count, offset)


def _sample_file(f, size: int, h) -> None:
    if size <= FILE_SAMPLES * FILE_SAMPLE_BYTES:
        h.update(_pread(f, 0, size))
        return
    step = (size - FILE_SAMPLE_BYTES) / (FILE_SAMPLES - 1)
    for i in range(FILE_SAMPLES):
        h.update(_pread(f, int(i * step), FILE_SAMPLE_BYTES))


def _sample_safetensors(f, size: int, h) -> int | None:
    """Hashes the header and samples of every tensor; None when the file is not
    safetensors as its name says (it is then sampled as an opaque file)."""
    if size < 8:
        return None
    (length,) = struct.unpack("<Q", _pread(f, 0, 8))
    if length > MAX_HEADER_BYTES or 8 + length > size:
        return None
    raw = _pread(f, 8, length)
    try:
        header = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(header, dict):
        return None
    h.update(_field(raw))
    data_start = 8 + length
    sampled = 0
    for name in sorted(k for k in header if k != "__metadata__"):
        entry = header[name]
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
            continue
        begin, end = data_start + offsets[0], data_start + offsets[1]
        if not data_start <= begin <= end <= size:
            continue
        length = end - begin
        n = min(TENSOR_SAMPLE_BYTES, length)
        for at in (begin, begin + (length - n) // 2, end - n):
            h.update(_pread(f, at, n))
        sampled += 1
    return sampled
