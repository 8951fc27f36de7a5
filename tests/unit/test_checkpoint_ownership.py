"""Checkpoints are per job, hostile manifests are refused, corrupt ones get repaired,
and retired steps stay retired (issue 10, defects 2, 3, 4 and 12)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

import lazarus.rank as lz
from activities.checkpoints import (
    CheckpointCorrupt,
    collect_garbage_sync,
    restore_checkpoint_sync,
    search_verified,
    verify_checkpoint,
)
from activities.checkpoints.resume_plan import set_aside
from activities.checkpoints.rollback import retire_newest
from lazarus.app import cli
from lazarus.domain import environment
from lazarus.domain.checkpoint_layout import COMMIT_MARKER, MANIFEST
from lazarus.domain.contracts import (
    FindVerifiedCheckpointRequest,
    GarbageCollectionRequest,
    RestoreCheckpointRequest,
)
from lazarus.domain.spec import CheckpointsSpec, SpecError, load_spec
from lazarus.rank import reset
from tests.checkpoint_helpers import clean_rank_env, flip_byte, write_checkpoint

pytestmark = pytest.mark.usefixtures("clean_rank_env")
__all__ = ["clean_rank_env"]


def write_for_job(root: Path, step: int, job: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A checkpoint whose manifest names ``job`` (as under the Lazarus launcher)."""
    monkeypatch.setenv(environment.JOB_ID, job)
    try:
        return write_checkpoint(root, step)
    finally:
        monkeypatch.delenv(environment.JOB_ID)


def hostile(root: Path, step: int, relpath: str) -> Path:
    """A committed checkpoint whose manifest lists ``relpath``."""
    directory = write_checkpoint(root, step)
    manifest = json.loads((directory / MANIFEST).read_text())
    manifest["files"][relpath] = {"size": 3, "sha256": None}
    (directory / MANIFEST).write_text(json.dumps(manifest))
    return directory


# --------------------------------------------------------------------------- defect 12


@pytest.mark.parametrize("bad", ["../../pwned", "/tmp/pwned-abs", "a/../../pwned"])
def test_verify_refuses_a_manifest_path_leaving_the_checkpoint(tmp_path: Path, bad: str) -> None:
    directory = hostile(tmp_path / "ckpt", 10, bad)
    result = verify_checkpoint(directory)
    assert not result.ok
    assert result.problems == [result.problems[0]]  # refused first, nothing else read
    assert f"refused file path {bad!r}" in result.problems[0]


def test_verify_refuses_a_symlink_out_of_the_checkpoint(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"top secret")
    directory = write_checkpoint(tmp_path / "ckpt", 10)
    (directory / "evil").symlink_to(secret)
    manifest = json.loads((directory / MANIFEST).read_text())
    manifest["files"]["evil"] = {"size": 10, "sha256": None}
    (directory / MANIFEST).write_text(json.dumps(manifest))
    result = verify_checkpoint(directory)
    assert not result.ok
    assert any("evil: refused: resolves outside the checkpoint" in p for p in result.problems)


@pytest.mark.parametrize("bad", ["../../pwned", "/PLACEHOLDER/pwned"])
def test_restore_refuses_a_hostile_manifest_before_writing(tmp_path: Path, bad: str) -> None:
    bad = bad.replace("/PLACEHOLDER", str(tmp_path))
    durable = tmp_path / "durable"
    source = hostile(durable, 10, bad)
    (source / "pwned").write_bytes(b"bad")  # so a download of the entry would succeed
    local = tmp_path / "local" / "deep"
    with pytest.raises(CheckpointCorrupt) as caught:
        restore_checkpoint_sync(
            RestoreCheckpointRequest(uri=str(source), checkpoint_dir=str(local))
        )
    assert str(source) in str(caught.value) and repr(bad) in str(caught.value)
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "local" / "pwned").exists()
    assert not (local / "step-00000010").exists()


