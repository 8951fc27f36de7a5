"""The chaos judge's sixth invariant: no snapshot of an abandoned timeline is resumed.

Pure logic (:func:`tests.chaos.invariants.abandoned_resumes`) on launches and
snapshot writers as the history and the census record them, and the census's
reading of manifests in a directory laid out like the memory tier.
"""

from __future__ import annotations

import json
from pathlib import Path

from lazarus.domain.checkpoint_layout import COMMIT_MARKER, MANIFEST, step_dir_name
from tests.chaos.invariants import (
    GenerationCensus,
    Launch,
    WriterSeen,
    abandoned_resumes,
    memory_left,
)

RUN = "/dev/shm/lazarus/job/run-1"


def snap(step: int) -> str:
    return f"{RUN}/{step_dir_name(step)}"


def test_a_rollback_then_a_resume_of_the_old_timeline_is_a_violation() -> None:
    # Generation 1 wrote 22 and 23; the rollback resumed generation 2 from 15;
    # generation 3 resuming 23 (written by 1) undoes the rollback.
    launches = [
        Launch(1, 0, None, at=0.0),
        Launch(2, 15, "/ckpt/step-00000015", at=10.0),
        Launch(3, 23, snap(23), at=20.0),
    ]
    writers = {snap(23): [WriterSeen(at=5.0, generation=1)]}
    violations, unjudged = abandoned_resumes(launches, writers)
    assert unjudged == []
    [violation] = violations
    assert "generation 3 resumed" in violation and "generation 2 resumed from step 15" in violation


def test_a_snapshot_of_the_new_timeline_is_fine() -> None:
    launches = [
        Launch(1, 0, None, at=0.0),
        Launch(2, 15, "/ckpt/step-00000015", at=10.0),
        Launch(3, 19, snap(19), at=20.0),
    ]
    # Step 19 was written by 1, then re-saved by 2 after the cut: 2's copy is resumed.
    writers = {snap(19): [WriterSeen(at=5.0, generation=1), WriterSeen(at=15.0, generation=2)]}
    assert abandoned_resumes(launches, writers) == ([], [])


def test_the_writer_is_the_one_seen_before_the_launch() -> None:
    launches = [
        Launch(1, 0, None, at=0.0),
        Launch(2, 15, "/ckpt/step-00000015", at=10.0),
        Launch(3, 19, snap(19), at=20.0),
    ]
    # Generation 2's re-save is seen only after generation 3 launched: 1's copy was resumed.
    writers = {snap(19): [WriterSeen(at=5.0, generation=1), WriterSeen(at=25.0, generation=2)]}
    violations, _ = abandoned_resumes(launches, writers)
    assert len(violations) == 1


def test_a_step_at_or_below_every_later_cut_stays_on_the_timeline() -> None:
    launches = [
        Launch(1, 0, None, at=0.0),
        Launch(2, 20, snap(20), at=10.0),  # a plain crash: resumed at generation 1's newest
        Launch(3, 20, snap(20), at=20.0),  # crashed again before a step: the same snapshot
    ]
    writers = {snap(20): [WriterSeen(at=5.0, generation=1)]}
    assert abandoned_resumes(launches, writers) == ([], [])


def test_disk_resumes_are_not_judged_and_unseen_snapshots_are_reported() -> None:
    launches = [
        Launch(1, 0, None, at=0.0),
        Launch(2, 10, "/ckpt/step-00000010", at=10.0),
        Launch(3, 12, snap(12), at=20.0),
    ]
    violations, unjudged = abandoned_resumes(launches, {})
    assert violations == []
    assert unjudged == [f"generation 3 resumed {snap(12)}, never seen committed before"]


def test_a_retried_generation_counts_with_its_last_request() -> None:
    launches = [
        Launch(1, 0, None, at=0.0),
        Launch(2, 23, snap(23), at=10.0),  # chosen, then the preflight sent it back
        Launch(2, 15, "/ckpt/step-00000015", at=11.0),
        Launch(3, 15, "/ckpt/step-00000015", at=20.0),
    ]
    writers = {snap(23): [WriterSeen(at=5.0, generation=1)]}
    assert abandoned_resumes(launches, writers) == ([], [])


def write_snapshot(run: Path, step: int, generation: object, committed: bool = True) -> Path:
    path = run / step_dir_name(step)
    path.mkdir(parents=True)
    (path / MANIFEST).write_text(json.dumps({"step": step, "generation": generation}))
    if committed:
        (path / COMMIT_MARKER).write_text("")
    return path


def test_the_census_records_each_committed_snapshots_writer(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    run = job_dir / "run-1"
    write_snapshot(run, 22, 1)
    write_snapshot(run, 23, 1, committed=False)  # in flight: not a resume point yet
    census = GenerationCensus(tmp_path / "runs", memory_job_dir=job_dir)
    census.sample()
    census.sample()  # unchanged: nothing new recorded
    assert list(census.writers) == [snap(22)]
    assert [w.generation for w in census.writers[snap(22)]] == [1]

    (run / step_dir_name(22) / MANIFEST).unlink()  # a re-save by generation 2
    (run / step_dir_name(22) / MANIFEST).write_text(json.dumps({"generation": 2}))
    census.sample()
    assert [w.generation for w in census.writers[snap(22)]] == [1, 2]
    assert memory_left(job_dir) == [str(run / step_dir_name(22)), str(run / step_dir_name(23))]
