"""A Slurm job whose compute nodes have their own Python at another path, with only
``lazarus-rank`` installed (issue 39): each rank's task runs as ``<node python> -m
lazarus.rank.slurm_task`` (never the worker's interpreter or its packages), the
ranks see no controller module and no checkout on their PYTHONPATH, and a node's own
``env`` reaches its ranks only. Real slurmctld/slurmd (n1..n3 on this host), the real
dev server and worker."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from activities.nodes.node_plan import GEN_DIR
from activities.nodes.rundir import read_json
from activities.nodes.slurm.agent import step_record
from activities.nodes.slurm.submit import start_allocation
from activities.start_checks import check_start
from infra.slurm import TestSlurm
from lazarus.app.devserver import DevServer
from lazarus.domain.spec import parse_spec
from lazarus.domain.worker_calls import StartCheckRequest
from tests.node_python import (
    RANK_SCRIPT,
    assert_launch_matches_dry_run,
    rank_only_python,
    worker_plan,
)
from tests.slurm.test_slurm_e2e import HOST, all_generations, harness
from workflows.state import Phase

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def node_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return rank_only_python(tmp_path_factory.mktemp("node-python"))


@pytest.mark.timeout(300)
async def test_ranks_run_on_the_nodes_python_with_only_lazarus_rank(
    slurm: TestSlurm, allocation: int, dev_server: DevServer, tmp_path: Path, node_python: Path
) -> None:
    (tmp_path / "rank.py").write_text(RANK_SCRIPT)
    out = tmp_path / "out"
    spec = parse_spec(
        {
            "name": f"slurm-nodepy-{uuid.uuid4().hex[:8]}",
            "command": [str(node_python), "rank.py", str(out)],
            "workdir": str(tmp_path),
            "nodes": [
                {"name": "n1", "launcher": "slurm", "host": HOST, "env": {"NODE_SETTING": "a"}},
                {"name": "n2", "launcher": "slurm", "host": HOST},
            ],
            "slurm": {"job_id": allocation, "python": str(node_python)},
            "nproc_per_node": 1,
            "checkpoint_dir": str(tmp_path / "checkpoints"),
            "run_dir": str(tmp_path / "runs"),
            "health": {"hang_timeout_s": 30, "startup_timeout_s": 120, "poll_interval_s": 0.2},
            "recovery": {"max_restarts": 0},
        },
        "<test>",
    ).resolved(tmp_path)
    async with harness(dev_server, tmp_path, slurm) as h:
        job = await h.start(spec)
        status = await job.result(timeout_s=240)
    ranks = {r: json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)}
    assert status.phase == Phase.SUCCEEDED, (status, ranks)
    site = str(node_python.parent.parent / "lib")
    for rank, seen in ranks.items():
        assert seen["controller_modules"] == [], seen
        assert seen["helper"].startswith(site), seen
        # The rank's keeper: the node's python running lazarus-rank's task module.
        assert seen["parent"][:3] == [str(node_python), "-m", "lazarus.rank.slurm_task"], seen
        assert seen["pythonpath"] is None, seen  # no checkout, no controller path
        assert seen["node_env"] == ("a" if rank == 0 else None), seen
        assert seen["env"]["LAZARUS_NODE"] == f"n{rank + 1}"
    # What `lazarus start --dry-run` showed is what ran (issue 39, part 3): each
    # node's srun line, placeholders filled in, and the ranks' variables.
    plan = worker_plan(spec)
    [gen] = all_generations(job)
    assert_launch_matches_dry_run(plan, ranks, gen.path)
    for node in plan.nodes:
        record = read_json(gen.path / step_record(node.name)) or {}
        shown = [
            word.replace(GEN_DIR, str(gen.path)).replace(
                "lazarus-g1-<run>-" + node.name, record["name"]
            )
            for word in node.runs
        ]
        assert record["argv"] == [record["argv"][0], *shown[1:]], (record, node.runs)


@pytest.mark.timeout(400)
async def test_submit_mode_runs_what_its_dry_run_showed(
    own_slurm: Callable[[], TestSlurm], dev_server: DevServer, tmp_path: Path, node_python: Path
) -> None:
    """``slurm: {nodes: 2, spares: 1}``: the dry run shows two placeholder nodes of
    the allocation and the ``sbatch`` line; Slurm grants n1..n3 for that line, and the
    job runs on n1, n2 as shown, each task on the node's own Python."""
    cluster = own_slurm()
    (tmp_path / "rank.py").write_text(RANK_SCRIPT)
    out = tmp_path / "out"
    spec = parse_spec(
        {
            "name": f"slurm-submit-{uuid.uuid4().hex[:8]}",
            "command": [str(node_python), "rank.py", str(out)],
            "workdir": str(tmp_path),
            "slurm": {"nodes": 2, "spares": 1, "python": str(node_python), "time": "10:00"},
            "nproc_per_node": 1,  # the test nodes have one CPU each
            "checkpoint_dir": str(tmp_path / "checkpoints"),
            "run_dir": str(tmp_path / "runs"),
            "health": {"hang_timeout_s": 30, "startup_timeout_s": 120, "poll_interval_s": 0.2},
            "recovery": {"max_restarts": 0},
        },
        "<test>",
    ).resolved(tmp_path)
    plan = worker_plan(spec)
    assert plan.submit is not None and len(plan.ranks) == 2
    assert [n.ranks for n in plan.nodes] == [[0], [1]]
    granted = start_allocation(spec, lambda _: None)  # the workflow's first step, by hand
    assert granted.slurm is not None and granted.slurm.job_id is not None
    shown = cluster.command("scontrol", "show", "job", "-o", str(granted.slurm.job_id)).stdout
    assert "NumNodes=3" in shown and "TimeLimit=00:10:00" in shown, shown
    assert "-N" in plan.submit and plan.submit[plan.submit.index("-N") + 1] == "3"
    async with harness(dev_server, tmp_path, cluster) as h:
        job = await h.start(granted)
        status = await job.result(timeout_s=300)
    ranks = {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(2)}
    assert status.phase == Phase.SUCCEEDED, (status, ranks)
    [gen] = all_generations(job)
    names = {"<allocation node 1>": "n1", "<allocation node 2>": "n2"}
    assert_launch_matches_dry_run(plan, ranks, gen.path, names)
    for seen in ranks.values():
        assert seen["parent"][:3] == [str(node_python), "-m", "lazarus.rank.slurm_task"]


@pytest.mark.timeout(120)
def test_lazarus_start_refuses_pyxis_where_srun_lacks_it(
    slurm: TestSlurm, allocation: int, tmp_path: Path
) -> None:
    """This test cluster has no pyxis: ``lazarus start`` says so, naming the field, and
    starts nothing (exit 2)."""
    spec = {
        "name": "pyxis-job",
        "command": ["python3", "train.py"],
        "workdir": str(tmp_path),
        "nodes": [{"name": "n1", "launcher": "slurm", "host": HOST}],
        "slurm": {"job_id": allocation, "container": {"image": "nvcr.io/nvidia/pytorch:24.05"}},
    }
    spec_file = tmp_path / "job.yaml"
    # The worker runs lazarus start's checks (issue 40): asked here directly, as the
    # CLI's call to a worker asks it; the CLI prints these lines and exits 2.
    checked = check_start(
        StartCheckRequest(spec=parse_spec(spec, str(spec_file)), spec_file=str(spec_file))
    )
    said = "\n".join(checked.problems)
    assert "slurm.container: runtime pyxis needs the pyxis plugin" in said
    assert "has no --container-image" in said
