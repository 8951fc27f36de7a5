"""Nothing of a warm-started run outlives it (issue 26, audit 10.): real
``launch_generation`` on local logical nodes a and b with spare s, and the stops built
as ``JobWorkflow._stop_all`` builds them (targets, ``stop_on_nodes``, ``settle_stop``).

b runs generation 1 with a zygote and an idle standby, is swapped out for s, fenced by
a pause and returned to the spares. It holds no rank after that, so no ordinary stop
reaches it again; the end-of-run stop must, or its zygote lives on. The check is the
process table: no process anywhere still names the run directory (ranks, zygotes and
their standbys all do, in their command line)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from activities.launcher import launch_generation
from activities.nodes import zygote_client
from activities.nodes.procfs import read_stat
from activities.nodes.zygote_socket import zygote_dir
from activities.stop import stop_on_nodes
from lazarus.domain.contracts import LaunchRequest, NodeAccess, StopRequest
from lazarus.domain.spec import JobSpec, parse_spec
from workflows.placement import active_nodes, node_spec
from workflows.state import JobState, NodePool
from workflows.stops import end_of_run_targets, settle_stop, stop_targets

DEADLINE_S = 20.0
"""How long the stopped processes get to be gone (standbys exit once their zygote's
channel closes): generous, for a loaded machine."""


def spec_for(tmp_path: Path) -> JobSpec:
    return parse_spec(
        {
            "name": f"zjob-{os.getpid()}",
            "command": [sys.executable, "-c", "import time; time.sleep(300)"],
            "nodes": [{"name": "a"}, {"name": "b"}],
            "spares": [{"name": "s"}],
            "warm_start": {"preload": [], "standby": 1},
        },
        "<test>",
    ).resolved(tmp_path)


def processes_naming(text: str) -> dict[int, int]:
    """pid -> pgid of every live process whose command line contains ``text``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        stat = read_stat(int(entry.name))
        if text in cmdline and stat is not None and stat.state not in ("Z", "X"):
            found[int(entry.name)] = stat.pgrp
    return found


@pytest.fixture(autouse=True)
def reaper(tmp_path: Path) -> Iterator[None]:
    """Teardown kills, by process group, whatever still names the test's directory:
    only this test's processes do."""
    yield
    for pgid in set(processes_naming(str(tmp_path)).values()):
        if pgid != os.getpgrp():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)


@pytest.mark.timeout(180)
def test_the_end_of_run_stops_the_zygotes_of_nodes_that_left_the_pool(tmp_path: Path) -> None:
    spec = spec_for(tmp_path)
    root = Path(spec.run_dir) / spec.job_id / "run-1"
    state = JobState(pool=NodePool(active=["a", "b"], spares=["s"]))
    pool = state.pool

    def launch(generation: int) -> None:
        result = launch_generation(
            LaunchRequest(
                spec=spec,
                generation=generation,
                run_root=str(root),
                nodes=active_nodes(spec, pool),
            )
        )
        assert result.warm_start is not None and result.warm_start.warm_ranks == [0, 1]

    def stop_all(reason: str, end_of_run: bool = False) -> None:
        """As ``JobWorkflow._stop_all`` (with PATCH_END_OF_RUN_EVERY_NODE)."""
        names = end_of_run_targets(spec, state) if end_of_run else stop_targets(spec, pool, None)
        result = stop_on_nodes(
            StopRequest(
                job_id=spec.job_id,
                run_root=str(root),
                grace_s=0,
                reason=reason,
                access=NodeAccess.of(spec, [node_spec(spec, n) for n in names]),
                end_of_run=end_of_run,
            )
        )
        settle_stop(state, names, result, time.time(), whole_job=True)

    launch(1)
    b_zygote = zygote_client.read_zygote(zygote_dir(root, "b"))
    assert b_zygote is not None
    stop_all("incident 1: gpu_hardware on node b")
    pool.swap_out("b", "incident 1: gpu_hardware", time.time(), None)
    launch(2)
    stop_all("paused by operator")
    assert [(q.node, q.fenced) for q in pool.quarantined] == [("b", True)]
    pool.release("b")  # lazarus return: a spare again, its zygote still up
    launch(3)
    assert pool.active == ["a", "s"] and pool.spares == ["b"]
    assert processes_naming(str(zygote_dir(root, "b"))), "b's zygote served generation 1"

    stop_all("end of run (cancelled)", end_of_run=True)

    deadline = time.monotonic() + DEADLINE_S
    while (left := processes_naming(str(root))) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"outlived the run: {left}"
