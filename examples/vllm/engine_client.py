"""EngineProcess: engine_process.py started and driven from another process, one
request at a time (what tests/vllm and bench/vllm_ttft.py use)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ENGINE = Path(__file__).resolve().parent / "engine_process.py"
REPO = Path(__file__).resolve().parents[2]


class EngineProcess:
    """``EngineProcess(model, socket, *flags)``: vLLM in its own process (with kvtier.vllm
    when socket is given). stderr goes to log_path (or nowhere)."""

    def __init__(self, model: Path, socket: str | None = None, *flags: str, log_path: Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        argv = [sys.executable, str(ENGINE), str(model)]
        if socket:
            argv += ["--kvtier", socket]
        argv += list(flags)
        environment = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_LOGGING_LEVEL": "WARNING",
                       "PYTHONPATH": f"{REPO / 'client' / 'python'}:{os.environ.get('PYTHONPATH', '')}",
                       **(env or {})}
        self.log = open(log_path, "w") if log_path else subprocess.DEVNULL
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                        text=True, env=environment)
        ready = self._read()
        if not ready.get("ready"):
            raise RuntimeError(f"the vLLM engine did not start: {ready}")

    def _read(self) -> dict:
        while True:
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError(f"the vLLM engine exited ({self.process.wait()}); see "
                                   f"{getattr(self.log, 'name', 'its stderr')}")
            if line.startswith("{"):
                return json.loads(line)

    def turn(self, prompt: list[int], max_tokens: int = 8, session: str | None = None, **fields) -> dict:
        """One request; its reply ({"tokens", "wall_s", "counters"})."""
        self.process.stdin.write(json.dumps({"prompt": prompt, "max_tokens": max_tokens, "session": session,
                                             **fields}) + "\n")
        self.process.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.log is not subprocess.DEVNULL:
            self.log.close()
