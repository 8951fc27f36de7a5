"""SSH nodes as issue 39 asks: reached through ``~/.ssh/config`` (a Host alias, and
one node only through a jump host, ``ProxyJump``), running ranks with the node's
own Python at another path that has only ``lazarus-rank``, on the node's own PATH,
with a node's own ``env``. Real sshd in network namespaces (h1, h2), the real dev
server and worker."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from activities.nodes.rundir import generations, runs
from activities.nodes.ssh.agent import SSHAgent
from infra.testhosts import TestHosts
from lazarus.domain.spec import JobSpec, NodeSpec, SSHSpec, parse_spec
from tests.e2e.conftest import Job
from tests.netns.conftest import HostsFactory
from tests.node_python import (
    RANK_SCRIPT,
    assert_launch_matches_dry_run,
    rank_only_python,
    worker_plan,
)
from workflows.state import Phase

pytestmark = pytest.mark.e2e

StartJob = Callable[[JobSpec], Awaitable[Job]]


@pytest.fixture(scope="module")
def node_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return rank_only_python(tmp_path_factory.mktemp("node-python"))


def ssh_config(hosts: TestHosts, path: Path) -> Path:
    """``node-one`` is h1; ``node-two`` is h2, reached only through ``node-one``."""
    h1, h2 = hosts.hosts[:2]
    path.write_text(
        f"Host node-one\n  HostName {h1.address}\n  Port {h1.port}\n  User root\n"
        f"  IdentityFile {hosts.identity_file}\n"
        f"Host node-two\n  HostName {h2.address}\n  Port {h2.port}\n  User root\n"
        f"  IdentityFile {hosts.identity_file}\n  ProxyJump node-one\n"
    )
    return path


def test_an_alias_and_a_jump_host_from_the_ssh_config(
    test_hosts: HostsFactory, tmp_path: Path
) -> None:
    hosts = test_hosts(2)
    h1 = hosts.hosts[0]
    ssh = SSHSpec(
        known_hosts=str(hosts.known_hosts), config=str(ssh_config(hosts, tmp_path / "config"))
    )
    seen = {}
    for alias, name in (("node-one", "h1"), ("node-two", "h2")):
        agent = SSHAgent(NodeSpec(name=name, launcher="ssh", host=alias), ssh)
        try:
            reply = agent._run(b'echo "$SSH_CONNECTION"; hostname -I\n', 20)
        finally:
            agent.close()
        assert reply.exit_code == 0, reply.output
        seen[alias] = reply.output.decode().split()
    # node-two's sshd saw the connection come from h1: the jump host opened it.
    assert seen["node-two"][0] == h1.address, seen
    assert seen["node-two"][2] == hosts.hosts[1].address, seen
    assert seen["node-one"][2] == h1.address and seen["node-one"][0] != h1.address, seen


def test_a_jump_host_that_refuses_is_named(test_hosts: HostsFactory, tmp_path: Path) -> None:
    hosts = test_hosts(2)
    config = ssh_config(hosts, tmp_path / "config")
    config.write_text(
        config.read_text().replace(
            "Host node-one\n  HostName", "Host node-one\n  HostName 10.255.255.1\n  #", 1
        )
    )
    ssh = SSHSpec(known_hosts=str(hosts.known_hosts), config=str(config), connect_timeout_s=1)
    agent = SSHAgent(NodeSpec(name="h2", launcher="ssh", host="node-two"), ssh)
    with pytest.raises(Exception, match="via jump host node-one"):
        agent._run(b"true\n", 5)
    agent.close()


@pytest.mark.timeout(240)
async def test_ranks_run_on_the_nodes_python_and_path_through_the_config(
    test_hosts: HostsFactory, start_job: StartJob, tmp_path: Path, node_python: Path
) -> None:
    hosts = test_hosts(2)
    (tmp_path / "rank.py").write_text(RANK_SCRIPT)
    out = tmp_path / "out"
    spec = parse_spec(
        {
            "name": f"ssh-nodepy-{uuid.uuid4().hex[:8]}",
            "command": [str(node_python), "rank.py", str(out)],
            "workdir": str(tmp_path),
            "nodes": [
                {"name": "h1", "launcher": "ssh", "host": "node-one", "env": {"NODE_SETTING": "a"}},
                {"name": "h2", "launcher": "ssh", "host": "node-two"},
            ],
            "ssh": {
                "known_hosts": str(hosts.known_hosts),
                "config": str(ssh_config(hosts, tmp_path / "config")),
                "python": str(node_python),
            },
            "checkpoint_dir": str(tmp_path / "checkpoints"),
            "run_dir": str(tmp_path / "runs"),
            "health": {"hang_timeout_s": 30, "startup_timeout_s": 60, "poll_interval_s": 0.2},
            "recovery": {"max_restarts": 0},
        },
        "<test>",
    ).resolved(tmp_path)
    job = await start_job(spec)
    status = await job.result(timeout_s=200)
    ranks = {r: json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)}
    assert status.phase == Phase.SUCCEEDED, (status, ranks)
    site = str(node_python.parent.parent / "lib")
    worker_bin = str(Path(sys.executable).parent)
    for rank, seen in ranks.items():
        assert seen["controller_modules"] == [], seen
        assert seen["helper"].startswith(site), seen
        assert seen["pythonpath"] is None, seen  # no checkout of the controller's
        # The node's own PATH (its login's), nothing of the worker's.
        assert seen["path"] and worker_bin not in seen["path"].split(":"), seen
        assert seen["node_env"] == ("a" if rank == 0 else None), seen
        # The alias resolved: the ranks rendezvous at h1's address, not "node-one".
        assert seen["env"]["MASTER_ADDR"] == hosts.hosts[0].address, seen
    # What `lazarus start --dry-run` showed is what ran (issue 39, part 3).
    plan = worker_plan(spec)
    [gen] = [g for run in runs(job.run_root) for g in generations(run)]
    assert_launch_matches_dry_run(plan, ranks, gen.path)
    h1, h2 = hosts.hosts[:2]
    assert [n.login for n in plan.nodes] == [
        f"root@{h1.address}:{h1.port}",
        f"root@{h2.address}:{h2.port} via root@{h1.address}:{h1.port}",
    ]
    assert [n.python for n in plan.nodes] == [str(node_python)] * 2
