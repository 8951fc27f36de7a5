"""The memory tier is as safe as the disk tier (issue 26, defects 1, 2 and 4).

* **One timeline.** After a rollback or a fallback the search never resumes a
  snapshot of the abandoned timeline, and the copies of one step never come from
  two generations (the audit's repros, with the real rank helper and search).
* **Private.** The tier lives in a per-user root created 0700; a root that is a
  symlink, another user's, or open to others is refused; snapshots are 0600; the
  prune follows no symlink.

The private root is moved under ``tmp_path`` (``PRIVATE_ROOT_PREFIX``), so the
tests never touch this machine's ``/dev/shm``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest

import lazarus.rank as lz
from activities.checkpoints.find import search_verified
from activities.checkpoints.memory_tier import choose
from activities.checkpoints.rollback import retire_newest
from activities.launcher import rank_environment
from activities.nodes.local.agent import local_memory_snapshots, remove_memory_dir
from activities.nodes.rundir import GenerationDir, job_root
from lazarus.domain import environment, memory_tier
from lazarus.domain.contracts import CheckpointRef, FindVerifiedCheckpointRequest
from lazarus.domain.spec import parse_spec
from lazarus.domain.timeline import MAX_CUTS, TimelineCut, abandoning_cut, with_cut
from lazarus.rank import memory, reset
from workflows.state import JobState

JOB = "job"


@pytest.fixture
def private_prefix(tmp_path: Path) -> Iterator[Path]:
    """The per-user roots live in ``tmp_path/shm`` for the test."""
    shm = tmp_path / "shm"
    shm.mkdir()
    shm.chmod(0o1777)
    with mock.patch.object(memory_tier, "PRIVATE_ROOT_PREFIX", f"{shm}/lazarus-"):
        yield shm


def rank_env(**values: str | int | None) -> dict[str, str]:
    """A node's local rank 0 of a world of 2, with ``values`` on top."""
    env = {
        environment.JOB_ID: JOB,
        environment.WORLD_SIZE: "2",
        environment.RANK: "0",
        environment.LOCAL_RANK: "0",
        environment.MEMORY_KEEP: "2",
    }
    env.update({k: str(v) for k, v in values.items() if v is not None})
    return env


def snap(env: dict[str, str], step: int, payload: str) -> None:
    with mock.patch.dict(os.environ, env, clear=False):
        reset._reset_state()
        (memory.write_dir(step) / "state.pt").write_text(payload)
        memory.commit(step)
    reset._reset_state()


def disk_save(env: dict[str, str], step: int, payload: str) -> None:
    with mock.patch.dict(os.environ, env, clear=False):
        reset._reset_state()
        (lz.checkpoint_path(step) / "state.pt").write_text(payload)
        lz.commit_checkpoint(step, hash_files=False)
    reset._reset_state()


def steps(root: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in root.glob("step-*") if p.name[0] != ".")


# ----------------------------------------------------------------- the timeline rule


def test_a_cut_abandons_what_older_generations_wrote_above_it() -> None:
    cuts = with_cut([], 2, 100)
    assert abandoning_cut(1, 154, cuts) == TimelineCut(generation=2, step=100)
    assert abandoning_cut(1, 100, cuts) is None  # the resume point itself
    assert abandoning_cut(2, 120, cuts) is None  # the new timeline's own
    assert abandoning_cut(None, 101, cuts) is not None  # an unsigned snapshot: the oldest


def test_cuts_stay_few_and_merging_only_abandons_more() -> None:
    cuts: list[TimelineCut] = []
    for generation in range(1, 200):
        cuts = with_cut(cuts, generation, generation * 10)
    assert len(cuts) <= MAX_CUTS
    exact = [TimelineCut(generation=g, step=g * 10) for g in range(1, 200)]
    for writer in range(0, 200, 7):
        for step in range(0, 2000, 13):
            if abandoning_cut(writer, step, exact) is not None:
                assert abandoning_cut(writer, step, cuts) is not None


