"""Run directories per workflow run (issue 10, defect 1) and the stop contract's
report of groups that survive SIGKILL (defect 9), without processes."""

from __future__ import annotations

import os
from pathlib import Path

from activities.nodes.rundir import GenerationDir, generations_below, latest_run, runs
from activities.nodes.shim_agent import _unkillable_groups
from infra import chaos


def make_gen(root: Path, generation: int, mtime_ns: int) -> GenerationDir:
    gen = GenerationDir.of(root, generation)
    gen.path.mkdir(parents=True)
    os.utime(gen.path, ns=(mtime_ns, mtime_ns))
    return gen


def test_runs_are_ordered_by_activity_and_skip_non_runs(tmp_path: Path) -> None:
    job = tmp_path / "job"
    make_gen(job / "run-zzz", 1, 1_000)
    make_gen(job / "run-aaa", 3, 3_000)
    (job / "escalations").mkdir()  # the workflow's markers: not a run
    (job / ".hidden" / "gen-00001").mkdir(parents=True)
    assert [r.name for r in runs(job)] == ["run-zzz", "run-aaa"]
    assert latest_run(job) == job / "run-aaa"
    assert runs(tmp_path / "missing") == [] and latest_run(tmp_path / "missing") is None


def test_a_legacy_job_directory_is_its_own_latest_run(tmp_path: Path) -> None:
    job = tmp_path / "job"
    make_gen(job, 2, 5_000)
    assert latest_run(job) == job
    assert chaos.run_root_of(job) == job
    make_gen(job / "run-new", 1, 9_000)  # started again after the upgrade
    assert latest_run(job) == job / "run-new"
    assert [g.path for g in generations_below(job)] == [
        job / "gen-00002",
        job / "run-new" / "gen-00001",
    ]
    # A run root resolves to itself.
    assert chaos.run_root_of(job / "run-new") == job / "run-new"


def test_shim_survivors_become_unkillable_groups_naming_their_pids() -> None:
    summary = {"survivors": [41, 77], "survivor_pids": [[41, 42], [41, 41], [77, 78]]}
    groups = _unkillable_groups("gpu-3", summary, 10.0)
    assert [(g.node, g.pgid, g.pids) for g in groups] == [
        ("gpu-3", 41, [41, 42]),
        ("gpu-3", 77, [78]),
    ]
    assert "41, 42" in groups[0].reason and "SIGKILL" in groups[0].reason
    assert _unkillable_groups("n", {"survivors": []}, 10.0) == []
