"""A whole Lazarus on one machine: the embedded dev server plus a controller worker.

``make demo``, the benchmarks and the end-to-end tests all need the same thing,
and all need to kill and restart its parts on purpose (the worker to prove ranks
survive it, the server to prove jobs survive that). The worker runs as its own
process, in its own process group, exactly as ``lazarus worker`` runs in production.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from temporalio.client import Client

from lazarus.app.devserver import DevServer
from lazarus.app.lifecycle import StartStop
from lazarus.app.settings import ConnectionSettings, connect


class LocalStack(StartStop):
    def __init__(
        self,
        state_dir: Path,
        task_queue: str = "lazarus",
        port: int | None = None,
        ui_port: int | None = None,
        headless: bool = True,
        server: DevServer | None = None,
    ) -> None:
        """Pass ``server`` to share one dev server between stacks (tests do); it is
        then started and stopped by its owner, not by this stack."""
        self.state_dir = Path(state_dir)
        self.task_queue = task_queue
        self._owns_server = server is None
        self.server = server or DevServer(
            self.state_dir / "server", port=port, ui_port=ui_port, headless=headless
        )
        self._worker: subprocess.Popen[bytes] | None = None
        self._worker_log: IO[bytes] | None = None
        self.worker_starts = 0

    @property
    def settings(self) -> ConnectionSettings:
        return ConnectionSettings(address=self.server.address, task_queue=self.task_queue)

    def worker_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "TEMPORAL_ADDRESS": self.server.address,
                "LAZARUS_TASK_QUEUE": self.task_queue,
                "TEMPORAL_NAMESPACE": "default",
            }
        )
        return env

    async def client(self) -> Client:
        return await connect(self.settings)

    def start(self) -> None:
        if self._owns_server:
            self.server.start()
        self.start_worker()

    def start_worker(self) -> int:
        if self.worker_running:
            return self.worker_pid
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.worker_starts += 1
        log_path = self.state_dir / f"worker-{self.worker_starts}.log"
        self._worker_log = open(log_path, "ab")  # noqa: SIM115 - lives as long as the worker
        self._worker = subprocess.Popen(
            [sys.executable, "-m", "lazarus.app.cli", "worker", "--task-queue", self.task_queue],
            env=self.worker_env(),
            stdin=subprocess.DEVNULL,
            stdout=self._worker_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self._worker.pid

    @property
    def worker_running(self) -> bool:
        return self._worker is not None and self._worker.poll() is None

    @property
    def worker_pid(self) -> int:
        assert self._worker is not None
        return self._worker.pid

    def kill_worker(self, sig: signal.Signals = signal.SIGKILL, timeout_s: float = 30.0) -> None:
        """Kill the worker process (not its group: ranks must not care either way)."""
        if self._worker is None:
            return
        if self._worker.poll() is None:
            self._worker.send_signal(sig)
            try:
                self._worker.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._worker.kill()
                self._worker.wait()
        self._worker = None
        if self._worker_log is not None:
            self._worker_log.close()
            self._worker_log = None

    def restart_server(self, down_s: float = 0.0) -> None:
        self.server.stop()
        time.sleep(down_s)
        self.server.start()

    def stop(self) -> None:
        self.kill_worker(signal.SIGTERM, timeout_s=15.0)
        if self._owns_server:
            self.server.stop()