def test_a_relaunch_below_an_earlier_cut_replaces_it() -> None:
    cuts = with_cut(with_cut([], 2, 150), 3, 100)
    assert cuts == [TimelineCut(generation=3, step=100)]
    # The same generation chosen again (its preflight sent it back): one cut.
    assert with_cut(cuts, 3, 90) == [TimelineCut(generation=3, step=90)]


def test_the_workflow_state_records_a_cut_per_relaunch() -> None:
    state = JobState()
    state.cut_timeline(None)
    state.generation = 1
    state.cut_timeline(CheckpointRef(step=100, path="/c/step-00000100"))
    assert state.timeline_cuts == [
        TimelineCut(generation=1, step=0),
        TimelineCut(generation=2, step=100),
    ]


# ------------------------------------------------------- defect 1: after a rollback


@pytest.mark.slow  # about 4 s: 170 saves
def test_a_crash_after_a_rollback_never_resumes_the_abandoned_timeline(
    tmp_path: Path, private_prefix: Path
) -> None:
    """The audit's repro: timeline A to 154 (snapshots every step, disk every 50), a
    rollback below 150, timeline B to 120, then a crash."""
    ckpt = tmp_path / "ckpt"
    mem = memory_tier.memory_checkpoint_dir(JOB, "/runs/job/run-1")
    mine = memory_tier.node_memory_dir(mem, "local")  # this machine's node: the search's
    on_node = Path(memory_tier.on_node(mine, os.getuid()))
    a = rank_env(
        **{
            environment.CHECKPOINT_DIR: str(ckpt),
            environment.MEMORY_CHECKPOINT_DIR: mine,
            environment.GENERATION: 1,
        }
    )
    for s in range(1, 155):
        (disk_save if s % 50 == 0 else snap)(a, s, f"A{s}")
    assert steps(on_node) == [153, 154]

    rolled = retire_newest(str(ckpt), JOB)
    cuts: list[TimelineCut] = [TimelineCut(generation=1, step=0)]
    request = {
        "checkpoint_dir": str(ckpt),
        "job_id": JOB,
        "expected_world_size": 2,
        "exclude_steps": [r.step for r in rolled.retired],
        "include_durable": False,
        "memory_dir": mem,
    }
    first = search_verified(
        FindVerifiedCheckpointRequest(**request, below_step=rolled.retired[0].step, timeline=cuts)
    )
    assert first.chosen is not None and first.chosen.step == 100
    cuts = with_cut(cuts, 2, first.chosen.step)

    b = {**a, environment.GENERATION: "2", environment.RESUME_STEP: "100"}
    for s in range(101, 121):
        (disk_save if s % 50 == 0 else snap)(b, s, f"B{s}")
    # The prune removed the abandoned snapshots, not the new timeline's.
    assert steps(on_node) == [119, 120]

    second = search_verified(FindVerifiedCheckpointRequest(**request, timeline=cuts))
    assert second.chosen is not None
    assert (second.chosen.step, second.location) == (120, "memory")
    chosen_here = memory_tier.on_node_dir(second.chosen.path, mem, "local")
    chosen = Path(memory_tier.on_node(chosen_here, os.getuid()))
    assert (chosen / "state.pt").read_text() == "B120"


def test_the_search_refuses_abandoned_snapshots_even_when_the_prune_kept_them(
    tmp_path: Path, private_prefix: Path
) -> None:
    """Whatever a node still holds (it missed the prune: it left the pool, its rank
    died first), the search judges it by the cuts."""
    mem = memory_tier.memory_checkpoint_dir(JOB, "/runs/job/run-1")
    mine = memory_tier.node_memory_dir(mem, "local")
    old = rank_env(**{environment.MEMORY_CHECKPOINT_DIR: mine, environment.GENERATION: 1})
    for s in (153, 154):
        snap(old, s, f"A{s}")
    got = search_verified(
        FindVerifiedCheckpointRequest(
            checkpoint_dir=str(tmp_path / "none"),
            job_id=JOB,
            expected_world_size=2,
            include_durable=False,
            memory_dir=mem,
            timeline=with_cut([], 2, 100),
        )
    )
    assert got.chosen is None
    assert [s.step for s in got.skipped] == [154, 153]
    assert "timeline the job left" in got.skipped[0].problems[0]


