"""Fixtures shared by every test folder that needs a real Temporal server."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from activities.checkpoints.replica_key import KEY_FILE_ENV
from activities.nodes.ssh.files import SSH_DIRS_ENV
from lazarus.app.devserver import DevServer

# The worker's replica key (activities.checkpoints.replica_key): one of the test
# process's own, shared with every worker and node process it starts, never the
# user's ~/.config.
_KEY_DIR = tempfile.mkdtemp(prefix="lazarus-test-key-")
os.environ.setdefault(KEY_FILE_ENV, os.path.join(_KEY_DIR, "replica.key"))
atexit.register(shutil.rmtree, _KEY_DIR, ignore_errors=True)

# The SSH files of the test hosts (infra/testhosts.py) and of tests' own specs live
# under the temporary directory: the workers this process starts allow it beside
# ~/.ssh (activities.nodes.ssh.files; a worker allows ~/.ssh alone by default).
os.environ.setdefault(SSH_DIRS_ENV, os.pathsep.join(["~/.ssh", tempfile.gettempdir()]))


@pytest.fixture(scope="session")
def dev_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    """One real ``temporal server start-dev`` per test process (per xdist worker)."""
    server = DevServer(tmp_path_factory.mktemp("temporal"), headless=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()


LONGEST_FIRST = ("slurm", "netns", "e2e", "integration", "workflow", "unit")
"""The folders in the order their tests start: the longest first, so that under
xdist a four-minute test never starts last and leaves the other workers idle."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Only tests/unit holds fast-tier tests: every other folder's are ``slow``, so
    ``pytest -m "not slow"`` selects the same tests as ``make test-fast``. Then the
    longest folders go first (:data:`LONGEST_FIRST`; a stable sort keeps each file's
    tests together, so module fixtures are set up once)."""
    here = Path(__file__).parent
    unit = here / "unit"
    for item in items:
        if not item.path.is_relative_to(unit):
            item.add_marker(pytest.mark.slow)

    def folder_rank(item: pytest.Item) -> int:
        parts = item.path.relative_to(here).parts if item.path.is_relative_to(here) else ()
        folder = parts[0] if len(parts) > 1 else ""
        return LONGEST_FIRST.index(folder) if folder in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=folder_rank)


@pytest.fixture
def worker_here(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The CLI's calls to a worker (start's checks, the checkpoint verbs: issue 40,
    part 2) answered in this process by the worker's own functions, each request and
    answer through JSON as Temporal carries them; no server, and no job is ever started
    (``JobClient.start`` fails the test). Returns the requests. The same calls through
    a real worker: tests/workflow/test_cli_client.py."""
    from activities.checkpoints.reports import listing, verification
    from activities.node_logs import AgentLogs
    from activities.start_checks import check_start
    from lazarus.app import cli
    from lazarus.app.client import JobClient
    from lazarus.domain.worker_calls import WorkerCall, WorkerReply

    requests: list[object] = []
    logs = AgentLogs()

    async def connect(settings: object, timeout_s: float = 5.0) -> object:
        return None

    async def call(self: JobClient, request: Any, what: str) -> Any:
        request = WorkerCall.model_validate_json(WorkerCall(request=request).model_dump_json())
        requests.append(request.request)
        answer = {
            "start_checks": check_start,
            "list_checkpoints": listing,
            "verify_checkpoints": verification,
            "read_log": logs.read,
            "ranks_ended": logs.ended,
        }[request.request.kind](request.request)
        return WorkerReply.model_validate_json(WorkerReply(answer=answer).model_dump_json()).answer

    async def free(self: JobClient, name: str) -> None:
        return None

    async def never(self: JobClient, what: object) -> object:
        raise AssertionError("worker_here starts no job")

    monkeypatch.setattr(cli, "connect", connect)
    monkeypatch.setattr(JobClient, "_call_worker", call)
    monkeypatch.setattr(JobClient, "ensure_not_running", free)
    monkeypatch.setattr(JobClient, "start", never)
    return requests
