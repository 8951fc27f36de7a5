"""The rank helper's contract with the supervisor and the checkpoint reader.

These tests pin what the other side relies on: heartbeat files are always whole
JSON and throttled, a checkpoint request fires once, a checkpoint counts only
once its marker exists and the marker comes last, and the helper stays free of
heavy imports.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import lazarus.rank as lazarus_rank
from lazarus.domain import checkpoint_layout, environment
from lazarus.rank import atomic_files, reset

REPO_ROOT = Path(__file__).resolve().parents[2]

_CONTRACT_VARIABLES = [
    value for name, value in vars(environment).items() if name.isupper() and isinstance(value, str)
]


@pytest.fixture(autouse=True)
def clean_rank_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts outside Lazarus with fresh module state, whatever the
    environment of the test runner holds."""
    for variable in _CONTRACT_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    reset._reset_state()
    yield
    reset._reset_state()


def _read_json(path: Path) -> dict[str, object]:
    document = json.loads(path.read_text())
    assert isinstance(document, dict)
    return document


def _write_atomically(path: Path, text: str) -> None:
    temp = path.with_name(path.name + ".writing")
    temp.write_text(text)
    os.replace(temp, path)


# --------------------------------------------------------------------------- identity


def test_info_outside_lazarus_uses_single_process_defaults() -> None:
    me = lazarus_rank.info()
    assert me == lazarus_rank.RankInfo(
        rank=0,
        local_rank=0,
        world_size=1,
        generation=0,
        job_id=None,
        checkpoint_dir=None,
        under_lazarus=False,
    )


