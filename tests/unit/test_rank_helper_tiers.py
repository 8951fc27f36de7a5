"""The rank helper's issue-12 contract: phase marks in the heartbeat, checkpoint
intervals from the controller (environment, then control file), and the memory
checkpoint tier (commit, keep-newest, torn and foreign snapshots skipped).

What the controller relies on is pinned here: the heartbeat's ``phases`` table, the
variable and control-file names, and the memory manifest's fields.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import lazarus.rank as lazarus_rank
from lazarus.domain import checkpoint_layout, environment, phases
from lazarus.rank import memory, reset

REPO_ROOT = Path(__file__).resolve().parents[2]
_CONTRACT_VARIABLES = [
    value for name, value in vars(environment).items() if name.isupper() and isinstance(value, str)
]


@pytest.fixture(autouse=True)
def clean_rank_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts outside Lazarus with fresh module state."""
    for variable in _CONTRACT_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    reset._reset_state()
    yield
    reset._reset_state()


def _beat(path: Path) -> dict[str, Any]:
    document = json.loads(path.read_text())
    assert isinstance(document, dict)
    return document


def _write_control(path: Path, document: dict[str, Any]) -> None:
    temp = path.with_name(path.name + ".writing")
    temp.write_text(json.dumps(document))
    os.replace(temp, path)


@pytest.fixture
def heartbeat_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "heartbeat.json"
    monkeypatch.setenv(environment.HEARTBEAT_FILE, str(path))
    return path


# --------------------------------------------------------------------------- phase marks


def test_marks_ride_in_the_heartbeat(heartbeat_file: Path) -> None:
    lazarus_rank.mark(phases.FRAMEWORK_IMPORTED)
    lazarus_rank.heartbeat(1)
    marks = _beat(heartbeat_file)[phases.HEARTBEAT_FIELD]
    assert set(marks) == {phases.PROCESS_STARTED, phases.FRAMEWORK_IMPORTED, phases.FIRST_STEP}
    assert marks[phases.PROCESS_STARTED] <= marks[phases.FRAMEWORK_IMPORTED]
    assert marks[phases.FRAMEWORK_IMPORTED] <= marks[phases.FIRST_STEP] <= time.time()


def test_a_phase_is_marked_once_per_process(heartbeat_file: Path) -> None:
    lazarus_rank.mark(phases.PROCESS_GROUP_READY)
    first = lazarus_rank.phase_marks()[phases.PROCESS_GROUP_READY]
    time.sleep(0.01)
    lazarus_rank.mark(phases.PROCESS_GROUP_READY)
    lazarus_rank.heartbeat(1)
    assert _beat(heartbeat_file)[phases.HEARTBEAT_FIELD][phases.PROCESS_GROUP_READY] == first


