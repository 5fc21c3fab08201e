"""kvtier.Client beyond the layouts: async forms, sessions, stats, region lifetime."""

from __future__ import annotations

import re
import threading

import pytest

import kvtier
from kvtier.hashing import block_hashes

pytest.importorskip("torch", reason="needs torch (Debian: python3-torch)")
import torch
from kvtier.torch import layout_from_tensors, memfd_tensor

SHAPE = (2, 16, 4, 2, 8)  # [2, blocks, block_size, heads, head_dim]


def engine(client, model_id):
    cache = memfd_tensor(SHAPE, torch.float16)
    cache.copy_(torch.arange(cache.numel(), dtype=torch.float32).view(SHAPE) % 1000)
    client.hello(layout_from_tensors(model_id, [cache], 0), engine_name="test-client")
    client.register_tensor(0, cache)
    return cache


def test_async_forms_pipeline_and_poll(client, unique):
    cache = engine(client, unique("async"))
    session = unique("session")
    hashes = block_hashes(range(32), 4, session)  # 8 blocks
    blocks = list(zip(hashes, range(8)))
    save = client.save_async(session, blocks)
    assert save.result() == kvtier.SaveResult(stored=8, deduplicated=0)
    assert save.done() and save.result().stored == 8  # result() again: the same outcome

    lookups = [client.lookup_async(hashes[:n]) for n in range(1, 9)]  # pipelined
    for n, pending in reversed(list(enumerate(lookups, start=1))):  # waited out of order
        assert pending.result().hit_count == n
    while not (begin := client.begin_turn_async(session)).done():
        pass  # done() never blocks; the reply arrives while polling
    assert begin.result().known_blocks == 8

    expected = cache[:, :8].clone()
    cache.zero_()
    load = client.load_async(session, list(zip(hashes, range(8, 16))))
    result = load.result()
    assert result.loaded_count == 8 and result.stop_reason is None
    assert torch.equal(cache[:, 8:16].view(torch.int16), expected.view(torch.int16))

    client.lookup_async(hashes)  # dropped without waiting: its reply is discarded
    missing = client.begin_turn_async(unique("never-saved"))
    with pytest.raises(kvtier.NotFound):
        missing.result()
    with pytest.raises(kvtier.NotFound):  # the same exception again
        missing.result()
    assert client.close_session_async(session).result() == 8