def test_info_reads_the_launcher_contract(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(environment.RANK, "3")
    monkeypatch.setenv(environment.LOCAL_RANK, "1")
    monkeypatch.setenv(environment.WORLD_SIZE, "4")
    monkeypatch.setenv(environment.GENERATION, "7")
    monkeypatch.setenv(environment.JOB_ID, "job-a")
    monkeypatch.setenv(environment.CHECKPOINT_DIR, str(tmp_path))
    me = lazarus_rank.info()
    assert (me.rank, me.local_rank, me.world_size, me.generation) == (3, 1, 4, 7)
    assert me.job_id == "job-a"
    assert me.checkpoint_dir == tmp_path
    assert me.under_lazarus


def test_info_names_a_malformed_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(environment.RANK, "zero")
    with pytest.raises(ValueError, match="RANK"):
        lazarus_rank.info()


# --------------------------------------------------------------------------- heartbeat


def test_heartbeat_is_a_no_op_outside_lazarus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    lazarus_rank.heartbeat(1, loss=0.5)
    lazarus_rank.flush_heartbeat()
    assert list(tmp_path.iterdir()) == []


def test_first_heartbeat_writes_immediately(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    beat = tmp_path / "heartbeat.json"
    monkeypatch.setenv(environment.HEARTBEAT_FILE, str(beat))
    monkeypatch.setenv(environment.HEARTBEAT_INTERVAL, "3600")
    before = time.time()
    lazarus_rank.heartbeat(12, loss=0.25, lr=1e-3)
    document = _read_json(beat)
    assert document["step"] == 12
    assert document["pid"] == os.getpid()
    assert document["metrics"] == {"loss": 0.25, "lr": 1e-3}
    assert isinstance(document["time"], float)
    assert before <= document["time"] <= time.time()


def test_heartbeat_is_throttled_and_flush_writes_the_last_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    beat = tmp_path / "heartbeat.json"
    monkeypatch.setenv(environment.HEARTBEAT_FILE, str(beat))
    monkeypatch.setenv(environment.HEARTBEAT_INTERVAL, "3600")
    lazarus_rank.heartbeat(1)
    for step in range(2, 50):
        lazarus_rank.heartbeat(step, loss=float(step))
    assert _read_json(beat)["step"] == 1
    lazarus_rank.flush_heartbeat()
    document = _read_json(beat)
    assert document["step"] == 49
    assert document["metrics"] == {"loss": 49.0}


def test_heartbeat_writes_again_once_the_interval_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    beat = tmp_path / "heartbeat.json"
    monkeypatch.setenv(environment.HEARTBEAT_FILE, str(beat))
    monkeypatch.setenv(environment.HEARTBEAT_INTERVAL, "0.05")
    lazarus_rank.heartbeat(1)
    lazarus_rank.heartbeat(2)
    assert _read_json(beat)["step"] == 1
    time.sleep(0.1)
    lazarus_rank.heartbeat(3)
    assert _read_json(beat)["step"] == 3


@pytest.mark.slow  # sleeps
def test_heartbeat_default_interval_is_a_fifth_of_a_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    beat = tmp_path / "heartbeat.json"
    monkeypatch.setenv(environment.HEARTBEAT_FILE, str(beat))
    lazarus_rank.heartbeat(1)
    lazarus_rank.heartbeat(2)
    assert _read_json(beat)["step"] == 1
    time.sleep(0.25)
    lazarus_rank.heartbeat(3)
    assert _read_json(beat)["step"] == 3


@pytest.mark.slow  # 400 writes raced by a reader thread
def test_heartbeat_readers_never_see_a_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    beat = tmp_path / "heartbeat.json"
    monkeypatch.setenv(environment.HEARTBEAT_FILE, str(beat))
    monkeypatch.setenv(environment.HEARTBEAT_INTERVAL, "0")
    lazarus_rank.heartbeat(0)
    stop = threading.Event()
    seen: list[int] = []
    failures: list[str] = []

    def read_continuously() -> None:
        while not stop.is_set():
            text = beat.read_text()
            try:
                seen.append(int(json.loads(text)["step"]))
            except (ValueError, KeyError) as exc:
                failures.append(f"{exc!r}: {text!r}")

    reader = threading.Thread(target=read_continuously)
    reader.start()
    try:
        big_metrics = {f"metric_{i}": float(i) for i in range(200)}
        for step in range(1, 400):
            lazarus_rank.heartbeat(step, **big_metrics)
    finally:
        stop.set()
        reader.join()
    assert failures == []
    assert seen == sorted(seen)
    assert _read_json(beat)["step"] == 399
    assert [p.name for p in tmp_path.iterdir()] == ["heartbeat.json"], "temp files left behind"


def test_heartbeat_reports_unconvertible_and_non_finite_metrics_as_null(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class ZeroDimTensorLike:
        def __float__(self) -> float:
            return 1.5

    beat = tmp_path / "heartbeat.json"
    monkeypatch.setenv(environment.HEARTBEAT_FILE, str(beat))
    lazarus_rank.heartbeat(
        1, loss=float("nan"), grad=float("inf"), tensor=ZeroDimTensorLike(), name="x"
    )
    assert _read_json(beat)["metrics"] == {"loss": None, "grad": None, "tensor": 1.5, "name": None}


def test_heartbeat_survives_an_unwritable_location(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv(environment.HEARTBEAT_FILE, str(blocker / "heartbeat.json"))
    monkeypatch.setenv(environment.HEARTBEAT_INTERVAL, "0")
    lazarus_rank.heartbeat(1)
    lazarus_rank.heartbeat(2)
    assert capsys.readouterr().err.count("cannot write heartbeat") == 1


def test_throttled_heartbeat_costs_about_a_microsecond(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(environment.HEARTBEAT_FILE, str(tmp_path / "heartbeat.json"))
    monkeypatch.setenv(environment.HEARTBEAT_INTERVAL, "3600")
    lazarus_rank.heartbeat(0)
    calls = 100_000
    started = time.perf_counter()
    for step in range(calls):
        lazarus_rank.heartbeat(step, loss=0.5)
    per_call_s = (time.perf_counter() - started) / calls
    # ~1 µs on a laptop; the bound is loose for slow, shared CI machines.
    assert per_call_s < 10e-6, f"{per_call_s * 1e6:.2f} µs per throttled call"


@pytest.mark.slow  # starts python
def test_heartbeat_is_flushed_at_exit(tmp_path: Path) -> None:
    beat = tmp_path / "heartbeat.json"
    script = "import lazarus.rank as r\nfor s in range(1, 8):\n    r.heartbeat(s)\n"
    subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT,
        env={
            **os.environ,
            environment.HEARTBEAT_FILE: str(beat),
            environment.HEARTBEAT_INTERVAL: "3600",
        },
        check=True,
        timeout=30,
    )
    assert _read_json(beat)["step"] == 7


# --------------------------------------------------------------------------- control file


def test_should_checkpoint_is_false_without_a_control_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert lazarus_rank.should_checkpoint() is False
    monkeypatch.setenv(environment.CONTROL_FILE, str(tmp_path / "control.json"))
    assert lazarus_rank.should_checkpoint() is False


def test_should_checkpoint_fires_once_per_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    control = tmp_path / "control.json"
    monkeypatch.setenv(environment.CONTROL_FILE, str(control))
    # What the launcher writes when it starts a generation: no request yet.
    _write_atomically(control, json.dumps({"checkpoint_request": 0}))
    assert lazarus_rank.should_checkpoint() is False
    _write_atomically(control, json.dumps({"checkpoint_request": 1}))
    assert lazarus_rank.should_checkpoint() is True
    assert lazarus_rank.should_checkpoint() is False
    # Rewritten with the same id (e.g. the controller re-asserting its state).
    _write_atomically(control, json.dumps({"checkpoint_request": 1, "note": "again"}))
    assert lazarus_rank.should_checkpoint() is False
    _write_atomically(control, json.dumps({"checkpoint_request": 2}))
    assert lazarus_rank.should_checkpoint() is True
    assert lazarus_rank.should_checkpoint() is False


def test_should_checkpoint_notices_an_in_place_rewrite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    control = tmp_path / "control.json"
    monkeypatch.setenv(environment.CONTROL_FILE, str(control))
    control.write_text(json.dumps({"checkpoint_request": 1}))
    assert lazarus_rank.should_checkpoint() is True
    control.write_text(json.dumps({"checkpoint_request": 2}))  # same size, same inode
    stat = control.stat()
    os.utime(control, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert lazarus_rank.should_checkpoint() is True


def test_should_checkpoint_does_not_reread_an_unchanged_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    control = tmp_path / "control.json"
    monkeypatch.setenv(environment.CONTROL_FILE, str(control))
    _write_atomically(control, json.dumps({"checkpoint_request": 1}))
    assert lazarus_rank.should_checkpoint() is True
    opened: list[object] = []
    real_open = open

    def recording_open(*args: Any, **kwargs: Any) -> Any:
        opened.append(args)
        return real_open(*args, **kwargs)

    monkeypatch.setattr("builtins.open", recording_open)
    for _ in range(100):
        assert lazarus_rank.should_checkpoint() is False
    assert opened == []


def test_should_checkpoint_retries_a_half_written_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    control = tmp_path / "control.json"
    monkeypatch.setenv(environment.CONTROL_FILE, str(control))
    control.write_text('{"checkpoint_req')
    assert lazarus_rank.should_checkpoint() is False
    _write_atomically(control, json.dumps({"checkpoint_request": 5}))
    assert lazarus_rank.should_checkpoint() is True


def test_should_checkpoint_ignores_content_without_a_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    control = tmp_path / "control.json"
    monkeypatch.setenv(environment.CONTROL_FILE, str(control))
    for content in (
        "[]",
        "{}",
        '{"checkpoint_request": "3"}',
        '{"checkpoint_request": true}',
        '{"checkpoint_request": -1}',
    ):
        _write_atomically(control, content)
        assert lazarus_rank.should_checkpoint() is False, content


# --------------------------------------------------------------------------- commit protocol


def _fill_checkpoint(directory: Path) -> dict[str, bytes]:
    contents = {
        "state.pt": b"model bytes" * 1000,
        "shards/rank-1.bin": b"\x00\x01" * 10,
    }
    for name, data in contents.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(data)
    # An unfinished write from a crashed rank must not be listed.
    (directory / f".state.pt.999.0{atomic_files.TEMP_SUFFIX}").write_bytes(b"partial")
    return contents


def test_checkpoint_path_needs_a_directory() -> None:
    with pytest.raises(RuntimeError, match=environment.CHECKPOINT_DIR):
        lazarus_rank.checkpoint_path(1)


def test_checkpoint_path_creates_the_step_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(environment.CHECKPOINT_DIR, str(tmp_path / "ckpt"))
    path = lazarus_rank.checkpoint_path(42)
    assert path == tmp_path / "ckpt" / "step-00000042"
    assert path.is_dir()
    assert lazarus_rank.checkpoint_path(42) == path  # exist_ok


def test_commit_writes_a_complete_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(environment.CHECKPOINT_DIR, str(tmp_path))
    monkeypatch.setenv(environment.WORLD_SIZE, "2")
    monkeypatch.setenv(environment.GENERATION, "3")
    directory = lazarus_rank.checkpoint_path(20)
    contents = _fill_checkpoint(directory)
    before = time.time()
    assert lazarus_rank.commit_checkpoint(20) == directory
    manifest = _read_json(directory / checkpoint_layout.MANIFEST)
    assert manifest["step"] == 20
    assert manifest["world_size"] == 2
    assert manifest["generation"] == 3
    assert isinstance(manifest["created_at"], float)
    assert before <= manifest["created_at"] <= time.time()
    assert manifest["files"] == {
        name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        for name, data in contents.items()
    }
    assert checkpoint_layout.is_committed(directory)
    assert checkpoint_layout.committed_steps(tmp_path) == [(20, directory)]


def test_commit_without_hashing_still_records_sizes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(environment.CHECKPOINT_DIR, str(tmp_path))
    directory = lazarus_rank.checkpoint_path(1)
    contents = _fill_checkpoint(directory)
    lazarus_rank.commit_checkpoint(1, hash_files=False)
    files = _read_json(directory / checkpoint_layout.MANIFEST)["files"]
    assert files == {name: {"size": len(data), "sha256": None} for name, data in contents.items()}


def test_commit_marker_is_written_last(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(environment.CHECKPOINT_DIR, str(tmp_path))
    directory = lazarus_rank.checkpoint_path(10)
    _fill_checkpoint(directory)
    events: list[str] = []
    real_replace, real_fsync = os.replace, os.fsync

    def recording_replace(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
        events.append(f"replace {Path(target).name}")
        real_replace(source, target)

    def recording_fsync(fd: int) -> None:
        events.append("fsync")
        real_fsync(fd)

    monkeypatch.setattr(os, "replace", recording_replace)
    monkeypatch.setattr(os, "fsync", recording_fsync)
    lazarus_rank.commit_checkpoint(10)
    renames = [event for event in events if event.startswith("replace")]
    assert renames == [
        f"replace {checkpoint_layout.MANIFEST}",
        f"replace {checkpoint_layout.COMMIT_MARKER}",
    ]
    marker_at = events.index(f"replace {checkpoint_layout.COMMIT_MARKER}")
    manifest_at = events.index(f"replace {checkpoint_layout.MANIFEST}")
    # Data files and the manifest are fsynced before the marker's rename...
    assert events[:manifest_at].count("fsync") >= 3
    assert "fsync" in events[manifest_at:marker_at]
    # ...and the marker's rename is itself made durable.
    assert "fsync" in events[marker_at:]


def test_a_commit_that_crashes_before_the_marker_does_not_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(environment.CHECKPOINT_DIR, str(tmp_path))
    directory = lazarus_rank.checkpoint_path(10)
    _fill_checkpoint(directory)
    real_replace = os.replace

    def crash_on_marker(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
        if Path(target).name == checkpoint_layout.COMMIT_MARKER:
            raise OSError("disk vanished")
        real_replace(source, target)

    monkeypatch.setattr(os, "replace", crash_on_marker)
    with pytest.raises(OSError, match="disk vanished"):
        lazarus_rank.commit_checkpoint(10)
    assert checkpoint_layout.committed_steps(tmp_path) == []
    monkeypatch.setattr(os, "replace", real_replace)
    lazarus_rank.commit_checkpoint(10)
    assert checkpoint_layout.committed_steps(tmp_path) == [(10, directory)]
    leftovers = [p.name for p in directory.iterdir() if "COMMITTED" in p.name]
    assert leftovers == [checkpoint_layout.COMMIT_MARKER]


def test_commit_is_idempotent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(environment.CHECKPOINT_DIR, str(tmp_path))
    directory = lazarus_rank.checkpoint_path(10)
    _fill_checkpoint(directory)
    lazarus_rank.commit_checkpoint(10)
    manifest_before = (directory / checkpoint_layout.MANIFEST).read_bytes()
    marker_before = (directory / checkpoint_layout.COMMIT_MARKER).read_bytes()
    assert lazarus_rank.commit_checkpoint(10) == directory
    assert (directory / checkpoint_layout.MANIFEST).read_bytes() == manifest_before
    assert (directory / checkpoint_layout.COMMIT_MARKER).read_bytes() == marker_before


def test_commit_refuses_to_run_on_other_ranks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(environment.CHECKPOINT_DIR, str(tmp_path))
    monkeypatch.setenv(environment.RANK, "1")
    with pytest.raises(RuntimeError, match="rank 0"):
        lazarus_rank.commit_checkpoint(10)
    assert checkpoint_layout.committed_steps(tmp_path) == []


# --------------------------------------------------------------------------- resume


def _commit(root: Path, step: int) -> Path:
    lazarus_rank.configure(checkpoint_dir=root)
    directory = lazarus_rank.checkpoint_path(step)
    (directory / "state.pt").write_bytes(b"x")
    return lazarus_rank.commit_checkpoint(step)


def test_fresh_start_when_nothing_is_known() -> None:
    assert lazarus_rank.resume_step() is None
    assert lazarus_rank.resume_path() is None


def test_outside_lazarus_resume_falls_back_to_the_newest_committed(tmp_path: Path) -> None:
    _commit(tmp_path, 10)
    newest = _commit(tmp_path, 20)
    lazarus_rank.checkpoint_path(30)  # started, never committed: must be skipped
    lazarus_rank.configure(checkpoint_dir=tmp_path)
    assert lazarus_rank.resume_step() == 20
    assert lazarus_rank.resume_path() == newest
    assert lazarus_rank.resume_point() == (20, newest)


def test_environment_checkpoint_dir_beats_the_configured_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _commit(tmp_path / "from-env", 5)
    _commit(tmp_path / "configured", 9)
    lazarus_rank.configure(checkpoint_dir=tmp_path / "configured")
    monkeypatch.setenv(environment.CHECKPOINT_DIR, str(tmp_path / "from-env"))
    assert lazarus_rank.resume_step() == 5


def test_under_lazarus_only_the_controllers_choice_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _commit(tmp_path, 10)
    older = _commit(tmp_path, 5)
    monkeypatch.setenv(environment.JOB_ID, "job-a")
    monkeypatch.setenv(environment.CHECKPOINT_DIR, str(tmp_path))
    assert lazarus_rank.resume_point() is None  # the controller said: start fresh
    monkeypatch.setenv(environment.RESUME_FROM, str(older))
    monkeypatch.setenv(environment.RESUME_STEP, "5")
    assert lazarus_rank.resume_point() == (5, older)


def test_explicit_resume_variables_fill_each_other_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(environment.RESUME_FROM, str(tmp_path / "step-00000040"))
    assert lazarus_rank.resume_point() == (40, tmp_path / "step-00000040")
    monkeypatch.delenv(environment.RESUME_FROM)
    monkeypatch.setenv(environment.RESUME_STEP, "40")
    monkeypatch.setenv(environment.CHECKPOINT_DIR, str(tmp_path))
    assert lazarus_rank.resume_point() == (40, tmp_path / "step-00000040")


def test_an_unparseable_resume_directory_needs_the_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(environment.RESUME_FROM, str(tmp_path / "latest"))
    with pytest.raises(ValueError, match=environment.RESUME_STEP):
        lazarus_rank.resume_point()
    monkeypatch.setenv(environment.RESUME_STEP, "7")
    assert lazarus_rank.resume_point() == (7, tmp_path / "latest")


# --------------------------------------------------------------------------- torch glue


@pytest.mark.timeout(60)
@pytest.mark.slow  # imports torch
def test_torch_save_and_load_round_trip_without_distributed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = pytest.importorskip("torch")
    import lazarus.rank.torch as lazarus_torch

    monkeypatch.setenv(environment.CHECKPOINT_DIR, str(tmp_path))
    state = {"weights": torch.arange(6.0).reshape(2, 3), "epoch": 2}
    directory = lazarus_torch.save(6, state)
    assert directory == tmp_path / "step-00000006"
    assert checkpoint_layout.is_committed(directory)
    files = _read_json(directory / checkpoint_layout.MANIFEST)["files"]
    assert isinstance(files, dict)
    assert set(files) == {"state.pt"}
    loaded = lazarus_torch.load()
    assert loaded is not None
    step, restored = loaded
    assert step == 6
    assert torch.equal(restored["weights"], state["weights"])
    assert restored["epoch"] == 2


# --------------------------------------------------------------------------- import purity


@pytest.mark.timeout(60)
@pytest.mark.slow  # starts python
def test_importing_the_helper_stays_light() -> None:
    check = (
        "import lazarus.rank, sys; "
        "assert 'temporalio' not in sys.modules and 'torch' not in sys.modules, "
        "sorted(m for m in sys.modules if m.split('.')[0] in ('temporalio', 'torch'))"
    )
    subprocess.run([sys.executable, "-c", check], cwd=REPO_ROOT, check=True, timeout=30)
