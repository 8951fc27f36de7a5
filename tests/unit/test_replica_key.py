"""The worker's replica key and the per-run secret derived from it (issue 36)."""

from __future__ import annotations

import stat
import threading
from pathlib import Path

import pytest

from activities.checkpoints import replica_key
from activities.checkpoints.replica_key import KEY_FILE_ENV, ReplicaKeyError, run_secret


def test_the_key_is_created_private_and_the_secret_is_stable_per_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "cfg" / "replica.key"
    monkeypatch.setenv(KEY_FILE_ENV, str(path))
    first = run_secret("/dev/shm/lazarus/job/run-1")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert run_secret("/dev/shm/lazarus/job/run-1") == first  # a retried launch agrees
    assert run_secret("/dev/shm/lazarus/job/run-2") != first  # a new run, a new secret
    assert len(bytes.fromhex(first)) == 32


def test_workers_creating_the_key_at_once_agree(tmp_path: Path) -> None:
    path = tmp_path / "replica.key"
    keys: list[bytes] = []
    threads = [
        threading.Thread(target=lambda: keys.append(replica_key.worker_key(path))) for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(keys)) == 1 and len(keys) == 8
    assert [p.name for p in tmp_path.iterdir()] == ["replica.key"]  # no temp file left


def test_a_key_file_others_can_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "replica.key"
    path.write_text("ab" * 32)
    path.chmod(0o644)
    with pytest.raises(ReplicaKeyError, match="chmod 600"):
        replica_key.worker_key(path)
    path.chmod(0o600)
    path.write_text("not hex")
    with pytest.raises(ReplicaKeyError, match="does not hold hex"):
        replica_key.worker_key(path)