# ---------------------------------------------- defect 4: one step, two timelines


@pytest.mark.slow  # over a second: two timelines of saves
def test_the_copies_of_one_step_never_come_from_two_timelines(tmp_path: Path) -> None:
    """The audit's repro: b is lost and c replaces it; the job resumes from disk 100;
    a dies between the barrier and its commit of 154, keeping generation 1's 154."""
    roots = {n: tmp_path / n for n in "abc"}

    def write(node: str, rank: int, step: int, generation: int, what: str) -> None:
        env = rank_env(
            **{
                environment.MEMORY_CHECKPOINT_DIR: str(roots[node]),
                environment.RANK: rank,
                environment.GENERATION: generation,
                environment.MEMORY_KEEP: 100,
            }
        )
        snap(env, step, what)

    for s in range(150, 155):
        write("a", 0, s, 1, f"old{s}")
        write("b", 1, s, 1, f"old{s}")
    for s in range(101, 154):
        write("a", 0, s, 2, f"new{s}")
        write("c", 1, s, 2, f"new{s}")
    write("c", 1, 154, 2, "new154")  # a died before committing its new 154

    listing = {n: {x.step: x for x in local_memory_snapshots(roots[n])} for n in "ac"}
    request = FindVerifiedCheckpointRequest(
        checkpoint_dir="/unused", job_id=JOB, expected_world_size=2
    )
    timed = request.model_copy(update={"timeline": with_cut([], 2, 100)})
    got = choose(timed, "/dev/shm/lazarus/job/run", ["a", "c"], listing)
    assert got.chosen is not None and got.chosen.step == 153
    assert any("timeline the job left" in p for p in got.skipped[0].problems)

    # Even without the cuts (a workflow that records none), two generations for one
    # step are refused.
    legacy = choose(request, "/dev/shm/lazarus/job/run", ["a", "c"], listing)
    assert legacy.chosen is not None and legacy.chosen.step == 153
    assert "two timelines" in legacy.skipped[0].problems[-1]


# ----------------------------------------------------------- defect 2: a private root