def test_threads_share_a_client(client, unique):
    engine(client, unique("threads"))
    session = unique("session")
    hashes = block_hashes(range(64), 4)
    client.save(session, list(zip(hashes, range(16))))
    failures = []

    def look(times):
        try:
            for _ in range(times):
                assert client.lookup(hashes).hit_count == 16
        except Exception as error:  # reported below
            failures.append(error)

    threads = [threading.Thread(target=look, args=(100,)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures


def test_session_context_closes_the_session(client, unique):
    engine(client, unique("session-cm"))
    session_id = unique("session")
    hashes = block_hashes(range(16), 4)
    with client.session(session_id) as session:
        assert session.save(list(zip(hashes, range(4)))).stored == 4
        assert session.begin_turn().known_blocks == 4
        assert session.lookup(hashes).hit_count == 4
        assert session.load(list(zip(hashes, range(4, 8)))).loaded_count == 4
    with pytest.raises(kvtier.NotFound):
        client.begin_turn(session_id)
    with client.session(unique("never-saved")):
        pass  # nothing saved: closing it is no error
    with pytest.raises(KeyError):  # the block's own exception is never replaced
        with client.session(unique("raises")):
            raise KeyError("engine failure")


def test_stats_and_hello_info(client, unique):
    engine(client, unique("stats"))
    info = client.hello_info
    assert info.device == "host" and info.gpu_uuids == () and info.namespace
    assert info.max_blocks_per_request > 0 and info.block_bytes == 2 * 4 * 2 * 8 * 2
    before = client.stats()
    client.save(unique("session"), list(zip(block_hashes(range(8), 4, "stats"), [0, 1])))
    after = client.stats()
    assert after.bytes_saved - before.bytes_saved == 2 * info.block_bytes
    assert set(after.tiers) == {"hbm", "ram", "nvme"}
    assert after.tiers["hbm"].capacity_bytes > 0 and after.connections >= 1
    assert after.policy in ("lru", "session", "predictive")
    assert kvtier.library_version().count(".") == 2


def test_close_unregisters_regions(daemon, unique):
    with kvtier.Client(daemon.socket_path) as client:
        cache = engine(client, unique("unregister"))
        client.unregister_region(0)
        with pytest.raises(kvtier.InvalidArgument):  # a plane's region is gone
            client.save(unique("session"), [(b"u" * 32, 0)])
        client.register_tensor(0, cache)  # the id may be used again
        assert client.save(unique("session"), [(b"u" * 32, 0)]).stored == 1
    assert client.closed


def test_lookup_bench_runs(daemon):
    from lookup_bench import run

    result = run(daemon.socket_path, lookups=50, hashes_per_lookup=32)
    assert result["lookups"] == 50 and result["p50_us"] > 0


def test_hashes_may_be_any_bytes_like(client, unique):
    engine(client, unique("bytes-like"))
    session = unique("session")
    hashes = block_hashes(range(8), 4)
    client.save(session, [(bytearray(hashes[0]), 0), (memoryview(hashes[1]), 1)])
    assert client.lookup([bytearray(hashes[0]), memoryview(hashes[1])]).hit_count == 2
    assert client.lookup([b"short", hashes[0]]).hit_count == 0  # any length 1..32
    words = memoryview(hashes[0]).cast("I")  # 8 items of 4 bytes: still 32 bytes
    assert client.lookup([words, hashes[1]]).hit_count == 2


def session_json(daemon, session_id):
    """What `kvtierctl session ID --json` says about a session of this test user."""
    import json
    import subprocess

    from kvtierd_process import BUILD_DIR

    out = subprocess.run([str(BUILD_DIR / "kvtierctl"), "--socket", daemon.socket_path, "--json",
                          "session", session_id], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def test_save_carries_retention_priorities(daemon, client, unique):
    engine(client, unique("retention"))
    session = unique("session")
    hashes = block_hashes(range(32), 4, session)  # 8 blocks
    blocks = list(zip(hashes, range(8)))
    ranges = [kvtier.BlockPriority(0, 2, 90), kvtier.BlockPriority(6, 2, 5, duration_s=30)]
    saved = client.save(session, blocks, priority=70, priority_duration_s=60,
                        block_priorities=ranges)
    assert saved.stored == 8
    shown = session_json(daemon, session)
    assert shown["priority"] == 70
    assert 0 < shown["priority_remaining_ms"] <= 60_000

    # A save without retention leaves it; a durationless one holds until changed.
    client.save(session, blocks)
    assert session_json(daemon, session)["priority"] == 70
    client.save_async(session, blocks, priority=20).result()
    shown = session_json(daemon, session)
    assert (shown["priority"], shown["priority_remaining_ms"]) == (20, 0)


@pytest.mark.parametrize("kwargs, message", [
    ({"priority": 101}, "priority is 101"),
    ({"priority": 0}, "priority is 0; 1..100"),
    ({"priority": True}, "priority must be an int"),
    ({"priority_duration_s": 5}, "without a priority"),
    ({"priority": 50, "priority_duration_s": -1}, "positive, finite number of seconds"),
    ({"priority": 50, "priority_duration_s": float("inf")}, "positive, finite number"),
    ({"priority": 50, "priority_duration_s": 2**64 / 1000}, "at most 18446744073709551615 ms"),
    ({"block_priorities": [kvtier.BlockPriority(0, 8, 50), kvtier.BlockPriority(0, 1, 60)]},
     "cover 9 blocks in total"),
    ({"block_priorities": [kvtier.BlockPriority(7, 2, 50)]}, "block_priorities[0] covers"),
    ({"block_priorities": [kvtier.BlockPriority(0, 0, 50)]}, "block_priorities[0] covers"),
    ({"block_priorities": [kvtier.BlockPriority(0, 1, 500)]}, "block_priorities[0].priority"),
    ({"block_priorities": [(0, 1, 50)]}, "must be a kvtier.BlockPriority"),
])
def test_bad_retention_is_refused_before_sending(client, unique, kwargs, message):
    engine(client, unique("bad-retention"))
    session = unique("session")
    blocks = list(zip(block_hashes(range(32), 4, session), range(8)))
    with pytest.raises(kvtier.InvalidArgument, match=re.escape(message)):
        client.save(session, blocks, **kwargs)
    with pytest.raises(kvtier.NotFound):  # nothing was saved
        client.begin_turn(session)


def test_tier_notices_tell_where_saved_blocks_went(unique):
    """watch_tiers_async: a drain to NVMe, then an eviction, are told block by block with
    each block's tier; a bad max_changes is refused before anything is sent."""
    import subprocess
    import time

    from kvtierd_process import BUILD_DIR, Kvtierd

    import grp
    import os

    admin = grp.getgrgid(os.getegid()).gr_name  # drain and evict are admin requests
    daemon = Kvtierd(["--slab-bytes", "1MiB", "--nvme-bytes", "16MiB", "--admin-group", admin])
    try:
        with kvtier.Client(daemon.socket_path) as client:
            engine(client, unique("notices"))
            assert client.watch_tiers_async(0, 64).result() == kvtier.TierNotices(changes=[], resync=False)
            session = unique("session")
            hashes = block_hashes(range(16), 4, session)  # 4 blocks
            assert client.save(session, list(zip(hashes, range(4)))).saved == 4
            ctl = [str(BUILD_DIR / "kvtierctl"), "--socket", daemon.socket_path]

            def told_until(expected: dict[bytes, str]) -> None:
                seen: dict[bytes, str] = {}
                deadline = time.monotonic() + 10
                while {h: seen.get(h) for h in expected} != expected:
                    assert time.monotonic() < deadline, seen
                    notices = client.watch_tiers_async(200, 64).result()
                    assert not notices.resync
                    seen.update(notices.changes)

            subprocess.run([*ctl, "drain"], check=True, capture_output=True)
            told_until({h: "nvme" for h in hashes})
            subprocess.run([*ctl, "evict", session], check=True, capture_output=True)
            told_until({h: "none" for h in hashes})
            with pytest.raises(kvtier.InvalidArgument, match="max_changes must be 1..4096"):
                client.watch_tiers_async(0, 0)
    finally:
        daemon.stop()