def test_search_moves_a_hostile_local_checkpoint_aside(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    write_checkpoint(root, 10)
    hostile(root, 20, "../../pwned")
    found = search_verified(FindVerifiedCheckpointRequest(checkpoint_dir=str(root)))
    assert found.chosen is not None and found.chosen.step == 10
    assert found.skipped[0].moved_to == str(root / ".corrupt" / "step-00000020.0")


# --------------------------------------------------------------------------- defect 3


def resave(root: Path, step: int, *, request: int | None = None, seed: int = 7) -> None:
    """What a relaunched rank 0 does: write its files into checkpoint_path, commit."""
    reset._reset_state()
    lz.configure(checkpoint_dir=root)
    if request is not None:
        lz.control._unanswered_request = request  # as should_checkpoint() records it
    (lz.checkpoint_path(step) / "state.pt").write_bytes(bytes([seed]) * 5000)
    lz.commit_checkpoint(step)
    reset._reset_state()


def test_a_corrupt_checkpoint_is_moved_aside_and_its_resave_verifies(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    write_checkpoint(root, 10)
    corrupt = write_checkpoint(root, 20)
    flip_byte(corrupt / "state.pt")
    found = search_verified(FindVerifiedCheckpointRequest(checkpoint_dir=str(root)))
    assert found.chosen is not None and found.chosen.step == 10
    assert [s.step for s in found.skipped] == [20]
    moved = found.skipped[0].moved_to
    assert moved is not None and Path(moved, "state.pt").is_file()  # kept for a person
    resave(root, 20, request=3)
    assert verify_checkpoint(root / "step-00000020").ok
    assert json.loads((root / "step-00000020" / MANIFEST).read_text())["checkpoint_request"] == 3


def test_resaving_a_committed_step_replaces_it_atomically(tmp_path: Path) -> None:
    """Without a find in between (the corrupt copy still in place), a re-save must not
    leave new bytes under the old manifest, and must record the request it answers."""
    root = tmp_path / "ckpt"
    corrupt = write_checkpoint(root, 20)
    flip_byte(corrupt / "state.pt")
    resave(root, 20, request=5)
    result = verify_checkpoint(root / "step-00000020")
    assert result.ok, result.problems
    manifest = json.loads((root / "step-00000020" / MANIFEST).read_text())
    assert manifest["checkpoint_request"] == 5
    assert (root / "step-00000020" / "state.pt").read_bytes() == bytes([7]) * 5000
    assert sorted(p.name for p in root.iterdir()) == ["step-00000020"]  # no leftovers
    lz.configure(checkpoint_dir=root)
    assert lz.commit_checkpoint(20) == root / "step-00000020"  # a retried commit: no-op
    assert verify_checkpoint(root / "step-00000020").ok


# --------------------------------------------------------------------------- defect 2


def test_find_gc_and_rollback_leave_another_jobs_checkpoints_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "shared"
    for step in (10, 20):
        write_for_job(root, step, "job-a", monkeypatch)
    write_for_job(root, 30, "job-b", monkeypatch)
    found = search_verified(FindVerifiedCheckpointRequest(checkpoint_dir=str(root), job_id="job-a"))
    assert found.chosen is not None and found.chosen.step == 20
    assert [(s.step, s.problems, s.moved_to) for s in found.skipped] == [
        (30, ["written by job job-b"], None)
    ]
    # job-b's newest is its own 30; job-a's are never its to delete.
    gc_b = collect_garbage_sync(
        GarbageCollectionRequest(
            checkpoint_dir=str(root), checkpoints=CheckpointsSpec(keep_local=0), job_id="job-b"
        )
    )
    assert gc_b.deleted_local == [] and gc_b.newest_verified_local == 30
    gc_a = collect_garbage_sync(
        GarbageCollectionRequest(
            checkpoint_dir=str(root), checkpoints=CheckpointsSpec(keep_local=1), job_id="job-a"
        )
    )
    assert [r.step for r in gc_a.deleted_local] == [10] and gc_a.newest_verified_local == 20
    rolled = retire_newest(str(root), job_id="job-a")
    assert [r.step for r in rolled.retired] == [20] and rolled.resume is None
    assert (root / "step-00000030").is_dir()


def test_default_checkpoint_dir_follows_the_final_job_name(tmp_path: Path) -> None:
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text("name: base\ncommand: [python, train.py]\n")
    assert load_spec(spec_file).checkpoint_dir == str(tmp_path / "checkpoints" / "base")
    renamed = load_spec(spec_file, name_override="other")
    assert renamed.checkpoint_dir == str(tmp_path / "checkpoints" / "other")
    spec_file.write_text(
        "name: base\ncommand: [python, train.py]\ncheckpoint_dir: ck/{job_id}/x\n"
        "checkpoints:\n  durable_uri: s3://bucket/{job_id}\n"
    )
    renamed = load_spec(spec_file, name_override="other")
    assert renamed.checkpoint_dir == str(tmp_path / "ck" / "other" / "x")
    assert renamed.checkpoints.durable_uri == "s3://bucket/other"
    spec_file.write_text("name: base\ncommand: [python, t.py]\ncheckpoint_dir: ck/{job}\n")
    with pytest.raises(SpecError) as caught:
        load_spec(spec_file)
    assert caught.value.lines == [
        f"{spec_file}: checkpoint_dir: unknown placeholder {{job}}; only {{job_id}} "
        "(the job's name) is replaced (line 3)"
    ]


def test_the_demo_and_the_walkthrough_do_not_share_checkpoints() -> None:
    import sys

    repo = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(repo / "examples"))
    try:
        import demo
    finally:
        sys.path.remove(str(repo / "examples"))
    walkthrough = load_spec(repo / "examples" / "jobs" / "ddp_demo.yaml")
    shown = demo.demo_spec()
    assert shown.name != walkthrough.name
    assert shown.checkpoint_dir != walkthrough.checkpoint_dir
    out = shown.command[shown.command.index("--out") + 1]
    assert out != walkthrough.command[walkthrough.command.index("--out") + 1]


def _spec(tmp_path: Path) -> Path:
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text("name: walk\ncommand: [python, train.py]\nnproc_per_node: 1\n")
    return spec_file


def test_start_dry_run_says_it_will_resume_and_from_whose_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, worker_here: list[object]
) -> None:
    spec_file = _spec(tmp_path)
    root = tmp_path / "checkpoints" / "walk"
    write_for_job(root, 300, "walk", monkeypatch)
    runner = CliRunner()
    result = runner.invoke(cli.app, ["start", str(spec_file), "--dry-run"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert "will RESUME from step 300, written by this job (walk)" in result.stdout
    result = runner.invoke(cli.app, ["start", str(spec_file), "--dry-run", "--json"])
    plan = json.loads(result.stdout)["resume_from"]
    assert plan["step"] == 300 and plan["written_by"] == "walk"
    assert isinstance(plan["written_at"], float)
    result = runner.invoke(
        cli.app, ["start", str(spec_file), "--dry-run", "--json", "--name", "other"]
    )
    assert json.loads(result.stdout)["resume_from"] is None  # its own, empty directory


def test_fresh_moves_checkpoints_aside_and_keeps_them(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    write_checkpoint(root, 10)
    write_checkpoint(root, 20)
    (root / ".step-00000030.resave").mkdir()
    result = set_aside(str(root), now=0.0)
    assert result.moved_to == str(root / ".previous-19700101T000000Z")
    assert result.steps == [10, 20]
    assert sorted(os.listdir(result.moved_to)) == [
        ".step-00000030.resave",
        "step-00000010",
        "step-00000020",
    ]
    assert search_verified(FindVerifiedCheckpointRequest(checkpoint_dir=str(root))).chosen is None
    assert set_aside(str(root)).moved_to is None  # nothing left to move


# --------------------------------------------------------------------------- defect 4


def test_excluded_steps_are_never_chosen_from_either_tier(tmp_path: Path) -> None:
    local, durable = tmp_path / "local", tmp_path / "durable"
    for step in (10, 20, 30):
        write_checkpoint(local, step)
    write_checkpoint(durable, 30)
    spec = CheckpointsSpec(durable_uri=str(durable))
    request = FindVerifiedCheckpointRequest(
        checkpoint_dir=str(local), checkpoints=spec, exclude_steps=[30]
    )
    found = search_verified(request)
    assert found.chosen is not None and found.chosen.step == 20 and found.skipped == []
    retired = retire_newest(str(local))  # rollback: the local copy goes to .rolled-back/
    assert [r.step for r in retired.retired] == [30]
    assert Path(retired.retired[0].path).parent == local / ".rolled-back"
    found = search_verified(request)  # only the durable tier still holds 30
    assert found.chosen is not None and found.chosen.step == 20
    assert (durable / "step-00000030" / COMMIT_MARKER).is_file()