def test_the_heartbeat_after_a_mark_writes_despite_the_throttle(
    heartbeat_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(environment.HEARTBEAT_INTERVAL, "3600")
    lazarus_rank.heartbeat(1)
    lazarus_rank.heartbeat(2)
    assert _beat(heartbeat_file)["step"] == 1  # throttled
    lazarus_rank.mark(phases.CHECKPOINT_LOADED)
    lazarus_rank.heartbeat(3)
    beat = _beat(heartbeat_file)
    assert beat["step"] == 3
    assert phases.CHECKPOINT_LOADED in beat[phases.HEARTBEAT_FIELD]


def test_first_step_is_the_first_heartbeat_beyond_the_resume_point(
    heartbeat_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(environment.HEARTBEAT_INTERVAL, "0")
    monkeypatch.setenv(environment.RESUME_FROM, str(tmp_path / "step-00000020"))
    assert lazarus_rank.resume_step() == 20
    lazarus_rank.heartbeat(20)  # a script announcing where it stands: not a new step
    assert phases.FIRST_STEP not in _beat(heartbeat_file)[phases.HEARTBEAT_FIELD]
    lazarus_rank.heartbeat(21)
    first = _beat(heartbeat_file)[phases.HEARTBEAT_FIELD][phases.FIRST_STEP]
    lazarus_rank.heartbeat(22)
    assert _beat(heartbeat_file)[phases.HEARTBEAT_FIELD][phases.FIRST_STEP] == first


def test_a_mark_needs_a_name() -> None:
    with pytest.raises(ValueError, match="name"):
        lazarus_rank.mark("")


@pytest.mark.timeout(60)
@pytest.mark.slow  # starts python
def test_process_start_is_read_from_proc_not_taken_at_import() -> None:
    """The child sleeps before importing the helper: ``process_started`` must still
    be the moment the process began, not the import."""
    script = (
        "import time; time.sleep(0.5); import json, lazarus.rank as lz; "
        "print(json.dumps([lz.phase_marks()['process_started'], time.time()]))"
    )
    launched_at = time.time()
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT,
        check=True,
        timeout=30,
        capture_output=True,
        text=True,
    )
    started, imported_after = json.loads(done.stdout)
    # Clock ticks are 10 ms; allow for them and for the parent's own delay.
    assert launched_at - 0.1 <= started <= imported_after - 0.4


@pytest.mark.timeout(90)
@pytest.mark.slow  # starts python with torch
def test_the_torch_glue_marks_its_phases(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    heartbeat = tmp_path / "beat.json"
    script = f"""
import lazarus.rank as lz, lazarus.rank.torch as lt
lt.init_process_group("gloo", init_method="file://{tmp_path / "rendezvous"}", rank=0, world_size=1)
assert lt.load() is None
lz.heartbeat(1)
lz.flush_heartbeat()
"""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("LAZARUS_")},
        environment.HEARTBEAT_FILE: str(heartbeat),
    }
    subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, env=env, check=True, timeout=60)
    marks = _beat(heartbeat)[phases.HEARTBEAT_FIELD]
    assert set(marks) == set(phases.RANK_PHASES)
    ordered = [marks[name] for name in phases.RANK_PHASES]
    assert ordered == sorted(ordered)


# --------------------------------------------------------------------------- intervals


def test_disk_interval_falls_back_to_the_scripts_own(monkeypatch: pytest.MonkeyPatch) -> None:
    assert lazarus_rank.checkpoint_every_steps() is None
    assert [s for s in range(1, 10) if lazarus_rank.should_checkpoint(s, every=3)] == [3, 6, 9]
    assert not lazarus_rank.should_checkpoint(3)  # no interval anywhere: requests only


def test_disk_interval_from_the_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(environment.CHECKPOINT_EVERY_STEPS, "4")
    assert lazarus_rank.checkpoint_every_steps() == 4
    assert [s for s in range(0, 10) if lazarus_rank.should_checkpoint(s, every=3)] == [4, 8]
    monkeypatch.setenv(environment.CHECKPOINT_EVERY_STEPS, "0")  # only on request
    assert not any(lazarus_rank.should_checkpoint(s, every=3) for s in range(10))