def test_the_private_root_is_created_closed_and_snapshots_are_0600(
    private_prefix: Path,
) -> None:
    mem = memory_tier.memory_checkpoint_dir(JOB, "/runs/job/run-1")
    snap(rank_env(**{environment.MEMORY_CHECKPOINT_DIR: mem, environment.GENERATION: 1}), 1, "x")
    root = Path(memory_tier.private_root(os.getuid()))
    assert root.parent == private_prefix
    for directory in (root, root / JOB, root / JOB / "run-1"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    for file in (root / JOB / "run-1" / "step-00000001").iterdir():
        assert stat.S_IMODE(file.stat().st_mode) == 0o600, file
    assert not Path(mem).exists() or not str(mem).startswith(str(private_prefix))


@pytest.mark.parametrize("how", ["symlink", "other_owner", "group_writable", "world_readable"])
def test_an_unsafe_root_is_refused_for_writes_lists_and_removal(
    tmp_path: Path, private_prefix: Path, how: str
) -> None:
    root = Path(memory_tier.private_root(os.getuid()))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    if how == "symlink":
        root.symlink_to(elsewhere)
    else:
        root.mkdir(mode=0o700)
        if how == "other_owner":
            if os.getuid() != 0:
                pytest.skip("needs root to give the directory to another user")
            os.chown(root, 65534, 65534)
        else:
            root.chmod(0o770 if how == "group_writable" else 0o755)
    mem = memory_tier.memory_checkpoint_dir(JOB, "/runs/job/run-1")
    env = rank_env(**{environment.MEMORY_CHECKPOINT_DIR: mem, environment.GENERATION: 1})
    with mock.patch.dict(os.environ, env), pytest.raises(memory.UnsafeMemoryRoot):
        memory.write_dir(1)
    with pytest.raises(memory.UnsafeMemoryRoot):
        local_memory_snapshots(Path(mem))
    with pytest.raises(memory.UnsafeMemoryRoot):
        remove_memory_dir(mem)
    assert list(elsewhere.iterdir()) == []


def test_the_prune_never_follows_a_symlink_into_another_directory(
    tmp_path: Path, private_prefix: Path
) -> None:
    """The audit's repro 2: a run directory swapped for a symlink to the disk
    checkpoints must not make the prune delete them."""
    disk = tmp_path / "ckpt"
    disk_env = rank_env(**{environment.CHECKPOINT_DIR: str(disk), environment.GENERATION: 1})
    for s in (10, 20, 30, 40, 50):
        disk_save(disk_env, s, f"d{s}")
    mem = memory_tier.memory_checkpoint_dir(JOB, "/runs/job/run-1")
    run = Path(memory_tier.on_node(mem, os.getuid()))
    env = rank_env(**{environment.MEMORY_CHECKPOINT_DIR: mem, environment.GENERATION: 1})
    snap(env, 1, "m1")
    for child in run.iterdir():
        for file in child.iterdir():
            file.unlink()
        child.rmdir()
    run.rmdir()
    run.symlink_to(disk)
    with mock.patch.dict(os.environ, env), pytest.raises(memory.UnsafeMemoryRoot):
        memory.commit(60)
    assert steps(disk) == [10, 20, 30, 40, 50]


def test_a_rank_and_a_script_reading_the_variables_find_the_private_path() -> None:
    env = {
        environment.MEMORY_CHECKPOINT_DIR: "/dev/shm/lazarus/job/run-1",
        environment.RESUME_FROM: "/dev/shm/lazarus/job/run-1/step-00000007",
        "OTHER": "/dev/shm/lazarus/x",
    }
    mapped = memory_tier.environment_on_node(env, 1234)
    assert mapped[environment.MEMORY_CHECKPOINT_DIR] == "/dev/shm/lazarus-1234/job/run-1"
    assert mapped[environment.RESUME_FROM] == "/dev/shm/lazarus-1234/job/run-1/step-00000007"
    assert mapped["OTHER"] == "/dev/shm/lazarus/x"
    # Idempotent, and a disk resume point is left alone.
    assert memory_tier.environment_on_node(mapped, 1234) == mapped
    assert memory_tier.on_node("/ckpt/step-00000007", 1234) == "/ckpt/step-00000007"


# ------------------------- S6: logical nodes of one machine keep to their own files


def test_two_logical_nodes_of_one_machine_never_share_or_prune_each_others_snapshots(
    tmp_path: Path, private_prefix: Path
) -> None:
    """The 2026-12-07 audit's S6: local logical nodes (and a one-host Slurm cluster)
    share one tmpfs. The launcher gives each node its own directory under the run's,
    and each node's keep-newest prune stays in it."""
    data = {
        "name": JOB,
        "command": ["python", "train.py"],
        "nodes": [{"name": "a"}, {"name": "b"}],
        "checkpoints": {"memory_every_steps": 1, "memory_keep": 1},
    }
    spec = parse_spec(data, "<test>").resolved(tmp_path)
    gen = GenerationDir.of(job_root(spec.run_dir, spec.job_id) / "run-1", 1)
    dirs = [
        rank_environment(spec, spec.nodes, i, gen, i, 29500, None, worker_env={})[
            environment.MEMORY_CHECKPOINT_DIR
        ]
        for i in (0, 1)
    ]
    assert dirs[0] != dirs[1]
    assert [d.rsplit("/", 1)[1] for d in dirs] == ["node-a", "node-b"]
    for step in (1, 2, 3):
        snap(
            rank_env(**{environment.MEMORY_CHECKPOINT_DIR: dirs[0], environment.GENERATION: 1}),
            step,
            "a",
        )
    snap(
        rank_env(**{environment.MEMORY_CHECKPOINT_DIR: dirs[1], environment.GENERATION: 1}), 2, "b"
    )
    snap(
        rank_env(**{environment.MEMORY_CHECKPOINT_DIR: dirs[0], environment.GENERATION: 1}), 4, "a"
    )
    on = [Path(memory_tier.on_node(d, os.getuid())) for d in dirs]
    assert steps(on[0]) == [3, 4]  # a's own prune kept its newest two
    assert steps(on[1]) == [2]  # and never touched b's
    assert (on[1] / "step-00000002" / "state.pt").read_text() == "b"
