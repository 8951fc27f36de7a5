"""``lazarus start --dry-run`` tells the truth on local nodes (issue 39, part 3): a
two-node local job (two logical nodes of this machine, two ranks each) launched by
the real dev server and worker runs on the nodes, with the ranks, ``MASTER_ADDR`` and
the variables its dry run showed. The ssh and Slurm launchers have the same check in
``tests/netns/test_ssh_node_python.py`` and ``tests/slurm/test_slurm_node_python.py``
(an existing allocation and submit mode)."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from activities.nodes.rundir import generations, runs
from lazarus.domain.spec import JobSpec, parse_spec
from tests.e2e.conftest import Job
from tests.node_python import RANK_SCRIPT, assert_launch_matches_dry_run, worker_plan
from workflows.state import Phase

pytestmark = pytest.mark.e2e

StartJob = Callable[[JobSpec], Awaitable[Job]]


@pytest.mark.timeout(180)
async def test_a_local_job_runs_what_its_dry_run_showed(
    start_job: StartJob, tmp_path: Path
) -> None:
    (tmp_path / "rank.py").write_text(RANK_SCRIPT)
    out = tmp_path / "out"
    spec = parse_spec(
        {
            "name": f"dry-local-{uuid.uuid4().hex[:8]}",
            "command": [sys.executable, "rank.py", str(out)],
            "workdir": str(tmp_path),
            "nodes": [{"name": "a", "env": {"NODE_SETTING": "a"}}, {"name": "b"}],
            "nproc_per_node": 2,
            "checkpoint_dir": str(tmp_path / "checkpoints"),
            "run_dir": str(tmp_path / "runs"),
            "health": {"hang_timeout_s": 30, "startup_timeout_s": 60, "poll_interval_s": 0.2},
            "recovery": {"max_restarts": 0},
        },
        "<test>",
    ).resolved(tmp_path)
    plan = worker_plan(spec)
    assert [(n.name, n.ranks) for n in plan.nodes] == [("a", [0, 1]), ("b", [2, 3])]
    job = await start_job(spec)
    status = await job.result(timeout_s=150)
    ranks = {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(4)}
    assert status.phase == Phase.SUCCEEDED, (status, ranks)
    [gen] = [g for run in runs(job.run_root) for g in generations(run)]
    assert_launch_matches_dry_run(plan, ranks, gen.path)
    assert [ranks[r]["node_env"] for r in range(4)] == ["a", "a", None, None]