@pytest.mark.parametrize("raw", ["often", "-2"])
def test_a_malformed_interval_variable_is_named(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(environment.CHECKPOINT_EVERY_STEPS, raw)
    with pytest.raises(ValueError, match=environment.CHECKPOINT_EVERY_STEPS):
        lazarus_rank.should_checkpoint(5)


def test_memory_interval_defaults_to_every_step_once_the_tier_is_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(environment.MEMORY_EVERY_STEPS, "3")
    assert lazarus_rank.memory_every_steps() == 0  # no directory: off
    assert not memory.due(3)
    monkeypatch.delenv(environment.MEMORY_EVERY_STEPS)
    monkeypatch.setenv(environment.MEMORY_CHECKPOINT_DIR, str(tmp_path))
    assert lazarus_rank.memory_every_steps() == 1
    monkeypatch.setenv(environment.MEMORY_EVERY_STEPS, "3")
    assert [s for s in range(0, 7) if memory.due(s)] == [3, 6]


def test_the_control_file_overrides_both_intervals_without_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    control = tmp_path / "control.json"
    monkeypatch.setenv(environment.CONTROL_FILE, str(control))
    monkeypatch.setenv(environment.MEMORY_CHECKPOINT_DIR, str(tmp_path / "mem"))
    monkeypatch.setenv(environment.CHECKPOINT_EVERY_STEPS, "100")
    monkeypatch.setenv(environment.MEMORY_EVERY_STEPS, "5")
    _write_control(control, {"checkpoint_request": 0})
    assert (lazarus_rank.checkpoint_every_steps(), lazarus_rank.memory_every_steps()) == (100, 5)
    _write_control(
        control,
        {
            "checkpoint_request": 0,
            environment.CONTROL_CHECKPOINT_EVERY_STEPS: 7,
            environment.CONTROL_MEMORY_EVERY_STEPS: 2,
        },
    )
    assert (lazarus_rank.checkpoint_every_steps(), lazarus_rank.memory_every_steps()) == (7, 2)
    assert lazarus_rank.should_checkpoint(14, every=3)
    assert not lazarus_rank.should_checkpoint(100, every=3)
    # A rewrite without the keys hands the intervals back to the environment.
    _write_control(control, {"checkpoint_request": 0})
    assert (lazarus_rank.checkpoint_every_steps(), lazarus_rank.memory_every_steps()) == (100, 5)


def test_a_bad_control_interval_is_reported_once_and_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    control = tmp_path / "control.json"
    monkeypatch.setenv(environment.CONTROL_FILE, str(control))
    monkeypatch.setenv(environment.CHECKPOINT_EVERY_STEPS, "10")
    _write_control(control, {environment.CONTROL_CHECKPOINT_EVERY_STEPS: "soon"})
    assert lazarus_rank.checkpoint_every_steps() == 10
    _write_control(control, {environment.CONTROL_CHECKPOINT_EVERY_STEPS: -1, "x": 1})
    assert lazarus_rank.checkpoint_every_steps() == 10
    errors = capsys.readouterr().err
    assert errors.count(environment.CONTROL_CHECKPOINT_EVERY_STEPS) == 1
    assert str(control) in errors


def test_reading_intervals_never_swallows_a_checkpoint_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    control = tmp_path / "control.json"
    monkeypatch.setenv(environment.CONTROL_FILE, str(control))
    _write_control(
        control, {"checkpoint_request": 1, environment.CONTROL_CHECKPOINT_EVERY_STEPS: 0}
    )
    assert lazarus_rank.checkpoint_every_steps() == 0  # this read sees the request first
    assert lazarus_rank.should_checkpoint()
    assert not lazarus_rank.should_checkpoint()
    _write_control(
        control, {"checkpoint_request": 2, environment.CONTROL_CHECKPOINT_EVERY_STEPS: 0}
    )
    assert lazarus_rank.should_checkpoint(3, every=3)  # the request, not the (zero) interval


# --------------------------------------------------------------------------- memory tier


@pytest.fixture
def memory_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "shm"
    monkeypatch.setenv(environment.MEMORY_CHECKPOINT_DIR, str(path))
    return path


def _snapshot(step: int, payload: bytes = b"state") -> Path:
    (memory.write_dir(step) / "state.pt").write_bytes(payload)
    return memory.commit(step)


def _committed(root: Path) -> list[int]:
    return [step for step, _ in checkpoint_layout.committed_steps(root)]


def test_a_memory_commit_writes_the_disk_tiers_manifest(
    memory_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(environment.JOB_ID, "job-a")
    monkeypatch.setenv(environment.GENERATION, "3")
    monkeypatch.setenv(environment.WORLD_SIZE, "2")
    directory = _snapshot(4, b"12345")
    assert directory == memory_dir / "step-00000004"
    assert checkpoint_layout.is_committed(directory)
    manifest = json.loads((directory / checkpoint_layout.MANIFEST).read_text())
    assert manifest["files"] == {"state.pt": {"size": 5, "sha256": None}}
    assert (manifest["step"], manifest["job_id"], manifest["generation"]) == (4, "job-a", 3)
    assert (manifest["world_size"], manifest["tier"]) == (2, checkpoint_layout.MEMORY_TIER)
    assert "checkpoint_request" not in manifest
    assert checkpoint_layout.size_problem(directory) is None


def test_only_the_newest_snapshots_are_kept(
    memory_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for step in range(1, 6):
        _snapshot(step)
    assert _committed(memory_dir) == [4, 5]
    assert sorted(p.name for p in memory_dir.iterdir()) == ["step-00000004", "step-00000005"]
    monkeypatch.setenv(environment.MEMORY_KEEP, "3")
    _snapshot(6)
    _snapshot(7)
    assert _committed(memory_dir) == [5, 6, 7]


def test_a_keep_below_one_is_refused(memory_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(environment.MEMORY_KEEP, "0")
    with pytest.raises(ValueError, match=environment.MEMORY_KEEP):
        memory.keep()


def test_the_snapshot_resumed_from_is_never_pruned(
    memory_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _snapshot(1)
    monkeypatch.setenv(environment.JOB_ID, "job-a")
    monkeypatch.setenv(environment.RESUME_FROM, str(memory_dir / "step-00000001"))
    for step in range(2, 6):
        _snapshot(step)
    assert _committed(memory_dir) == [1, 4, 5]


def test_prune_clears_torn_leftovers_below_the_newest_commit(memory_dir: Path) -> None:
    torn = memory.write_dir(2)
    (torn / "state.pt").write_bytes(b"half")
    above = memory.write_dir(9)  # uncommitted above the newest: left alone
    _snapshot(3)
    assert not torn.exists()
    assert above.exists()
    temp = above / f".state.pt.1.1{checkpoint_layout.TEMP_SUFFIX}"
    temp.write_bytes(b"killed writer")
    memory.write_dir(9)
    assert not temp.exists()


def test_torn_and_foreign_snapshots_are_skipped(
    memory_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for step in (1, 2, 3):
        _snapshot(step, b"x" * 10)
    monkeypatch.setenv(environment.MEMORY_KEEP, "10")
    _snapshot(4, b"x" * 10)
    _snapshot(5, b"x" * 10)
    (memory_dir / "step-00000005" / "state.pt").write_bytes(b"x" * 4)  # torn: size mismatch
    (memory_dir / "step-00000004" / checkpoint_layout.COMMIT_MARKER).unlink()  # torn: no marker
    manifest_path = memory_dir / "step-00000003" / checkpoint_layout.MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest["job_id"] = "someone-else"
    manifest_path.write_text(json.dumps(manifest))
    assert [step for step, _ in memory.usable_snapshots()] == [2]
    assert lazarus_rank.resume_point() == (2, memory_dir / "step-00000002")


def test_a_snapshot_of_another_job_is_skipped_under_any_job(
    memory_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(environment.JOB_ID, "job-a")
    _snapshot(1)
    assert [step for step, _ in memory.usable_snapshots()] == [1]
    monkeypatch.setenv(environment.JOB_ID, "job-b")
    assert memory.usable_snapshots() == []
    monkeypatch.delenv(environment.JOB_ID)  # a plain torchrun run owns no Lazarus job's copy
    assert memory.usable_snapshots() == []


def test_outside_lazarus_the_newest_across_tiers_wins(
    memory_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = tmp_path / "disk"
    monkeypatch.setenv(environment.CHECKPOINT_DIR, str(disk))
    for step in (4, 8):
        (lazarus_rank.checkpoint_path(step) / "state.pt").write_bytes(b"d")
        lazarus_rank.commit_checkpoint(step)
    _snapshot(6)
    assert lazarus_rank.resume_point() == (8, disk / "step-00000008")
    reset._reset_state()
    _snapshot(8)
    assert lazarus_rank.resume_point() == (8, memory_dir / "step-00000008")  # a tie: memory
    reset._reset_state()
    _snapshot(9)
    assert lazarus_rank.resume_point() == (9, memory_dir / "step-00000009")
    reset._reset_state()
    seen: list[list[int]] = []

    def agree(steps: list[int]) -> int | None:
        seen.append(steps)
        return 4

    assert lazarus_rank.resume_point(agree=agree) == (4, disk / "step-00000004")
    assert seen == [[4, 8, 8, 9]]


def test_under_lazarus_the_controller_may_point_into_the_memory_tier(
    memory_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _snapshot(5)
    _snapshot(6)
    monkeypatch.setenv(environment.JOB_ID, "job-a")
    assert lazarus_rank.resume_point() is None  # no choice made: the controller decides
    monkeypatch.setenv(environment.RESUME_FROM, str(memory_dir / "step-00000005"))
    assert lazarus_rank.resume_point() == (5, memory_dir / "step-00000005")


# --------------------------------------------------------------------------- torch glue


@pytest.mark.timeout(60)
@pytest.mark.slow  # imports torch
def test_a_torch_snapshot_is_a_copy_taken_before_it_returns(
    memory_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = pytest.importorskip("torch")
    import lazarus.rank.torch as lazarus_torch

    weights = torch.zeros(4)
    model_state = {"w": weights, "meta": {"lr": [0.1]}}
    assert not lazarus_torch.snapshot(0, {"w": weights})  # step 0 is never due
    assert lazarus_torch.snapshot(1, lambda: model_state)
    weights.add_(1)  # training goes on while the write is in flight
    model_state["meta"]["lr"][0] = 0.5
    lazarus_torch.flush_snapshots()
    monkeypatch.setenv(environment.RESUME_FROM, str(memory_dir / "step-00000001"))
    loaded = lazarus_torch.load()
    assert loaded is not None
    step, state = loaded
    assert step == 1
    assert torch.equal(state["w"], torch.zeros(4))
    assert state["meta"] == {"lr": [0.1]}
    manifest = json.loads((memory_dir / "step-00000001" / checkpoint_layout.MANIFEST).read_text())
    assert manifest["tier"] == checkpoint_layout.MEMORY_TIER


@pytest.mark.timeout(60)
@pytest.mark.slow  # imports torch
def test_checkpoint_sends_a_step_to_one_tier(
    memory_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = pytest.importorskip("torch")
    import lazarus.rank.torch as lazarus_torch

    monkeypatch.setenv(environment.CHECKPOINT_DIR, str(tmp_path / "disk"))
    monkeypatch.setenv(environment.MEMORY_EVERY_STEPS, "2")
    state = {"w": torch.ones(2)}
    tiers = []
    for step in range(1, 7):
        tiers.append(lazarus_torch.checkpoint(step, state, every=3))
        # Steps longer than a snapshot's write: one due while the previous is still
        # being written would be skipped (never queued), which is not this test's case.
        lazarus_torch.flush_snapshots()
    assert tiers == [None, "memory", "disk", "memory", None, "disk"]
    assert _committed(tmp_path / "disk") == [3, 6]
    assert _committed(memory_dir) == [2, 4]


def test_a_rank_other_than_local_zero_writes_nothing(
    memory_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(environment.RANK, "3")
    monkeypatch.setenv(environment.LOCAL_RANK, "1")
    assert not memory.is_writer()
    monkeypatch.setenv(environment.LOCAL_RANK, "0")
    assert memory.is_writer()  # each node's local rank 0 writes its node's copy


def test_a_snapshot_due_while_the_last_is_being_written_is_skipped_and_counted(
    memory_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 36: the training thread never waits for a write (or a push) in flight:
    the snapshot is skipped, counted, and the memory stays one copy in flight."""
    pytest.importorskip("torch")
    import threading

    import lazarus.rank.torch as lazarus_torch

    monkeypatch.setenv(environment.MEMORY_EVERY_STEPS, "1")
    release = threading.Event()
    busy = threading.Thread(target=release.wait, daemon=True)
    busy.start()
    monkeypatch.setattr(lazarus_torch, "_snapshot_thread", busy)
    before = lazarus_torch.snapshots_skipped
    try:
        assert lazarus_torch.snapshot(5, {"w": 1}) is False
        assert lazarus_torch.checkpoint(6, {"w": 1}) is None
        assert lazarus_torch.snapshots_skipped == before + 2
    finally:
        release.set()
        busy.join(timeout=5)
    assert _committed(memory_dir) == []
