"""kvtier.hashing: chained, deterministic prefix hashes over full blocks."""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys

from typing import Any

import pytest

from kvtier import InvalidArgument
from kvtier.hashing import HASH_BYTES, ROOT_HASH, block_hash, block_hashes


def reference(tokens, block_size, extra=b""):
    parent, out = bytes(32), []
    for i in range(len(tokens) // block_size):
        block = tokens[i * block_size:(i + 1) * block_size]
        parent = hashlib.sha256(parent + struct.pack(f"<{block_size}q", *block) + extra).digest()
        out.append(parent)
    return out


def test_matches_the_documented_formula():
    tokens = [1, 2, 3, -4, 2**40, 6, 7, 8, 9]
    hashes = block_hashes(tokens, 4, extra_keys=b"lora-7")
    assert hashes == reference(tokens, 4, b"lora-7")
    assert len(hashes) == 2  # the partial third block is not hashed
    assert all(len(h) == HASH_BYTES for h in hashes)
    assert block_hash(None, tokens[:4], b"lora-7") == hashes[0]
    assert block_hash(hashes[0], tokens[4:8], b"lora-7") == hashes[1]
    assert ROOT_HASH == bytes(32)


def test_chains_through_parent():
    tokens = list(range(100, 164))
    head, tail = tokens[:32], tokens[32:]
    first = block_hashes(head, 16)
    assert block_hashes(tokens, 16) == first + block_hashes(tail, 16, parent=first[-1])


def test_a_change_in_a_block_changes_every_later_hash():
    tokens = list(range(64))
    changed = list(tokens)
    changed[20] = 999
    a, b = block_hashes(tokens, 16), block_hashes(changed, 16)
    assert a[0] == b[0]
    assert all(x != y for x, y in zip(a[1:], b[1:]))
    assert block_hashes(tokens, 16, extra_keys="x") != a
    assert block_hashes(tokens, 16, extra_keys="x") == block_hashes(tokens, 16, extra_keys=b"x")


def test_accepts_tensors_and_ranges():
    torch = pytest.importorskip("torch", reason="needs torch (Debian: python3-torch)")

    tokens = list(range(48))
    assert block_hashes(torch.tensor(tokens), 16) == block_hashes(tokens, 16)
    assert block_hashes(range(48), 16) == block_hashes(tuple(tokens), 16)
    assert block_hashes([], 16) == []
    assert block_hashes(tokens[:15], 16) == []


def test_same_hashes_in_another_process_with_another_hash_seed():
    code = ("import sys; from kvtier.hashing import block_hashes; "
            "print(','.join(h.hex() for h in block_hashes(range(0, 3000, 7), 16, 'salt')))")
    outputs = set()
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=os.pathsep.join(sys.path))
        outputs.add(subprocess.run([sys.executable, "-c", code], env=env, check=True,
                                   capture_output=True, text=True).stdout.strip())
    assert outputs == {",".join(h.hex() for h in block_hashes(range(0, 3000, 7), 16, "salt"))}


# Called with what its signature refuses too, on purpose: untyped here.
unchecked_block_hashes: Any = block_hashes


@pytest.mark.parametrize("call", [
    lambda: unchecked_block_hashes([1, 2], 0),
    lambda: unchecked_block_hashes([1, 2], True),
    lambda: unchecked_block_hashes([1, 2**63], 2),
    lambda: unchecked_block_hashes(["a", "b"], 2),
    lambda: unchecked_block_hashes([1, 2], 2, parent=b"short"),
    lambda: unchecked_block_hashes([1, 2], 2, extra_keys=5),
    lambda: unchecked_block_hashes([[1, 2]], 1),
])
def test_bad_input_is_invalid_argument(call):
    with pytest.raises(InvalidArgument):
        call()


def test_the_library_computes_the_same_hashes_as_the_reference():
    """libkvtier's kvtier_block_hashes (used when the library is there) against the
    documented formula, over block sizes, extra keys, parents and the int64 range."""
    import random

    from kvtier import _lib, hashing

    assert getattr(_lib.library(), "kvtier_block_hashes", None) is not None
    rng = random.Random(5)
    tokens = [rng.randrange(-2**63, 2**63) for _ in range(3000)] + [2**63 - 1, -2**63] * 8
    for block_size in (1, 7, 16, 128):
        for extra in (b"", b"model=m\x00lora=\x00salt=s", bytes(range(256)) * 3):
            for parent in (None, hashlib.sha256(b"before").digest()):
                full = len(tokens) // block_size * block_size
                native = hashing._native_block_hashes(tokens[:full], block_size, extra,
                                                      parent or ROOT_HASH)
                expected, previous = [], parent
                for i in range(0, full, block_size):  # one block at a time, in Python
                    previous = block_hash(previous, tokens[i:i + block_size], extra)
                    expected.append(previous)
                assert native == expected
                assert block_hashes(tokens, block_size, extra, parent) == expected
    assert hashing._native_block_hashes([], 16, b"", ROOT_HASH) == []
